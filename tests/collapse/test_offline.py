"""Offline diagnostics: reading rollout records and TRL completion logs, bad lines, pair selection,
prompt rendering, scoring a file with a tiny model, and the heatmap."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from ragen2.collapse import score_matrix_naive
from ragen2.collapse.heatmap import column_zscores, draw_heatmap, heatmap_figure
from ragen2.collapse.offline import diagnose, pairs_to_tell_from_chance, reading, render_prompt, select_pairs
from ragen2.collapse.rollout_files import Record, read_rollouts, split_completion
from ragen2.errors import RolloutFormatError

pytestmark = pytest.mark.usefixtures("one_thread")


def write_jsonl(path, rows) -> str:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


def episode(group, episode, prompt, reasonings, **extra):
    return [{"group": group, "prompt": f"{prompt} turn {t}<think>", "reasoning": z, "reward": 0.5,
             "episode": episode, "turn": t, **extra} for t, z in enumerate(reasonings)]


# ----------------------------------------------------------------------------- records


def test_reads_ragen2_rollout_records(tmp_path):
    rows = episode(7, 0, "Room A", ["left", "up"], response="left</think><answer>Left</answer>")
    rows += episode(7, 1, "Room A", ["right"]) + episode("b", 2, "Room B", ["down", "", "up"])
    f = read_rollouts(write_jsonl(tmp_path / "step_10.jsonl", rows))
    assert f.format == "records" and f.unit == "line" and f.skipped == [] and f.notes == []
    assert len(f.records) == 6
    r = f.records[0]
    assert (r.line, r.group, r.prompt, r.reasoning, r.reward, r.episode, r.turn, r.prefix) == (
        1, 7, "Room A turn 0<think>", "left", 0.5, 0, 0, None)
    assert read_rollouts(tmp_path / "step_10.jsonl", format="ragen2").records == f.records


def test_first_turn_columns_are_groups_and_first_turns_follow_turn_numbers(tmp_path):
    rows = episode(0, 0, "Room A", ["a0", "a1"]) + episode(0, 1, "Room A", ["b0", "b1"])
    rows += episode(1, 0, "Room B", ["", "c1"]) + episode(1, 1, "Room B", ["d0"])
    rows = rows[::-1]  # file order must not matter: the first turn is the smallest `turn`
    records = read_rollouts(write_jsonl(tmp_path / "r.jsonl", rows)).records
    sel = select_pairs(records, "first_turn", 64, np.random.default_rng(0))
    assert [records[i].prompt for i in sel.columns] == ["Room B turn 0<think>", "Room A turn 0<think>"]
    assert sorted(records[i].reasoning for i in sel.pairs) == ["a0", "b0", "d0"]
    assert {records[i].reasoning: records[sel.columns[j]].group for i, j in zip(sel.pairs, sel.source)} == {
        "a0": 0, "b0": 0, "d0": 1}
    assert (sel.considered, sel.empty, sel.valid_thinking_rate) == (4, 1, 0.75)


def test_trajectory_and_pairs_schemes_give_every_pair_its_own_column(tmp_path):
    rows = episode(0, 0, "A", ["a0", "a1", "a2"]) + episode(1, 0, "B", ["b0"]) + [
        {"group": 2, "prompt": "C<think>", "reasoning": "c"}]  # no episode: a one-turn episode
    records = read_rollouts(write_jsonl(tmp_path / "r.jsonl", rows)).records
    traj = select_pairs(records, "trajectory", 30, np.random.default_rng(1))
    assert traj.columns == traj.pairs and traj.source == list(range(30)) and traj.considered == 30
    # Episodes are drawn uniformly, then a turn: the lone "c" record is drawn about 1/3 of the time,
    # each turn of the three-turn episode about 1/9.
    counts = {z: sum(records[i].reasoning == z for i in traj.pairs) for z in ("a0", "a1", "a2", "b0", "c")}
    assert counts["c"] > counts["a0"] and counts["b0"] > counts["a2"]
    pairs = select_pairs(records, "pairs", 64, np.random.default_rng(0))
    assert sorted(pairs.pairs) == list(range(5)) and pairs.columns == pairs.pairs
    assert len(select_pairs(records, "pairs", 2, np.random.default_rng(0)).pairs) == 2


def test_bad_lines_are_skipped_and_reported_with_their_numbers(tmp_path):
    good = {"group": 0, "prompt": "A<think>", "reasoning": "go"}
    rows = [
        good,
        '{"group": 0, "prompt": "A", "reasoning": "x"',  # 2: cut off
        {"group": 0, "prompt": "A"},  # 3
        "",  # blank lines are not records
        {"group": 1.5, "prompt": "A", "reasoning": "x"},  # 5
        {"group": 0, "prompt": [{"content": "hi"}], "reasoning": "x"},  # 6
        {"group": 0, "prompt": "A", "reasoning": 3},  # 7
        {"group": 0, "prompt": "A", "reasoning": "x", "turn": -1},  # 8
        [1, 2],  # 9
        {"group": 1, "prompt": [{"role": "user", "content": "B"}], "reasoning": "go"},
    ]
    f = read_rollouts(write_jsonl(tmp_path / "r.jsonl", rows))
    assert [r.line for r in f.records] == [1, 10]
    assert f.skipped == [
        (2, "not valid JSON (Expecting ',' delimiter at column 45)"),
        (3, "missing 'reasoning' (a record needs group, prompt and reasoning)"),
        (5, "'group' must be an int or a string, got 1.5"),
        (6, "'prompt'[0] must be a chat message {'role': ..., 'content': ...}, got {'content': 'hi'}"),
        (7, "'reasoning' must be a string, got 3"),
        (8, "'turn' must be an integer >= 0 or null, got -1"),
        (9, "expected a JSON object, got list"),
    ]


def test_a_file_without_a_usable_line_raises_with_the_first_problems(tmp_path):
    rows = [{"prompt": "A"}, "not json", {"group": 0, "prompt": "", "reasoning": ""}]
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(RolloutFormatError) as err:
        read_rollouts(path)
    message = str(err.value)
    assert "no usable record (records format) in 3 lines" in message
    assert "line 1: missing 'group', 'reasoning'" in message
    assert "line 2: not valid JSON" in message and "line 3: 'prompt' is empty" in message
    with pytest.raises(RolloutFormatError, match="no such file"):
        read_rollouts(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(RolloutFormatError, match="holds no records"):
        read_rollouts(tmp_path / "empty.jsonl")


# ----------------------------------------------------------------------------- TRL


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>\nI see a box.\n</think>\n<answer>Up</answer>", ("<think>", "I see a box.", True)),
        ("Let me see. <think>plan</think>done", ("Let me see. <think>", "plan", True)),
        ("plan first</think>answer", ("", "plan first", True)),  # the template opened <think>
        ("<think>cut off mid-thought", ("<think>", "cut off mid-thought", True)),
        ("The answer is 4.", ("", "The answer is 4.", False)),
    ],
)
def test_split_completion(text, expected):
    assert split_completion(text) == expected


def test_trl_jsonl_groups_identical_prompts_and_keeps_the_last_step(tmp_path):
    rows = [
        {"step": 10, "prompt": "Q1", "completion": "<think>old</think>1", "reward": 1.0, "advantage": 0.1},
        {"step": 20, "prompt": "Q1", "completion": "<think>one</think>1", "reward": 1.0, "advantage": 0.5},
        {"step": 20, "prompt": "Q2", "completion": "<think>two</think>2", "reward": 0.0, "advantage": -0.5},
        {"step": 20, "prompt": "Q1", "completion": "just 1", "reward": 0.0, "advantage": -0.5},
        {"step": 20, "prompt": "Q2"},
    ]
    f = read_rollouts(write_jsonl(tmp_path / "completions.jsonl", rows))
    assert f.format == "trl"
    assert [(r.line, r.group, r.prompt, r.prefix, r.reasoning, r.reward) for r in f.records] == [
        (2, 0, "Q1", "<think>", "one", 1.0),
        (3, 1, "Q2", "<think>", "two", 0.0),
        (4, 0, "Q1", "", "just 1", 0.0),
    ]
    assert f.skipped == [(5, "a TRL completion row needs 'prompt' and 'completion'")]
    assert f.notes == [
        "the file logs 2 training steps (10..20); diagnosed the last, step 20 (3 completions)",
        "1 of 3 completions have no <think>...</think>: their whole text is used as the reasoning",
    ]
    sel = select_pairs(f.records, "first_turn", 64, np.random.default_rng(0))
    assert len(sel.columns) == 3  # Q1 with "<think>", Q2, Q1 without: the untagged input differs


def test_trl_parquet_and_wandb_table_with_chat_messages(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    chat = [{"role": "user", "content": "Which arm?"}]
    table = {
        "step": [5, 5],
        "prompt": [chat, chat],
        "completion": [
            [{"role": "assistant", "content": "<think>Dragon pays more.</think>Dragon"}],
            [{"role": "assistant", "content": "Turtle", "reasoning_content": "Turtle is safe."}],
        ],
        "accuracy_reward": [1.0, 0.0],
        "advantage": [0.7, -0.7],
    }
    pq.write_table(pa.table(table), tmp_path / "completions_00005.parquet")
    from_parquet = read_rollouts(tmp_path / "completions_00005.parquet")
    assert from_parquet.format == "trl" and from_parquet.unit == "row"
    assert [(r.line, r.group, r.reasoning, r.prefix) for r in from_parquet.records] == [
        (1, 0, "Dragon pays more.", "<think>"), (2, 0, "Turtle is safe.", "<think>")]
    assert from_parquet.records[0].prompt == chat

    columns = list(table)
    wandb = {"_type": "table", "columns": columns, "data": [[table[c][i] for c in columns] for i in range(2)]}
    (tmp_path / "completions.table.json").write_text(json.dumps(wandb))
    assert read_rollouts(tmp_path / "completions.table.json").records == from_parquet.records


# ----------------------------------------------------------------------------- rendering and scoring


def test_render_prompt(tiny_tokenizer):
    chat = [{"role": "user", "content": "Which arm?"}]
    assert render_prompt(Record(1, 0, "Room A<think>", "x"), tiny_tokenizer) == "Room A<think>"
    assert render_prompt(Record(1, 0, "Q1", "x", prefix="<think>"), tiny_tokenizer) == "Q1<think>"
    rendered = "<|im_start|>user\nWhich arm?<|im_end|>\n<|im_start|>assistant\n"
    assert render_prompt(Record(1, 0, chat, "x"), tiny_tokenizer) == rendered + "<think>"
    assert render_prompt(Record(1, 0, chat, "x", prefix=""), tiny_tokenizer) == rendered


def test_render_prompt_respects_templates_that_open_the_reasoning(tiny_tokenizer):
    r1 = copy.deepcopy(tiny_tokenizer)  # DeepSeek-R1 style: the generation prompt ends with <think>
    r1.chat_template = tiny_tokenizer.chat_template.replace("assistant\n' }}", "assistant\n<think>\n' }}")
    assert r1.chat_template != tiny_tokenizer.chat_template
    text = render_prompt(Record(1, 0, [{"role": "user", "content": "Hi"}], "x"), r1)
    assert text.endswith("assistant\n<think>\n") and text.count("<think>") == 1
    r1.chat_template = None
    with pytest.raises(RolloutFormatError, match="line 4: the prompt is a list of chat messages, but"):
        render_prompt(Record(4, 0, [{"role": "user", "content": "Hi"}], "x"), r1)


def test_diagnose_scores_the_file_and_counts_empty_reasoning(tmp_path, tiny_tokenizer, tiny_model):
    rows = []
    for g, room in enumerate(["Room A", "Room B", "Room C"]):
        for k in range(3):
            rows += episode(g, 10 * g + k, room, ["" if (g, k) == (2, 0) else f"go {['left', 'up', 'down'][k]}"])
    rows.append("{broken")
    f = read_rollouts(write_jsonl(tmp_path / "r.jsonl", rows))
    result = diagnose(f, tiny_model, tiny_tokenizer, scheme="first_turn", micro_batch_size=4)
    m = result.metrics
    assert (m["num_pairs"], m["num_inputs"], m["num_distinct_inputs"]) == (8, 3, 3)
    assert m["valid_thinking_rate"] == pytest.approx(8 / 9) and result.selection.empty == 1
    assert result.column_labels == ["0", "1", "2"] and result.logp.shape == (8, 3)
    # The matrix is the definition: log p(reasoning tokens | rendered prompt tokens).
    m0, j = 0, 2
    record = f.records[result.selection.pairs[m0]]
    prompt = tiny_tokenizer("Room C turn 0<think>", add_special_tokens=False)["input_ids"]
    z = tiny_tokenizer(record.reasoning, add_special_tokens=False)["input_ids"]
    assert result.logp[m0, j] == pytest.approx(score_matrix_naive(tiny_model, None, [prompt], [z])[0, 0], abs=1e-4)
    assert result.lengths[m0] == len(z)


def test_trl_log_of_the_same_completions_gives_the_same_proxies(tmp_path, tiny_tokenizer, tiny_model):
    """Invariance: one batch written as records and as a TRL completion log diagnoses identically."""
    rooms = ["Room A: box right.", "Room B: box left.", "Room C: no box."]
    plans = ["push right", "go left then up", "wait here", "push it down"]
    records, trl = [], []
    for g, room in enumerate(rooms):
        for k in range(3):
            plan = plans[(g + k) % len(plans)]
            records.append({"group": f"seed-{g}", "prompt": room + "<think>", "reasoning": plan})
            trl.append({"step": 3, "prompt": room, "completion": f"<think>{plan}</think><answer>Up</answer>"})
    a = diagnose(read_rollouts(write_jsonl(tmp_path / "records.jsonl", records)), tiny_model, tiny_tokenizer)
    b = diagnose(read_rollouts(write_jsonl(tmp_path / "trl.jsonl", trl)), tiny_model, tiny_tokenizer)
    assert b.metrics == pytest.approx(a.metrics, abs=1e-9)
    assert a.metrics["num_inputs"] == 3 and a.metrics["num_pairs"] == 9


def test_diagnose_refuses_a_file_with_only_empty_reasoning(tmp_path, tiny_tokenizer, tiny_model):
    f = read_rollouts(write_jsonl(tmp_path / "r.jsonl", episode(0, 0, "A", ["", " "])))
    with pytest.raises(RolloutFormatError, match="all 1 first_turn turns have empty reasoning"):
        diagnose(f, tiny_model, tiny_tokenizer)


# ----------------------------------------------------------------------------- heatmap


def test_column_zscores():
    logp = np.array([[-2.0, -4.0, -6.0], [-3.0, -3.0, -3.0]])  # second reasoning: every input alike
    z = column_zscores(logp, np.array([2, 5]))
    np.testing.assert_allclose(z[0], [np.sqrt(1.5), 0.0, -np.sqrt(1.5)])
    np.testing.assert_array_equal(z[1], [0.0, 0.0, 0.0])


def test_heatmap_png(tmp_path):
    rng = np.random.default_rng(0)
    source = np.repeat(np.arange(4), 3)[::-1].copy()
    logp = rng.normal(-20, 1, size=(12, 4))
    logp[np.arange(12), source] += 5
    path = draw_heatmap(logp, source, np.full(12, 10), tmp_path / "h.png", input_labels=list("abcd"), title="t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_heatmap_ticks_are_whole_items():
    """Rows are inputs and columns reasonings: with 2 inputs and 3 reasonings every tick in view is an
    index (0, 1, 2), never −0.5 or 0.5, on both axes."""
    logp = np.random.default_rng(0).normal(-20, 1, size=(3, 2))
    ax = heatmap_figure(logp, np.array([0, 0, 1]), np.full(3, 10)).axes[0]
    for ticks, limits in ((ax.get_xticks(), ax.get_xlim()), (ax.get_yticks(), ax.get_ylim())):
        shown = [t for t in ticks if min(limits) <= t <= max(limits)]
        assert shown and all(float(t).is_integer() for t in shown), shown


def test_reading_never_calls_missing_or_too_few_pairs_chance():
    nan = float("nan")
    base = {"chance_level": 0.5, "num_inputs": 2.0, "num_distinct_inputs": 2.0}
    one = reading({**base, "retrieval_acc": nan, "num_pairs": 1.0})
    assert one.startswith("the proxies cannot be computed from 1 pair:") and "at least 2" in one
    single = reading({**base, "retrieval_acc": nan, "chance_level": 1.0, "num_pairs": 2.0, "num_distinct_inputs": 1.0})
    assert single.startswith("the proxies cannot be computed from 2 pairs:") and "distinct inputs" in single
    # 2 of 2 hits at chance 1/2: 2 s.e. = 2 sqrt(.25 / 2) = 0.71, so even 1.0 is within the noise.
    few = reading({**base, "retrieval_acc": 1.0, "num_pairs": 2.0})
    assert "too few to tell Retrieval-Acc 1.000 from chance 0.500" in few and "at least 5 pairs" in few
    assert "within sampling noise of chance" not in one + single + few
    assert reading({**base, "retrieval_acc": 0.5, "num_pairs": 64.0}).startswith("Retrieval-Acc is within sampling")
    # Smallest M with 1 > c + 2 sqrt(c (1 - c) / M): M > 4c / (1 - c).
    assert [pairs_to_tell_from_chance(c) for c in (1 / 2, 1 / 3, 1 / 8)] == [5, 3, 2]


def test_memory_notes_of_another_frameworks_dump_are_their_own_scheme(tmp_path, tiny_tokenizer, tiny_model):
    """A dump that marks memory segments (`"memory": true`, chat-message prompts): --scheme memory scores the notes,
    each after its history rendered and opened with <memory>, and the other schemes leave the notes out."""
    rows = []
    for g, room in enumerate(["Room A", "Room B", "Room C"]):
        history = [{"role": "user", "content": f"{room}: the key is at {g}."}]
        rows += episode(g, g, room, ["go left", "go up"])
        rows.append({"group": g, "episode": g, "turn": 2, "memory": True, "reasoning": f"key at {g}" if g else "",
                     "prompt": history + [{"role": "user", "content": "Write a note."}]})
    rows.append({"group": 9, "prompt": "x", "reasoning": "y", "memory": "yes"})
    f = read_rollouts(write_jsonl(tmp_path / "dump.jsonl", rows))
    assert [r.memory for r in f.records].count(True) == 3 and f.skipped[0][0] == 10
    assert "'memory' must be true, false or null" in f.skipped[0][1]
    memory = select_pairs(f.records, "memory", 64, np.random.default_rng(0))
    assert sorted(memory.pairs) == [5, 8] and (memory.considered, memory.empty) == (3, 1)  # room A's note is empty
    for scheme in ("first_turn", "trajectory", "pairs"):
        chosen = select_pairs(f.records, scheme, 64, np.random.default_rng(0))
        assert not any(f.records[i].memory for i in chosen.pairs + chosen.columns), scheme
    assert render_prompt(f.records[5], tiny_tokenizer).endswith("<|im_start|>assistant\n<memory>")
    m = diagnose(f, tiny_model, tiny_tokenizer, scheme="memory", micro_batch_size=4).metrics
    assert (m["num_pairs"], m["num_inputs"]) == (2, 2) and m["valid_thinking_rate"] == pytest.approx(2 / 3)


def test_ragen2_records_mark_their_notes(tmp_path, tiny_tokenizer, make_trajectory):
    from ragen2.evaluate import write_rollout_records

    t = make_trajectory(0, [("Room A", "go left"), ("Room A note", "key at 0"), ("Room A turn 2", "go up")])
    t.turns[1].memory = True
    write_rollout_records(tmp_path / "r.jsonl", [t], tiny_tokenizer)
    assert [r.memory for r in read_rollouts(tmp_path / "r.jsonl").records] == [False, True, False]
