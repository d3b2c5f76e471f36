"""Warm start: loadable, deterministic, cached atomically, trained on the rollout's own token layout."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from ragen2.agent import GenerationOutput, RolloutConfig, rollout
from ragen2.envs import make
from ragen2.errors import ConfigError
from ragen2.models import policy_store
from ragen2.models import warmstart as ws
from ragen2.models.demos import play_demo
from ragen2.models.tiny import TOOL_TAG_TOKENS, TOOLS_CHAT_TEMPLATE

# A model and data set small enough to build in a few seconds.
TINY = dict(
    episodes_per_env=6, steps=4, warmup_steps=2, vocab_size=400, hidden_size=32, num_layers=1,
    num_heads=2, num_kv_heads=1, intermediate_size=64, batch_tokens=2048,
)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> ws.Path:
    return ws.warmstart(tmp_path_factory.mktemp("ws") / "policy", seed=0, **TINY)


def weights(path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(path).state_dict()


def test_saved_policy_loads_with_auto_classes_and_has_a_chat_template(built):
    tokenizer = AutoTokenizer.from_pretrained(built)
    model = AutoModelForCausalLM.from_pretrained(built)
    assert tokenizer.chat_template
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n")
    for tag in ("<think>", "</think>", "<answer>", "</answer>"):
        assert len(tokenizer.encode(tag, add_special_tokens=False)) == 1
    assert model.config.vocab_size == len(tokenizer)
    info = json.loads((built / ws.INFO_FILE).read_text())
    assert info["key"] == ws.WarmStartConfig(seed=0, **TINY).key()
    assert info["settings"]["steps"] == TINY["steps"] and np.isfinite(info["sft_loss_final"])


def test_saved_tokenizer_encodes_exactly_like_the_one_the_warm_start_trained_with(built):
    config = ws.WarmStartConfig(seed=0, **TINY)
    demos = ws.make_demos(config, np.random.default_rng(config.seed))
    trained = ws.demo_tokenizer(demos, config.vocab_size)
    saved = AutoTokenizer.from_pretrained(built)
    for episode in demos:
        assert episode.conversation(saved).samples() == episode.conversation(trained).samples()
    assert saved.convert_ids_to_tokens(saved.encode("at (row 2, col 3);", add_special_tokens=False))[-2:] == [
        "(row 2, col 3)", ";"
    ]


def test_same_seed_gives_identical_weights_and_another_seed_does_not(built, tmp_path):
    again = weights(ws.warmstart(tmp_path / "again", seed=0, **TINY))
    other = weights(ws.warmstart(tmp_path / "other", seed=1, **TINY))
    first = weights(built)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first if other[k].shape == first[k].shape)


def test_second_call_reuses_the_directory_without_training(built, monkeypatch):
    model_file = built / "model.safetensors"
    mtime = model_file.stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("the warm start was rebuilt although it was cached")

    monkeypatch.setattr(ws, "_build", fail)
    assert ws.warmstart(built, seed=0, **TINY) == built
    assert model_file.stat().st_mtime_ns == mtime


def test_default_location_is_the_cache_keyed_by_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGEN2_CACHE", str(tmp_path))
    path = ws.warmstart(seed=0, **TINY)
    assert path == tmp_path / f"tiny-policy-{ws.WarmStartConfig(seed=0, **TINY).key()}"
    assert ws.WarmStartConfig(seed=0, **TINY).key() != ws.WarmStartConfig(seed=0, **{**TINY, "steps": 5}).key()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary directory left behind


def test_interrupted_warm_start_leaves_no_directory(tmp_path, monkeypatch):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ws, "sft", interrupt)
    with pytest.raises(KeyboardInterrupt):
        ws.warmstart(tmp_path / "policy", seed=0, **TINY)
    assert list(tmp_path.iterdir()) == []


def test_a_concurrent_build_that_finishes_first_is_kept(tmp_path, monkeypatch):
    out = tmp_path / "policy"
    build = ws._build

    def racing_build(config, tmp, device):
        build(config, tmp, device)
        out.mkdir()
        build(config, out, device)  # another process saves the same warm start meanwhile

    monkeypatch.setattr(ws, "_build", racing_build)
    assert ws.warmstart(out, seed=0, **TINY) == out
    assert [p.name for p in tmp_path.iterdir()] == ["policy"]
    assert json.loads((out / ws.INFO_FILE).read_text())["key"] == ws.WarmStartConfig(seed=0, **TINY).key()


def test_directory_with_other_content_is_refused_and_unknown_settings_name_the_fix(built, tmp_path):
    with pytest.raises(ConfigError, match="does not hold a warm start with these settings"):
        ws.warmstart(built, seed=0, **{**TINY, "steps": 5})
    with pytest.raises(ConfigError, match="Did you mean: steps"):
        ws.warmstart(tmp_path / "x", stpes=3)


def test_sft_loss_falls(tmp_path):
    path = ws.warmstart(tmp_path / "p", seed=0, **{**TINY, "steps": 20, "lr": 1e-2})
    info = json.loads((path / ws.INFO_FILE).read_text())
    assert info["sft_loss_final"] < 0.7 * info["sft_loss_initial"], info


def test_mixed_loss_with_shared_prefixes_equals_a_plain_forward_pass(built):
    """The prefix-cached loss over a batch split by environment (fast) against one padded forward
    over the same sequences (reference): same loss, same gradients."""
    config = ws.WarmStartConfig(seed=0, **TINY)
    tokenizer = AutoTokenizer.from_pretrained(built)
    model = AutoModelForCausalLM.from_pretrained(built)
    demos = ws.make_demos(config, np.random.default_rng(0))
    by_env = [[s for ep in demos if ep.env_name == name for s in ep.conversation(tokenizer).samples()] for name in config.envs]
    rng = np.random.default_rng(0)
    samples = [s for env_samples in by_env for s in env_samples]
    batches = ws._length_buckets(samples, 2048, rng)
    assert sorted(i for b in batches for i in b) == list(range(len(samples)))  # an epoch: every sample once
    assert all(len(b) == 1 or len(b) * max(len(samples[i][0]) for i in b) <= 2048 for b in batches)
    for k in range(3):  # a batch with a few sequences of several environments
        parts = [[s for s in env_samples[k::7]][:3] for env_samples in by_env]
        parts = [part for part in parts if part]
        model.zero_grad()
        fast = ws.mixed_loss(model, parts, tokenizer.pad_token_id)
        fast.backward()
        fast_grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        ids, mask, attention = ws._pad([s for part in parts for s in part], tokenizer.pad_token_id)
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
        scored = mask[:, 1:].bool()
        reference = F.cross_entropy(logits[scored], ids[:, 1:][scored])
        reference.backward()
        assert torch.allclose(fast, reference, atol=1e-5)
        for p, g in zip(model.parameters(), fast_grads):
            assert torch.allclose(p.grad, g, atol=1e-6)


class ScriptedBackend:
    """Answers each generate call with the next scripted response (one episode at a time), decoded as a real backend does."""

    def __init__(self, tokenizer, responses: list[list[int]]):
        self.tokenizer = tokenizer
        self.responses = list(responses)

    def generate(self, prompts, *, max_new_tokens, temperature, top_p):
        assert len(prompts) == 1
        ids = self.responses.pop(0)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return [GenerationOutput(token_ids=ids, text=text, finish_reason="stop")]


@pytest.mark.parametrize("env_name", ["sokoban", "frozenlake", "bandit"])
def test_demonstration_samples_equal_what_a_rollout_of_the_same_responses_stores(built, env_name):
    tokenizer = AutoTokenizer.from_pretrained(built)
    for seed in range(3):
        episode = play_demo(env_name, {}, seed, max_turns=5, max_actions_per_turn=2, rng=np.random.default_rng(seed))
        responses = [
            tokenizer.encode(t.response, add_special_tokens=False) + [tokenizer.eos_token_id] for t in episode.turns
        ]
        (traj,) = rollout(ScriptedBackend(tokenizer, responses), tokenizer, env_name, {}, [seed], [0], RolloutConfig())
        assert traj.success == episode.success and len(traj.turns) == len(episode.turns)
        assert traj.samples == episode.conversation(tokenizer).samples()


def test_the_two_built_in_warm_starts_cover_every_env_in_its_preset_turn_layout():
    """Default: the grid envs and Bandit; `tiny:countdown`: Countdown's own; `tiny:countdown,...`: the other four's."""
    from ragen2.config import load_config
    from ragen2.envs import names
    from ragen2.models.demos import ORACLES

    config = ws.WarmStartConfig()
    assert config.envs == ws.CORE_ENVS
    assert sorted(ws.CORE_ENVS + ws.TOOL_ENVS + ws.MEMORY_ENVS) == sorted(names())
    assert {cls for cls in ORACLES} >= {type(make(name, **config.env_kwargs.get(name, {}))) for name in names()}
    for name in names():
        expected_path = (
            None if name in ws.CORE_ENVS else f"tiny:{name}" if name in ("countdown", *ws.MEMORY_ENVS)
            else "tiny:" + ",".join(ws.TOOL_ENVS)
        )
        assert load_config(name).model.path == expected_path, name
        r = load_config(name).rollout
        assert config.env_turns[name] == (r.max_turns, r.max_actions_per_turn), name
        notes = (r.memory_budget, r.max_tokens_per_turn, r.context_turns or 1) if r.memory == "summary" else None
        assert config.env_memory.get(name) == notes, name
    # The corridor's turns and notes leave the keys of the warm starts without it as they were.
    assert ws.make_config(0, {}).key() == ws.make_config(0, {"env_memory": {}}).key() == "d10ad80ef562"
    no_corridor = {k: v for k, v in ws.DEFAULT_ENV_TURNS.items() if k != "corridor"}
    assert ws.make_config(0, {"envs": ("frozenlake",), "env_turns": no_corridor}).key() == "ea5387713e48"
    assert ws.make_config(0, {"envs": ("corridor",)}).key() != ws.make_config(
        0, {"envs": ("corridor",), "env_memory": {"corridor": (300, 32, 1)}}).key()


def test_policy_settings_apply_to_their_envs_and_give_way_to_explicit_settings(tmp_path):
    countdown = ws.make_config(0, {"envs": ("countdown",)})
    assert (countdown.num_layers, countdown.episodes_per_env) == (4, 12000)
    assert ws.make_config(0, {"envs": ("countdown",), "num_layers": 3}).num_layers == 3
    assert ws.make_config(0, {"envs": ("countdown", "math")}).num_layers == ws.WarmStartConfig().num_layers
    # the cache directory of `tiny:countdown` is named by the settings it is built with
    assert ws.cache_path(countdown, tmp_path).name == f"tiny-policy-{countdown.key()}"


def test_episode_shares_scale_each_env_and_keep_at_least_one_episode():
    config = ws.WarmStartConfig(
        envs=("bandit", "countdown"), episodes_per_env=10, episode_shares={"countdown": 0.01}, env_kwargs={}
    )
    demos = ws.make_demos(config, np.random.default_rng(0))
    assert [d.env_name for d in demos] == ["bandit"] * 10 + ["countdown"]
    with pytest.raises(ConfigError, match="episode_shares"):
        ws.WarmStartConfig(episode_shares={"math": 0})
    with pytest.raises(ConfigError, match="env_turns"):
        ws.WarmStartConfig(env_turns={"math": (0, 1)})


def test_command_line_settings_are_typed_like_their_fields_and_bad_ones_name_the_allowed_keys():
    assert ws.parse_settings(["hidden_size=512", "lr=1e-3", "steps=10"]) == {"hidden_size": 512, "lr": 0.001, "steps": 10}
    assert isinstance(ws.parse_settings(["lr=1"])["lr"], float)
    with pytest.raises(ConfigError, match="hidden_size"):  # a typo names the close key
        ws.parse_settings(["hiden_size=512"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        ws.parse_settings(["hidden_size"])
    with pytest.raises(ConfigError, match="not an integer"):
        ws.parse_settings(["num_layers=2.5"])


def test_cli_builds_a_policy_of_the_given_size_into_out(tmp_path):
    from ragen2.cli import main

    settings = [f"{k}={v}" for k, v in TINY.items()] + ["hidden_size=48"]
    assert main(["warmstart", "--out", str(tmp_path / "p"), "--device", "cpu", *settings]) == 0
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "p").config.hidden_size == 48
    assert main(["warmstart", "--out", str(tmp_path / "q"), "depth=3"]) == 2  # error message, no traceback


def test_the_default_warm_start_keeps_its_key():
    """Tool-calling variants are new entries of `envs`: the default policy's settings, hence its cache, are unchanged."""
    assert ws.WarmStartConfig().key() == "d10ad80ef562"


