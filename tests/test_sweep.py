"""`ragen2 sweep`: grid expansion, config checks, and a real two-run sweep that resumes and skips."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ragen2 import sweep
from ragen2.cli import main
from ragen2.errors import ConfigError
from ragen2.tracking import read_metrics

REPO = Path(__file__).resolve().parents[1]


def write_spec(path: Path, spec: dict) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_grid_expansion_names_overrides_and_exclusions(tmp_path):
    spec = sweep.load_spec(write_spec(tmp_path / "grid.yaml", {
        "preset": "sokoban",
        "base": {"trainer.total_steps": 3, "env.kwargs.dim_room": [6, 6]},
        "axes": {
            "env": {"fl": {"preset": "frozenlake", "rollout.max_turns": 4}, "sok": {}},
            "algo.kl_coef": [0.0, 0.01],
        },
        "seeds": [0, 1],
        "exclude": [{"env": "fl", "algo.kl_coef": 0.01}],
    }))
    points = spec.points()
    # 2 x 2 grid minus one point, times 2 seeds; seeds vary slowest.
    assert [p.name for p in points] == [
        "env=fl__algo.kl_coef=0.0__seed=0",
        "env=sok__algo.kl_coef=0.0__seed=0",
        "env=sok__algo.kl_coef=0.01__seed=0",
        "env=fl__algo.kl_coef=0.0__seed=1",
        "env=sok__algo.kl_coef=0.0__seed=1",
        "env=sok__algo.kl_coef=0.01__seed=1",
    ]
    fl = points[0]
    assert fl.preset == "frozenlake" and fl.labels == {"env": "fl", "algo.kl_coef": "0.0"}
    assert fl.train_args(Path("out/x")) == [
        "frozenlake", "logging.progress=false", "trainer.total_steps=3", "env.kwargs.dim_room=[6, 6]",
        "rollout.max_turns=4", "algo.kl_coef=0.0", "trainer.seed=0", "trainer.run_dir=out/x",
    ]
    assert points[2].preset == "sokoban" and points[2].overrides["algo.kl_coef"] == 0.01
    # Command-line overrides win over base and axes; --seeds picks some of the spec's seeds.
    smoke = spec.points({"trainer.total_steps": 2, "rollout.max_turns": 1}, seeds=[1])
    assert [p.seed for p in smoke] == [1, 1, 1]
    assert all(p.overrides["trainer.total_steps"] == 2 and p.overrides["rollout.max_turns"] == 1 for p in smoke)
    with pytest.raises(ConfigError, match=r"seeds \[5\] are not in the spec's seeds \[0, 1\]"):
        spec.points(seeds=[5])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"axes": {"a.b": 3}}, r"axis 'a.b' must be a non-empty list"),
        ({"seeds": [0, "1"]}, r"seeds must be a non-empty list of integers"),
        ({"axis": {}}, r"unknown spec key 'axis'.*Did you mean: axes"),
        ({"axes": {"algo.name": ["grpo"]}, "exclude": [{"algo": "grpo"}]}, r"exclude names 'algo', which is not an axis"),
        ({"warmstart": {"stpes": 3}}, r"unknown warmstart key 'stpes'.*Did you mean: steps"),
        ({"warmstart": {"envs": ["frozenlake"], "steps": 0}}, r"warmstart steps=0 is not allowed"),
        ({"warmstart": {"base": "smollm2-135m", "hidden_size": 64}}, r"unknown warmstart key 'hidden_size'"),
        ({"warmstart": {"base": "smollm2-135m", "lora_rank": -1}}, r"--lora-rank -1 is not allowed"),
        ({"warmstart": {"envs": ["bandit"], "lora_rank": 4}}, r"unknown warmstart key 'lora_rank'"),
        ({"environment": ["ATEN_CPU_CAPABILITY=default"]}, r"environment must map variable names to strings"),
    ],
)
def test_bad_specs_refused(tmp_path, spec, message):
    with pytest.raises(ConfigError, match=message):
        sweep.load_spec(write_spec(tmp_path / "bad.yaml", spec))


def test_a_missing_or_malformed_spec_is_a_one_line_error(tmp_path, capsys):
    from ragen2.cli import main

    assert main(["sweep", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: sweep spec {tmp_path / 'nope.yaml'} does not exist") and err.count("\n") == 1
    (tmp_path / "broken.yaml").write_text("axes: [\n")
    assert main(["sweep", str(tmp_path / "broken.yaml")]) == 2
    assert "is not valid YAML" in capsys.readouterr().err
    assert main(["sweep", str(write_spec(tmp_path / "s.yaml", {"preset": "bandit"})), "--seeds", "a"]) == 2
    assert "--seeds a: give integers separated by commas" in capsys.readouterr().err


def test_unknown_config_key_fails_before_anything_runs(tmp_path):
    spec = write_spec(tmp_path / "typo.yaml", {"preset": "bandit", "axes": {"algo.kl_coeff": [0.0, 0.1]}})
    with pytest.raises(ConfigError, match=r"unknown config key 'algo.kl_coeff'.*algo.kl_coef"):
        sweep.run_sweep(spec, tmp_path / "out", dry_run=False)
    assert not (tmp_path / "out").exists()


def test_jobs_may_not_oversubscribe_the_cores(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", {"preset": "bandit"})
    cores = sweep.available_cores()
    with pytest.raises(ConfigError, match=rf"--jobs {cores + 1} is not allowed: use 1 to {cores}"):
        sweep.run_sweep(spec, tmp_path / "out", jobs=cores + 1)


def test_tables_need_a_sweep_directory(tmp_path):
    with pytest.raises(ConfigError, match=r"holds no sweep.json: it is not a sweep directory"):
        sweep.write_tables(tmp_path)


def test_mean_se():
    mean, se, n = sweep.mean_se([1.0, 2.0, 6.0, math.nan])
    assert (mean, n) == (3.0, 3)
    assert se == pytest.approx(math.sqrt(7.0 / 3.0))  # sample std sqrt(7) over sqrt(3)
    assert sweep.format_mean_se([0.5]) == "0.5 (n=1)"


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory, save_random_policy):
    """A 2-point sweep of 2 steps on Bandit with the random test policy, run for real with 2 jobs."""
    root = tmp_path_factory.mktemp("sweep")
    save_random_policy(root / "policy")
    spec = write_spec(root / "tiny.yaml", {
        "description": "Two filters on Bandit.",
        "preset": "bandit",
        "base": {
            "model.path": str(root / "policy"), "model.device": "cpu",
            "rollout.num_groups": 4, "rollout.group_size": 2, "rollout.max_tokens_per_turn": 8,
            "trainer.total_steps": 2, "trainer.eval_every": 1, "trainer.eval_episodes": 4, "trainer.save_every": 1,
            "algo.mini_batch_size": 8, "algo.micro_batch_size": 8,
            "collapse.compute_freq": 1, "collapse.num_samples": 8, "logging.tensorboard": False,
        },
        "axes": {"filter": {
            "q1": {"filter.strategy": "quartile", "filter.value": 1, "filter.include_zero": True},
            "traj": {"filter.strategy": "none", "filter.include_zero": True, "filter.trajectory_keep": 0.5},
        }},
        "seeds": [3],
        "environment": {"ATEN_CPU_CAPABILITY": "default"},
    })
    out = root / "out"
    actions = sweep.run_sweep(spec, out, jobs=min(2, sweep.available_cores()), threads=1)
    return spec, out, actions


def test_sweep_runs_every_point_and_tables_match_the_metrics(tiny_sweep):
    spec, out, actions = tiny_sweep
    names = ["filter=q1__seed=3", "filter=traj__seed=3"]
    assert actions == {name: "done" for name in names}, [(out / n / sweep.LOG_FILE).read_text()[-2000:] for n in names]
    rows = {row["run"]: row for row in sweep.read_sweep(out)}
    for name in names:
        records = read_metrics(out / name)
        evals = [r["eval/success_rate"] for r in records if "eval/success_rate" in r]
        entropy = [r["train/entropy"] for r in records if "train/entropy" in r]
        row = rows[name]
        assert row["status"] == "done" and row["steps"] == 2 and row["seed"] == 3
        assert row["initial_success"] == evals[0] and row["final_success"] == evals[-1]
        assert row["peak_success"] == max(evals)
        assert row["token_entropy"] == entropy[-1]
        # The random policy seldom writes a closed <think> block: no MI then, and the table says NaN.
        mi = [r["collapse_trajectory/mi_est"] for r in records if "collapse_trajectory/mi_est" in r]
        assert row["mi_est_traj"] == mi[-1] if mi else math.isnan(row["mi_est_traj"])
        step_times = [r["timing_s/step"] - r.get("timing_s/evaluate", 0) - r.get("timing_s/checkpoint", 0)
                      for r in records if "timing_s/step" in r]
        assert row["train_step_s"] == pytest.approx(sum(step_times) / len(step_times), rel=1e-12)
        config = yaml.safe_load((out / name / "config.yaml").read_text())
        assert config["trainer"]["seed"] == 3 and config["logging"]["progress"] is False
    # Quartile 1 of 4 groups is one group; trajectory-level filtering keeps every group.
    assert rows["filter=q1__seed=3"]["kept_ratio"] == 0.25
    assert rows["filter=traj__seed=3"]["kept_ratio"] == 1.0
    table = (out / "sweep.md").read_text()
    assert "Two filters on Bandit." in table and "| q1 | 1/1 |" in table
    csv_lines = (out / "sweep.csv").read_text().splitlines()
    assert csv_lines[0].startswith("run,filter,seed,status,steps,initial_success") and len(csv_lines) == 3
    grid = json.loads((out / sweep.GRID_FILE).read_text())
    assert grid["runs"][0]["command"].startswith("ATEN_CPU_CAPABILITY=default ragen2 train bandit ")
    # The spec's environment reaches every run's process: torch there chose the portable kernels.
    logs = [(out / n / sweep.LOG_FILE).read_text() for n in names]
    assert all("default kernels (ATEN_CPU_CAPABILITY)" in log for log in logs), logs[0][:3000]


def test_second_call_skips_finished_and_resumes_interrupted(tiny_sweep):
    spec, out, _ = tiny_sweep
    q1, traj = out / "filter=q1__seed=3", out / "filter=traj__seed=3"
    before = (traj / "metrics.jsonl").read_text()
    # Interrupt q1 after step 1 as a kill would leave it: no exit status, latest checkpoint step 1.
    (q1 / sweep.STATUS_FILE).unlink()
    (q1 / "checkpoints" / "latest").write_text("step_1\n")
    assert sweep.run_sweep(spec, out, dry_run=True) == {q1.name: "resume", traj.name: "skip"}
    actions = sweep.run_sweep(spec, out, jobs=1, threads=1)
    assert actions == {q1.name: "done", traj.name: "skip"}
    assert (traj / "metrics.jsonl").read_text() == before  # untouched
    log = (q1 / sweep.LOG_FILE).read_text()
    assert f"train --resume {q1}" in log
    steps = [r["step"] for r in read_metrics(q1)]
    assert steps == [0, 1, 2]  # step 2 redone once, not duplicated


def test_changed_spec_refuses_a_run_with_another_config(tiny_sweep, tmp_path):
    spec, out, _ = tiny_sweep
    data = yaml.safe_load(spec.read_text())
    data["base"]["optim.lr"] = 0.5
    changed = write_spec(tmp_path / "tiny.yaml", data)
    with pytest.raises(ConfigError, match=r"holds a run with another config \(optim.lr: 0.0001 -> 0.5\)"):
        sweep.run_sweep(changed, out, dry_run=True)


def test_cli_dry_run_and_tables_only(tiny_sweep, capsys):
    spec, out, _ = tiny_sweep
    assert main(["sweep", str(spec), "--out", str(out), "--dry-run"]) == 0
    assert "skip         filter=q1__seed=3" in capsys.readouterr().out
    (out / "sweep.md").unlink()
    cmd = [sys.executable, "-m", "ragen2", "sweep", str(spec), "--out", str(out), "--tables-only"]
    tables = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert tables.returncode == 0, tables.stderr
    assert (out / "sweep.md").is_file() and f"wrote {out / 'sweep.csv'}" in tables.stdout


def test_spec_warmstart_builds_the_policy_once_and_every_run_uses_it(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGEN2_CACHE", str(tmp_path / "cache"))
    settings = {"envs": ["bandit"], "episodes_per_env": 4, "steps": 2, "warmup_steps": 1, "vocab_size": 300,
                "hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}
    spec = write_spec(tmp_path / "ws.yaml", {
        "preset": "bandit", "warmstart": settings,
        "base": {"model.device": "cpu", "rollout.num_groups": 2, "rollout.group_size": 2, "rollout.max_tokens_per_turn": 8,
                 "trainer.total_steps": 1, "trainer.eval_every": 0, "trainer.save_every": 0, "collapse.enable": False,
                 "logging.tensorboard": False, "filter.strategy": "none", "filter.include_zero": True},
        "seeds": [0],
    })
    assert sweep.run_sweep(spec, tmp_path / "out", dry_run=True) == {"seed=0": "start"}
    assert not (tmp_path / "cache").exists()  # a dry run names the policy but trains nothing
    assert sweep.run_sweep(spec, tmp_path / "out", threads=1) == {"seed=0": "done"}
    policies = list((tmp_path / "cache").iterdir())
    assert len(policies) == 1 and json.loads((policies[0] / "warmstart.json").read_text())["settings"]["hidden_size"] == 32
    config = yaml.safe_load((tmp_path / "out" / "seed=0" / "config.yaml").read_text())
    assert Path(config["model"]["path"]) == policies[0]


def small_bandit_spec(path: Path, policy: Path, total_steps: int, seeds: list[int]) -> Path:
    """A spec of Bandit runs of `total_steps` tiny steps with the random test policy, nothing else computed."""
    return write_spec(path, {
        "preset": "bandit",
        "base": {"model.path": str(policy), "model.device": "cpu", "rollout.num_groups": 2,
                 "rollout.group_size": 2, "rollout.max_tokens_per_turn": 8, "trainer.total_steps": total_steps,
                 "trainer.eval_every": 0, "trainer.save_every": 0, "collapse.enable": False,
                 "logging.tensorboard": False, "filter.strategy": "none", "filter.include_zero": True},
        "seeds": seeds,
    })


def test_running_some_seeds_keeps_the_whole_grid_in_the_tables(tmp_path, save_random_policy):
    save_random_policy(tmp_path / "policy")
    spec = small_bandit_spec(tmp_path / "two_seeds.yaml", tmp_path / "policy", 1, [0, 1])
    out = tmp_path / "out"
    assert sweep.run_sweep(spec, out, threads=1, seeds=[1]) == {"seed=1": "done"}
    # Two processes may each run some of the seeds: the grid, and so the tables, still list every run.
    assert [r["name"] for r in sweep.read_grid(out)["runs"]] == ["seed=0", "seed=1"]
    assert [(r["run"], r["status"]) for r in sweep.read_sweep(out)] == [("seed=0", "missing"), ("seed=1", "done")]


def test_spec_warmstart_with_a_base_fine_tunes_that_model(tmp_path, monkeypatch, save_random_policy):
    from ragen2.models.base_warmstart import base_cache_path, make_base_config

    monkeypatch.setenv("RAGEN2_CACHE", str(tmp_path / "cache"))
    save_random_policy(tmp_path / "base")
    settings = {"base": str(tmp_path / "base"), "envs": ["bandit"], "episodes_per_env": 4, "steps": 1,
                "warmup_steps": 1, "lora_rank": 2, "eval_episodes": 0}
    spec = sweep.load_spec(write_spec(tmp_path / "ws.yaml", {"preset": "bandit", "warmstart": settings, "seeds": [0]}))
    expected = base_cache_path(make_base_config(str(tmp_path / "base"), envs=("bandit",), episodes_per_env=4, steps=1,
                                                warmup_steps=1, lora_rank=2, eval_episodes=0))
    assert sweep.warmstart_policy(spec.warmstart, build=False) == expected and not expected.exists()
    assert sweep.warmstart_policy(spec.warmstart, build=True) == expected
    info = json.loads((expected / "warmstart.json").read_text())
    assert info["base"] == str(tmp_path / "base") and info["settings"]["lora_rank"] == 2


def test_sigterm_stops_the_sweep_and_its_runs_which_checkpoint_and_resume(tmp_path, save_random_policy):
    """`kill` of the sweep reaches its runs too (each in its own session, so the sweep passes the signal on): each
    stops at a complete step with a checkpoint, no process is left training, and the next call resumes them."""
    save_random_policy(tmp_path / "policy")
    spec = small_bandit_spec(tmp_path / "long.yaml", tmp_path / "policy", 10000, [0])
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "ragen2", "sweep", str(spec), "--out", str(out), "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = out / "seed=0" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2) and time.monotonic() < deadline:
        time.sleep(0.5)
    proc.terminate()
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, output
    assert "call the sweep again to resume" in output
    training = [p for p in Path("/proc").glob("[0-9]*") if _cmdline(p).count(str(out / "seed=0"))]
    assert not training, [_cmdline(p) for p in training]
    steps = len(metrics.read_text().splitlines())
    assert sweep.plan(sweep.load_spec(spec).points()[0], out / "seed=0") == "resume" and steps < 10000
    assert json.loads((out / "seed=0" / sweep.STATUS_FILE).read_text())["returncode"] == 130


def _cmdline(proc_dir: Path) -> str:
    try:
        return (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
