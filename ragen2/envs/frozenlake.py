"""FrozenLake: walk across a frozen lake to the goal without falling into a hole (Gymnasium's dynamics)."""

from __future__ import annotations

from collections import deque
from typing import ClassVar

import gymnasium as gym
from gymnasium.envs.toy_text import frozen_lake as gym_frozen_lake

from ragen2.envs import ENVS
from ragen2.envs.base import SEVERAL_ACTIONS_ANSWER, TextEnv
from ragen2.envs.grid import GRID_CONVENTION, INVALID_INFO, MOVES_MEANING, Cell, cell_text, move_name
from ragen2.errors import ConfigError

# Action name -> Gymnasium's action id (LEFT=0, DOWN=1, RIGHT=2, UP=3) and (d_row, d_col).
ACTIONS: dict[str, int] = {"Left": gym_frozen_lake.LEFT, "Down": gym_frozen_lake.DOWN,
                           "Right": gym_frozen_lake.RIGHT, "Up": gym_frozen_lake.UP}
_DELTAS: dict[str, Cell] = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}

FROZEN, HOLE, GOAL, PLAYER, PLAYER_IN_HOLE, PLAYER_ON_GOAL = "_", "O", "G", "P", "X", "√"
_MAX_GENERATION_TRIES = 10_000


