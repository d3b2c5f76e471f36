"""Solver demonstrations for the warm start: one oracle per environment, and episodes played with it.

Each oracle looks at a live environment and writes this turn's response the way the policy
is asked to: `reasoning</think><answer>A1 || A2</answer>` (the prompt already ends with
`<think>`). The reasoning restates the state's coordinates and names what decides the move
(the push to make, the direction of the goal, the hole to avoid); the answer is the start of
a shortest solution. The warm-started policy's reasoning therefore depends on its input from
the first RL step (DESIGN §5): the diagnostics watch a policy that can collapse, not one
that never reasoned.

Two choices make the demonstrations learnable by a model of a few hundred thousand
parameters within minutes:
- The reasoning opens with the observation's coordinates line, verbatim. Copying it is the
  first thing the model learns; after that every decision depends on numbers at fixed
  places in its own reasoning rather than on reading the grid.
- Among equally short solutions the oracle takes the one that prefers moves in the order
  Up, Down, Left, Right (`PRIORITY`), so where walls and holes allow, the moves follow from
  the stated cells by one fixed rule ("rows first") instead of a solver's tie-breaking.

Bandit is the exception on purpose: its oracle picks an arm uniformly at random, so the warm
start leaves the choice near 50/50 and RL has the high-EV arm left to discover. A pretrained
base is taught the reading of the names instead (`PRETRAINED_ORACLES`): its tokens mean
something, so the held-out names test whether the reading carries over.

The other environments (Countdown, math, SearchQA, code, WebShop) act as their own `solve()`
says from the current state (`solver_demo`); the reasoning restates what the answer depends
on (the numbers and the target, the question, the task) or, for the multi-turn ones, says why
this action comes next (the title to look up, the option the instruction asks for).

Corridor's oracle reads the exit's colour off the sign in its reasoning of the first turn and again at
the doors, and says nothing of it in between, so the colour must come from the history or from a
memory note. Its note oracle (`NOTE_ORACLES`) writes the note a rollout under `rollout.memory=summary`
is asked for: the colour, in the sign's words. `DemoEpisode.conversation` with memory settings lays
the notes out where the rollout would ask for them.

Environments that declare tools also have tool-calling demonstrations (`play_demo(..., tool_calls=True)`):
the same oracle's reasoning, then its action as a native call, `reasoning</think><tool_call>{json}</tool_call>`,
with the tool instruction and tool schemas as the system prompt and each result returned as a `tool`
message, as `rollout.tool_calls=true` lays an episode out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np
from transformers import PreTrainedTokenizerBase

from ragen2 import envs
from ragen2.agent.conversation import Conversation, MemorySettings
from ragen2.agent.parsing import ResponseFormat, parse_response
from ragen2.agent.tool_calls import ToolCall, parse_tool_turn, render_tool_calls
from ragen2.envs.bandit import BanditEnv
from ragen2.envs.base import TextEnv
from ragen2.envs.codeexec import CodeEnv
from ragen2.envs.corridor import CorridorEnv
from ragen2.envs.countdown import CountdownEnv
from ragen2.envs.external.base import ExternalEnv
from ragen2.envs.frozenlake import FrozenLakeEnv
from ragen2.envs.mathqa import MathEnv
from ragen2.envs.searchqa import SearchQAEnv
from ragen2.envs.sokoban import MOVES, Room, SokobanEnv
from ragen2.envs.webshop import BACK_TO_SEARCH, BUY_NOW, NEXT_PAGE, PREV_PAGE, WebShopEnv, parse_action
from ragen2.errors import ConfigError
from ragen2.tags import ACTION_SEPARATOR, ANSWER_CLOSE, ANSWER_OPEN, MEMORY_CLOSE, THINK_CLOSE

Cell = tuple[int, int]  # (row, col), as the environments use
# This turn's response for a live env, from (env, max_actions, rng); None when the state leaves the
# oracle nothing to demonstrate, which ends the episode.
Oracle = Callable[[TextEnv, int, np.random.Generator], str | None]

# Tie-break among equally short solutions: rows before columns.
PRIORITY = ("Up", "Down", "Left", "Right")


def canonical_path(
    start: Hashable, step: Callable[[Hashable, str], Hashable | None], is_goal: Callable[[Hashable], bool]
) -> list[str] | None:
    """The shortest action list from `start` that takes the first optimal action in PRIORITY order at every state.

    `step(state, action)` returns the next state, or None when the action must not be taken
    (it ends the episode in failure); an action that leaves the state unchanged is ignored.
    Explores every reachable state once, then walks back distances from the goal states:
    small rooms and lakes have a few hundred states.
    """
    edges: dict[Hashable, list[tuple[str, Hashable]]] = {}
    order, seen = [start], {start}
    for state in order:  # breadth-first; `order` grows while it is walked
        edges[state] = []
        if is_goal(state):
            continue  # the episode ends here
        for action in PRIORITY:
            nxt = step(state, action)
            if nxt is None or nxt == state:
                continue
            edges[state].append((action, nxt))
            if nxt not in seen:
                seen.add(nxt)
                order.append(nxt)
    parents: dict[Hashable, list[Hashable]] = {s: [] for s in order}
    for state, outs in edges.items():
        for _, nxt in outs:
            parents[nxt].append(state)
    dist = {s: 0 for s in order if is_goal(s)}
    queue = deque(dist)
    while queue:
        state = queue.popleft()
        for parent in parents[state]:
            if parent not in dist:
                dist[parent] = dist[state] + 1
                queue.append(parent)
    if start not in dist:
        return None
    path, state = [], start
    while dist[state] > 0:
        action, state = next((a, s) for a, s in edges[state] if dist.get(s) == dist[state] - 1)
        path.append(action)
    return path


def _fmt(cell: Cell) -> str:
    """A cell in the observations' own words."""
    return f"(row {cell[0]}, col {cell[1]})"


