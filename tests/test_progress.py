"""Progress off a terminal: a line per step at the latest every N steps or a minute, with the time left,
and a heartbeat while a long step runs; on a terminal, a live bar."""

from __future__ import annotations

import io
import math
import os
import pty
import re
import select
import time

import pytest

from ragen2.progress import Heartbeat, Progress, duration


def test_progress_prints_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    with Progress(total=5, every=2, file=out) as progress:
        for step in range(1, 6):
            progress.update(step, reward=step / 10, success=0.5, entropy=math.nan)
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["2/5", "4/5", "5/5"]  # fast steps: every 2nd and the last
    assert "reward 0.4  success 0.5  entropy -" in lines[1]


def test_progress_disabled_prints_nothing() -> None:
    out = io.StringIO()
    with Progress(total=3, enabled=False, every=1, file=out) as progress:
        for step in range(1, 4):
            progress.update(step, reward=1.0)
    assert out.getvalue() == ""


def test_progress_on_a_narrow_terminal_keeps_every_field_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a 40-column terminal the bar fits and the fields wrap below it, each name with its value."""
    monkeypatch.setenv("COLUMNS", "40")
    monkeypatch.delenv("TERM", raising=False)
    master, slave = pty.openpty()
    with os.fdopen(slave, "w") as terminal, Progress(total=2, file=terminal) as progress:
        assert progress._bar is not None  # a terminal gets the live bar, not summary lines
        for step in (1, 2):
            progress.update(step, reward=7.725, success=0.75, entropy=0.06652, eval_success=0.5)
    screen = b""
    while select.select([master], [], [], 0.2)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal's other end is closed: everything has been read
            break
        if not chunk:
            break
        screen += chunk
    os.close(master)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.decode())
    last = [line.rstrip() for line in text.replace("\r", "\n").splitlines() if line.strip()][-3:]
    assert last[0].startswith("train ") and "2/2" in last[0]
    assert all(len(line) <= 40 for line in last)
    fields = " ".join(last[1:]).split()
    assert fields == ["reward", "7.725", "success", "0.75", "entropy", "0.06652", "eval_success", "0.5"]
    assert any(line.split()[:2] == ["eval_success", "0.5"] or line.split()[-2:] == ["eval_success", "0.5"]
               for line in last[1:])


def test_a_slow_step_gets_its_own_line_with_the_time_left() -> None:
    """Off a terminal, a step's line whenever `interval_s` passed since the last one, between every-N lines."""
    out = io.StringIO()
    with Progress(total=20, every=10, file=out, interval_s=0.05) as progress:
        progress.update(1, reward=1.0)  # not a multiple of 10, but the log has been silent long enough
        time.sleep(0.2)
        progress.update(2, reward=1.0)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("step ") and "under way" not in line]
    assert [line.split()[1] for line in lines] == ["2/20"], out.getvalue()
    assert re.search(r"\(0\.1\d s/step; about [23] s left\)$", lines[0]), lines[0]  # 18 steps of about 0.1 s


def test_the_heartbeat_says_what_runs_while_a_step_is_long() -> None:
    out = io.StringIO()
    with Progress(total=4, file=out, interval_s=0.2) as progress:
        progress.doing("initial evaluation (step 0)")
        time.sleep(0.5)
    beats = out.getvalue().splitlines()
    assert beats and all(line.startswith("initial evaluation (step 0): under way for ") for line in beats)
    assert len(beats) <= 3  # one per interval of silence, not one per check


def test_heartbeat_lines_count_as_output_and_stop_with_the_work() -> None:
    lines: list[str] = []
    beat = Heartbeat(lines.append, interval_s=0.1, what="evaluating sokoban")
    time.sleep(0.35)
    beat.stop()
    count = len(lines)
    time.sleep(0.15)
    assert 2 <= count <= 4 and len(lines) == count
    assert lines[0].startswith("evaluating sokoban: under way for 0 s")


@pytest.mark.parametrize(("seconds", "text"), [(0.4, "0 s"), (59, "59 s"), (200, "3 min 20 s"), (7500, "2 h 05 min")])
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text
