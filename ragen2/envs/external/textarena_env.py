"""TextArena games as ragen2 environments: `make("textarena:Sudoku-v0-easy")`, `make("textarena:TicTacToe-v0")`.

TextArena judges a move inside the game and ends the game after repeated invalid moves; it
lists no moves. The adapter lists them per game (`GAMES`), tries a move on a copy where
only the game can tell whether it is legal, and replays nothing it rejected, so invalid
actions change nothing, as ragen2's contract wants. TextArena draws from Python's global
`random` (and Sokoban from numpy's): each environment keeps its own copy of both streams
and swaps it in around every call into the game, so an episode follows from its seed
whatever else draws numbers in between. Two-player games are played against a fixed
opponent (uniformly random legal moves, drawn from the episode's seed).
"""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import random
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import textarena as ta
from textarena.envs.registration import ENV_REGISTRY

from ragen2.envs.external.base import ExternalEnv, Outcome, unknown_game
from ragen2.envs.sokoban import SokobanEnv
from ragen2.errors import ConfigError

Game = Any  # a TextArena env without wrappers


@dataclass(frozen=True)
class GameSpec:
    """What the adapter knows of one TextArena game."""

    moves: Callable[[Game], list[str]]
    """The candidate moves now, as the agent writes them (`[A C]`)."""
    trial: bool = False
    """Only the game can tell which candidates are legal: keep those a copy of the game accepts."""
    rejected_loses: str | None = None
    """The game rejects a listed move as its way of losing (Minesweeper's mine): end the episode, saying this."""
    solver: Callable[[TextArenaEnv], list[str] | None] | None = None
    players: int = 1
    max_actions: int | None = None
    """Default episode length; None = the game's own turn limit (50 when it has none)."""


# ----------------------------------------------------------------------------- moves


def _sudoku_moves(g: Game) -> list[str]:
    board = g.state.game_state["board"]
    return [f"[{r + 1} {c + 1} {n}]" for r in range(9) for c in range(9) if board[r][c] == 0
            for n in range(1, 10) if g._is_move_correct(r, c, n)]


def _hanoi_moves(g: Game) -> list[str]:
    return [f"[{a} {b}]" for a, b in itertools.permutations("ABC", 2)]


def _guess_moves(g: Game) -> list[str]:
    return [f"[{n}]" for n in range(g.min_number, g.max_number + 1) if n not in g.guessed_numbers]


def _direction_moves(g: Game) -> list[str]:
    return ["[up]", "[down]", "[left]", "[right]"]


def _lights_moves(g: Game) -> list[str]:
    return [f"[{r} {c}]" for r in range(g.size) for c in range(g.size)]


def _mastermind_moves(g: Game) -> list[str]:
    gs = g.state.game_state
    digits = range(1, gs["num_numbers"] + 1)
    codes = (itertools.product(digits, repeat=gs["code_length"]) if gs["duplicate_numbers"]
             else itertools.permutations(digits, gs["code_length"]))
    guessed = {tuple(h["guess"]) for h in gs["history"]}
    return [f"[{' '.join(map(str, code))}]" for code in codes if code not in guessed]


def _minesweeper_moves(g: Game) -> list[str]:
    return [f"[{r} {c}]" for r in range(g.rows) for c in range(g.cols) if not g.revealed[r][c]]


def _pegjump_moves(g: Game) -> list[str]:
    board = g.state.game_state["board"]
    return [f"[{a} {b}]" for a, over, b in g.ALLOWED_MOVES if board[a] and board[over] and not board[b]]


def _rushhour_moves(g: Game) -> list[str]:
    return [f"[{vid}{d}]" for vid in sorted(g.state.game_state["vehicles"]) for d in "+-"]


def _tictactoe_moves(g: Game) -> list[str]:
    board = g.state.game_state["board"]
    return [f"[{r * 3 + c}]" for r in range(3) for c in range(3) if board[r][c] == ""]


def _connectfour_moves(g: Game) -> list[str]:
    return [f"[{c}]" for c in range(g.num_cols) if g.state.game_state["board"][0][c] == "."]


# ----------------------------------------------------------------------------- solvers


def _bfs(env: TextArenaEnv, key: Callable[[Game], Any], max_nodes: int = 20_000) -> list[str] | None:
    """Breadth-first search over copies of the game: a shortest winning move list, or None past `max_nodes`."""
    start = env.game_copy()
    seen = {key(start)}
    queue: deque[tuple[Game, list[str]]] = deque([(start, [])])
    while queue and len(seen) < max_nodes:
        game, path = queue.popleft()
        for move in env.spec.moves(game):
            child = copy.deepcopy(game)
            result = env.play_on(child, move)
            if result is None:
                continue
            if result.success:
                return path + [move]
            k = key(child)
            if not result.done and k not in seen:
                seen.add(k)
                queue.append((child, path + [move]))
    return None


