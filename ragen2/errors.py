"""Named exceptions for bad input. Each message holds the offending value and how to fix it."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable


class Ragen2Error(Exception):
    """Base class of every error ragen2 raises on bad user input."""


class ConfigError(Ragen2Error, ValueError):
    """A config key is unknown, or a value is not allowed."""


class UnknownNameError(Ragen2Error, KeyError):
    """A name picked from a registry (environment, algorithm, strategy) does not exist."""

    def __str__(self) -> str:  # KeyError would quote the message otherwise
        return str(self.args[0])


class CheckpointError(Ragen2Error, RuntimeError):
    """A checkpoint is missing, incomplete or unreadable."""


class RolloutFormatError(Ragen2Error, ValueError):
    """A rollout record file has malformed lines."""


class DivergedError(Ragen2Error, RuntimeError):
    """Training made the policy's weights or outputs non-finite (too high a learning rate, as a rule)."""


class RolloutWorkerError(Ragen2Error, RuntimeError):
    """An asynchronous run's rollout worker died or failed, so the run stops (resume from its last checkpoint)."""


def did_you_mean(name: str, choices: Iterable[str], n: int = 3, shown: Callable[[str], str] = str) -> str:
    """Return ' Did you mean: a, b?' for the closest choices, or '' when none is close.

    `shown` writes each match as the user should type it: names compared without a shared part
    (a suite's `textarena:` prefix) are shown with it, which would otherwise make every choice look close.
    """
    close = difflib.get_close_matches(name, list(choices), n=n, cutoff=0.5)
    return f" Did you mean: {', '.join(map(shown, close))}?" if close else ""
