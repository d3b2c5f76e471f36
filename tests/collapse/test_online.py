"""OnlineDiagnostics: schedule, the two sampling schemes, EMA carried across steps, determinism,
checkpoint state, and agreement with a hand-assembled score matrix."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from ragen2.collapse import OnlineDiagnostics, mi_metrics, score_matrix_naive
from ragen2.collapse.online import first_turn_pairs, reasoning_ids, summary_rows, trajectory_pairs, turn_pairs
from ragen2.config import CollapseConfig

pytestmark = pytest.mark.usefixtures("one_thread")
METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"

PROMPTS = [  # one first observation per group (the group shares the env seed)
    "Turn 1: player at (row 1, col 2), box right.",
    "Turn 1: player at (row 3, col 2), box left.",
    "Turn 1: arms Dragon, Turtle.",
]
REASONINGS = ["Go left then up.", "The box is right of me.", "I push it down onto the target.", "Dragon."]


@pytest.fixture
def batch(make_trajectory):
    return lambda **kw: _batch(make_trajectory, **kw)


def _batch(make_trajectory, groups=PROMPTS, per_group=3, empty_first=((1, 0),)):
    """len(groups) x per_group trajectories of two turns; `empty_first` lists (group, index) with empty
    first-turn reasoning."""
    trajectories = []
    for g, prompt in enumerate(groups):
        for k in range(per_group):
            first = "" if (g, k) in empty_first else REASONINGS[(g + k) % len(REASONINGS)]
            second = REASONINGS[(g + 2 * k + 1) % len(REASONINGS)]
            trajectories.append(make_trajectory(g, [(prompt, first), (prompt + f" Turn 2 of {k}.", second)]))
    return trajectories


def config(**kw) -> CollapseConfig:
    return CollapseConfig(**{"compute_freq": 5, "num_samples": 12, "micro_batch_size": 8, **kw})


def test_schedule_is_step_one_then_every_compute_freq():
    diag = OnlineDiagnostics(config(compute_freq=5), seed=0)
    assert [s for s in range(1, 21) if diag.should_run(s)] == [1, 5, 10, 15, 20]
    assert not any(OnlineDiagnostics(config(enable=False), 0).should_run(s) for s in range(1, 11))


def test_first_turn_columns_are_the_groups(tiny_tokenizer, batch):
    trajectories = batch()
    pairs = first_turn_pairs(trajectories, 64, np.random.default_rng(0))
    assert len(pairs.prompts) == 3  # P = groups, though group 1 has an empty first reasoning
    assert len(pairs.reasonings) == 8  # 9 first turns, one empty
    assert pairs.valid_thinking_rate == pytest.approx(8 / 9)
    for z, j in zip(pairs.reasonings, pairs.source):  # every reasoning points at its group's prompt
        owners = [t for t in trajectories if reasoning_ids(t.turns[0]) == z]
        assert any(t.turns[0].prompt_ids == pairs.prompts[j] for t in owners)
    fewer = first_turn_pairs(trajectories, 5, np.random.default_rng(0))
    assert len(fewer.reasonings) == 5 and len(fewer.prompts) == 3  # still all groups as columns


def test_identical_group_prompts_are_one_class(tiny_tokenizer, tiny_model, batch):
    trajectories = batch(groups=[PROMPTS[0], PROMPTS[0], PROMPTS[2]])
    out = OnlineDiagnostics(config(), 0).run(tiny_model, tiny_tokenizer, trajectories, 1)
    assert out["collapse_first_turn/num_inputs"] == 3
    assert out["collapse_first_turn/num_distinct_inputs"] == 2
    assert out["collapse_first_turn/chance_level"] == pytest.approx(1 / 2)


def test_trajectory_pairs_are_their_own_columns(tiny_tokenizer, batch):
    trajectories = batch()
    pairs = trajectory_pairs(trajectories, 40, np.random.default_rng(3))
    assert len(pairs.prompts) == len(pairs.reasonings) == len(pairs.source)
    assert pairs.source == list(range(len(pairs.reasonings)))
    # 18 turns, 1 empty: about 1/18 of the draws are dropped, and some draws hit a second turn.
    assert 30 <= len(pairs.reasonings) <= 40
    assert pairs.valid_thinking_rate == pytest.approx(len(pairs.reasonings) / 40)
    first_prompts = {tuple(t.turns[0].prompt_ids) for t in trajectories}
    assert any(tuple(p) not in first_prompts for p in pairs.prompts)


def test_run_returns_both_prefixes_as_numbers(tiny_tokenizer, tiny_model, batch):
    out = OnlineDiagnostics(config(), 0).run(tiny_model, tiny_tokenizer, batch(), 1)
    for prefix in ("collapse_first_turn/", "collapse_trajectory/"):
        for key in ("retrieval_acc", "mi_zscore_ema", "cond_entropy", "valid_thinking_rate", "num_pairs"):
            assert isinstance(out[prefix + key], float)
    assert not any("ema_state" in key for key in out)
    documented = set(re.findall(r"^\| `([^`]+)` \|", METRICS_DOC.read_text(), flags=re.MULTILINE))
    assert set(out) - documented == set()  # STYLE 7: every emitted key has a row in docs/metrics.md
    assert out["collapse_first_turn/num_inputs"] == 3 and out["collapse_first_turn/num_pairs"] == 8
    assert out["collapse_trajectory/num_inputs"] == out["collapse_trajectory/num_pairs"] <= 12


def test_online_equals_hand_assembled_matrix(tiny_tokenizer, tiny_model, batch):
    """Reference: the first-turn proxies equal naive scoring of [prompt | reasoning] fed to mi_metrics."""
    trajectories = batch()
    out = OnlineDiagnostics(config(), 0).run(tiny_model, tiny_tokenizer, trajectories, 1)

    prompts = [trajectories[3 * g].turns[0].prompt_ids for g in range(3)]
    pairs = [(reasoning_ids(t.turns[0]), t.group_id) for t in trajectories if reasoning_ids(t.turns[0])]
    reasonings = [z for z, _ in pairs]
    logp = np.array(
        [[score_matrix_naive(tiny_model, None, [p], [z])[0, 0] for p in prompts] for z in reasonings]
    )  # [M, P], one unbatched forward per pair
    expected = mi_metrics(logp, np.array([g for _, g in pairs]), lengths=np.array([len(z) for z in reasonings]),
                          input_ids=prompts)
    for key in ("retrieval_acc", "recall@2", "mi_est", "mi_seq_est", "mi_zscore", "mi_zscore_ema",
                "cond_entropy", "reasoning_entropy", "chance_level", "num_pairs", "num_inputs"):
        assert out[f"collapse_first_turn/{key}"] == pytest.approx(expected[key], abs=1e-4), key


def test_ema_is_carried_and_checkpointed(tiny_tokenizer, tiny_model, batch):
    first, second = batch(), batch(groups=PROMPTS[::-1], empty_first=())
    diag = OnlineDiagnostics(config(), 0)
    one = diag.run(tiny_model, tiny_tokenizer, first, 1)
    saved = diag.state_dict()
    five = diag.run(tiny_model, tiny_tokenizer, second, 5)
    for prefix in ("collapse_first_turn/", "collapse_trajectory/"):
        expected = 0.9 * one[prefix + "marginal_std"] + 0.1 * five[prefix + "marginal_std"]
        assert five[prefix + "marginal_std_ema"] == pytest.approx(expected)
        assert five[prefix + "mi_zscore_ema"] == pytest.approx(five[prefix + "mi_est"] / (expected + 1e-3))
        assert five[prefix + "mi_zscore_ema"] != pytest.approx(five[prefix + "mi_zscore"])
    resumed = OnlineDiagnostics(config(), 0)
    resumed.load_state_dict(saved)
    assert resumed.run(tiny_model, tiny_tokenizer, second, 5) == five  # a resumed run continues exactly


def test_sampling_depends_only_on_seed_and_step(tiny_tokenizer, tiny_model, batch):
    trajectories = batch()
    cfg = config(num_samples=6)
    a = OnlineDiagnostics(cfg, 7).run(tiny_model, tiny_tokenizer, trajectories, 5)
    b = OnlineDiagnostics(cfg, 7).run(tiny_model, tiny_tokenizer, trajectories, 5)
    assert a == b
    def draw(seed: int, step: int) -> list[list[int]]:
        return trajectory_pairs(trajectories, 6, np.random.default_rng([seed, step, 1])).reasonings

    assert draw(7, 5) == draw(7, 5)
    assert draw(7, 5) != draw(7, 10) and draw(7, 5) != draw(8, 5)


def test_no_reasoning_reports_the_rate_and_keeps_the_ema(tiny_tokenizer, tiny_model, batch):
    diag = OnlineDiagnostics(config(), 0)
    diag.run(tiny_model, tiny_tokenizer, batch(), 1)
    before = diag.state_dict()
    silent = [dataclasses.replace(t, turns=[dataclasses.replace(u, reasoning_span=(0, 0)) for u in t.turns])
              for t in batch()]
    out = diag.run(tiny_model, tiny_tokenizer, silent, 5)
    assert out == {
        "collapse_first_turn/valid_thinking_rate": 0.0,
        "collapse_first_turn/num_pairs": 0.0,
        "collapse_trajectory/valid_thinking_rate": 0.0,
        "collapse_trajectory/num_pairs": 0.0,
    }
    assert diag.state_dict() == before


def test_one_pair_batch_logs_no_mi_zscore(tiny_tokenizer, tiny_model, batch):
    """Issue 15: a first step with one valid pair logged MI-ZScore 89.3 (sigma 0). Now the proxies
    that one pair cannot support are absent; the count and the entropies are logged."""
    diag = OnlineDiagnostics(config(num_samples=1, alarm_patience=1, alarm_margin=0.9), 0)
    result = diag.step(tiny_model, tiny_tokenizer, batch(), 1)
    out = result.metrics
    for prefix in ("collapse_first_turn/", "collapse_trajectory/"):
        assert out[prefix + "num_pairs"] == 1.0
        for key in ("mi_zscore", "mi_zscore_ema", "retrieval_acc", "recall@2", "mi_est", "mi_seq_est",
                    "marginal_std", "marginal_std_ema"):
            assert prefix + key not in out, key
        assert np.isfinite(out[prefix + "cond_entropy"]) and np.isfinite(out[prefix + "reasoning_entropy"])
    assert out["collapse_first_turn/num_inputs"] == 3 and out["collapse_trajectory/num_distinct_inputs"] == 1
    assert all(np.isfinite(v) for v in out.values())
    documented = set(re.findall(r"^\| `([^`]+)` \|", METRICS_DOC.read_text(), flags=re.MULTILINE))
    assert set(out) - documented == set()
    # No EMA step and no alarm evidence: a margin of 0.9 would call any real check "at chance".
    assert diag.ema == {"first_turn": None, "trajectory": None}
    assert result.alarm is None and diag.alarm.state_dict()["streak"] == 0
    # The next usable check starts the EMA at its own sigma.
    good = OnlineDiagnostics(config(), 0)
    good.load_state_dict(diag.state_dict())
    full = good.run(tiny_model, tiny_tokenizer, batch(), 5)
    assert full["collapse_first_turn/marginal_std_ema"] == full["collapse_first_turn/marginal_std"]
    assert good.ema["first_turn"].steps == 1


def test_summary_rows_show_the_last_check_with_its_pair_count():
    p = "collapse_first_turn/"
    records = [
        {"step": 1, p + "num_pairs": 1.0, p + "num_distinct_inputs": 3.0, p + "chance_level": 1 / 3,
         p + "cond_entropy": 2.0, p + "retrieval_acc": None},
        {"step": 2, "rollout/return_mean": 0.5},
    ]
    assert summary_rows(records) == [
        ("MI proxies (first turn)", "Retrieval-Acc n/a (chance 0.333), MI-ZScore-EMA n/a; 1 pair, 3 distinct inputs "
         "(step 1)"),
    ]
    records.append({"step": 5, p + "num_pairs": 8.0, p + "num_distinct_inputs": 3.0, p + "chance_level": 1 / 3,
                    p + "retrieval_acc": 0.625, p + "mi_zscore_ema": 0.4127})
    assert summary_rows(records)[0][1] == ("Retrieval-Acc 0.625 (chance 0.333), MI-ZScore-EMA 0.413; 8 pairs, "
                                           "3 distinct inputs (step 5)")
    assert summary_rows([{"step": 1, "rollout/return_mean": 0.5}]) == []


def test_step_is_the_one_call_per_step(tiny_tokenizer, tiny_model, batch):
    """Off-schedule steps cost nothing; on-schedule ones return metrics and the alarm's decision."""
    diag = OnlineDiagnostics(config(compute_freq=2, alarm_patience=1, alarm_margin=0.9, alarm_entropy_band=None), 0)
    trajectories = batch()
    off = diag.step(tiny_model, tiny_tokenizer, trajectories, 3)
    assert off.metrics == {} and off.alarm is None
    on = diag.step(tiny_model, tiny_tokenizer, trajectories, 2)
    assert on.metrics["collapse_first_turn/num_pairs"] == 8
    assert on.alarm is not None and on.alarm.step == 2 and on.alarm.action == "warn"  # margin 0.9: always "at chance"