def _shift(cell: Cell, move: str, sign: int = 1) -> Cell:
    dr, dc = MOVES[move]
    return (cell[0] + sign * dr, cell[1] + sign * dc)


def _response(reasoning: str, actions: list[str]) -> str:
    return f"{reasoning}{THINK_CLOSE}{ANSWER_OPEN}{f' {ACTION_SEPARATOR} '.join(actions)}{ANSWER_CLOSE}"


def _require(path: list[str] | None, env: TextEnv) -> list[str]:
    if not path:
        raise ValueError(f"{type(env).__name__} has no solution from its current state; demonstrations need a solvable state")
    return path


def sokoban_plan(env: SokobanEnv) -> list[str] | None:
    """The canonical shortest solution from the env's current state (see `canonical_path`)."""
    room = Room(env.dim_room, frozenset(env.walls), frozenset(env.targets), frozenset(env.boxes), env.player)
    return canonical_path(
        (room.player, room.boxes),
        lambda state, action: room.move(*state, MOVES[action]),
        lambda state: state[1] <= room.targets,
    )


def sokoban_demo(env: SokobanEnv, max_actions: int, rng: np.random.Generator) -> str:
    """Restate the positions, name the push that the solution makes next, and the walk to it.

    E.g. `Player at (row 2, col 2); box at (row 3, col 3); target at (row 4, col 3). Push it
    Down from (row 2, col 3). Row 2 to 2: stay. Col 2 to 3: right.` The first sentence is the
    observation's coordinates line (for one box, verbatim). The push cell is the box's far
    side; the walk there is spelled out axis by axis (`_heading`), so the first moves follow
    from adjacent numbers.
    """
    plan = _require(sokoban_plan(env), env)
    player, boxes = env.player, set(env.boxes)
    for move in plan:  # a shortest plan never bumps into a wall, so every step walks or pushes
        nxt = _shift(player, move)
        if nxt in boxes:
            box, push = nxt, move
            break
        player = nxt
    else:  # unreachable: a Sokoban solution pushes at least once
        raise AssertionError(f"plan {plan} never pushes a box")
    return _response(_sokoban_reasoning(env, box, push, "Push"), plan[:max_actions])


def _sokoban_reasoning(env: SokobanEnv, box: Cell, push: str, verb: str) -> str:
    """The positions, then `VERB it PUSH from STAND.` and the walk to STAND (the cell behind the box)."""
    target = min(env.targets, key=lambda t: (abs(t[0] - box[0]) + abs(t[1] - box[1]), t))
    stand = _shift(box, push, -1)
    return (
        f"Player at {_fmt(env.player)}; box at {_fmt(box)}; target at {_fmt(target)}. "
        f"{verb} it {push} from {_fmt(stand)}. {_heading(env.player, stand)}"
    )


