"""What `ragen2 train` prints: a short header, the run's own events, no library noise."""

from __future__ import annotations

import os
import subprocess
import sys
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
    assert "2 steps of 2 groups x 2" in header[0]
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
    done = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