def test_the_default_runs_policy_is_the_frozenlake_learning_tests_warm_start():
    """tiny:frozenlake (the `default` preset's model) is the 700-step part-way warm start that
    tests/rl/test_learning.py trains from, so the seeds recorded for one stand for the other."""
    from ragen2.config import load_config

    assert load_config("default").model.path == "tiny:frozenlake"
    explicit = dict(envs=("frozenlake",), episodes_per_env=1000, steps=700, num_layers=2, batch_tokens=2048, lr=1e-2,
                    warmup_steps=50)
    assert ws.make_config(0, {"envs": ("frozenlake",)}) == ws.WarmStartConfig(**explicit)
    assert ws.make_config(0, {"envs": ("frozenlake",)}).key() == "ea5387713e48"


def test_the_default_runs_policy_ships_with_the_package_and_nothing_is_built(tmp_path, monkeypatch):
    """tiny:frozenlake loads the copy shipped in the package, the same weights on every CPU, with an empty cache."""
    from ragen2.models.loading import resolve_model_path

    monkeypatch.setenv("RAGEN2_CACHE", str(tmp_path))
    path = ws.Path(resolve_model_path("tiny:frozenlake"))
    assert path.parent == policy_store.SHIPPED_DIR
    assert list(tmp_path.iterdir()) == []
    info = json.loads((path / ws.INFO_FILE).read_text())
    assert info["key"] == ws.make_config(0, {"envs": ("frozenlake",)}).key() == "ea5387713e48"
    assert (path / "model.safetensors").stat().st_size < 2_000_000
    assert AutoModelForCausalLM.from_pretrained(path).num_parameters() == info["num_parameters"]
    assert ws.shipped_policy(ws.WarmStartConfig().key()) is None  # the others are built on first use