def test_per_turn_schemes_score_turn_k_alone(tiny_tokenizer, tiny_model, batch):
    trajectories = batch()
    pairs = turn_pairs(trajectories, 1, 64, np.random.default_rng(0))
    assert len(pairs.prompts) == 9  # every second-turn prompt differs ("Turn 2 of k" within each group)
    assert sorted(pairs.reasonings) == sorted(reasoning_ids(t.turns[1]) for t in trajectories)
    second = {(tuple(t.turns[1].prompt_ids), tuple(reasoning_ids(t.turns[1]))) for t in trajectories}
    assert {(tuple(pairs.prompts[c]), tuple(z)) for c, z in zip(pairs.source, pairs.reasonings)} == second
    out = OnlineDiagnostics(config(per_turn=2), 0).run(tiny_model, tiny_tokenizer, trajectories, 1)
    plain = OnlineDiagnostics(config(), 0).run(tiny_model, tiny_tokenizer, trajectories, 1)
    assert out["collapse_turn_2/num_inputs"] == 9 and out["collapse_turn_2/num_pairs"] == 9
    assert {k: v for k, v in out.items() if not k.startswith("collapse_turn_2/")} == plain  # the others unchanged
    assert turn_pairs(trajectories, 2, 64, np.random.default_rng(0)).prompts == []  # nobody reached turn 3
    with pytest.raises(ValueError, match="collapse.per_turn=1 is not allowed"):
        config(per_turn=1)


