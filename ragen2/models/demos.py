"""Solver demonstrations for the warm start: one oracle per environment, and episodes played with it.

Each oracle looks at a live environment and writes this turn's response the way the policy
is asked to: `reasoning</think><answer>A1 || A2</answer>` (the prompt already ends with
`<think>`). The reasoning states facts of the current state (positions, the push or the hole
that decides the move) and the answer is the start of a shortest solution, so the warm-started
policy's reasoning depends on its input from the first RL step (DESIGN §5): the diagnostics
then watch a policy that can collapse, not one that never reasoned.

Bandit is the exception on purpose: its oracle picks an arm uniformly at random, so the warm
start leaves the choice near 50/50 and RL has the high-EV arm left to discover.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ragen2 import envs
from ragen2.agent.conversation import Conversation
from ragen2.agent.parsing import ACTION_SEPARATOR, ANSWER_CLOSE, ANSWER_OPEN, THINK_CLOSE, parse_response
from ragen2.envs.bandit import BanditEnv
from ragen2.envs.base import TextEnv
from ragen2.envs.frozenlake import FrozenLakeEnv
from ragen2.envs.sokoban import MOVES, SokobanEnv
from ragen2.errors import ConfigError

Cell = tuple[int, int]  # (row, col), as the environments use


def _fmt(cell: Cell) -> str:
    """A cell in the observations' own words, so the model copies rather than translates."""
    return f"(row {cell[0]}, col {cell[1]})"


def _shift(cell: Cell, move: str, sign: int = 1) -> Cell:
    dr, dc = MOVES[move]
    return (cell[0] + sign * dr, cell[1] + sign * dc)


def _response(reasoning: str, actions: list[str]) -> str:
    return f"{reasoning}{THINK_CLOSE}{ANSWER_OPEN}{f' {ACTION_SEPARATOR} '.join(actions)}{ANSWER_CLOSE}"


def _solution(env: TextEnv) -> list[str]:
    solution = env.solve()
    if not solution:
        raise ValueError(f"{type(env).__name__} has no solution from its current state; demonstrations need a solvable state")
    return solution


def sokoban_demo(env: SokobanEnv, max_actions: int, rng: np.random.Generator) -> str:
    """Restate the positions, then the push that the shortest solution makes next.

    E.g. `Player at (row 2, col 2); box at (row 3, col 3); target at (row 4, col 3). Push it
    Down from (row 2, col 3).` The first sentence repeats the observation's coordinates line
    (for one box, verbatim): a copy a small model learns early, after which the push and
    the moves depend only on numbers at fixed places in its own reasoning. The push cell is
    the box's far side, so both the walk there and the push follow from the stated cells.
    """
    solution = _solution(env)
    player, boxes = env.player, set(env.boxes)
    for move in solution:  # the solver never wastes a move on a wall, so every step walks or pushes
        nxt = _shift(player, move)
        if nxt in boxes:
            box, push = nxt, move
            break
        player = nxt
    else:  # unreachable: a solution of a Sokoban room pushes at least once
        raise AssertionError(f"solution {solution} never pushes a box")
    target = min(env.targets, key=lambda t: (abs(t[0] - box[0]) + abs(t[1] - box[1]), t))
    reasoning = (
        f"Player at {_fmt(env.player)}; box at {_fmt(box)}; target at {_fmt(target)}. "
        f"Push it {push} from {_fmt(_shift(box, push, -1))}."
    )
    return _response(reasoning, solution[:max_actions])