def _solve_hanoi(env: TextArenaEnv) -> list[str] | None:
    return _bfs(env, lambda g: repr(g.state.game_state["towers"]))


def _solve_frozenlake(env: TextArenaEnv) -> list[str] | None:
    return _bfs(env, lambda g: tuple(g.state.game_state["player_pos"]))


def _solve_sokoban(env: TextArenaEnv) -> list[str] | None:
    """ragen2's own Sokoban search, on the room redrawn in ragen2's symbols (same push rules)."""
    g = env.game
    player = tuple(int(x) for x in g.player_position)
    rows = []
    for r, row in enumerate(g.room_state):
        line = ""
        for c, cell in enumerate(row):
            target = g.room_fixed[r][c] == 2
            if (r, c) == player:
                line += "S" if target else "P"
            elif cell in (3, 4):
                line += "√" if target else "X"
            else:
                line += "#" if cell == 0 else "O" if target else "_"
        rows.append(line)
    moves = SokobanEnv.from_text("\n".join(rows)).solve()
    return None if moves is None else [f"[{m.lower()}]" for m in moves]


def _solve_pegjump(env: TextArenaEnv) -> list[str] | None:
    """Depth-first search over boards (a 15-hole triangle has few enough positions)."""
    board, moves = list(env.game.state.game_state["board"]), env.game.ALLOWED_MOVES
    dead: set[tuple[bool, ...]] = set()

    def search(b: list[bool]) -> list[str] | None:
        if sum(b) == 1:
            return []
        if tuple(b) in dead:
            return None
        for a, over, to in moves:
            if b[a] and b[over] and not b[to]:
                b[a], b[over], b[to] = False, False, True
                rest = search(b)
                b[a], b[over], b[to] = True, True, False
                if rest is not None:
                    return [f"[{a} {to}]", *rest]
        dead.add(tuple(b))
        return None

    return search(board)


def _solve_sudoku(env: TextArenaEnv) -> list[str] | None:
    g = env.game
    board = g.state.game_state["board"]
    return [f"[{r + 1} {c + 1} {g.full_grid[r][c]}]" for r in range(9) for c in range(9) if board[r][c] == 0]


def _solve_guess(env: TextArenaEnv) -> list[str] | None:
    return [f"[{env.game.game_number}]"]


def _solve_mastermind(env: TextArenaEnv) -> list[str] | None:
    return [f"[{' '.join(map(str, env.game.state.game_state['secret_code']))}]"]


def _solve_secretary(env: TextArenaEnv) -> list[str] | None:
    gs = env.game.state.game_state
    draws, now = gs["draws"], gs["current_idx"] - 1  # the value on show is draws[current_idx - 1]
    best = max(range(now, len(draws)), key=lambda i: draws[i])
    if max(draws) != draws[best]:
        return None  # the best value has passed
    return ["[continue]"] * (best - now) + ["[accept]"]


def _solve_lightsout(env: TextArenaEnv) -> list[str] | None:
    """Gaussian elimination over GF(2): which cells to press once each."""
    g = env.game
    n = g.size
    grid = g.state.game_state["grid"]
    cells = n * n
    rows = []
    for r in range(n):
        for c in range(n):
            row = 0
            for dr, dc in ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)):
                rr, cc = r + dr, c + dc
                if 0 <= rr < n and 0 <= cc < n:
                    row |= 1 << (rr * n + cc)
            rows.append([row, int(bool(grid[r][c]))])
    pivots = []
    for col in range(cells):
        pivot = next((i for i in range(len(pivots), cells) if rows[i][0] >> col & 1), None)
        if pivot is None:
            continue
        k = len(pivots)
        rows[k], rows[pivot] = rows[pivot], rows[k]
        for i in range(cells):
            if i != k and rows[i][0] >> col & 1:
                rows[i][0] ^= rows[k][0]
                rows[i][1] ^= rows[k][1]
        pivots.append(col)
    if any(rows[i][1] for i in range(len(pivots), cells)):
        return None
    return [f"[{col // n} {col % n}]" for k, col in enumerate(pivots) if rows[k][1]]