def test_compare_weights_is_zero_for_a_copy_and_the_largest_difference_otherwise(built, tmp_path):
    from safetensors.torch import load_file, save_file

    assert policy_store.compare_weights(built, built) == 0.0
    tensors = load_file(built / "model.safetensors")
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[3] += 0.25
    (tmp_path / "other").mkdir()
    save_file(tensors, tmp_path / "other" / "model.safetensors")
    assert policy_store.compare_weights(built, tmp_path / "other") == pytest.approx(0.25)


def test_warmstart_cli_says_whether_a_rebuild_of_a_shipped_policy_is_bit_for_bit_the_same(built, tmp_path,
                                                                                          monkeypatch, capsys):
    from ragen2.cli import main

    shipped = tmp_path / "shipped"
    shipped.mkdir()
    shutil.copytree(built, shipped / "policy")
    monkeypatch.setattr(policy_store, "SHIPPED_DIR", shipped)
    settings = [f"{k}={v}" for k, v in TINY.items()]
    assert main(["warmstart", "--out", str(tmp_path / "rebuilt"), *settings]) == 0
    out = capsys.readouterr().out
    assert "the same weights, bit for bit" in out and f"model.path={tmp_path / 'rebuilt'}" in out
    assert main(["warmstart", "--out", str(tmp_path / "other"), *settings, "lr=0.02"]) == 0
    assert "shipped" not in capsys.readouterr().out  # other settings: no shipped copy to compare with