def sokoban_wedge(env: SokobanEnv) -> tuple[Cell, str, list[str]] | None:
    """A push after which the room has no solution, as (box, direction, walk to it and the push); None if none exists.

    The first such push in (box, PRIORITY) order whose cell behind the box the player can reach
    without moving a box: the beginner's mistake of pushing a box against a wall it cannot leave.
    """
    room = Room(env.dim_room, frozenset(env.walls), frozenset(env.targets), frozenset(env.boxes), env.player)

    def walk(cell: Cell, move: str) -> Cell | None:
        nxt = _shift(cell, move)
        return None if nxt in room.boxes else cell if room.blocked(nxt) else nxt

    for box in sorted(room.boxes):
        for push in PRIORITY:
            stand, beyond = _shift(box, push, -1), _shift(box, push)
            if room.blocked(stand) or stand in room.boxes or room.blocked(beyond) or beyond in room.boxes:
                continue
            after = (box, room.boxes - {box} | {beyond})
            solution = canonical_path(after, lambda state, a: room.move(*state, MOVES[a]), lambda state: state[1] <= room.targets)
            if solution is not None:
                continue  # still solvable
            path = [] if stand == env.player else canonical_path(env.player, walk, lambda cell: cell == stand)
            if path is not None:
                return box, push, path + [push]
    return None


def sokoban_novice(probability: float) -> Oracle:
    """The Sokoban oracle, replaced in each turn with `probability` by a novice who wedges the box (`sokoban_wedge`).

    The novice's reasoning has the solver's form with `Wedge` where the solver writes `Push`: one
    word, right after the positions, decides whether the episode can still be won. A policy
    warm-started on both teachers makes that choice about as often as they did, and RL can learn
    from reward alone which to follow (the default run, docs/benchmarks.md), as it learns the
    better Bandit arm. After a wedge the room has no solution and the demonstration ends.
    """

    def oracle(env: SokobanEnv, max_actions: int, rng: np.random.Generator) -> str | None:
        if sokoban_plan(env) is None:
            return None
        wedge = sokoban_wedge(env) if rng.random() < probability else None
        if wedge is None:
            return sokoban_demo(env, max_actions, rng)
        box, push, actions = wedge
        return _response(_sokoban_reasoning(env, box, push, "Wedge"), actions[:max_actions])

    return oracle


def frozenlake_plan(env: FrozenLakeEnv) -> list[str] | None:
    """The canonical shortest hole-free path from the player to the goal (see `canonical_path`)."""
    holes, size = set(env.holes), env.size

    def step(cell: Cell, action: str) -> Cell | None:
        nxt = _shift(cell, action)
        if not (0 <= nxt[0] < size and 0 <= nxt[1] < size):
            return cell
        return None if nxt in holes else nxt

    return canonical_path(env.player, step, lambda cell: cell == env.goal)


def _heading(start: Cell, end: Cell) -> str:
    """How to get from `start` to `end`, one axis at a time, each decided by the two numbers just before it.

    E.g. `Row 3 to 1: up. Col 0 to 2: right.` A tiny model copies the numbers out of the
    stated cells, then compares two adjacent digits: far easier than comparing two cells
    named many tokens apart.
    """
    rows = "down" if end[0] > start[0] else "up" if end[0] < start[0] else "stay"
    cols = "right" if end[1] > start[1] else "left" if end[1] < start[1] else "stay"
    return f"Row {start[0]} to {end[0]}: {rows}. Col {start[1]} to {end[1]}: {cols}."


def frozenlake_demo(env: FrozenLakeEnv, max_actions: int, rng: np.random.Generator) -> str:
    """Restate the positions, say which way the goal lies and which hole, if any, turns the path.

    E.g. `Player at (row 3, col 0); goal at (row 1, col 2). Row 3 to 1: up. Col 0 to 2: right.
    I avoid the hole at (row 2, col 0).` A hole is named when, on this turn's moves, the first
    move toward the goal in PRIORITY order would fall into it: the reason the path turns.
    """
    plan = _require(frozenlake_plan(env), env)
    goal, holes, cell = env.goal, set(env.holes), env.player

    def distance(c: Cell) -> int:
        return abs(goal[0] - c[0]) + abs(goal[1] - c[1])

    in_the_way = None
    for move in plan[:max_actions]:
        greedy = next(_shift(cell, m) for m in PRIORITY if distance(_shift(cell, m)) < distance(cell))
        if greedy in holes:
            in_the_way = greedy
            break
        cell = _shift(cell, move)
    avoid = f"I avoid the hole at {_fmt(in_the_way)}." if in_the_way else "No hole is in the way."
    reasoning = f"Player at {_fmt(env.player)}; goal at {_fmt(goal)}. {_heading(env.player, goal)} {avoid}"
    return _response(reasoning, plan[:max_actions])


