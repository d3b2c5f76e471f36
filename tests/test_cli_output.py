"""What `ragen2 train` prints: a short header, the run's own events, no library noise."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import ragen2

REPO = Path(ragen2.__file__).resolve().parents[1]


def test_train_prints_a_short_header_its_skipped_steps_and_no_library_noise(tmp_path, save_random_policy):
    policy = tmp_path / "policy"
    save_random_policy(policy)
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "ragen2", "train", "bandit-ppo", f"model.path={policy}", "model.device=cpu",
        f"trainer.run_dir={run_dir}", "rollout.num_groups=2", "rollout.group_size=2",
        "rollout.max_tokens_per_turn=8", "trainer.total_steps=2", "trainer.save_every=1", "trainer.eval_every=0",
        "logging.tensorboard=false",
        "filter.value=0", "filter.include_zero=true",  # top_p 0 keeps no group: every step is skipped
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    done = subprocess.run(command, cwd=tmp_path, env=env | {"PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    err = done.stderr
    header = [line for line in err.splitlines() if f"run {run_dir}:" in line]
    assert len(header) == 1 and "bandit, ppo, filter top_p 0; model " in header[0]
    assert "2 steps of 2 groups x 2 episodes" in header[0]
    assert f"config: {run_dir / 'config.yaml'}" in err
    for step in (1, 2):  # printed as they happen, not only written to events.jsonl
        assert f"step {step} skipped: no group kept" in err
    # The resolved config (about 100 lines), the critic head's load report and shard-writing bars stay hidden.
    for noise in ("resolved config", "LOAD REPORT", "Loading weights", "Writing model shards", "trainer:\n"):
        assert noise not in err + done.stdout, noise
    assert len(err.splitlines()) < 10

    verbose = subprocess.run([*command[:3], "-v", *command[3:]] + [f"trainer.run_dir={tmp_path / 'run-v'}", "trainer.total_steps=1"],
                             cwd=tmp_path, env=env | {"PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                             timeout=300)
    assert verbose.returncode == 0, verbose.stderr
    assert "resolved config:" in verbose.stderr and "LOAD REPORT" in verbose.stderr


def test_help_and_a_refused_config_import_neither_torch_nor_transformers():
    """What makes them answer in well under a second: the heavy libraries load only for real work."""
    probe = (
        "import sys\nfrom ragen2.cli import main\n"
        "for argv in (['train', 'optim.lr=-1'], ['train', 'nosuchpreset'], ['train', 'sokoban', 'no.key=1']):\n"
        "    assert main(argv) == 2, argv\n"
        "try:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = _run_probe(probe)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_off_a_terminal_a_slow_run_prints_every_step(tmp_path, save_random_policy):
    """With stdout a pipe (a log file, CI), steps slower than logging.progress_interval_s each get a line."""
    policy = tmp_path / "policy"
    save_random_policy(policy)
    command = [
        sys.executable, "-m", "ragen2", "train", "bandit", f"model.path={policy}", "model.device=cpu",
        f"trainer.run_dir={tmp_path / 'run'}", "rollout.num_groups=2", "rollout.group_size=2",
        "rollout.max_tokens_per_turn=8", "trainer.total_steps=3", "trainer.eval_every=0", "early_stop.eval_floor=false",
        "logging.tensorboard=false", "logging.progress_interval_s=0.01",
    ]
    done = subprocess.run(command, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("step ") and "s/step" in line]
    assert [line.split()[1] for line in lines] == ["1/3", "2/3", "3/3"], done.stdout


def test_train_help_names_every_environment_and_algorithm():
    from ragen2.cli import build_parser
    from ragen2.config import AlgoConfig
    from ragen2.envs import names

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    text = " ".join(train.format_help().split())
    assert "ENV-ALGO-FILTER" in text and "paper" in text and "nofilter" in text
    for name in [*names(), *typing.get_args(typing.get_type_hints(AlgoConfig)["name"])]:
        assert re.search(rf"\b{name}\b", text), name


def test_train_help_says_whether_each_built_in_preset_learns():
    from ragen2.cli import PRESET_LEARNING, build_parser
    from ragen2.envs import names

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    text = " ".join(train.format_help().split())
    marked = {name.strip() for names_, _ in PRESET_LEARNING for name in names_.split(",")}
    presets = [path.stem for path in (REPO / "ragen2" / "configs").glob("*.yaml")]
    for name in [*names(), *presets, "SUITE:GAME"]:
        assert name in marked, name
    verdicts = ("learns", "not measurably", "not measured", "not from")
    for names_, verdict in PRESET_LEARNING:
        assert any(v in verdict for v in verdicts), names_
        assert " ".join(f"{names_}: {verdict}".split()) in text, names_


def test_a_hub_client_warning_prints_once():
    """huggingface_hub logs through its own handler; the CLI's root handler must not print it again."""
    probe = (
        "import sys\nimport ragen2.cli as cli\n"
        "def noisy(args):\n"
        "    from huggingface_hub.utils import logging as hub_logging\n"
        "    hub_logging.get_logger('huggingface_hub.file_download').warning('Retrying in 1s [Retry 1/5].')\n"
        "    return 0\n"
        "cli.cmd_sweep = noisy\nsys.exit(cli.main(['sweep', 'spec.yaml']))\n"
    )
    done = _run_probe(probe)
    assert done.stderr.count("Retrying in 1s") == 1, done.stderr


def _run_probe(code: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter that imports this checkout; it must exit 0."""
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def test_train_without_a_preset_runs_the_default_preset(tmp_path, save_random_policy, caplog):
    """`ragen2 train` = `ragen2 train default` (FrozenLake, 16 x 8 at lr 5e-4, 256 held-out episodes), overrides on top."""
    import logging

    import yaml

    from ragen2.cli import main

    policy = tmp_path / "policy"
    save_random_policy(policy)
    run_dir = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="ragen2"):
        assert main(["train", f"model.path={policy}", "model.device=cpu", f"trainer.run_dir={run_dir}",
                     "rollout.group_size=2", "rollout.max_tokens_per_turn=8", "trainer.total_steps=1",
                     "trainer.eval_every=0", "collapse.enable=false", "logging.tensorboard=false"]) == 0
    assert "preset default (the default)" in caplog.text
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["env"]["name"] == "frozenlake" and saved["rollout"]["num_groups"] == 16
    assert saved["optim"]["lr"] == 5e-4 and saved["trainer"]["eval_episodes"] == 256
    assert saved["model"]["path"] == str(policy) and saved["rollout"]["group_size"] == 2
