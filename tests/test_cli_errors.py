"""Bad input to the CLI fails fast, with one line that names the value and the fix (issue 20).

Each test runs `ragen2.cli.main(argv)` in-process and reads stderr: exit code 2, one line
starting `error:`, no traceback (that needs -v), and no run directory left behind. No model
loads, except the tiny random policies of the non-finite-step and diagnose cases.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from ragen2.cli import main
from ragen2.config import load_config, save_config
from ragen2.errors import DivergedError
from ragen2.models.loading import check_model_path
from ragen2.tracking import read_events


def error_line(capsys, argv: list[str]) -> str:
    """Run the CLI, assert it refused with exactly one `error:` line on stderr, and return that line."""
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0].removeprefix("error: ")


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Every test runs in an empty directory, so a stale runs/... would show."""
    monkeypatch.chdir(tmp_path)


def no_run_dir_left(tmp_path: Path) -> bool:
    return not (tmp_path / "runs").exists()


def write_safetensors(path: Path, data_bytes: int) -> None:
    """A safetensors file whose header describes one float32 tensor of 4 values (16 bytes), followed by
    `data_bytes` bytes: 16 makes it whole, fewer truncates it."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * data_bytes)


def fake_model_dir(path: Path, data_bytes: int = 16) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "tokenizer.json").write_text("{}")
    write_safetensors(path / "model.safetensors", data_bytes)
    return path


# ----------------------------------------------------------------------------- files


def test_report_of_a_missing_run_dir(capsys):
    msg = error_line(capsys, ["report", "runs/does-not-exist"])
    assert msg == ("ragen2 report runs/does-not-exist: no such directory; pass a run directory written by "
                   "`ragen2 train` (runs/ENV-ALGO-TIME).")


def test_report_suggests_a_close_run_dir(capsys, tmp_path):
    (tmp_path / "runs" / "sokoban-grpo-1").mkdir(parents=True)
    (tmp_path / "runs" / "sokoban-grpo-1" / "metrics.jsonl").write_text("")
    assert error_line(capsys, ["report", "runs/sokoban-grpo-2"]).endswith("Did you mean: sokoban-grpo-1?")


def test_report_of_a_directory_without_metrics(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    assert "ragen2 report empty: no metrics.jsonl there" in error_line(capsys, ["report", "empty"])


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p.write_text("x"), "model.path={p} is a file, not a model directory; pass a model directory "
                                      "(as save_pretrained writes it) or a hub name"),
        (lambda p: p.mkdir(), "model.path={p} is an empty directory; pass a model directory (as save_pretrained "
                              "writes it) or a hub name"),
        (lambda p: fake_model_dir(p, data_bytes=8), "model.path={p} holds model.safetensors, which is truncated or "
                                                     "corrupt (78 bytes; its header describes 86); copy or save "
                                                     "the model again"),
        (lambda p: (fake_model_dir(p), (p / "config.json").write_text('{"a": ')),
         "model.path={p} holds config.json, which is not valid JSON (line 1, column 7: Expecting value): it is "
         "corrupt or truncated; pass a model directory (as save_pretrained writes it) or a hub name"),
        (lambda p: (fake_model_dir(p), (p / "model.safetensors").unlink()),
         "model.path={p} has config.json but no weights (model.safetensors or model.safetensors.index.json or "
         "pytorch_model.bin or pytorch_model.bin.index.json); pass a model directory (as save_pretrained writes "
         "it) or a hub name"),
    ],
    ids=["file", "empty-dir", "truncated-safetensors", "bad-config-json", "no-weights"],
)
def test_bad_model_path_fails_before_a_run_dir_exists(capsys, tmp_path, make, message):
    path = tmp_path / "model"
    make(path)
    msg = error_line(capsys, ["train", "bandit", f"model.path={path}"])
    assert msg == message.format(p=path)
    assert no_run_dir_left(tmp_path)


def test_a_model_that_fails_to_load_leaves_no_run_dir(capsys, tmp_path):
    """The files look whole, so the run directory is made; transformers then refuses the tokenizer."""
    fake_model_dir(tmp_path / "model")
    msg = error_line(capsys, ["train", "bandit", f"model.path={tmp_path / 'model'}"])
    assert msg.startswith(f"model.path={tmp_path / 'model'}: cannot load its tokenizer (")
    assert no_run_dir_left(tmp_path)


def test_a_hub_name_is_not_mistaken_for_a_missing_path(monkeypatch):
    monkeypatch.setattr("ragen2.models.hub.hub_unreachable", lambda: None)  # online: the hub decides
    check_model_path("Qwen/Qwen2.5-0.5B-Instruct")  # its dots once read as a file suffix: "does not exist"
    check_model_path("gpt2")


@pytest.mark.parametrize("name, problem, closest", [
    ("textarena:TowerOfHanio-v0", "TowerOfHanio-v0 is not an adapted TextArena game; adapted: ",
     "textarena:TowerOfHanoi-v0, textarena:TowerOfHanoi-v0-hard, textarena:TowerOfHanoi-v0-medium"),
    ("gym:Blackjak-v1", "Blackjak-v1 is not a registered Gymnasium environment; with text renderers: ",
     "gym:Blackjack-v1, gym:tabular/Blackjack-v0"),
    ("textarna:TowerOfHanoi-v0", "'textarna' is not an environment suite; suites: textarena:GAME, ",
     "textarena:TowerOfHanoi-v0, textworld:TowerOfHanoi-v0"),
])
def test_a_mistyped_suite_or_game_is_a_bad_env_name(capsys, tmp_path, name, problem, closest):
    """These once read "env.kwargs for NAME: ..." (a bad game)
    or listed only the built-in environments (a bad suite)."""
    pytest.importorskip("textarena")
    msg = error_line(capsys, ["train", "bandit", f"env.name={name}"])
    assert msg.startswith(f"env.name={name!r}: {problem}")
    assert msg.endswith(f"Did you mean: {closest}?")
    assert no_run_dir_left(tmp_path)


def test_eval_of_a_truncated_model_names_the_file(capsys, tmp_path):
    fake_model_dir(tmp_path / "m", data_bytes=0)
    assert error_line(capsys, ["eval", str(tmp_path / "m")]).startswith(
        f"model {tmp_path / 'm'} holds model.safetensors, which is truncated or corrupt (70 bytes"
    )


def test_diagnose_with_a_truncated_model_names_the_file(capsys, tmp_path):
    fake_model_dir(tmp_path / "m", data_bytes=0)
    (tmp_path / "r.jsonl").write_text('{"group": 0, "prompt": "p", "reasoning": "z"}\n')
    assert error_line(capsys, ["diagnose", str(tmp_path / "r.jsonl"), "--model", str(tmp_path / "m")]).startswith(
        f"--model {tmp_path / 'm'} holds model.safetensors, which is truncated or corrupt (70 bytes"
    )


def test_resume_from_a_truncated_checkpoint_names_the_file_and_the_earlier_one(capsys, tmp_path):
    run = tmp_path / "run"
    save_config(load_config("bandit", [f"trainer.run_dir={run}", "model.device=cpu"]), _mkdir(run) / "config.yaml")
    checkpoints = run / "checkpoints"
    for step, data in ((1, 16), (2, 10)):
        ckpt = fake_model_dir(checkpoints / f"step_{step}", data_bytes=data)
        (ckpt / "config.yaml").write_text((run / "config.yaml").read_text())
        torch.save({"step": step}, ckpt / "trainer_state.pt")
    (checkpoints / "latest").write_text("step_2\n")
    msg = error_line(capsys, ["train", "--resume", str(run)])
    assert msg == (
        f"checkpoint {checkpoints / 'step_2'} holds model.safetensors, which is truncated or corrupt (80 bytes; "
        f"its header describes 86); resume from an earlier checkpoint by writing its name (step_1, the one "
        f"before) into {checkpoints / 'latest'}"
    )


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


# ----------------------------------------------------------------------------- config


def test_malformed_yaml_gives_line_and_column(capsys, tmp_path):
    (tmp_path / "bad.yaml").write_text("trainer: {total_steps: 5\nalgo: ppo\n")
    msg = error_line(capsys, ["train", "bad.yaml"])
    assert msg.startswith("bad.yaml: invalid YAML at line 2, column 5: ")
    assert msg.endswith("; write one `key: value` per line, nested keys indented")


def test_empty_yaml_is_refused(capsys, tmp_path):
    (tmp_path / "empty.yaml").write_text("# nothing yet\n\n")
    assert error_line(capsys, ["train", "empty.yaml"]) == (
        "empty.yaml is empty (nothing but blanks or comments): a config file must set at least one key, "
        "e.g. `trainer: {total_steps: 50}`"
    )


def test_missing_yaml_file_is_named(capsys):
    assert error_line(capsys, ["train", "nope.yaml"]).startswith("preset file nope.yaml does not exist")


@pytest.mark.parametrize("lr, shown", [("-1", "-1.0"), ("1e30", "1e+30"), (".inf", "inf"), ("2", "2.0")])
def test_learning_rate_must_be_finite_and_sane(capsys, tmp_path, lr, shown):
    assert error_line(capsys, ["train", f"optim.lr={lr}"]) == (
        f"optim.lr={shown} is not allowed: use a finite learning rate in [0, 1] (0 freezes the weights); "
        "fine-tuning uses about 1e-6 to 1e-3, the tiny policy 1e-4 to 1e-3"
    )
    assert no_run_dir_left(tmp_path)


@pytest.mark.parametrize("episodes", [0, -3])
def test_eval_episodes_must_be_positive_when_evaluating(capsys, episodes):
    assert error_line(capsys, ["train", f"trainer.eval_episodes={episodes}"]) == (
        f"trainer.eval_episodes={episodes} is not allowed while evaluation is on (trainer.eval_every=10): use an "
        "integer >= 1 (reference: 512), or trainer.eval_every=0 to turn evaluation off"
    )


def test_eval_episodes_are_free_when_evaluation_is_off():
    assert load_config(None, ["trainer.eval_every=0", "trainer.eval_episodes=0"]).trainer.eval_episodes == 0


# ----------------------------------------------------------------------------- arguments


def test_eval_without_a_model_says_what_to_pass(capsys):
    assert error_line(capsys, ["eval"]) == (
        "ragen2 eval needs the model to evaluate first: a model directory (e.g. runs/RUN/checkpoints/step_30), "
        "a run directory (its latest checkpoint), a hub name, or tiny; e.g. `ragen2 eval tiny --env sokoban`"
    )


def test_eval_with_an_override_first_says_the_model_comes_first(capsys):
    assert "(got the override 'rollout.max_turns=5' there)" in error_line(capsys, ["eval", "rollout.max_turns=5"])


def test_override_without_a_value(capsys):
    assert error_line(capsys, ["train", "trainer.total_steps"]) == (
        "'trainer.total_steps' is not a preset; overrides are key=value, e.g. trainer.total_steps=30"
    )


@pytest.mark.parametrize("argv", [["train", "--trainer.total_steps=5"], ["train", "sokoban", "--trainer.total_steps", "5"]])
def test_override_written_as_an_option(capsys, argv):
    assert error_line(capsys, argv) == (
        f"{argv[-1] if '=' in argv[-1] else argv[-2]}: config overrides are written key=value without dashes, "
        "e.g. `ragen2 train trainer.total_steps=5`"
    )


def test_verbose_prints_the_traceback(capsys):
    assert main(["-v", "report", "runs/does-not-exist"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1].startswith("error: ragen2 report runs/does-not-exist: no such directory")
    assert main(["report", "runs/does-not-exist", "-v"]) == 2  # -v after the command works too
    assert "Traceback" in capsys.readouterr().err


def test_diagnose_refuses_a_negative_token_cap(capsys, tmp_path):
    (tmp_path / "r.jsonl").write_text('{"group": 0, "prompt": "p", "reasoning": "z"}\n')
    assert error_line(capsys, ["diagnose", "r.jsonl", "--model", "tiny", "--max-reasoning-tokens", "-1"]) == (
        "--max-reasoning-tokens -1 is not allowed: use an integer >= 1, or 0 for no cap"
    )


# ----------------------------------------------------------------------------- while running


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, save_random_policy) -> Path:
    path = tmp_path_factory.mktemp("policy")
    save_random_policy(path)
    return path


def test_nonfinite_steps_are_skipped_then_the_run_stops(policy_dir, tmp_path, monkeypatch, one_thread):
    """Every update's loss is NaN: each step is skipped with a `nonfinite_step` event, and the run stops
    after trainer.max_skipped_steps of them, instead of crashing."""
    from ragen2.rl import advantage_stage, trainer

    advantage_phase = advantage_stage.advantage_phase

    def nan_advantages(run, kept):
        batch = advantage_phase(run, kept)
        batch.advantages = torch.full_like(batch.advantages, torch.nan)
        return batch

    monkeypatch.setattr(trainer, "advantage_phase", nan_advantages)
    run_dir = tmp_path / "run"
    config = load_config("bandit", [
        f"model.path={policy_dir}", "model.device=cpu", f"trainer.run_dir={run_dir}", "rollout.num_groups=2",
        "rollout.group_size=4", "rollout.max_tokens_per_turn=8", "trainer.total_steps=5", "trainer.eval_every=0",
        "trainer.max_skipped_steps=2", "algo.mini_batch_size=8", "filter.strategy=none", "filter.include_zero=true",
        "collapse.enable=false", "logging.progress=false", "logging.tensorboard=false",
    ])
    summary = trainer.train(config)
    kinds = [e["kind"] for e in read_events(run_dir)]
    assert kinds == ["skipped_nonfinite", "nonfinite_step", "skipped_nonfinite", "nonfinite_step", "early_stop"]
    assert "2 consecutive steps were skipped (the last: the loss or gradient was not finite" in summary
    assert "Lower optim.lr" in summary


def test_sampling_from_a_diverged_policy_is_one_line():
    from types import SimpleNamespace

    from ragen2.rl.rollout_stage import finite_sampling

    run = SimpleNamespace(config=load_config(None, ["optim.lr=0.5"]))
    with pytest.raises(DivergedError, match=r"^step 3: the policy's next-token probabilities are NaN or infinite "
                                            r"while sampling evaluation episodes: its weights diverged \(optim.lr=0.5"):
        with finite_sampling(run, 3, "evaluation episodes"):
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")


def test_diagnose_caps_each_reasoning(policy_dir, tmp_path, capsys, one_thread):
    """Four reasonings of 1 MB each: each is cut to its first 16 tokens, and the cut is reported."""
    rows = [json.dumps({"group": g, "prompt": f"Arms: Dragon, Turtle {g}.<think>", "reasoning": "Dragon " * 150_000})
            for g in range(4)] + [json.dumps({"group": 4, "prompt": "Arms.<think>", "reasoning": "Turtle."})]
    (tmp_path / "big.jsonl").write_text("\n".join(rows) + "\n")
    rc = main(["diagnose", "big.jsonl", "--model", str(policy_dir), "--device", "cpu", "--out", "diag",
               "--max-reasoning-tokens", "16"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "truncated 4 of 5 reasonings to their first 16 tokens (--max-reasoning-tokens)" in out
    report = json.loads((tmp_path / "diag" / "diagnose.json").read_text())
    assert report["reasoning_truncated"] == 4 and report["max_reasoning_tokens"] == 16
    assert max(report["reasoning_tokens"]) == 16
