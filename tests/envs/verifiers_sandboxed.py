"""A verifiers taskset whose reward needs the task's runtime (a sandbox the agent's harness ran in), which
`verifiers:` does not provide: loading it must say so."""

from __future__ import annotations

import verifiers.v1 as vf


class SandboxedTask(vf.Task):
    @vf.reward
    async def tests_pass(self, trace: vf.Trace, runtime: vf.Runtime) -> float:
        result = await runtime.run("pytest -q")
        return float(result.exit_code == 0)


class SandboxedTaskset(vf.Taskset[SandboxedTask, vf.TasksetConfig]):
    def load(self) -> list[SandboxedTask]:
        return [SandboxedTask(vf.TaskData(prompt="Fix the failing test."), self.config.task)]


__all__ = ["SandboxedTaskset"]
