"""mini-swe-agent, a coding harness nobody here wrote, trains through the endpoint with its commands run in the
sandbox (ragen2/coding/mini_swe_agent.py, the entrypoint tests/serve/swe_agent.py).

The adapter: mini-swe-agent's own agent loop on `SandboxEnvironment` runs each command in the sandbox, in a copy
of the task's repository; a command cannot reach the host's files; the reward is the host's run of the task's
tests (1 once the bug is fixed, 0 before). Training: a tiny policy fitted to mini-swe-agent's conversations on the
shipped task (fix `mean`, or only look at it, then submit) trains 2 steps through `agent.entrypoint` with no HTTP
error, every command it issued run in the sandbox, every reward the host's test run.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

pytest.importorskip("minisweagent", reason="mini-swe-agent is not installed: run `make` (agent-frameworks extra)")

import swe_agent  # noqa: E402
from chat_templates import QWEN25_TOOLS  # noqa: E402
from helpers import fine_tune  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.models.test_models import DeterministicModel, make_output  # noqa: E402
from minisweagent.utils.serialize import recursive_merge  # noqa: E402

from ragen2.coding import RepoTask, Workspace  # noqa: E402
from ragen2.coding.mini_swe_agent import SandboxEnvironment, default_config  # noqa: E402
from ragen2.coding.workspace import TASKS_DIR  # noqa: E402
from ragen2.envs.sandbox import SANDBOX_UIDS  # noqa: E402
from ragen2.models.tiny import build_tokenizer  # noqa: E402
from ragen2.rl.trainer import train  # noqa: E402
from test_agent_training import agent_config  # noqa: E402

AGENT = Path(__file__).parent / "swe_agent.py"
FIX = "sed -i 's/(len(values) - 1)/len(values)/' tinystats/core.py"
REPLIES = {  # what the test policy learns to write: fix the bug or only look at it, then submit
    "fix": f"THOUGHT: mean divides by one too few.\n\n```mswea_bash_command\n{FIX}\n```",
    "look": "THOUGHT: I read the code first.\n\n```mswea_bash_command\ncat tinystats/core.py\n```",
    "submit": "THOUGHT: Done.\n\n```mswea_bash_command\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```",
}


def scripted_run(replies: list[str]) -> DefaultAgent:
    """mini-swe-agent's DefaultAgent with the test entrypoint's settings, on `SandboxEnvironment`, its model replaced
    by one that writes `replies`."""
    settings = recursive_merge(default_config(), swe_agent.CONFIG)
    outputs = [make_output(r, [{"command": c} for c in re.findall(r"```mswea_bash_command\s*\n(.*?)\n```", r, re.S)])
               for r in replies]
    model = DeterministicModel(outputs=outputs, observation_template=settings["model"]["observation_template"])
    env = SandboxEnvironment(Workspace(swe_agent.TASK), **settings["environment"])
    agent_settings = {k: v for k, v in settings["agent"].items() if k != "mode"}
    agent = DefaultAgent(model, env, **{**agent_settings, "step_limit": len(replies), "cost_limit": 0})
    agent.run(swe_agent.TASK.issue)
    return agent


def test_the_adapter_runs_commands_in_the_sandbox_and_the_host_scores_the_tests(tmp_path):
    agent = scripted_run([REPLIES["look"], REPLIES["fix"], REPLIES["submit"]])
    workspace = agent.env.workspace
    assert agent.messages[-1]["extra"]["exit_status"] == "Submitted"
    look, fix, submit = workspace.commands
    assert submit.output == "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n"
    assert "return sum(values) / (len(values) - 1)" in look.output and look.returncode == 0
    assert look.sandbox["pid"] == 1  # its shell's parent was PID 1 of a PID namespace of its own
    if os.geteuid() == 0:
        assert look.sandbox["uid"] in SANDBOX_UIDS
    assert fix.returncode == 0 and b"/ len(values)" in workspace.files["tinystats/core.py"]
    assert workspace.test().reward == 1.0  # the fixed copy passes the task's tests
    assert Workspace(swe_agent.TASK).test().reward == 0.0  # the shipped, buggy repository does not
    # The copy was the sandbox's: the shipped repository on the host is as it was.
    assert b"(len(values) - 1)" in (TASKS_DIR / "mean" / "repo" / "tinystats" / "core.py").read_bytes()


def test_a_command_cannot_touch_the_host(tmp_path):
    target = tmp_path / "host.txt"
    target.write_text("host")
    workspace = Workspace(RepoTask.load("mean"))
    result = workspace.run(f"cat {target}; echo sandbox > {target}; echo away > ../outside.txt; echo tmp > /tmp/x; "
                           f"cat /etc/hostname; ls {Path.cwd()}; python -c 'import ragen2'")
    assert target.read_text() == "host"  # neither read nor written: the host's filesystem is not there
    assert "No such file or directory" in result.output and "ModuleNotFoundError" in result.output
    assert "outside.txt" not in str(workspace.files) and not (tmp_path / "outside.txt").exists()
    workspace.run("printf 'def test_nothing():\\n    pass\\n' > tests/test_core.py")
    assert workspace.test().reward == 0.0  # the tests are put back as shipped: rewriting them gains nothing
    workspace.run(f"{FIX} && rm -r tests")
    assert workspace.test().reward == 1.0  # and a fix passes them, though the agent deleted its copy of them


@pytest.fixture(scope="module")
def swe_policy(tmp_path_factory) -> Path:
    """A tiny policy that, on the test entrypoint's first prompt, writes the fix or a look at the code (half each),
    and submits after either: its episodes fix or fail the task."""
    runs = {name: scripted_run([REPLIES[name], REPLIES["submit"]]).messages for name in ("fix", "look")}
    conversations = {name: [{"role": m["role"], "content": m["content"]} for m in messages if m["role"] != "exit"]
                     for name, messages in runs.items()}
    corpus = [json.dumps(messages) for messages in conversations.values()] * 10 + list(REPLIES.values()) * 10
    tokenizer = build_tokenizer(corpus, vocab_size=400, chat_template=QWEN25_TOOLS)
    pairs = []
    for name, messages in conversations.items():
        for k in (2, 4):  # the two assistant messages: [system, task, reply, observation, reply, observation]
            prompt = tokenizer.apply_chat_template(messages[:k], add_generation_prompt=True, tokenize=False)
            pairs.append((prompt, messages[k]["content"] + "<|im_end|>"))
    rows = []
    for prompt, completion in pairs:
        p, c = (tokenizer.encode(text, add_special_tokens=False) for text in (prompt, completion))
        rows.append((p + c, [-100] * len(p) + c))
    path = tmp_path_factory.mktemp("swe_policy")
    fine_tune(tokenizer, rows, steps=300, lr=3e-3, path=path)  # 80 steps: most replies do not parse
    return path


def test_mini_swe_agent_trains_two_steps_with_its_commands_in_the_sandbox(swe_policy, answers, tmp_path,
                                                                          monkeypatch, one_thread):
    log = tmp_path / "episodes.jsonl"
    monkeypatch.setenv("SWE_LOG", str(log))
    shipped = {p: p.read_bytes() for p in (TASKS_DIR / "mean").rglob("*") if p.is_file()}
    train(agent_config(tmp_path, swe_policy, "play", f"agent.entrypoint={AGENT}:play", "trainer.total_steps=2",
                       f"rollout.max_turns={swe_agent.STEP_LIMIT}", "rollout.max_tokens_per_turn=96",
                       "logging.sample_every=1", "logging.sample_trajectories=8", "collapse.enable=false",
                       "filter.strategy=none", "filter.include_zero=true"))
    errors = [a for a in answers if a[2] >= 400]
    assert answers and not errors, f"the endpoint answered with HTTP errors: {errors}"

    episodes = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(episodes) == 16  # 2 steps of 2 groups of 4
    commands = [c for e in episodes for c in e["commands"]]
    assert commands, "no command ran"
    assert all(c["sandbox"]["pid"] == 1 for c in commands)  # every one in the sandbox's PID namespace
    if os.geteuid() == 0:
        assert all(c["sandbox"]["uid"] in SANDBOX_UIDS for c in commands)
    for e in episodes:  # the reward is the host's test run: 1 exactly when the fix ran
        assert e["reward"] == (1.0 if e["report"]["passed"] else 0.0)
        assert e["report"]["tests_run"] == 4
        fixed = any(c["command"] == FIX and c["returncode"] == 0 for c in e["commands"])
        assert e["reward"] == float(fixed), e["commands"]
    assert {e["reward"] for e in episodes} == {0.0, 1.0}  # it fixes or fails the task
    assert shipped == {p: p.read_bytes() for p in shipped}  # the shipped task is untouched

    run = tmp_path / "run"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2]
    assert [m["rollout/error_rate"] for m in steps] == [0.0, 0.0]
    assert all(any(key.startswith("train/") for key in m) for m in steps)  # both steps updated the policy
    for m, step in zip(steps, (episodes[:8], episodes[8:])):  # the trained returns are the host's rewards
        assert m["rollout/return_mean"] == pytest.approx(sum(e["reward"] for e in step) / 8)
    records = [json.loads(line) for step in (1, 2)
               for line in (run / "rollouts" / f"train_step_{step}.jsonl").read_text().splitlines()]
    assert len(records) == sum(method == "POST" for method, _, _ in answers)  # every call served was recorded