def bandit_demo(env: BanditEnv, max_actions: int, rng: np.random.Generator) -> str:
    """Name both arms and pull one uniformly at random: the warm start must not know the better arm."""
    first, second = env.arm_names
    arm = (first, second)[int(rng.integers(2))]
    return _response(f"Arms: {first}, {second}. I try {arm}.", [arm])


def bandit_reading_demo(env: BanditEnv, max_actions: int, rng: np.random.Generator) -> str:
    """Read the names and pull the risky arm, whose expected value is the higher (0.25 against 0.1).

    For a pretrained model, whose tokens carry meaning: the training names teach the reading,
    and the test split's unseen names check that it carries over. The tiny policy's tokens
    mean nothing, so it is taught with `bandit_demo` and left to find the arm by RL.
    """
    high = env.high_arm
    low = next(name for name in env.arm_names if name != high)
    reasoning = (
        f"{high} sounds risky and {low} sounds safe. "
        f"Risky pays 1.0 x 0.25 = 0.25 on average, safe pays 0.1, so I pull {high}."
    )
    return _response(reasoning, [high])


def solver_demo(env: TextEnv, max_actions: int, explain: Callable[[TextEnv, str], str]) -> str:
    """The next `max_actions` actions of `env.solve()` from the current state, with `explain(env, first_action)` as reasoning."""
    plan = _require(env.solve(), env)[:max_actions]
    return _response(explain(env, plan[0]), plan)