def test_staleness_splits_the_pairs_by_their_groups_staleness(tiny_tokenizer, tiny_model, batch):
    """Group 0 fresh, groups 1 and 2 one update old: each staleness's proxies are those of its reasonings
    scored against all the batch's inputs, and their pair-weighted means are the whole batch's."""
    trajectories = batch()
    staleness = {0: 0, 1: 1, 2: 1}
    out = OnlineDiagnostics(config(), 0).run(tiny_model, tiny_tokenizer, trajectories, 1, staleness=staleness)
    plain = OnlineDiagnostics(config(), 0).run(tiny_model, tiny_tokenizer, trajectories, 1)
    assert {k: v for k, v in out.items() if not k.startswith("async/")} == plain  # the whole batch's, unchanged

    def split(k: int, scheme: str = "first_turn") -> dict[str, float]:
        prefix = f"async/staleness_{k}/collapse_{scheme}/"
        return {key.removeprefix(prefix): v for key, v in out.items() if key.startswith(prefix)}

    fresh, stale = split(0), split(1)
    assert (fresh["num_pairs"], stale["num_pairs"]) == (3, 5)  # group 1 has one empty first reasoning
    assert fresh["num_inputs"] == stale["num_inputs"] == 3 and fresh["chance_level"] == pytest.approx(1 / 3)
    assert not any(key in part for part in (fresh, stale) for key in ("mi_zscore_ema", "marginal_std_ema"))
    whole = {key.removeprefix("collapse_first_turn/"): v for key, v in plain.items()}
    for key in ("retrieval_acc", "recall@2", "mi_est", "mi_seq_est", "cond_entropy", "reasoning_entropy"):
        assert (3 * fresh[key] + 5 * stale[key]) / 8 == pytest.approx(whole[key]), key

    prompts = [trajectories[3 * g].turns[0].prompt_ids for g in range(3)]
    pairs = [(reasoning_ids(t.turns[0]), t.group_id) for t in trajectories[3:] if reasoning_ids(t.turns[0])]
    logp = np.array([[score_matrix_naive(tiny_model, None, [p], [z])[0, 0] for p in prompts] for z, _ in pairs])
    expected = mi_metrics(logp, np.array([g for _, g in pairs]), lengths=np.array([len(z) for z, _ in pairs]),
                          input_ids=prompts)  # groups 1 and 2's reasonings against all three inputs
    for key in ("retrieval_acc", "mi_est", "mi_zscore", "marginal_std", "cond_entropy", "num_pairs"):
        assert stale[key] == pytest.approx(expected[key], abs=1e-4), key

    trajectory_pairs_drawn = sum(split(k, "trajectory")["num_pairs"] for k in (0, 1))
    assert trajectory_pairs_drawn == out["collapse_trajectory/num_pairs"]
    assert re.search(r"^\| `async/staleness_K/collapse_<scheme>/<metric>` \|", METRICS_DOC.read_text(), re.MULTILINE)
    # A staleness whose groups gave no first-turn reasoning logs its count, 0, and nothing else.
    silent = batch(empty_first=((1, 0), (1, 1), (1, 2)))
    out = OnlineDiagnostics(config(), 0).run(tiny_model, tiny_tokenizer, silent, 1, staleness={0: 0, 1: 2, 2: 0})
    assert {k: v for k, v in out.items() if k.startswith("async/staleness_2/collapse_first_turn/")} == {
        "async/staleness_2/collapse_first_turn/num_pairs": 0.0}
    assert out["async/staleness_0/collapse_first_turn/num_pairs"] == out["collapse_first_turn/num_pairs"] == 6


