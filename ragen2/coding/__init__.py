"""Coding harnesses whose shell commands run in ragen2's sandbox, trained through the endpoint.

`workspace`: a task repository (`RepoTask`) whose copy lives in the sandbox (`Workspace`): every
command runs there, and the host scores the result with the task's own tests. `mini_swe_agent`:
mini-swe-agent driving such a task as an `agent.entrypoint` (docs/agents.md, "A coding harness in
the sandbox"). The shipped task is in tasks/mean.
"""

from ragen2.coding.workspace import CommandResult, RepoTask, TestReport, Workspace

__all__ = ["CommandResult", "RepoTask", "TestReport", "Workspace"]