def test_tool_demonstration_samples_equal_what_a_tool_calling_rollout_of_the_same_responses_stores():
    config = ws.WarmStartConfig(envs=("searchqa+tools", "code+tools", "webshop+tools"), episodes_per_env=40,
                                vocab_size=600)
    demos = ws.make_demos(config, np.random.default_rng(0))
    tokenizer = ws.demo_tokenizer(demos, config.vocab_size)
    assert tokenizer.chat_template == TOOLS_CHAT_TEMPLATE
    for tag in TOOL_TAG_TOKENS:
        assert len(tokenizer.encode(tag, add_special_tokens=False)) == 1
    assert {ep.env_name for ep in demos} == {"searchqa", "code", "webshop"}
    for episode in demos:
        responses = [
            tokenizer.encode(t.response, add_special_tokens=False) + [tokenizer.eos_token_id] for t in episode.turns
        ]
        max_turns, max_actions = config.env_turns[episode.env_name]
        cfg = RolloutConfig(tool_calls=True, max_turns=max_turns, max_actions_per_turn=max_actions)
        (traj,) = rollout(ScriptedBackend(tokenizer, responses), tokenizer, episode.env_name, {}, [episode.seed], [0], cfg)
        assert traj.success == episode.success and all(turn.format_valid for turn in traj.turns)
        assert traj.samples == episode.conversation(tokenizer).samples()


