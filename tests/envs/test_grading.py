"""The `code` grader: exact integers, float tolerance, non-finite numbers, odd return values, fence parsing time."""

from __future__ import annotations

import math
import signal
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen2.envs.codeexec import extract_program, parse_program, same_output, same_value

FACTORIAL_20 = "2432902008176640000"
STIRLING_20 = "2432902007581511168"  # a Stirling-series approximation: relative error 2.4e-10


def test_large_integers_are_compared_exactly():
    assert same_output(STIRLING_20, FACTORIAL_20) is False
    assert same_output("9" * 400, str(7**474)) is False  # as floats both were inf
    assert same_output(str(2**1024), str(7**474)) is False
    assert same_output(str(7**474), str(7**474) + "\n") is True
    assert same_output("0" * 5 + str(7**5000), str(7**5000)) is True  # past int()'s 4300 digits


@pytest.mark.parametrize("off", [1, 500, 1000])
def test_answers_mod_a_prime_that_are_off_fail(off):
    mod = 10**9 + 7
    answer = mod - 1
    assert same_output(str(answer - off), str(answer)) is False
    assert same_output(f"1 {answer - off} 3", f"1 {answer} 3") is False
    assert same_output(f"{answer - off}.0", str(answer)) is False  # a float must round to the integer


@pytest.mark.parametrize(
    "got, expected, same",
    [
        ("007", "7", True),
        ("+5", "5", True),
        ("-0", "0", True),
        ("-5", "5", False),
        ("3.0", "3", True),
        ("2.9999999", "3", True),
        ("3", "3.0000001", True),
        ("3.5", "3", False),
        ("0.0000001", "0", True),
        ("1e3", "1000", True),
        ("1.0000001e9", "1000000000", False),  # within 1e-6 but another integer
        ("2.43290200817664e18", FACTORIAL_20, True),  # the float's text is exactly 20!
        (FACTORIAL_20 + ".0", FACTORIAL_20, True),
        ("2432902008176640001.0", FACTORIAL_20, False),  # the same float, another integer
        ("2.4329020075815112e18", FACTORIAL_20, False),
        ("2.4329020075815112e18", "2.43290200817664e18", True),  # two floats: within the tolerance
        ("1e-99999999999999999999999", "9" * 30, False),  # past Decimal's exponent range
        ("1_000", "1000", False),  # not a number token
        ("١٢", "12", False),  # nor are non-ASCII digits
    ],
)
def test_integer_and_float_tokens(got, expected, same):
    assert same_output(got, expected) is same
    assert same_output(expected, got) is same


@pytest.mark.parametrize(
    "got, expected",
    [
        ("1e400", "1e500"),
        ("1e400", "1" + "0" * 400),
        ("inf", "1e999"),
        ("inf", "Infinity"),
        ("nan", "NaN"),
        ("-inf", "-1e309"),
    ],
)
def test_non_finite_numbers_equal_nothing(got, expected):
    assert same_output(got, expected) is False
    assert same_output(expected, got) is False


def test_same_value_on_large_and_non_finite_numbers():
    assert same_value(10**400, 2) is False
    assert same_value(2**1100, 2**1100) is True
    assert same_value(2**1100, 2**1100 + 1) is False
    assert same_value(10**400, math.inf) is False
    assert same_value(math.inf, 10**400) is False
    assert same_value(2.0**60, 2**60) is True  # exactly that integer
    assert same_value(2.0**60, 2**60 + 1) is False
    assert same_value(999999006.0, 1000000006) is False
    assert same_value([{"a": [10**400, (2**1100,)]}], [{"a": [10**400, [2**1100]]}]) is True
    for value in (math.nan, math.inf, -math.inf):
        assert same_value(value, value) is False
        assert same_value([value], [value]) is False


class _Raises:
    def __eq__(self, other):
        raise RuntimeError("no comparing me")

    __hash__ = object.__hash__


class _Lies(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


def test_same_value_ignores_an_objects_own_comparison_and_never_raises():
    raising, lying = _Raises(), _Lies(1)
    assert same_value(raising, raising) is False
    assert same_value([1, raising], [1, 2]) is False
    assert same_value({raising: 1}, {1: 1}) is False
    assert same_value(lying, 2) is False
    assert same_value("a", lying) is False
    assert same_value({lying: 1}, {2: 1}) is False
    assert same_value(True, 1) is False and same_value(None, 0) is False
    cycle, other = [], []
    cycle.append(cycle)
    other.append(other)
    assert same_value(cycle, other) is True
    assert same_value(cycle, [[1]]) is False
    deep = got = []
    for _ in range(100_000):
        deep.append([])
        deep = deep[0]
    assert same_value(got, got) is True  # no recursion limit


# Any integers, often past 2**53 and often close to each other, where floats would call them equal.
_INTEGERS = st.integers() | st.integers(-(10**400), 10**400)
_PAIRS = _INTEGERS.flatmap(lambda a: st.tuples(st.just(a), _INTEGERS | st.integers(-1000, 1000).map(a.__add__)))


@settings(max_examples=300, deadline=None)
@given(_PAIRS)
def test_integers_match_exactly_when_printed(pair):
    a, b = pair
    assert same_output(str(a), str(b)) is (a == b)
    assert same_output(f"{a}.0", str(a)) is (abs(a) < 10**308)  # a float literal past 1.8e308 is inf
    assert same_value(a, b) is (a == b)


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_finite_floats_match_themselves(x):
    assert same_output(str(x), str(x)) is True
    assert same_output(f"{x:.10f}", repr(x)) is True  # 10 decimals are within the absolute tolerance
    assert same_value(x, x) is True


def _seconds(function, *args, limit: float = 5.0) -> float:
    """Seconds `function(*args)` takes; past `limit` it is interrupted and the test fails."""

    def interrupt(signum, frame):
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, limit)
    start = time.perf_counter()
    try:
        function(*args)
    except TimeoutError:
        pytest.fail(f"{function.__name__} ran past {limit} s")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return time.perf_counter() - start


@pytest.mark.parametrize(
    "reply",
    [
        "```" + " " * 1_000_000,
        "```py" + "\t" * 1_000_000,
        "```\n" + " " * 1_000_000,
        "```" * 333_333,
        "``` " * 250_000,
    ],
    ids=["fence-spaces", "tag-tabs", "unclosed", "backticks", "fence-space"],
)
def test_a_degenerate_megabyte_reply_parses_quickly(reply):
    assert _seconds(parse_program, reply) < 0.5


def test_fence_parsing_is_linear():
    small = min(_seconds(extract_program, "```" + " " * 128_000) for _ in range(3))
    large = min(_seconds(extract_program, "```" + " " * 512_000) for _ in range(3))
    assert small < 0.1 and large < 8 * small + 0.02
