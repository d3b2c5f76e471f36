"""Progress for long work: a live bar on a terminal, and off one (a log file, CI, `nohup`) plain
lines that never leave the log silent for more than a minute.

A step of a real model on CPU can take minutes, and so can one evaluation; a log that shows
nothing for that long looks like a hang. `Heartbeat` prints what is under way and for how long
whenever nothing else was printed for `interval_s`; `Progress` prints a line per finished step
when steps are slow, every `every` steps when they are fast, with the rate and the time left.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, TextIO

# Longest a non-terminal log stays silent while work goes on.
INTERVAL_S = 60.0


class Heartbeat:
    """A background thread that reports `what` is under way when no line was written for `interval_s`.

    `say` writes one line and counts as output; `doing` names the work now under way.
    """

    def __init__(self, say: Callable[[str], None], interval_s: float = INTERVAL_S, what: str = "starting") -> None:
        self._say = say
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._last_line = time.monotonic()
        self.doing(what)
        self.detail: Callable[[], str] = lambda: ""  # appended to each beat, e.g. the time left
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ragen2-heartbeat", daemon=True)
        self._thread.start()

    def doing(self, what: str) -> None:
        with self._lock:
            self._what, self._since = what, time.monotonic()

    def say(self, line: str) -> None:
        with self._lock:
            self._last_line = time.monotonic()
        self._say(line)

    def silent_for(self) -> float:
        """Seconds since the last line."""
        with self._lock:
            return time.monotonic() - self._last_line

    def _run(self) -> None:
        while not self._stop.wait(min(max(self.interval_s / 4, 0.05), 5.0)):
            with self._lock:
                now = time.monotonic()
                due = now - self._last_line >= self.interval_s
                what, since = self._what, self._since
            if due:
                self.say(f"{what}: under way for {duration(now - since)}{self.detail()}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def heartbeat(what: str, say: Callable[[str], None], interval_s: float = INTERVAL_S) -> Iterator[Heartbeat]:
    """`with heartbeat("evaluating sokoban", log.info): ...` reports the work every `interval_s` until it ends."""
    beat = Heartbeat(say, interval_s, what)
    try:
        yield beat
    finally:
        beat.stop()


class Progress:
    """Training progress for the console: a live rich bar on a terminal, plain lines elsewhere.

    On an interactive terminal it shows a bar over `total` steps with the latest values of the
    fields the trainer passes (reward, success, entropy, ...). When the output is not a terminal,
    a redrawn bar would fill the log with control codes, so it prints one line per step, at the
    latest every `every` steps or `interval_s` seconds and at the last step, with the rate and
    time left, and a heartbeat line while a step or evaluation runs longer than `interval_s`.
    `doing` names what is under way for that line. `enabled=False` is silent.
    """

    def __init__(
        self, total: int, enabled: bool = True, every: int = 10, start: int = 0, file: TextIO | None = None,
        interval_s: float = INTERVAL_S,
    ) -> None:
        from rich.console import Console

        self.total = int(total)
        self.every = max(1, int(every))
        self.enabled = enabled
        self._file = file if file is not None else sys.stdout
        self._start_time = self._last_step_line = time.monotonic()
        self._start_step = self._step = int(start)
        self._per_step = math.nan
        self._bar: Any = None
        self._heartbeat: Heartbeat | None = None
        console = Console(file=self._file)
        if enabled and console.is_interactive:
            from rich.live import Live
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress
            from rich.progress import TimeRemainingColumn

            self._bar = RichProgress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TimeRemainingColumn(),
            )
            self._task = self._bar.add_task("train", total=self.total, completed=self._start_step)
            self._live = Live(self._bar, console=console, refresh_per_second=4)
            self._live.start()
        elif enabled:
            self._heartbeat = Heartbeat(self._print, interval_s, f"step {self._start_step + 1}/{self.total}")
            self._heartbeat.detail = self._time_left

    def doing(self, what: str) -> None:
        """Name the work under way (`step 3/30`, `initial evaluation`) for the heartbeat line."""
        if self._heartbeat is not None:
            self._heartbeat.doing(what)

    def update(self, step: int, **fields: float | None) -> None:
        """Report that `step` (1-based count of finished steps) is done, with its field values."""
        if not self.enabled:
            return
        items = [f"{name} {_format_value(value)}" for name, value in fields.items()]
        done, self._step = step - self._start_step, step
        self._per_step = (time.monotonic() - self._start_time) / done if done > 0 else math.nan
        if self._bar is not None:
            from rich.columns import Columns
            from rich.console import Group

            self._bar.update(self._task, completed=step)
            # The fields go below the bar, as columns that wrap whole: a narrow terminal does not cut them off.
            self._live.update(Group(self._bar, Columns(items, padding=(0, 2))))
            return
        beat, now = self._heartbeat, time.monotonic()
        if step % self.every == 0 or step == self.total or now - self._last_step_line >= beat.interval_s:
            beat.say(f"step {step}/{self.total}  {'  '.join(items)}  ({self._per_step:.2f} s/step{self._time_left()})")
            self._last_step_line = now
        beat.doing(f"step {step + 1}/{self.total}")

    def _time_left(self) -> str:
        """'; about 12 min left' at the mean step time so far ('' before the first step ends)."""
        left = (self.total - self._step) * self._per_step
        return f"; about {duration(left)} left" if left >= 1 else ""

    def _print(self, line: str) -> None:
        print(line, file=self._file, flush=True)

    def close(self) -> None:
        """Stop the live bar (leaving its last state on screen) or the heartbeat. Safe to call twice."""
        if self._bar is not None:
            self._live.stop()
            self._bar = None
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def duration(seconds: float) -> str:
    """'45 s', '3 min 20 s', '2 h 05 min': short enough for a log line, exact enough to plan by."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def _format_value(value: float | None) -> str:
    """Four significant digits; '-' for a value not measured this step."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.4g}"