def test_roles_split_the_trajectory_pairs_by_the_calls_role(tiny_tokenizer, tiny_model, batch):
    """Agent calls carry a role: each role's trajectory pairs are scored against that role's inputs only, equal to
    mi_metrics of the naive scores restricted to them, and the roles' pairs add up to the whole scheme's."""
    trajectories = batch()
    for t in trajectories:
        t.turns[0].role, t.turns[1].role = "solver", "critic"
    out = OnlineDiagnostics(config(), 0).run(tiny_model, tiny_tokenizer, trajectories, 1)
    pairs = trajectory_pairs(trajectories, 12, np.random.default_rng([0, 1, 1]))  # the trajectory scheme's draw
    assert out["collapse_trajectory/num_pairs"] == len(pairs.reasonings)
    counts = {role: pairs.column_roles.count(role) for role in ("solver", "critic")}
    assert min(counts.values()) >= 2 and sum(counts.values()) == len(pairs.reasonings)
    for role, n in counts.items():
        assert out[f"collapse_role/{role}/num_pairs"] == out[f"collapse_role/{role}/num_inputs"] == n
        rows = [m for m, r in enumerate(pairs.column_roles) if r == role]  # each pair is its own column
        prompts = [pairs.prompts[m] for m in rows]
        logp = np.array([[score_matrix_naive(tiny_model, None, [p], [pairs.reasonings[m]])[0, 0] for p in prompts]
                         for m in rows])
        expected = mi_metrics(logp, np.arange(len(rows)), lengths=np.array([len(pairs.reasonings[m]) for m in rows]),
                              input_ids=prompts)
        for key in ("retrieval_acc", "mi_est", "mi_zscore", "cond_entropy", "chance_level"):
            if np.isfinite(expected[key]):
                assert out[f"collapse_role/{role}/{key}"] == pytest.approx(expected[key], abs=1e-4), (role, key)
    assert re.search(r"^\| `collapse_role/<role>/<metric>` \|", METRICS_DOC.read_text(), re.MULTILINE)
    plain = OnlineDiagnostics(config(), 0).run(tiny_model, tiny_tokenizer, batch(), 1)
    assert not any(key.startswith("collapse_role/") for key in plain)  # ragen2's own turns carry no role
    assert {k: v for k, v in out.items() if not k.startswith("collapse_role/")} == plain


