"""MCP tools as an environment: any MCP server started over stdio offers its tools to the policy.

`make("mcp:NAME", command=[...], tasks="tasks.jsonl", checker="check.py:score")`: the server's tools
(its `tools/list`) plus `finish(answer)` are the actions; a task file gives the prompts and the
reference answers, and a checker scores the final answer. NAME labels the server in run names;
`mcp:calculator` without a command is the built-in calculator with arithmetic tasks, which runs
offline with nothing to configure. One server process, started on first
use and kept for the life of the Python process, serves every episode with the same command:
the tools should keep no state between calls (a calculator, a search index, a read-only database).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import random
import re
import sys
import threading
from collections.abc import Callable
from typing import Any, ClassVar

import gymnasium as gym

from ragen2.envs.base import TextEnv, bracket_tool
from ragen2.envs.data import read_records, require_fields
from ragen2.errors import ConfigError

CALCULATOR = (sys.executable, "-m", "ragen2.envs.external.mcp_calculator")
_ACTION = re.compile(r"\s*([A-Za-z_][\w.-]*)\s*(\{.*\})?\s*", flags=re.S)
_EXAMPLE = {"integer": 1, "number": 1.5, "string": "x", "boolean": True}  # an example argument by JSON type
FINISH = bracket_tool("finish", "Give your final answer; this ends the episode.", "answer", "The answer.")


class MCPConnection:
    """One MCP server process and its client session on a background event loop, callable from plain code."""

    def __init__(self, command: tuple[str, ...], timeout_s: float):
        from mcp import Client, StdioServerParameters  # the `agents` extra, loaded only by this environment
        from mcp.client.stdio import stdio_client

        self.command, self.timeout_s = command, timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ragen2-mcp", daemon=True)
        self._thread.start()
        self._closing: asyncio.Event | None = None
        self._client = None
        ready: asyncio.Future = self._loop.create_future()
        errlog = open(os.devnull, "w")  # the server's own log lines (every call, at INFO) would flood the run's

        async def session() -> None:
            self._closing = asyncio.Event()
            params = StdioServerParameters(command=command[0], args=list(command[1:]))
            try:
                async with Client(stdio_client(params, errlog=errlog)) as client:
                    self._client = client
                    ready.set_result((await client.list_tools()).tools)
                    await self._closing.wait()
            except Exception as e:
                if not ready.done():
                    ready.set_exception(e)
            finally:
                errlog.close()

        self._session = asyncio.run_coroutine_threadsafe(session(), self._loop)
        try:
            self.tools = asyncio.run_coroutine_threadsafe(asyncio.wait_for(ready, timeout_s), self._loop).result()
        except Exception as e:
            self.close()
            while isinstance(e, BaseExceptionGroup) and e.exceptions:  # anyio's task groups wrap the cause
                e = e.exceptions[0]
            raise ConfigError(f"command={list(command)}: the MCP server did not start over stdio "
                              f"({type(e).__name__}: {e}); run the command by hand to see why") from e

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """(the result's text, whether the server reported an error) of one tool call."""
        result = asyncio.run_coroutine_threadsafe(self._client.call_tool(name, arguments), self._loop).result(
            self.timeout_s)
        text = "\n".join(part.text for part in result.content if getattr(part, "text", None) is not None)
        return text, bool(result.is_error)

    def close(self) -> None:
        if self._closing is not None:
            self._loop.call_soon_threadsafe(self._closing.set)
        try:
            self._session.result(self.timeout_s)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(self.timeout_s)


_connections: dict[tuple[str, ...], MCPConnection] = {}
_connections_lock = threading.Lock()


def connection(command: tuple[str, ...], timeout_s: float) -> MCPConnection:
    """The shared connection to the server `command` starts, started on first use."""
    with _connections_lock:
        if command not in _connections:
            _connections[command] = MCPConnection(command, timeout_s)
        return _connections[command]


@atexit.register
def _close_connections() -> None:
    for conn in _connections.values():
        try:
            conn.close()
        except Exception:  # the process is ending: a server that will not stop is killed with it
            pass


def calculator_tasks(n: int = 200) -> list[dict[str, Any]]:
    """The default tasks: `a * b + c`, which takes the calculator's two tools in order (a fixed list, so a
    seed always gives the same task)."""
    rng = random.Random(0)
    tasks = []
    for _ in range(n):
        a, b, c = rng.randint(2, 30), rng.randint(2, 30), rng.randint(1, 99)
        tasks.append({"prompt": f"Compute {a} * {b} + {c}.", "answer": str(a * b + c),
                      "solution": [f'multiply {{"a": {a}, "b": {b}}}', f'add {{"a": {a * b}, "b": {c}}}',
                                   f'finish {{"answer": "{a * b + c}"}}']})
    return tasks


def exact_match(task: dict[str, Any], answer: str) -> float:
    """1.0 when the answer equals the task's `answer` (case, surrounding spaces and a final period ignored)."""
    norm = lambda text: str(text).strip().rstrip(".").strip().lower()  # noqa: E731
    return float(norm(answer) == norm(task["answer"]))


def make(name: str, command: list[str] | None = None, **cfg: Any) -> MCPEnv:
    """`mcp:NAME`: the server `command` starts; `mcp:calculator` may leave it out."""
    if command is None and name != "calculator":
        raise ConfigError(f"mcp:{name} needs the command that starts its server over stdio: env.kwargs.command="
                          "[program, arg, ...]; mcp:calculator is the built-in example")
    return MCPEnv(command or list(CALCULATOR), **cfg)


class MCPEnv(TextEnv):
    """Solve a task with the tools of an MCP server; the final answer is scored by a checker.

    ## Description
    The server (`command`, started over stdio; for `mcp:calculator` a calculator with `add`
    and `multiply`, ragen2.envs.external.mcp_calculator) offers its tools; `finish(answer)` is added to
    them. Each reset picks a task: a record of `tasks` (.jsonl, .json or .parquet with
    `prompt` and `answer`, and optionally `solution`, a list of actions that solve it), or
    by default one of 200 arithmetic tasks `a * b + c`. `solve()` returns the task's
    `solution` from its current state, None when the task has none.

    ## Actions
    A tool name followed by its arguments as a JSON object, e.g. `add {"a": 1, "b": 2}` or
    `finish {"answer": "3"}`. An unknown tool, or arguments that are not a JSON object, is
    an invalid action. With `rollout.tool_calls=true` the tools are called in the policy's
    native format instead (their JSON schemas come from the server).

    ## Observation
    `Task: ...`; after a tool call, the task and the tool's result text (`add returned: 3`,
    or the server's error message); after `finish`, the answer given and the reward.

    ## Rewards
    Tool calls earn 0. `finish` earns the checker's score of the answer: by default 1 for an
    exact match with the task's `answer` (case, spaces and a final period ignored), else 0;
    `checker="FILE.py:FUNCTION"`, FUNCTION(task, answer) -> float, scores it otherwise.

    ## Episode end
    Terminated by `finish`; truncated after `max_actions` valid actions without one.

    ## Info
    - `action_is_valid` (bool): the action names a tool and its arguments are a JSON object.
    - `success` (bool): a `finish` answer scored at least 1.
    - `tool_error` (bool): the server reported an error for this call (bad arguments, a failing tool).
    """

    info_keys: ClassVar[frozenset[str]] = frozenset({"action_is_valid", "success", "tool_error"})

    def __init__(self, command: list[str], tasks: str | None = None, checker: str | None = None,
                 max_actions: int = 5, timeout_s: float = 60.0) -> None:
        if not isinstance(max_actions, int) or max_actions < 1:
            raise ConfigError(f"max_actions={max_actions!r} is not allowed: use an integer >= 1")
        if not isinstance(command, (list, tuple)) or not command or not all(isinstance(c, str) for c in command):
            raise ConfigError(f"command={command!r} must be a non-empty list of strings: the program and its arguments")
        self.max_actions = max_actions
        self.tasks = _load_tasks(tasks) if tasks else calculator_tasks()
        self.checker: Callable[[dict, str], float] = exact_match
        if checker:
            from ragen2.entrypoint import load_entrypoint

            self.checker = load_entrypoint(checker, "env.kwargs.checker", ("task", "answer"))
        self.server = connection(tuple(command), timeout_s)
        self.tools = tuple(_schema(tool) for tool in self.server.tools) + (FINISH,)
        self._names = frozenset(t["function"]["name"] for t in self.tools)
        self._examples = examples = [f"{t['function']['name']} {json.dumps(_example(t))}" for t in self.tools]
        listing = "\n".join(f"- {t['function']['name']} {json.dumps(_example(t))}: {t['function']['description']}"
                            for t in self.tools)
        self.instruction = (
            "You are solving a task with the tools of a server.\n"
            f"Actions: a tool name followed by its arguments as a JSON object. The tools, each with example "
            f"arguments:\n{listing}\n"
            "Rewards: tool calls earn 0; finish earns 1 for the right answer and ends the episode.\n"
            f"Answer as <think>...</think><answer>{examples[0]} || {examples[-1]}</answer>: one or more actions "
            "separated by ||."
        )
        self.tool_instruction = (
            "You are solving a task with the tools of a server. Call finish with your final answer; it earns 1 "
            "when the answer is right and ends the episode.\n"
            "Think inside <think>...</think>, then call one or more tools."
        )
        self._task: dict[str, Any] | None = None
        self._taken, self._done, self._last, self._history = 0, False, "", []

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        gym.Env.reset(self, seed=seed)
        self._task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        self._taken, self._done, self._history = 0, False, []
        self._last = f"Task: {self._task['prompt']}"
        return self._last, {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._task is None or self._done:
            raise RuntimeError("step() needs a running episode: call reset() first")
        info = {"action_is_valid": False, "success": False, "tool_error": False}
        call = _parse_action(str(action), self._names)
        if call is None:
            return self._last, 0.0, False, False, info
        name, arguments = call
        info["action_is_valid"] = True
        self._taken += 1
        self._history.append(str(action).strip())
        if name == "finish":
            answer = str(arguments.get("answer", ""))
            reward = float(self.checker(self._task, answer))
            info["success"] = reward >= 1
            self._done = True
            self._last = f"Task: {self._task['prompt']}\nYou answered {answer!r}: reward {reward:g}."
            return self._last, reward, True, False, info
        text, error = self.server.call(name, arguments)
        info["tool_error"] = error
        self._last = f"Task: {self._task['prompt']}\n{name} returned: {text}"
        truncated = self._taken >= self.max_actions
        self._done = truncated
        return self._last, 0.0, False, truncated, info

    def valid_actions(self) -> list[str]:
        """One example call per tool, as the instruction shows them (the arguments are open-ended)."""
        return list(self._examples)

    def solve(self) -> list[str] | None:
        """The task's `solution`, minus the actions this episode already took of it; None without one."""
        if self._task is None or "solution" not in self._task:
            return None
        solution = list(self._task["solution"])
        taken = len(self._history) if self._history == solution[: len(self._history)] else 0
        return solution[taken:] if taken < len(solution) else None

    def tool_action(self, name: str, arguments: dict[str, Any]) -> str | None:
        return f"{name} {json.dumps(arguments)}" if name in self._names else None


def _schema(tool: Any) -> dict[str, Any]:
    """An MCP tool as an OpenAI function schema, the shape chat templates render."""
    return {"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                             "parameters": tool.input_schema or {"type": "object", "properties": {}}}}


def _example(tool: dict[str, Any]) -> dict[str, Any]:
    """Example arguments of a tool: each required parameter with a value of its JSON type."""
    parameters = tool["function"]["parameters"]
    properties = parameters.get("properties", {})
    return {name: _EXAMPLE.get(properties.get(name, {}).get("type"), "x") for name in parameters.get("required", [])}


def _parse_action(text: str, names: frozenset[str]) -> tuple[str, dict[str, Any]] | None:
    match = _ACTION.fullmatch(text)
    if match is None or match.group(1) not in names:
        return None
    try:
        arguments = json.loads(match.group(2)) if match.group(2) else {}
    except json.JSONDecodeError:
        return None
    return (match.group(1), arguments) if isinstance(arguments, dict) else None


def _load_tasks(path: str) -> list[dict[str, Any]]:
    tasks = []
    for where, record in read_records(path):
        require_fields(path, where, record, ("prompt", "answer"), "task")
        tasks.append(record)
    if not tasks:
        raise ConfigError(f"tasks={path} holds no tasks")
    return tasks