def _solve_minesweeper(env: TextArenaEnv) -> list[str] | None:
    """Reveal the first cell in the middle, then every safe cell still hidden, played out on a copy."""
    game = env.game_copy()
    path: list[str] = []
    while True:
        if game.first_move:
            move = f"[{game.rows // 2} {game.cols // 2}]"
        else:
            hidden = [(r, c) for r in range(game.rows) for c in range(game.cols)
                      if not game.revealed[r][c] and game.grid[r][c] != -1]
            if not hidden:
                return path
            move = f"[{hidden[0][0]} {hidden[0][1]}]"
        result = env.play_on(game, move)
        if result is None:
            return None
        path.append(move)
        if result.done:
            return path if result.success else None


# The single-player games that play offline, by TextArena's base name (the id before "-v0").
GAMES: dict[str, GameSpec] = {
    "Sudoku": GameSpec(_sudoku_moves, solver=_solve_sudoku),
    "TowerOfHanoi": GameSpec(_hanoi_moves, trial=True, solver=_solve_hanoi),
    "GuessTheNumber": GameSpec(_guess_moves, solver=_solve_guess),
    "FifteenPuzzle": GameSpec(_direction_moves, trial=True),
    "LightsOut": GameSpec(_lights_moves, solver=_solve_lightsout),
    "Mastermind": GameSpec(_mastermind_moves, solver=_solve_mastermind),
    "FrozenLake": GameSpec(_direction_moves, trial=True, solver=_solve_frozenlake, max_actions=100),  # its limit
    "Sokoban": GameSpec(_direction_moves, trial=True, solver=_solve_sokoban),
    "Blackjack": GameSpec(lambda g: ["[Hit]", "[Stand]"]),
    "Bandit": GameSpec(lambda g: [f"[{b}]" for b in g.buttons]),
    "Secretary": GameSpec(lambda g: ["[accept]", "[continue]"], solver=_solve_secretary),
    "Minesweeper": GameSpec(_minesweeper_moves, rejected_loses="you revealed a mine", solver=_solve_minesweeper),
    "PegJump": GameSpec(_pegjump_moves, solver=_solve_pegjump),
    "RushHour": GameSpec(_rushhour_moves, trial=True),
    # Two-player games, against the fixed opponent.
    "TicTacToe": GameSpec(_tictactoe_moves, players=2),
    "ConnectFour": GameSpec(_connectfour_moves, players=2),
}

# Games TextArena has that do not work here, and why (kept out of GAMES).
UNAVAILABLE: dict[str, str] = {
    "TwentyQuestions": "its game master is an LLM behind an API key",
    "GuessWho": "its game master is an LLM behind an API key",
    "WordLadder": "needs an NLTK corpus download",
    "Hangman": "needs an NLTK corpus download",
    "Chess": "TextArena 0.7.4's Chess module is Python 3.12 syntax (a SyntaxError on 3.11)",
}

OPPONENTS = ("random",)


def _base(game_id: str) -> str:
    return game_id.split("-v", 1)[0]


def game_ids() -> list[str]:
    """The TextArena ids this adapter plays (every registered variant of the games in GAMES, wrappers aside)."""
    return sorted(i for i in ENV_REGISTRY if _base(i) in GAMES and not i.endswith(("-raw", "-train")))