def _clip(text: str, limit: int = 80) -> str:
    """`text` on one line, cut at a word boundary to at most `limit` characters (`...` marks a cut)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rsplit(" ", 1)[0] + "..."


def _argument(action: str) -> str:
    """The text inside `verb[...]`."""
    return action[action.index("[") + 1 : action.rindex("]")]


def countdown_demo(env: CountdownEnv, max_actions: int, rng: np.random.Generator) -> str:
    """Restate the problem as shown, then the equation: `Numbers: 9, 5. Target: 14. 9 + 5 = 14.`

    The restatement repeats the observation's exact words, so copying a number is matching the
    word before it in the prompt. When the sum of all the numbers hits the target (about 4 in 10 small problems), that sum is
    the demonstrated equation rather than the solver's shortest one: one pattern that holds across
    many problems is something a small model can copy, where the solver's choice among equal
    solutions looks arbitrary to it.
    """
    numbers, target = env.numbers, env.target
    equation = " + ".join(map(str, numbers)) if sum(numbers) == target else _require(env.solve(), env)[0]
    return _response(f"Numbers: {', '.join(map(str, numbers))}. Target: {target}. {equation} = {target}.", [equation])


def math_demo(env: MathEnv, max_actions: int, rng: np.random.Generator) -> str:
    """Restate the question, then give the result: `Calculate -5 + -9. That is -14.`"""
    return solver_demo(env, max_actions, lambda env, answer: f"{_clip(env.question)} That is {answer}.")


def searchqa_demo(env: SearchQAEnv, max_actions: int, rng: np.random.Generator) -> str:
    """Restate the question, then name the document to look up or the answer the results gave.

    E.g. `Who kept the lighthouse at the southern tip of Ost? I look up Cape Dunmore.`, then, with
    the results shown, `... The results say Hob Tennant.`
    """

    def explain(env: SearchQAEnv, action: str) -> str:
        verb = "The results say" if action.lower().startswith("finish") else "I look up"
        return f"{_clip(env.question.question)} {verb} {_argument(action)}."

    return solver_demo(env, max_actions, explain)


def code_demo(env: CodeEnv, max_actions: int, rng: np.random.Generator) -> str:
    """Restate the task and say how the program is called; answer with the reference program in a fenced block.

    E.g. `Task: Write reverse_words(s) returning the words of s (split on spaces)... I define reverse_words.`
    """
    problem = env.problem
    how = f"I define {problem.fn_name}." if problem.fn_name else "I read standard input and print the answer."
    (program,) = _require(env.solve(), env)
    reasoning = f"Task: {_clip(problem.statement.splitlines()[0])} {how}"
    return _response(reasoning, [f"```python\n{program.rstrip()}\n```"])


def webshop_demo(env: WebShopEnv, max_actions: int, rng: np.random.Generator) -> str:
    """Say why the next action of the solution is taken: the words searched, the product that matches, the option asked for.

    E.g. `I need insulated bpa free water bottle 12 oz white.`, then `The insulated bpa free
    water bottle is B0KPM1QJHP.`, `The instruction asks for 12 oz.`, `Every option is chosen;
    I buy it.`
    """

    def explain(env: WebShopEnv, action: str) -> str:
        verb, argument = parse_action(action)
        goal = env.goal
        if verb == "search":
            return f"I need {argument}."
        if argument == NEXT_PAGE:
            return "The product is on a later page."
        if argument in (PREV_PAGE, BACK_TO_SEARCH):
            return "This page does not have the product; I go back."
        if argument == BUY_NOW:
            return "Every option is chosen; I buy it."
        if argument == goal.asin:
            return f"The {' '.join(goal.attributes)} {goal.type.name} is {argument}."
        return f"The instruction asks for {argument}."

    return solver_demo(env, max_actions, explain)


def external_demo(env: ExternalEnv, max_actions: int, rng: np.random.Generator) -> str:
    """Another suite's game, played by its solver or walkthrough; the reasoning states the plan.

    Nothing is known about the game's text, so the reasoning cannot restate a state in a fixed
    form as the built-in oracles do. The remaining plan is the next best thing: it is a
    function of the state in front of the policy, so reasoning that copies it depends on the
    input, and the answer is its first `max_actions` moves.
    """
    plan = _require(env.solve(), env)
    shown = ", ".join(plan[:8]) + (", ..." if len(plan) > 8 else "")
    return _response(f"Plan: {shown}.", plan[:max_actions])


def corridor_demo(env: CorridorEnv, max_actions: int, rng: np.random.Generator) -> str:
    """Forward to the doors, then open the exit; the colour is stated where the sign is read and where it is used."""
    where = f"Room {env.room + 1} of {env.rooms}"
    if env.room == env.rooms - 1:
        return _response(corridor_note(env), [f"Open {env.exit}"])
    if env.room == 0:
        return _response(f"{corridor_note(env)} {where}: go on.", ["Forward"])
    return _response(f"{where}: go on.", ["Forward"])


def corridor_note(env: CorridorEnv) -> str:
    """What a memory note must keep in the corridor: the exit's colour, in the sign's words."""
    return f"The exit is the {env.exit} door."


ORACLES: dict[type[TextEnv], Oracle] = {
    SokobanEnv: sokoban_demo,
    FrozenLakeEnv: frozenlake_demo,
    BanditEnv: bandit_demo,
    CountdownEnv: countdown_demo,
    MathEnv: math_demo,
    SearchQAEnv: searchqa_demo,
    CodeEnv: code_demo,
    WebShopEnv: webshop_demo,
    CorridorEnv: corridor_demo,
}
# The note an oracle writes when a rollout under rollout.memory=summary asks for one, from the live env.
NOTE_ORACLES: dict[type[TextEnv], Callable[[TextEnv], str]] = {CorridorEnv: corridor_note}
# A pretrained base reads the Bandit's names (see `bandit_reading_demo`); the rest is shared.
PRETRAINED_ORACLES: dict[type[TextEnv], Oracle] = ORACLES | {BanditEnv: bandit_reading_demo}


def demo_response(env: TextEnv, max_actions: int, rng: np.random.Generator, oracles: dict[type[TextEnv], Oracle] = ORACLES) -> str | None:
    """This turn's demonstration, `reasoning</think><answer>A1 || A2</answer>`, for a live env (None: nothing to show).

    `max_actions` caps the actions per turn (the rollout's `max_actions_per_turn`); `rng`
    draws the random choices some oracles make (the Bandit arm); `oracles` maps environment
    classes to their oracle (another suite's games use `external_demo`).
    """
    oracle = oracles.get(type(env)) or (external_demo if isinstance(env, ExternalEnv) else None)
    if oracle is None:
        supported = ", ".join(sorted(cls.__name__ for cls in oracles))
        raise ConfigError(f"no demonstration oracle for {type(env).__name__}; oracles exist for {supported}")
    return oracle(env, max_actions, rng)


def tool_call(env: TextEnv, action: str) -> ToolCall:
    """The call of one of `env.tools` that stands for `action` (`env.action_call`: `search[x]` -> search(query=x))."""
    call = env.action_call(action)
    if call is None:
        names = ", ".join(tool["function"]["name"] for tool in env.tools) or "none"
        raise ConfigError(f"{type(env).__name__}: no tool call stands for the action {action!r} (its tools: {names})")
    return ToolCall(*call)


def tool_response(env: TextEnv, response: str, max_actions: int) -> str:
    """An oracle's `reasoning</think><answer>A</answer>` as native calls: `reasoning</think><tool_call>..</tool_call>`."""
    parsed = parse_response(response, max_actions)
    return f"{parsed.reasoning}{THINK_CLOSE}" + render_tool_calls([tool_call(env, a) for a in parsed.actions])


@dataclass
class DemoTurn:
    observation: str  # the state text shown this turn
    actions_left: int  # the action budget shown with it
    response: str  # the oracle's response (what follows `<think>`)
    tool_results: list[str] | None = None  # tool calling: the previous turn's results, shown in place of the state
    note: str | None = None  # the memory note the oracle writes if asked before this turn (NOTE_ORACLES)


@dataclass
class DemoEpisode:
    """One oracle episode as text: replayable into any tokenizer's `Conversation`."""

    env_name: str
    seed: int
    system_prompt: str
    turns: list[DemoTurn] = field(default_factory=list)
    success: bool = False
    tools: list[dict] | None = None  # tool calling: the environment's tool schemas

    def conversation(
        self, tokenizer: PreTrainedTokenizerBase, context_turns: int | None = None, memory: MemorySettings | None = None,
    ) -> Conversation:
        """The episode in the agent layer's token layout, exactly as a rollout of it would be stored; with `memory`,
        the oracle's note wherever the rollout would ask for one."""
        conv = Conversation(tokenizer, self.system_prompt, context_turns, tools=self.tools, memory=memory)
        for turn in self.turns:
            conv.add_observation(turn.observation, turn.actions_left, turn.tool_results)
            if conv.writing_note:
                if turn.note is None:
                    raise ConfigError(f"{self.env_name} has no note oracle, so its demonstrations cannot be laid out "
                                      "with memory notes")
                conv.add_response_text(turn.note + MEMORY_CLOSE)
            conv.add_response_text(turn.response)
        return conv


def play_demo(
    env_name: str, env_kwargs: dict, seed: int, max_turns: int, max_actions_per_turn: int, rng: np.random.Generator,
    oracles: dict[type[TextEnv], Oracle] = ORACLES, tool_calls: bool = False,
) -> DemoEpisode:
    """Play one episode with the oracle, following the rollout loop's rules.

    As in `ragen2.agent.rollout`: the budget shown starts at `env.max_actions` and falls by
    one per executed action; the episode ends on termination, truncation or after `max_turns`.
    With `tool_calls` the actions are native tool calls (`tool_response`), parsed back as the
    rollout parses them, and each executed call's result is the next turn's `tool` message.
    """
    env = envs.make(env_name, **env_kwargs)
    observation, _ = env.reset(seed=seed)
    if tool_calls and not env.tools:
        raise ConfigError(f"{env_name} declares no tools, so it has no tool-calling demonstrations")
    episode = DemoEpisode(env_name=env_name, seed=seed, system_prompt=env.tool_instruction if tool_calls else env.instruction,
                          tools=list(env.tools) if tool_calls else None)
    actions_left, results = env.max_actions, None
    for _ in range(max_turns):
        response = demo_response(env, max_actions_per_turn, rng, oracles)
        if response is None:
            break
        if tool_calls:
            response = tool_response(env, response, max_actions_per_turn)
            actions = parse_tool_turn(response, ResponseFormat(), max_actions_per_turn, env.tool_action).actions
        else:
            actions = parse_response(response, max_actions_per_turn).actions
        note = NOTE_ORACLES[type(env)](env) if type(env) in NOTE_ORACLES else None
        episode.turns.append(DemoTurn(observation, actions_left, response, results, note))
        done, results = False, [] if tool_calls else None
        for action in actions:
            observation, _, terminated, truncated, info = env.step(action)
            if results is not None:
                results.append(observation)
            actions_left -= 1
            episode.success = bool(info["success"])
            done = terminated or truncated
            if done:
                break
        if done:
            break
    return episode
