"""Config: presets, overrides, strict validation with helpful messages, generated docs."""

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from ragen2.config import Config, check_sizes, config_from_file, config_markdown, load_config, preset_names, save_config
from ragen2.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_are_the_builtin_sokoban_run():
    c = load_config()
    assert c.env.name == "sokoban" and c.model.path is None and c.filter.strategy == "top_p"


def test_env_algo_preset_layers_and_overrides():
    c = load_config("frozenlake-ppo", ["algo.clip_high=0", "rollout.context_turns=null", "optim.lr=3e-5"])
    assert c.env.name == "frozenlake" and c.env.kwargs["size"] == 4
    assert c.algo.name == "ppo"
    assert c.algo.clip_high == 0.0 and isinstance(c.algo.clip_high, float)  # `0` is a valid float
    assert c.rollout.context_turns is None
    assert c.optim.lr == pytest.approx(3e-5)


def test_every_preset_loads():
    for name in preset_names():
        assert isinstance(load_config(name), Config)


def test_env_shorthand():
    assert load_config(None, ["env=bandit"]).env.name == "bandit"


@pytest.mark.parametrize(
    "override, message",
    [
        ("algo.clip_hgh=0.3", "unknown config key 'algo.clip_hgh'. Did you mean: algo.clip_high"),
        ("trainr.total_steps=5", "unknown config key 'trainr.total_steps'. Did you mean: trainer.total_steps"),
        ("algo.name=pppo", "allowed values: 'ppo', 'grpo'"),
        ("optim.lr=fast", "optim.lr='fast' must be a number"),
        ("rollout.group_size=1", "needs rollout.group_size >= 2"),
        ("env.name=frozen", "Did you mean: frozenlake"),
        ("env.name=sokobn", "or a suite's game (textarena:GAME, textworld:GAME, gym:GAME"),
        ("env.kwargs.sze=3", "env.kwargs for 'sokoban'"),
        ("trainer.total_steps=0", "trainer.total_steps=0 must be at least 1"),
        ("rollout.max_turns=0", "rollout.max_turns=0 is not allowed: use an integer >= 1"),
        ("logging.tensorboard=maybe", "must be true or false"),
        ("algo.clip_high", "must look like key=value"),
    ],
)
def test_bad_config_names_key_and_fix(override, message):
    with pytest.raises(ConfigError, match=None) as err:
        load_config(None, [override])
    assert message in str(err.value)


def test_unknown_preset_lists_presets():
    with pytest.raises(ConfigError, match="unknown preset 'sokobann'.*Did you mean: sokoban"):
        load_config("sokobann")


def test_saved_config_round_trips(tmp_path):
    c = load_config("bandit-rloo", ["trainer.seed=7"])
    save_config(c, tmp_path / "config.yaml")
    assert config_from_file(tmp_path / "config.yaml") == c


def test_config_doc_is_current():
    assert (ROOT / "docs" / "config.md").read_text() == config_markdown(), (
        "docs/config.md is stale: run `python -m ragen2.config > docs/config.md`"
    )


def test_python_m_ragen2_config_prints_the_doc(capsys):
    runpy.run_module("ragen2.config", run_name="__main__")
    assert capsys.readouterr().out == config_markdown()


def test_config_does_not_import_the_mixture_module():
    # ragen2.mixture builds on the config package (ragen2.config.tagged_envs); the reverse would be a circle.
    code = ("import sys; from ragen2.config import load_config; "
            "load_config(None, ['env.mixture=[{name: bandit}, {name: sokoban}]', 'env.eval=[{tag: bandit}]']); "
            "assert 'ragen2.mixture' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_env_algo_filter_presets_layer_in_order():
    c = load_config("sokoban-ppo-nofilter")
    assert (c.env.name, c.algo.name, c.filter.strategy, c.filter.include_zero) == ("sokoban", "ppo", "none", True)
    paper = load_config("frozenlake-grpo-paper", ["filter.value=0.5"])  # overrides still win
    assert (paper.filter.strategy, paper.filter.value, paper.filter.include_zero) == ("top_p", 0.5, False)
    assert "sokoban-ppo-nofilter" in preset_names() and "sokoban-nofilter" not in preset_names()
    with pytest.raises(ConfigError, match="unknown preset 'sokoban-ppo-nofiltr'.*Did you mean: sokoban-ppo-nofilter"):
        load_config("sokoban-ppo-nofiltr")


def test_removed_filter_eps_says_what_replaces_it():
    with pytest.raises(ConfigError, match=r"'filter.eps' no longer exists.*filter.zero_tol.*eps=0.01 is zero_tol=0.1.*"
                                          r"filter.selection_eps"):
        load_config(None, ["filter.eps=0.01"])
    c = load_config(None, ["filter.zero_tol=0.1", "filter.selection_eps=0"])
    assert (c.filter.zero_tol, c.filter.selection_eps) == (0.1, 0.0)
    with pytest.raises(ConfigError, match=r"filter.selection_eps=-1.0 is not allowed: use a number >= 0"):
        load_config(None, ["filter.selection_eps=-1"])


def test_sizes_that_cannot_fit_are_refused_before_anything_runs():
    gib = 2**30
    config = load_config(None, ["rollout.num_groups=4", "rollout.group_size=8", "rollout.max_turns=5",
                                "rollout.max_tokens_per_turn=100", "trainer.eval_every=0"])
    check_sizes(config, memory_bytes=gib)  # 32 x 5 x 100 tokens x 8 bytes: 128 kB
    with pytest.raises(ConfigError, match=r"rollout.num_groups x rollout.group_size = 8,000,000,000 episodes a step"):
        load_config(None, ["rollout.group_size=1000000000"])  # 28,610 GiB: more than any machine here
    # 2**20 episodes of 5 x 96 tokens at 8 bytes: 3.75 GiB, over 2 GiB and under 8 GiB
    held_out = load_config(None, ["trainer.eval_episodes=1048576", "rollout.max_tokens_per_turn=96"])
    with pytest.raises(ConfigError, match=r"trainer.eval_episodes = 1,048,576 episodes an evaluation.*at least 4 GiB"):
        check_sizes(held_out, memory_bytes=2 * gib)
    check_sizes(held_out, memory_bytes=8 * gib)


@pytest.mark.parametrize("steps", ["1000000000000", "1e12", "10**12"])
def test_absurd_step_counts_are_refused_however_written(steps):
    with pytest.raises(ConfigError, match="trainer.total_steps"):
        load_config(None, [f"trainer.total_steps={steps}"])