class TextArenaEnv(ExternalEnv):
    """One TextArena game (`game`, e.g. `Sudoku-v0-easy`) behind ragen2's TextEnv contract.

    ## Observation
    The game's own messages to the player since the last move: at reset the rules and the
    board, then what the move did and the board again; the game's verdict when it ends.

    ## Actions
    The moves in TextArena's format (`[A C]`, `[3 4 9]`, `[up]`); the brackets may be left
    out, case and extra spaces are ignored. `valid_actions()` lists the legal ones.

    ## Rewards
    TextArena's final reward when the game ends (1 for a win; a share of the puzzle solved,
    or -1/0/1 against an opponent), 0 on every other step.

    ## Episode end
    Terminated when the game ends or no move is left; truncated after `max_actions` moves
    (default: the game's own turn limit).

    ## Info
    - `action_is_valid` (bool), `success` (bool: TextArena's full reward, a win).
    """

    def __init__(self, game: str, max_actions: int | None = None, opponent: str = "random", **game_kwargs: Any) -> None:
        base = _base(game)
        if base in UNAVAILABLE:
            raise ConfigError(f"textarena:{game} does not play offline: {UNAVAILABLE[base]}")
        if base not in GAMES or game not in ENV_REGISTRY:
            raise unknown_game("textarena", game, f"{game} is not an adapted TextArena game; adapted: "
                               f"{', '.join(game_ids())}", game_ids())
        if opponent not in OPPONENTS:
            raise ConfigError(f"opponent={opponent!r} is not allowed: use one of {', '.join(OPPONENTS)}")
        self.spec = GAMES[base]
        self.game_id = game
        with _quiet():
            self.game = ta.make(f"{game}-raw", **game_kwargs)
        self.opponent = opponent
        limit = getattr(self.game, "max_turns", None) or getattr(self.game, "num_turns", None)
        super().__init__(max_actions or self.spec.max_actions or limit or 50)
        versus = "" if self.spec.players == 1 else " You are Player 0; a fixed opponent plays Player 1."
        self.instruction = (
            f"You are playing {base}, a TextArena game.{versus} The first observation gives the rules and the "
            "board; each later one says what your move did.\n"
            "Write each move in the game's format, e.g. [A C] or [3 4 9] (the brackets may be left out).\n"
            "Answer as <think>...</think><answer>Move1 || Move2</answer>: one or more moves separated by ||."
        )
        self._streams: tuple[Any, Any] = (random.getstate(), np.random.get_state())

    # --- the game's random streams and output, swapped in around each call

    @contextlib.contextmanager
    def _own_streams(self) -> Iterator[None]:
        outer = (random.getstate(), np.random.get_state())
        random.setstate(self._streams[0])
        np.random.set_state(self._streams[1])
        try:
            with _quiet():
                yield
        finally:
            self._streams = (random.getstate(), np.random.get_state())
            random.setstate(outer[0])
            np.random.set_state(outer[1])

    def game_copy(self) -> Game:
        """A copy of the game (its random streams go with `play_on`)."""
        return copy.deepcopy(self.game)

    def play_on(self, game: Game, move: str) -> Outcome | None:
        """Play `move` on `game` (a copy) with a copy of the streams; None when the game rejects it."""
        saved = self._streams
        try:
            with self._own_streams():
                return self._play(game, move)
        finally:
            self._streams = saved

    def legal_moves(self, game: Game) -> list[str]:
        candidates = self.spec.moves(game)
        if not self.spec.trial:
            return candidates
        return [m for m in candidates if self.play_on(copy.deepcopy(game), m) is not None]

    # --- ExternalEnv hooks

    def _start(self, seed: int) -> str:
        random.seed(seed)
        self._streams = (random.getstate(), np.random.RandomState(seed).get_state())
        with self._own_streams():
            self.game.reset(num_players=self.spec.players, seed=seed)
        return self._messages(self.game) or f"{self.game_id} has started."

    def _moves(self) -> list[str]:
        return self.legal_moves(self.game)

    def _apply(self, move: str) -> Outcome | None:
        backup = (copy.deepcopy(self.game), self._streams)
        with self._own_streams():
            result = self._play(self.game, move)
        if result is None:
            self.game, self._streams = backup
            if self.spec.rejected_loses:
                return Outcome(f"Game over: {self.spec.rejected_loses}.", 0.0, True, False)
        return result

    def _solution(self) -> list[str] | None:
        return None if self.spec.solver is None else self.spec.solver(self)

    # --- one move, then the opponent's replies, on `game` (streams already swapped in)

    def _play(self, game: Game, move: str) -> Outcome | None:
        game.step(move)
        state = game.state
        state.logs.clear()  # TextArena's full game log, unused here: it would make every copy slower than the last
        if state.error_count > 0 or state.game_info[0].get("invalid_move"):
            return None
        while not state.done and state.current_player_id != 0:
            replies = self.spec.moves(game)
            game.step(replies[random.randrange(len(replies))])  # the game's stream: copies replay it
        if not state.done:
            return Outcome(self._messages(game), 0.0, False, False)
        reward = float((state.rewards or {}).get(0, 0.0))
        reason = state.game_info[0].get("reason")
        text = self._messages(game) + (f"\nGame over: {reason}" if reason else "\nGame over.")
        return Outcome(text.strip(), reward, True, reward >= 1.0)

    def _messages(self, game: Game) -> str:
        """Player 0's pending messages, cleared: the game's text, and the opponent's moves."""
        lines = []
        for sender, message, kind in game.state.observations[0]:
            if kind == ta.ObservationType.PLAYER_ACTION:
                if sender != 0:
                    lines.append(f"Player {sender} played: {message}")
            else:
                lines.append(message.strip())
        game.state.observations[0] = []
        return "\n".join(line for line in lines if line)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Some games print progress (RushHour's puzzle generator): keep it off the training log."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def make(game: str, **cfg: Any) -> TextArenaEnv:
    return TextArenaEnv(game, **cfg)
