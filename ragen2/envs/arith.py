"""Exact, safe evaluation of arithmetic text: integers, + - * /, parentheses. Never `eval`.

Agents write equations such as `(3 + 5) * 2` or `(3 + 5) * 2 = 16`. The text is
checked against a character whitelist, parsed with `ast` (which builds a tree and
runs nothing), and the tree is walked with `fractions.Fraction`, so `7 / 2 * 2`
is exactly 7 and no float rounding decides a reward. Size limits keep every
accepted input cheap: at most `MAX_CHARS` characters, `MAX_NUMBERS` numbers of at
most `MAX_DIGITS` digits, and no powers, so values stay small.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass
from fractions import Fraction

MAX_CHARS = 200
MAX_NUMBERS = 16
MAX_DIGITS = 6

# Typographic operators a model may copy from text, mapped to their ASCII forms.
_TRANSLATION = str.maketrans({"×": "*", "÷": "/", "−": "-"})
_ALLOWED = re.compile(r"[0-9+\-*/() ]+")
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


class NotArithmetic(ValueError):
    """The text is not an expression of integers, + - * / and parentheses within the size limits."""


@dataclass(frozen=True)
class Arithmetic:
    """A parsed expression: its exact value and the integer literals it uses, in order."""

    value: Fraction | None  # None when the expression divides by zero: well-formed, but undefined
    numbers: tuple[int, ...]


def parse_arithmetic(text: str) -> Arithmetic:
    """Parse and evaluate `text`, optionally followed by `= <expression>`.

    Only the left side of `=` is evaluated; the right side (the claimed result)
    must parse too but is otherwise ignored. Unary signs (`-3`), powers, floor
    division, decimals and leading zeros are not arithmetic here: the numbers of
    an equation are the problem's integers, combined by the four operations.

    Raises:
        NotArithmetic: the text is anything else.
    """
    text = str(text).translate(_TRANSLATION).strip()
    if len(text) > MAX_CHARS:
        raise NotArithmetic(f"longer than {MAX_CHARS} characters")
    sides = text.split("=")
    if len(sides) > 2:
        raise NotArithmetic("more than one '='")
    left = _parse_side(sides[0])
    if len(sides) == 2:
        _parse_side(sides[1])  # the claimed result must be arithmetic too
    return left


def _parse_side(text: str) -> Arithmetic:
    text = text.strip()
    if not _ALLOWED.fullmatch(text):
        raise NotArithmetic("only digits, + - * /, parentheses and spaces are allowed")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise NotArithmetic(f"does not parse: {e}") from e
    numbers: list[int] = []
    value = _evaluate(tree.body, numbers)
    return Arithmetic(value=value, numbers=tuple(numbers))


def _evaluate(node: ast.AST, numbers: list[int]) -> Fraction | None:
    """Walk the tree; only integer literals and the four binary operations are accepted."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        if len(str(node.value)) > MAX_DIGITS:
            raise NotArithmetic(f"numbers have at most {MAX_DIGITS} digits")
        numbers.append(node.value)
        if len(numbers) > MAX_NUMBERS:
            raise NotArithmetic(f"at most {MAX_NUMBERS} numbers")
        return Fraction(node.value)
    if isinstance(node, ast.BinOp):
        op = _OPERATORS.get(type(node.op))
        if op is None:
            raise NotArithmetic(f"{type(node.op).__name__} is not allowed: use + - * /")
        left, right = _evaluate(node.left, numbers), _evaluate(node.right, numbers)
        if left is None or right is None or (op is operator.truediv and right == 0):
            return None
        return op(left, right)
    raise NotArithmetic(f"{type(node).__name__} is not allowed: use integers, + - * / and parentheses")
