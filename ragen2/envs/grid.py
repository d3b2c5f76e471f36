"""What the grid worlds, Sokoban and FrozenLake, share: (row, col) cells, the four moves an action names,
an observation's coordinates and the sentences of their instructions that state these conventions.

One place, so that both read a move and describe the grid the same way: the tiny policy learns both from one
set of demonstrations.
"""

from __future__ import annotations

Cell = tuple[int, int]  # (row, col), 0-indexed from the top-left corner

MOVE_NAMES = ("Up", "Down", "Left", "Right")
_BY_LOWER = {name.lower(): name for name in MOVE_NAMES}

# The instructions' sentences on the grid and the moves ("Actions: <the env's order>. " comes before MOVES_MEANING).
GRID_CONVENTION = "The grid has one row per line; positions are (row, col), counting from 0 at the top-left.\n"
MOVES_MEANING = "Up decreases the row, Down increases it, Left decreases the column, Right increases it."

# What `step` returns for a text that names no move: the state stays, nothing is earned.
INVALID_INFO = {"action_is_valid": False, "action_is_effective": False, "success": False}


def move_name(action: str) -> str | None:
    """The move an action text names (case and whitespace around and inside it ignored), or None."""
    return _BY_LOWER.get(" ".join(str(action).split()).lower())


def cell_text(cell: Cell) -> str:
    """A cell as the observations' coordinates line writes it: `(row 2, col 3)`."""
    return f"(row {cell[0]}, col {cell[1]})"