def test_memory_notes_are_scored_against_the_histories_they_summarise(tiny_tokenizer, tiny_model, make_trajectory):
    """collapse_memory/: each note against the prompts of the drawn notes, equal to mi_metrics of the naive scores;
    the reasoning schemes draw from the acting turns only, as if the notes were not there."""
    notes = ["Dragon.", "", "Go left then up.", "The box is right of me."]  # the second is empty
    with_notes, without = [], []
    for g, prompt in enumerate(PROMPTS):
        for k in range(3):
            turns = [(prompt, REASONINGS[(g + k) % 4]), (prompt + f" Note {k}?", notes[(g + k) % 4]),
                     (prompt + f" Turn 2 of {k}.", REASONINGS[(g + 2 * k + 1) % 4])]
            t = make_trajectory(g, turns)
            t.turns[1].memory = True
            with_notes.append(t)
            without.append(make_trajectory(g, [turns[0], turns[2]]))
    out = OnlineDiagnostics(config(), 0).run(tiny_model, tiny_tokenizer, with_notes, 1)
    plain = OnlineDiagnostics(config(), 0).run(tiny_model, tiny_tokenizer, without, 1)
    assert {k: v for k, v in out.items() if not k.startswith("collapse_memory/")} == plain
    kept = [t.turns[1] for t in with_notes if t.turns[1].reasoning]
    assert out["collapse_memory/valid_thinking_rate"] == pytest.approx(len(kept) / 9)
    assert out["collapse_memory/num_pairs"] == out["collapse_memory/num_inputs"] == len(kept) == 7
    prompts = [turn.prompt_ids for turn in kept]
    logp = np.array([[score_matrix_naive(tiny_model, None, [p], [reasoning_ids(z)])[0, 0] for p in prompts]
                     for z in kept])
    expected = mi_metrics(logp, np.arange(len(kept)), lengths=np.array([len(reasoning_ids(z)) for z in kept]),
                          input_ids=prompts)
    for key in ("retrieval_acc", "mi_est", "mi_zscore", "mi_zscore_ema", "cond_entropy", "chance_level"):
        assert out[f"collapse_memory/{key}"] == pytest.approx(expected[key], abs=1e-4), key
    assert re.search(r"^\| `collapse_memory/retrieval_acc` \|", METRICS_DOC.read_text(), re.MULTILINE)
    assert ("MI proxies (memory notes)", ) == tuple(name for name, _ in summary_rows([{"step": 1, **out}])
                                                    if "memory" in name)
