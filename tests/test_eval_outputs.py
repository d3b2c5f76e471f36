"""Where `ragen2 eval` and `ragen2 diagnose` write, and the sample episodes eval saves and prints."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from ragen2.cli import main
from ragen2.config import load_config, save_config
from ragen2.evaluate import new_results_dir
from ragen2.verdict import LEARNED, VS_RANDOM, binomial_se, verdict

STAMP = r"\d{8}-\d{6}"
DIAGNOSE_CORPUS = [
    "Turn 1:\nState:\n#_PX_#\nPlayer at (row 1, col 2).",
    "<think>The box is right of me, so I push it.</think><answer>Right</answer>",
] * 10


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """Every test here runs on one thread (see tests/conftest.py, one_thread)."""


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, save_random_policy) -> Path:
    path = tmp_path_factory.mktemp("models") / "policy"
    save_random_policy(path)
    return path


def eval_args(policy_dir: Path, *extra: str) -> list[str]:
    """Bandit, 3 held-out episodes of at most 8 tokens: a few seconds."""
    return ["eval", str(policy_dir), "rollout.max_tokens_per_turn=8", "--env", "bandit", "--episodes", "3",
            "--device", "cpu", *extra]


def transcript_turns(text: str) -> list[tuple[str, str]]:
    """(prompt, model output) of every turn in a transcripts.txt, in file order."""
    turn = r"^--- turn \d+: prompt \(.*?\)\n(.*?)\n--- turn \d+: model output\n(.*?)\n--- turn \d+: environment: "
    return re.findall(turn, text, flags=re.MULTILINE | re.DOTALL)


def test_eval_writes_a_results_directory_with_the_sample_episodes(policy_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(eval_args(policy_dir, "--samples", "2")) == 0
    out = capsys.readouterr().out
    [results] = list((tmp_path / "eval").iterdir())
    assert re.fullmatch(rf"policy-bandit-{STAMP}", results.name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval"]  # nothing else in the current directory
    assert sorted(p.name for p in results.iterdir()) == ["eval.json", "rollouts.jsonl", "transcripts.txt"]

    report = json.loads((results / "eval.json").read_text())
    assert report["episodes"] == 3 and report["samples"] == 2
    assert set(report["results"]) == {"policy", "uniform-random"}
    records = [json.loads(line) for line in (results / "rollouts.jsonl").read_text().splitlines()]
    assert sorted({r["episode"] for r in records}) == [0, 1]  # one turn per Bandit episode
    # The transcript holds each sampled turn's full prompt and exactly the text the model generated.
    transcripts = (results / "transcripts.txt").read_bytes().decode("utf-8")  # bytes: a generated "\r" stays
    assert transcript_turns(transcripts) == [(r["prompt"], r["response"]) for r in records]
    assert "environment: actions none; format invalid; reward -0.100" in transcripts

    # The terminal: the table with the random agent, then the two sample episodes, then where the files are.
    table_at, samples_at = out.index("uniform-random"), out.index("sample episodes (2 of the 2 in ")
    assert table_at < samples_at
    assert out.count("turn 1 output: ") == 2 and out.count("first state:") == 2
    assert out.count("turn 1 actions none; format invalid; reward -0.100") == 2
    assert f"in {Path('eval') / results.name}\n" in out


def success(results: dict) -> tuple[float, float]:
    """(success rate, binomial SE) of one agent's row in eval.json, computed here from its rate and count."""
    return results["eval/success_rate"], binomial_se(results["eval/success_rate"], results["eval/episodes"])


