"""mini-swe-agent (2.4.6) trained through ragen2's endpoint, with every shell command it issues run in the sandbox.

`play` is an `agent.entrypoint`:

    ragen2 train agent agent.entrypoint=ragen2.coding.mini_swe_agent:play rollout.max_turns=6

One episode is one run of mini-swe-agent's `DefaultAgent` on the shipped task (tasks/mean: fix `mean` so that
its tests pass) with its own prompts (mini_textbased.yaml: one command a reply, in a ```mswea_bash_command
block). Its model is mini-swe-agent's litellm text model pointed at the episode's endpoint; its environment
is `SandboxEnvironment`, which runs each command in the sandbox, in the episode's copy of the repository
(`Workspace`); its reward is the host's run of the task's tests. `run_episode` does the same with a task, the
prompts and the limits of your choice: docs/agents.md, "A coding harness in the sandbox", has the walkthrough.
"""

from __future__ import annotations

import copy
import os
import platform
from dataclasses import asdict, dataclass, field
from typing import Any

# litellm downloads a price list at import unless told to use its own copy, and mini-swe-agent prints a banner.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

try:
    import yaml
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.config import builtin_config_dir
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel
    from minisweagent.utils.serialize import recursive_merge
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ImportError("mini-swe-agent is not installed: pip install 'ragen2[agent-frameworks]' "
                      "(make installs it in .venv)") from e

from ragen2.coding.workspace import CommandResult, RepoTask, TestReport, Workspace
from ragen2.errors import ConfigError


class SandboxEnvironment(LocalEnvironment):
    """mini-swe-agent's local environment, except that each command runs in ragen2's sandbox (`Workspace.run`).

    Commands start in the root of the episode's copy of the repository, whatever `cwd` says (a host path
    means nothing in the sandbox); `config.env` and `config.timeout` apply as in LocalEnvironment. Its
    template variables leave out the host's environment variables, which LocalEnvironment adds.
    """

    def __init__(self, workspace: Workspace, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.workspace = workspace

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        timeout = timeout or self.config.timeout
        result = self.workspace.run(action.get("command", ""), timeout=timeout, env=self.config.env)
        output = {"output": result.output, "returncode": result.returncode, "exception_info": ""}
        if result.timed_out:
            output["exception_info"] = f"The command timed out after {timeout} seconds and was killed."
        self._check_finished(output)  # `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` ends the run
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return recursive_merge(self.config.model_dump(), platform.uname()._asdict(), kwargs)


class EndpointModel(LitellmTextbasedModel):
    """mini-swe-agent's litellm text model, for ragen2's endpoint: an error is final (no retries with back-off:
    the endpoint refuses a call for a reason, and a retried call would not be the one recorded)."""

    abort_exceptions = [Exception, KeyboardInterrupt]


@dataclass
class EpisodeResult:
    """What one mini-swe-agent run did: its reward, why it stopped, every command and the host's test run."""

    reward: float
    exit_status: str
    model_calls: int
    format_errors: int
    """Replies mini-swe-agent could not parse (not exactly one command block): no command ran for them."""
    commands: list[CommandResult] = field(default_factory=list)
    report: TestReport | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def default_config() -> dict:
    """mini-swe-agent's own settings for a text-based model (its mini_textbased.yaml)."""
    return yaml.safe_load((builtin_config_dir / "mini_textbased.yaml").read_text())


def run_episode(client: Any, task: RepoTask, *, config: dict | None = None, step_limit: int = 6,
                max_tokens: int | None = None) -> EpisodeResult:
    """One mini-swe-agent run on `task` through the endpoint `client` talks to (its base URL and key).

    `config` is merged over `default_config()` (keys agent, model, environment, as in mini-swe-agent's YAML
    files: system_template, instance_template, observation_template, timeout, ...). `step_limit` caps the
    model calls, parse failures included: keep it within `rollout.max_turns`, or the endpoint refuses the
    call after the last and the episode ends with an error. The reward is `Workspace.test`'s.
    """
    if not isinstance(task, RepoTask):
        raise ConfigError(f"task must be a RepoTask (RepoTask.load(PATH)), not {type(task).__name__}")
    if not isinstance(step_limit, int) or step_limit < 1:
        raise ConfigError(f"step_limit={step_limit!r} is not allowed: use an integer >= 1")
    settings = recursive_merge(default_config(), copy.deepcopy(config or {}))
    unknown = set(settings) - {"agent", "model", "environment"}
    if unknown:
        raise ConfigError(f"config has keys {sorted(unknown)}: use agent, model and environment")
    model_kwargs = {**settings["model"].get("model_kwargs", {}), "api_base": str(client.base_url),
                    "api_key": client.api_key}
    if max_tokens is not None:
        model_kwargs["max_tokens"] = max_tokens
    model = EndpointModel(**{**settings["model"], "model_name": "openai/policy", "model_kwargs": model_kwargs,
                             "cost_tracking": "ignore_errors"})
    workspace = Workspace(task)
    env = SandboxEnvironment(workspace, **settings["environment"])
    agent_settings = {k: v for k, v in settings["agent"].items() if k != "mode"}  # mode: the interactive agent's
    agent = DefaultAgent(model, env, **{**agent_settings, "step_limit": step_limit, "cost_limit": 0})
    info = agent.run(task.issue)
    format_errors = sum(m.get("extra", {}).get("interrupt_type") == "FormatError" for m in agent.messages)
    report = workspace.test()
    return EpisodeResult(report.reward, str(info.get("exit_status", "")), agent.n_calls, format_errors,
                         workspace.commands, report)


def play(client: Any, seed: int) -> float:
    """`agent.entrypoint`: mini-swe-agent on the shipped task; 1.0 when the host's run of its tests passes."""
    return run_episode(client, RepoTask.load("mean")).reward