def test_tiny_tool_variants_exist_only_for_environments_with_tools():
    from ragen2.models.loading import resolve_model_path

    toolless = "sokoban\\+tools has no tools to demonstrate; ENV\\+tools exists for code, searchqa, webshop"
    with pytest.raises(ConfigError, match=toolless):
        resolve_model_path("tiny:searchqa+tools,sokoban+tools")
    with pytest.raises(ConfigError, match="unknown environment"):
        resolve_model_path("tiny:serchqa+tools")


def test_validation_seeds_are_neither_training_nor_held_out_seeds():
    from ragen2.envs import EVAL_SEED_OFFSET, eval_seeds, validation_seeds

    seeds = validation_seeds(500)
    assert len(set(seeds)) == 500 and min(seeds) >= EVAL_SEED_OFFSET  # above every training seed
    assert not set(seeds) & set(eval_seeds(100_000))


def test_the_stop_ends_fine_tuning_at_a_check_and_its_settings_key_only_a_stopping_warm_start():
    config = ws.WarmStartConfig(seed=0, **(TINY | {"steps": 9}), check_every=2)
    demos = ws.make_demos(config, np.random.default_rng(0))
    tokenizer = ws.demo_tokenizer(demos, config.vocab_size)
    samples, env_of_sample = ws.demo_samples(demos, tokenizer, config.envs)
    model = ws.build_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    asked: list[int] = []
    losses = ws.sft(model, tokenizer, samples, env_of_sample, config, np.random.default_rng(0),
                    stop=lambda step: asked.append(step) or step >= 6)
    assert asked == [2, 4, 6] and len(losses) == 6
    assert ws.WarmStartConfig(check_every=7).key() == ws.WarmStartConfig().key()  # no stop: checks change nothing
    assert ws.WarmStartConfig(stop_at_success=0.4).key() != ws.WarmStartConfig(stop_at_success=0.5).key()
    with pytest.raises(ConfigError, match="stop_at_success=1.5"):
        ws.WarmStartConfig(stop_at_success=1.5)
    assert ws.parse_settings(["stop_at_success=0.4", "check_every=25"]) == {"stop_at_success": 0.4, "check_every": 25}
    from ragen2.models.base_warmstart import make_base_config

    with pytest.raises(ConfigError, match="stop_at_success stops the tiny policy's warm start only"):
        make_base_config("smollm2-135m", stop_at_success=0.4)


def test_a_stopping_warm_start_records_its_checks_and_the_check_leaves_the_random_state_alone(tmp_path):
    settings = TINY | {"envs": ("frozenlake",), "steps": 4, "check_every": 2, "check_episodes": 6}
    out = ws.warmstart(tmp_path / "p", seed=0, stop_at_success=1.0, **settings)  # out of reach: every step runs
    info = json.loads((out / ws.INFO_FILE).read_text())
    assert info["steps_trained"] == 4 and [c["step"] for c in info["validation_checks"]] == [2, 4]
    config = ws.WarmStartConfig(seed=0, stop_at_success=1.0, **settings)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    state = torch.get_rng_state()
    success = ws.validation_success(model, tokenizer, config)
    assert torch.equal(state, torch.get_rng_state()) and not model.training
    assert success == ws.validation_success(model, tokenizer, config) == info["validation_checks"][-1]["success"]


def test_the_novice_share_keys_its_warm_start_and_must_be_a_probability():
    assert ws.WarmStartConfig(sokoban_novice=0.0).key() == "d10ad80ef562"
    assert ws.WarmStartConfig(sokoban_novice=0.5).key() != ws.WarmStartConfig(sokoban_novice=0.3).key()
    with pytest.raises(ConfigError, match="sokoban_novice=1.5"):
        ws.WarmStartConfig(sokoban_novice=1.5)


def test_a_cpu_warm_start_gives_the_same_weights_on_any_thread_count(tmp_path):
    """It trains on one thread, whatever the caller's count, which it gets back: equal keys, equal weights."""
    from safetensors.torch import load_file

    threads = torch.get_num_threads()
    weights = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            out = ws.warmstart(tmp_path / f"threads-{n}", **(TINY | {"hidden_size": 64, "steps": 8}))
            assert torch.get_num_threads() == n
            weights.append(load_file(out / "model.safetensors"))
    finally:
        torch.set_num_threads(threads)
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