def test_eval_says_whether_the_policy_beats_random_and_the_run_start(policy_dir, tmp_path, monkeypatch, capsys):
    """A plain model gets the verdict against the random agent; a run directory (its latest checkpoint) also
    the one against the run's first evaluation (0.5 over 8 episodes), when it plays the run's settings."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "bandit-1"
    shutil.copytree(policy_dir, run / "checkpoints" / "step_2")
    (run / "checkpoints" / "latest").write_text("step_2\n")
    save_config(load_config("bandit", ["rollout.max_tokens_per_turn=8"]), run / "config.yaml")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/success_rate": 0.5, "eval/episodes": 8}) + "\n"
                                      + json.dumps({"step": 1, "rollout/success_rate": 0.25}) + "\n")

    assert main(eval_args(policy_dir, "--out", "plain", "--samples", "0")) == 0
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "plain" / "eval.json").read_text())["results"]
    against_random = "uniform-random → policy: " + verdict(*success(rows["uniform-random"]), *success(rows["policy"]),
                                                           words=VS_RANDOM)
    assert json.loads((tmp_path / "plain" / "eval.json").read_text())["verdicts"] == [against_random]
    assert f"\n{against_random}\n" in out and "run start" not in out

    assert main(eval_args(run, "--out", "run", "--samples", "0")) == 0
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "run" / "eval.json").read_text())
    start = "run start (step 0) → this eval: " + verdict(0.5, (0.25 / 8) ** 0.5, *success(result["results"]["policy"]),
                                                         words=LEARNED)
    assert result["verdicts"] == [against_random, start]  # the same weights and episodes as the plain model
    assert f"\n{against_random}\n{start}\n" in out

    assert main(eval_args(run, "--out", "hot", "--samples", "0", "--no-random", "--temperature", "1.0")) == 0
    assert ("\nrun start → this eval: not compared, this eval plays other settings: temperature 1.0 (run: 0.5)\n"
            in capsys.readouterr().out)


def test_eval_out_names_the_directory(policy_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(eval_args(policy_dir, "--out", "mine", "--samples", "0", "--no-random")) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    assert json.loads((tmp_path / "mine" / "eval.json").read_text())["samples"] == 0
    assert (tmp_path / "mine" / "transcripts.txt").read_text() == ""
    assert "sample episodes" not in out and "uniform-random" not in out


def test_eval_is_repeatable_and_trainer_seed_changes_the_episodes(policy_dir, tmp_path, monkeypatch, capsys):
    """The same command gives the same sampled episodes; another trainer.seed gives other ones."""
    monkeypatch.chdir(tmp_path)
    episodes = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        args = eval_args(policy_dir, "--out", name, "--no-random", "--episodes", "8", "--samples", "8")
        assert main([*args[:3], f"trainer.seed={seed}", *args[3:]]) == 0  # overrides before the options
        lines = (tmp_path / name / "rollouts.jsonl").read_text().splitlines()
        episodes[name] = [json.loads(line)["response"] for line in lines]
        assert json.loads((tmp_path / name / "eval.json").read_text())["seed"] == seed
    capsys.readouterr()
    assert episodes["a"] == episodes["b"]
    assert episodes["a"] != episodes["c"]


def test_eval_refuses_a_json_file_as_out(policy_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(eval_args(policy_dir, "--out", "eval-bandit.json")) == 2
    err = capsys.readouterr().err
    assert "--out eval-bandit.json: --out is a directory" in err and "e.g. --out eval-bandit" in err
    assert main(eval_args(policy_dir, "--samples", "-1")) == 2
    assert "--samples -1 is not allowed" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_results_directories_are_named_after_their_source(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    checkpoint = Path("runs/sokoban-grpo-1/checkpoints/step_30")
    checkpoint.mkdir(parents=True)
    first = new_results_dir("eval", checkpoint, "sokoban")
    again = new_results_dir("eval", checkpoint, "sokoban")
    assert re.fullmatch(rf"eval/sokoban-grpo-1-step_30-sokoban-{STAMP}", first.as_posix())
    assert again != first and again.is_dir()  # never the same directory twice
    assert re.fullmatch(rf"Qwen2.5-0.5B-Instruct-math-{STAMP}",
                        new_results_dir("eval", "Qwen/Qwen2.5-0.5B-Instruct", "math").name)
    tiny = new_results_dir("eval", "tiny:countdown", "countdown")
    assert re.fullmatch(rf"tiny_countdown-countdown-{STAMP}", tiny.name)
    rollouts = Path("runs/sokoban-grpo-1/rollouts/train_step_10.jsonl")
    rollouts.parent.mkdir()
    rollouts.write_text("")
    diagnosed = new_results_dir("diagnose", rollouts)
    assert re.fullmatch(rf"diagnose/sokoban-grpo-1-train_step_10-{STAMP}", diagnosed.as_posix())


def test_diagnose_writes_into_a_results_directory(tmp_path, monkeypatch, save_random_policy, capsys):
    model = tmp_path / "model"
    save_random_policy(model, DIAGNOSE_CORPUS)
    rollouts = tmp_path / "runs" / "r1" / "rollouts" / "step_2.jsonl"
    rollouts.parent.mkdir(parents=True)
    rollouts.write_text("".join(
        json.dumps({"group": g, "prompt": f"Room {g}: player at (row {g}, col 2).<think>", "episode": 2 * g + k,
                    "turn": 0, "reasoning": f"I push the box {'right' if k else 'down'} {g}."}) + "\n"
        for g in range(2) for k in range(2)
    ))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["diagnose", str(rollouts), "--model", str(model), "--device", "cpu"]) == 0
    [results] = list((work / "diagnose").iterdir())
    assert re.fullmatch(rf"r1-step_2-{STAMP}", results.name)
    assert sorted(p.name for p in results.iterdir()) == ["diagnose.json", "heatmap.png"]
    assert sorted(p.name for p in work.iterdir()) == ["diagnose"]
    assert str(Path("diagnose") / results.name / "diagnose.json") in capsys.readouterr().out
