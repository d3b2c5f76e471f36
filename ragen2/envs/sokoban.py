"""Sokoban: push every box onto a target in a small room made by reverse play from a solved state."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from ragen2.envs import ENVS
from ragen2.envs.base import SEVERAL_ACTIONS_ANSWER, TextEnv
from ragen2.envs.grid import GRID_CONVENTION, INVALID_INFO, MOVES_MEANING, Cell, cell_text, move_name
from ragen2.errors import ConfigError

# Action name -> (d_row, d_col). Insertion order is the solver's tie-break order.
MOVES: dict[str, Cell] = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
_DIRECTIONS = tuple(MOVES.values())

# Reward scheme of gym-sokoban, used by RAGEN (SPEC §7).
STEP_REWARD = -0.1
BOX_ON_TARGET_REWARD = 1.0
BOX_OFF_TARGET_REWARD = -1.0
SOLVED_REWARD = 10.0

WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "#", "_", "O", "X", "√", "P", "S"
SYMBOLS = WALL + FLOOR + TARGET + BOX + BOX_ON_TARGET + PLAYER + PLAYER_ON_TARGET  # the `symbols` kwarg's order
_SYMBOL_NAMES = ("wall", "floor", "target", "box", "box on target", "player", "player on target")

# Shapes carved around the random walker when making the room topology: a cell,
# a horizontal or vertical pair, an L and a 2x2 block give rooms with nooks and corridors.
_CARVE_MASKS: tuple[tuple[Cell, ...], ...] = (
    ((0, 0),),
    ((0, 0), (0, 1)),
    ((0, 0), (1, 0)),
    ((0, 0), (0, 1), (1, 0)),
    ((0, 0), (0, 1), (1, 0), (1, 1)),
)
_MAX_GENERATION_TRIES = 10_000


class Room:
    """A Sokoban position: static walls and targets, moving player and boxes."""

    def __init__(
        self, shape: Cell, walls: frozenset[Cell], targets: frozenset[Cell], boxes: frozenset[Cell], player: Cell
    ) -> None:
        self.shape = shape
        self.walls = walls
        self.targets = targets
        self.boxes = boxes
        self.player = player

    def blocked(self, cell: Cell) -> bool:
        """Walls and everything outside the grid stop the player and boxes."""
        r, c = cell
        return cell in self.walls or not (0 <= r < self.shape[0] and 0 <= c < self.shape[1])

    def solved(self) -> bool:
        return self.boxes <= self.targets

    def move(self, player: Cell, boxes: frozenset[Cell], d: Cell) -> tuple[Cell, frozenset[Cell]]:
        """Forward rule: step to a free cell, or push one box into a free cell; otherwise stay."""
        nxt = (player[0] + d[0], player[1] + d[1])
        if self.blocked(nxt):
            return player, boxes
        if nxt in boxes:
            beyond = (nxt[0] + d[0], nxt[1] + d[1])
            if self.blocked(beyond) or beyond in boxes:
                return player, boxes
            boxes = (boxes - {nxt}) | {beyond}
        return nxt, boxes

    def solve(self, max_depth: int | None = None) -> list[str] | None:
        """Breadth-first search over (player, boxes): a shortest action list, or None.

        Exact for any number of boxes; `max_depth` bounds the search (None when no
        solution is at most that long).
        """
        start = (self.player, self.boxes)
        if self.solved():
            return []
        parent: dict[tuple[Cell, frozenset[Cell]], tuple[Any, str] | None] = {start: None}
        frontier, depth = [start], 0
        while frontier and (max_depth is None or depth < max_depth):
            depth += 1
            next_frontier = []
            for state in frontier:
                for name, d in MOVES.items():
                    new = self.move(*state, d)
                    if new in parent:
                        continue
                    parent[new] = (state, name)
                    if new[1] <= self.targets:
                        return _path_to(parent, new)
                    next_frontier.append(new)
            frontier = next_frontier
        return None

    def text(self) -> str:
        """Grid (one row per line) then a line of (row, col) coordinates."""
        rows = []
        for r in range(self.shape[0]):
            row = []
            for c in range(self.shape[1]):
                cell, on_target = (r, c), (r, c) in self.targets
                if cell in self.walls:
                    row.append(WALL)
                elif cell == self.player:
                    row.append(PLAYER_ON_TARGET if on_target else PLAYER)
                elif cell in self.boxes:
                    row.append(BOX_ON_TARGET if on_target else BOX)
                else:
                    row.append(TARGET if on_target else FLOOR)
            rows.append("".join(row))
        boxes, targets = sorted(self.boxes), sorted(self.targets)
        coords = (
            f"Player at {cell_text(self.player)}; "
            f"{'box' if len(boxes) == 1 else 'boxes'} at {', '.join(map(cell_text, boxes))}; "
            f"{'target' if len(targets) == 1 else 'targets'} at {', '.join(map(cell_text, targets))}."
        )
        return "\n".join(rows) + "\n" + coords

    @classmethod
    def parse(cls, text: str) -> Room:
        """Read a grid drawn with the observation symbols; a coordinates line after it is ignored."""
        symbols = set(WALL + FLOOR + TARGET + BOX + BOX_ON_TARGET + PLAYER + PLAYER_ON_TARGET)
        lines = [line.strip() for line in text.strip().splitlines()]
        grid = []
        for line in lines:
            if not line or not set(line) <= symbols:
                break
            grid.append(line)
        if not grid or len({len(line) for line in grid}) != 1:
            raise ConfigError(
                f"room text must start with a rectangular grid of {''.join(sorted(symbols))}; got {text!r}"
            )
        cells = {(r, c): ch for r, line in enumerate(grid) for c, ch in enumerate(line)}
        players = [p for p, ch in cells.items() if ch in PLAYER + PLAYER_ON_TARGET]
        boxes = frozenset(p for p, ch in cells.items() if ch in BOX + BOX_ON_TARGET)
        targets = frozenset(p for p, ch in cells.items() if ch in TARGET + BOX_ON_TARGET + PLAYER_ON_TARGET)
        if len(players) != 1:
            raise ConfigError(
                f"room text needs exactly one player ({PLAYER} or {PLAYER_ON_TARGET}); found {len(players)} in {text!r}"
            )
        if not boxes or len(boxes) != len(targets):
            raise ConfigError(
                "room text needs at least one box and as many targets as boxes; "
                f"found {len(boxes)} boxes and {len(targets)} targets in {text!r}"
            )
        walls = frozenset(p for p, ch in cells.items() if ch == WALL)
        return cls((len(grid), len(grid[0])), walls, targets, boxes, players[0])


def _path_to(parent: dict, state: Any) -> list[str]:
    path = []
    while parent[state] is not None:
        state, name = parent[state]
        path.append(name)
    return path[::-1]


def generate_room(
    rng: np.random.Generator,
    dim_room: Cell,
    num_boxes: int,
    search_depth: int,
    min_solution_length: int,
    max_solution_length: int,
) -> Room:
    """A random room whose shortest solution takes min_solution_length..max_solution_length actions.

    Reverse play: carve a connected floor with a random walk, put the boxes on
    targets and the player on another floor cell, then walk the player
    `search_depth` random steps, pulling a box along whenever the player steps
    away from one. Every reverse step undoes a legal forward move, so the room is
    solvable by construction; the BFS solver then rejects rooms whose shortest
    solution is shorter or longer than asked (an unscrambled room takes 0 actions).
    """
    h, w = dim_room
    for _ in range(_MAX_GENERATION_TRIES):
        walls = _carve_topology(rng, h, w)
        floor = [(r, c) for r in range(h) for c in range(w) if (r, c) not in walls]
        if len(floor) < num_boxes + 2:
            continue
        picks = rng.choice(len(floor), size=num_boxes + 1, replace=False)
        targets = frozenset(floor[i] for i in picks[:num_boxes])
        room = Room(dim_room, walls, targets, targets, floor[picks[-1]])
        _reverse_play(rng, room, search_depth)
        solution = room.solve(max_depth=max_solution_length)
        if solution is not None and len(solution) >= min_solution_length:
            return room
    raise RuntimeError(
        f"no solvable room found in {_MAX_GENERATION_TRIES} tries for dim_room={dim_room}, num_boxes={num_boxes}, "
        f"search_depth={search_depth}, solution length {min_solution_length}..{max_solution_length}; "
        "widen the solution length range or the room"
    )


def _carve_topology(rng: np.random.Generator, h: int, w: int) -> frozenset[Cell]:
    """Walls of a room whose floor is one connected region inside a wall border."""
    floor: set[Cell] = set()
    r, c = int(rng.integers(1, h - 1)), int(rng.integers(1, w - 1))
    # 1.5 * (h + w) walk steps, as gym-sokoban's topology generator uses.
    for _ in range(int(1.5 * (h + w))):
        mask = _CARVE_MASKS[rng.integers(len(_CARVE_MASKS))]
        floor.update((r + dr, c + dc) for dr, dc in mask if 0 < r + dr < h - 1 and 0 < c + dc < w - 1)
        dr, dc = _DIRECTIONS[rng.integers(4)]
        r, c = min(max(r + dr, 1), h - 2), min(max(c + dc, 1), w - 2)
    return frozenset((i, j) for i in range(h) for j in range(w) if (i, j) not in floor)


def _reverse_play(rng: np.random.Generator, room: Room, steps: int) -> None:
    """Scramble a solved room in place by moves and pulls, each the inverse of a forward move or push."""
    for _ in range(steps):
        dr, dc = _DIRECTIONS[rng.integers(4)]
        p = room.player
        nxt, behind = (p[0] + dr, p[1] + dc), (p[0] - dr, p[1] - dc)
        if room.blocked(nxt) or nxt in room.boxes:
            continue
        if behind in room.boxes:  # forward: the player at nxt pushes this box from p to behind
            room.boxes = (room.boxes - {behind}) | {p}
        room.player = nxt


@ENVS.register("sokoban")
class SokobanEnv(TextEnv):
    """Push every box onto a target in a small generated room.

    ## Description
    Each reset makes a room by reverse play from a solved state (see
    `generate_room`): the floor is carved inside a wall border, boxes start on
    their targets and `search_depth` random reverse moves pull them away. Every
    room is therefore solvable, and it is kept only when its shortest solution
    takes `min_solution_length` (default 2) to `max_solution_length` (default
    `max_actions`) actions, so every room can be solved within the episode.
    With the defaults (6x6, one box, 30 reverse steps, 10 actions) shortest
    solutions take 2 to 10 actions, 3.6 on average; over 90% take at most 6.
    `solve()` returns an exact shortest solution from the current state by
    breadth-first search over (player, boxes), for any number of boxes.
    `reset(options={"room": text})` or `SokobanEnv.from_text(text)` loads a
    hand-drawn room instead.

    ## Actions
    `Up`, `Down`, `Left`, `Right` (case and surrounding whitespace ignored). Up
    decreases the row, Left decreases the column. Walking into a wall, or
    pushing a box into a wall or another box, is a valid action that leaves the
    state unchanged. Any other text is an invalid action.

    ## Observation
    The grid, one row per line: `#` wall, `_` floor, `O` target, `X` box,
    `√` box on target, `P` player, `S` player on target. Then one line of
    0-indexed coordinates, e.g.
    `Player at (row 2, col 3); box at (row 3, col 3); target at (row 4, col 3).`
    ("boxes"/"targets" and comma-separated cells when there are several).
    `symbols` (7 characters, in the order above) draws the grid with others, an
    out-of-distribution variant; the instruction's legend names them.

    ## Rewards
    -0.1 per valid action, +1 per box pushed onto a target, -1 per box pushed
    off a target, +10 when every box is on a target. An invalid action gets 0.

    ## Episode end
    Terminated when every box is on a target. Truncated after `max_actions`
    valid actions without success. Invalid actions do not count.

    ## Info
    - `action_is_valid` (bool): the text named an action.
    - `action_is_effective` (bool): the action moved the player.
    - `success` (bool): every box is on a target.
    """

    instruction: ClassVar[str] = (
        "You are solving Sokoban. Push every box onto a target.\n"
        "Symbols: # wall, _ floor, O target, X box, √ box on target, P player, S player on target.\n"
        + GRID_CONVENTION
        + "Actions: Up, Down, Left, Right. "
        + MOVES_MEANING
        + " Walking into a box pushes it one cell if the cell behind it is free. Boxes cannot be pulled, so a box "
        "pushed into a corner is stuck.\n"
        "Rewards: -0.1 per action, +1 for a box pushed onto a target, -1 for a box pushed off one, "
        "+10 when every box is on a target.\n" + SEVERAL_ACTIONS_ANSWER
    )
    info_keys: ClassVar[frozenset[str]] = frozenset({"action_is_valid", "action_is_effective", "success"})

    def __init__(
        self,
        dim_room: tuple[int, int] = (6, 6),
        num_boxes: int = 1,
        search_depth: int = 30,
        max_actions: int = 10,
        min_solution_length: int = 2,
        max_solution_length: int | None = None,
        symbols: str = SYMBOLS,
    ) -> None:
        # Defaults: RAGEN's Sokoban setting (6x6, one box, 30 reverse steps, 5 turns x 2 actions).
        if len(symbols) != len(SYMBOLS) or len(set(symbols)) != len(SYMBOLS) or any(ch.isspace() for ch in symbols):
            raise ConfigError(
                f"symbols={symbols!r} is not allowed: use {len(SYMBOLS)} distinct non-blank characters for "
                f"{', '.join(_SYMBOL_NAMES)}, in that order (default {SYMBOLS!r})"
            )
        if num_boxes < 1:
            raise ConfigError(f"num_boxes={num_boxes} is not allowed: use an integer >= 1")
        dim_room = tuple(dim_room)
        if len(dim_room) != 2 or min(dim_room) < 3 or (dim_room[0] - 2) * (dim_room[1] - 2) < num_boxes + 2:
            raise ConfigError(
                f"dim_room={dim_room} is not allowed: use (rows, cols), both >= 3, with room inside the "
                f"wall border for num_boxes + 2 = {num_boxes + 2} cells"
            )
        if search_depth < 1:
            raise ConfigError(f"search_depth={search_depth} is not allowed: use an integer >= 1")
        if max_actions < 1:
            raise ConfigError(f"max_actions={max_actions} is not allowed: use an integer >= 1")
        max_solution_length = max_actions if max_solution_length is None else max_solution_length
        if not 1 <= min_solution_length <= max_solution_length:
            raise ConfigError(
                f"min_solution_length={min_solution_length}, max_solution_length={max_solution_length} "
                "(default: max_actions) are not allowed: use 1 <= min_solution_length <= max_solution_length"
            )
        self.dim_room = (int(dim_room[0]), int(dim_room[1]))
        self.num_boxes = num_boxes
        self.search_depth = search_depth
        self.max_actions = max_actions
        self.min_solution_length = min_solution_length
        self.max_solution_length = max_solution_length
        self.symbols = symbols
        self._redraw = str.maketrans(SYMBOLS, symbols)
        if symbols != SYMBOLS:  # the instruction names the symbols the grid shows
            legend = ", ".join(f"{ch} {name}" for ch, name in zip(symbols, _SYMBOL_NAMES))
            self.instruction = type(self).instruction.replace(
                ", ".join(f"{ch} {name}" for ch, name in zip(SYMBOLS, _SYMBOL_NAMES)), legend
            )
        self._room: Room | None = None
        self._actions_taken = 0
        self._done = False

    @classmethod
    def from_text(cls, room: str, **cfg: Any) -> SokobanEnv:
        """An env reset to the room drawn in `room` (observation symbols, one row per line)."""
        env = cls(**cfg)
        env.reset(options={"room": room})
        return env

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """Generate a room from `seed`, or load `options["room"]` (grid text) when given."""
        gym.Env.reset(self, seed=seed)  # seeds self.np_random; TextEnv.reset is abstract
        if options and "room" in options:
            self._room = Room.parse(options["room"])
        else:
            self._room = generate_room(
                self.np_random,
                self.dim_room,
                self.num_boxes,
                self.search_depth,
                self.min_solution_length,
                self.max_solution_length,
            )
        self._actions_taken = 0
        self._done = False
        return self.room_text(), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        room = self._require_running()
        name = move_name(action)
        if name is None:
            return self.room_text(), 0.0, False, False, dict(INVALID_INFO)
        player, boxes = room.move(room.player, room.boxes, MOVES[name])
        # One push moves one box, so the count of boxes on targets changes by -1, 0 or +1.
        delta = len(boxes & room.targets) - len(room.boxes & room.targets)
        effective = player != room.player
        room.player, room.boxes = player, boxes
        success = room.solved()
        reward = STEP_REWARD
        reward += BOX_ON_TARGET_REWARD if delta > 0 else BOX_OFF_TARGET_REWARD if delta < 0 else 0.0
        reward += SOLVED_REWARD if success else 0.0
        self._actions_taken += 1
        truncated = not success and self._actions_taken >= self.max_actions
        self._done = success or truncated
        info = {"action_is_valid": True, "action_is_effective": effective, "success": success}
        return self.room_text(), reward, success, truncated, info

    def solve(self) -> list[str] | None:
        """A shortest list of actions that puts every box on a target from the current state."""
        return self._require_room().solve()

    def valid_actions(self) -> list[str]:
        return list(MOVES)

    def room_text(self) -> str:
        """The observation text of the current state: the grid in `symbols`, then the coordinates line."""
        grid, coords = self._require_room().text().rsplit("\n", 1)
        return grid.translate(self._redraw) + "\n" + coords

    @property
    def player(self) -> Cell:
        return self._require_room().player

    @property
    def boxes(self) -> list[Cell]:
        return sorted(self._require_room().boxes)

    @property
    def targets(self) -> list[Cell]:
        return sorted(self._require_room().targets)

    @property
    def walls(self) -> list[Cell]:
        return sorted(self._require_room().walls)

    def _require_room(self) -> Room:
        if self._room is None:
            raise RuntimeError("SokobanEnv has no room yet: call reset() first")
        return self._room

    def _require_running(self) -> Room:
        room = self._require_room()
        if self._done:
            raise RuntimeError("step() called after the episode ended: call reset() first")
        return room