def frozenlake_demo(env: FrozenLakeEnv, max_actions: int, rng: np.random.Generator) -> str:
    """Restate the positions, say where the goal lies and which hole, if any, the next moves steer around.

    A hole is "in the way" when a move toward the goal from a cell on this turn's path would
    fall into it: the reason the shortest path turns where it does. The first sentence is
    the observation's coordinates line, verbatim (see `sokoban_demo`).
    """
    solution = _solution(env)
    goal, holes, cell = env.goal, set(env.holes), env.player
    vertical = "down" if goal[0] > cell[0] else "up" if goal[0] < cell[0] else ""
    horizontal = "right" if goal[1] > cell[1] else "left" if goal[1] < cell[1] else ""
    direction = " and ".join(d for d in (vertical, horizontal) if d)
    in_the_way = None
    for move in solution[:max_actions]:
        toward = [
            _shift(cell, m) for m in MOVES
            if abs(goal[0] - _shift(cell, m)[0]) + abs(goal[1] - _shift(cell, m)[1])
            < abs(goal[0] - cell[0]) + abs(goal[1] - cell[1])
        ]
        in_the_way = next((h for h in toward if h in holes), None)
        if in_the_way is not None:
            break
        cell = _shift(cell, move)
    avoid = f"I avoid the hole at {_fmt(in_the_way)}." if in_the_way else "No hole is in the way."
    reasoning = f"Player at {_fmt(env.player)}; goal at {_fmt(goal)}. The goal is {direction}. {avoid}"
    return _response(reasoning, solution[:max_actions])


def bandit_demo(env: BanditEnv, max_actions: int, rng: np.random.Generator) -> str:
    """Name both arms and pull one uniformly at random: the warm start must not know the better arm."""
    first, second = env.arm_names
    arm = (first, second)[int(rng.integers(2))]
    return _response(f"Arms: {first}, {second}. I try {arm}.", [arm])


ORACLES: dict[type[TextEnv], Callable[[TextEnv, int, np.random.Generator], str]] = {
    SokobanEnv: sokoban_demo,
    FrozenLakeEnv: frozenlake_demo,
    BanditEnv: bandit_demo,
}


def demo_response(env: TextEnv, max_actions: int, rng: np.random.Generator) -> str:
    """This turn's demonstration, `reasoning</think><answer>A1 || A2</answer>`, for a live env.

    `max_actions` caps the actions per turn (the rollout's `max_actions_per_turn`); `rng`
    draws the random choices some oracles make (the Bandit arm).
    """
    oracle = ORACLES.get(type(env))
    if oracle is None:
        supported = ", ".join(sorted(cls.__name__ for cls in ORACLES))
        raise ConfigError(f"no demonstration oracle for {type(env).__name__}; oracles exist for {supported}")
    return oracle(env, max_actions, rng)


@dataclass
class DemoTurn:
    observation: str  # the state text shown this turn
    actions_left: int  # the action budget shown with it
    response: str  # the oracle's response (what follows `<think>`)


@dataclass
class DemoEpisode:
    """One oracle episode as text: replayable into any tokenizer's `Conversation`."""

    env_name: str
    seed: int
    system_prompt: str
    turns: list[DemoTurn] = field(default_factory=list)
    success: bool = False

    def conversation(self, tokenizer, context_turns: int | None = None) -> Conversation:
        """The episode in the agent layer's token layout, exactly as a rollout of it would be stored."""
        conv = Conversation(tokenizer, self.system_prompt, context_turns)
        for turn in self.turns:
            conv.add_observation(turn.observation, turn.actions_left)
            conv.add_response_text(turn.response)
        return conv


def play_demo(
    env_name: str, env_kwargs: dict, seed: int, max_turns: int, max_actions_per_turn: int, rng: np.random.Generator
) -> DemoEpisode:
    """Play one episode with the oracle, following the rollout loop's rules.

    Same as `ragen2.agent.rollout`: the budget shown starts at `env.max_actions` and falls by
    one per executed action; the episode ends on termination, truncation or after `max_turns`.
    """
    env = envs.make(env_name, **env_kwargs)
    observation, _ = env.reset(seed=seed)
    episode = DemoEpisode(env_name=env_name, seed=seed, system_prompt=env.instruction)
    actions_left = env.max_actions
    for _ in range(max_turns):
        response = demo_response(env, max_actions_per_turn, rng)
        episode.turns.append(DemoTurn(observation, actions_left, response))
        done = False
        for action in parse_response(response, max_actions_per_turn).actions:
            observation, _, terminated, truncated, info = env.step(action)
            actions_left -= 1
            episode.success = bool(info["success"])
            done = terminated or truncated
            if done:
                break
        if done:
            break
    return episode
