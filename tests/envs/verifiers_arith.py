"""A verifiers taskset written for the tests with verifiers' own classes: sums of two small numbers, scored by
two weighted rewards. `verifiers:verifiers_arith` loads it (a taskset id is the module that exports it)."""

from __future__ import annotations

import random

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: int


class SumTask(vf.Task[SumData]):
    """Add the two numbers."""

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == str(self.data.answer))

    @vf.reward(weight=0.1)
    async def is_number(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.lstrip("-").isdigit())

    @vf.metric
    async def length(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class SumConfig(vf.TasksetConfig):
    num_tasks: int = 6
    high: int = 9


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self) -> list[SumTask]:
        rng, high = random.Random(0), self.config.high
        pairs = [(rng.randint(1, high), rng.randint(1, high)) for _ in range(self.config.num_tasks)]
        return [SumTask(SumData(prompt=f"What is {a} + {b}?", system_prompt="Reply with the number only.",
                                answer=a + b), self.config.task) for a, b in pairs]


async def half(trace: vf.Trace) -> float:
    """A reward plugged through the taskset config (`task.rewards`)."""
    return 0.5


async def broken(trace: vf.Trace) -> float:
    raise ValueError("this reward function is broken")


__all__ = ["SumTaskset"]