def shortest_path(size: int, holes: frozenset[Cell], start: Cell, goal: Cell) -> list[str] | None:
    """Breadth-first search avoiding holes; the action names of a shortest path, or None."""
    parent: dict[Cell, tuple[Cell, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            path = []
            while parent[cell] is not None:
                cell, name = parent[cell]
                path.append(name)
            return path[::-1]
        for name, (dr, dc) in _DELTAS.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in holes and nxt not in parent:
                parent[nxt] = (cell, name)
                queue.append(nxt)
    return None


@ENVS.register("frozenlake")
class FrozenLakeEnv(TextEnv):
    """Reach the goal on a random frozen lake without falling into a hole.

    ## Description
    The hole layout comes from Gymnasium's `generate_random_map(size, p)`
    (each cell frozen with probability `p`) and the moves from Gymnasium's
    `FrozenLakeEnv`. With `random_start_goal=True` (default, as in RAGEN) the
    start and the goal are then placed on two random frozen cells; with False
    they stay in Gymnasium's corners (start top-left, goal bottom-right). A map
    is kept only when the goal is reachable from the start in at most
    `max_solution_length` moves (default: `max_actions`). `solve()` returns a
    shortest hole-free path for the non-slippery lake.

    ## Actions
    `Left`, `Down`, `Right`, `Up` (case and surrounding whitespace ignored). Up
    decreases the row, Left decreases the column. Walking off the grid is a
    valid action that leaves the player in place. With `is_slippery=True` the
    player moves in the intended direction with probability `success_rate`, and
    otherwise to one of the two perpendicular directions (equally likely).

    ## Observation
    The grid, one row per line: `_` frozen, `O` hole, `G` goal, `P` player,
    `X` player in a hole, `√` player on the goal. Then one line of 0-indexed
    coordinates: `Player at (row 0, col 1); goal at (row 3, col 2).`

    ## Rewards
    1 for reaching the goal, 0 otherwise (also for falling into a hole and for
    invalid actions).

    ## Episode end
    Terminated on reaching the goal (success) or falling into a hole. Truncated
    after `max_actions` valid actions. Invalid actions do not count.

    ## Info
    - `action_is_valid` (bool): the text named an action.
    - `action_is_effective` (bool): the player moved.
    - `success` (bool): the player is on the goal.
    """

    instruction: ClassVar[str] = (
        "You are walking on a frozen lake. Reach the goal without falling into a hole.\n"
        "Symbols: _ frozen ice, O hole, G goal, P player, X player in a hole, √ player on the goal.\n"
        + GRID_CONVENTION
        + "Actions: Left, Down, Right, Up. "
        + MOVES_MEANING
        + " The ice may be slippery: you might move in a different direction than you chose.\n"
        "Rewards: 1 for reaching the goal, 0 otherwise. Falling into a hole ends the game.\n" + SEVERAL_ACTIONS_ANSWER
    )
    info_keys: ClassVar[frozenset[str]] = frozenset({"action_is_valid", "action_is_effective", "success"})

    def __init__(
        self,
        size: int = 4,
        p: float = 0.9,
        is_slippery: bool = False,
        success_rate: float = 1.0 / 3.0,
        max_actions: int = 10,
        random_start_goal: bool = True,
        max_solution_length: int | None = None,
    ) -> None:
        # Defaults: the paper's 4x4 lake with p=0.9 frozen and 10 actions; success_rate is Gymnasium's.
        if size < 2:
            raise ConfigError(f"size={size} is not allowed: use an integer >= 2")
        if not 0.0 < p <= 1.0:
            raise ConfigError(f"p={p} is not allowed: the probability that a cell is frozen must be in (0, 1]")
        if not 0.0 <= success_rate <= 1.0:
            raise ConfigError(f"success_rate={success_rate} is not allowed: use a probability in [0, 1]")
        if max_actions < 1:
            raise ConfigError(f"max_actions={max_actions} is not allowed: use an integer >= 1")
        if max_solution_length is not None and max_solution_length < 1:
            raise ConfigError(f"max_solution_length={max_solution_length} is not allowed: use an integer >= 1 or None")
        max_solution_length = max_actions if max_solution_length is None else max_solution_length
        if not random_start_goal and max_solution_length < 2 * (size - 1):
            raise ConfigError(
                f"max_solution_length={max_solution_length} (default: max_actions) is too short for the "
                f"corner-to-corner path of random_start_goal=False on size={size}: use at least {2 * (size - 1)}"
            )
        self.size = size
        self.p = p
        self.is_slippery = is_slippery
        self.success_rate = success_rate
        self.max_actions = max_actions
        self.random_start_goal = random_start_goal
        self.max_solution_length = max_solution_length
        self._lake: gym_frozen_lake.FrozenLakeEnv | None = None
        self._holes: frozenset[Cell] = frozenset()
        self._goal: Cell = (0, 0)
        self._actions_taken = 0
        self._done = False

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        gym.Env.reset(self, seed=seed)  # seeds self.np_random; TextEnv.reset is abstract
        desc = self._generate_map()
        self._holes = frozenset((r, c) for r, row in enumerate(desc) for c, ch in enumerate(row) if ch == "H")
        self._goal = next((r, c) for r, row in enumerate(desc) for c, ch in enumerate(row) if ch == "G")
        self._lake = gym_frozen_lake.FrozenLakeEnv(
            desc=desc, is_slippery=self.is_slippery, success_rate=self.success_rate
        )
        # The lake's own generator draws the slips; seed it from ours so the episode follows from `seed`.
        self._lake.reset(seed=int(self.np_random.integers(2**31)))
        self._actions_taken = 0
        self._done = False
        return self._text(), {}

    def _generate_map(self) -> list[str]:
        """Gymnasium's random map, optionally with a random start and goal, solvable within the horizon."""
        for _ in range(_MAX_GENERATION_TRIES):
            rows = gym_frozen_lake.generate_random_map(self.size, self.p, seed=int(self.np_random.integers(2**31)))
            grid = [list(row) for row in rows]
            if self.random_start_goal:
                grid[0][0] = grid[-1][-1] = "F"
                frozen = [(r, c) for r in range(self.size) for c in range(self.size) if grid[r][c] == "F"]
                i, j = self.np_random.choice(len(frozen), size=2, replace=False)
                (sr, sc), (gr, gc) = frozen[i], frozen[j]
                grid[sr][sc], grid[gr][gc] = "S", "G"
            else:
                (sr, sc), (gr, gc) = (0, 0), (self.size - 1, self.size - 1)
            holes = frozenset((r, c) for r in range(self.size) for c in range(self.size) if grid[r][c] == "H")
            path = shortest_path(self.size, holes, (sr, sc), (gr, gc))
            if path is not None and len(path) <= self.max_solution_length:
                return ["".join(row) for row in grid]
        raise RuntimeError(
            f"no map with a path of at most {self.max_solution_length} moves in {_MAX_GENERATION_TRIES} tries "
            f"for size={self.size}, p={self.p}; raise p or max_solution_length"
        )

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        lake = self._require_running()
        name = move_name(action)
        if name is None:
            return self._text(), 0.0, False, False, dict(INVALID_INFO)
        before = self.player
        _, reward, terminated, _, _ = lake.step(ACTIONS[name])
        success = self.player == self._goal
        self._actions_taken += 1
        truncated = not terminated and self._actions_taken >= self.max_actions
        self._done = bool(terminated) or truncated
        info = {"action_is_valid": True, "action_is_effective": self.player != before, "success": success}
        return self._text(), float(reward), bool(terminated), truncated, info

    def solve(self) -> list[str] | None:
        """A shortest hole-free path to the goal (exact without slipping); None from a hole."""
        if self.player in self._holes:
            return None
        return shortest_path(self.size, self._holes, self.player, self._goal)

    def valid_actions(self) -> list[str]:
        return list(ACTIONS)

    @property
    def player(self) -> Cell:
        s = int(self._require_lake().s)
        return divmod(s, self.size)

    @property
    def goal(self) -> Cell:
        self._require_lake()
        return self._goal

    @property
    def holes(self) -> list[Cell]:
        self._require_lake()
        return sorted(self._holes)

    def _text(self) -> str:
        player = self.player
        rows = []
        for r in range(self.size):
            row = []
            for c in range(self.size):
                cell = (r, c)
                if cell in self._holes:
                    row.append(PLAYER_IN_HOLE if cell == player else HOLE)
                elif cell == self._goal:
                    row.append(PLAYER_ON_GOAL if cell == player else GOAL)
                else:
                    row.append(PLAYER if cell == player else FROZEN)
            rows.append("".join(row))
        return "\n".join(rows) + f"\nPlayer at {cell_text(player)}; goal at {cell_text(self._goal)}."

    def _require_lake(self) -> gym_frozen_lake.FrozenLakeEnv:
        if self._lake is None:
            raise RuntimeError("FrozenLakeEnv has no map yet: call reset() first")
        return self._lake

    def _require_running(self) -> gym_frozen_lake.FrozenLakeEnv:
        lake = self._require_lake()
        if self._done:
            raise RuntimeError("step() called after the episode ended: call reset() first")
        return lake

