"""One process per run directory: a lock that `ragen2 train` holds while it writes a run.

Two processes writing one run directory interleave metrics.jsonl and checkpoints, and both
believe they own it. The lock is an OS file lock (`fcntl.flock`) on `RUN_DIR/.lock`: the kernel
drops it when its process exits, crashes or is killed, so a dead run never blocks the next one.
The file also records the holder's PID and host; finding the file present but unlocked means a
process died without cleaning up, and the new process says so as it takes over.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

from ragen2.errors import Ragen2Error

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"


class RunLockedError(Ragen2Error, RuntimeError):
    """Another live process is training in the run directory."""


class RunLock:
    """Held from `acquire` to `release` (or process exit); a context manager as well."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock, or raise RunLockedError naming the process that holds it."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = _describe(_read_holder(self.path))
                raise RunLockedError(
                    f"{self.path.parent} is in use by another ragen2 process{holder}: two processes would corrupt "
                    f"its metrics and checkpoints. Wait for it to finish (or stop it), then run again"
                ) from None
            if _same_file(fd, self.path):
                break
            os.close(fd)  # locked a file its holder unlinked on release: lock the current one instead
        stale = _read_holder(self.path)
        if stale:
            log.warning("%s: taking over a stale lock left by a process that is no longer running%s",
                        self.path.parent, _describe(stale))
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        """Remove the file and drop the lock; a no-op when not held."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)  # unlinked while still locked: no one can take the old file meanwhile
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _read_holder(path: Path) -> dict:
    """What the lock file says about its holder ({} when empty or unreadable)."""
    try:
        holder = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict) -> str:
    if not holder:
        return ""
    return f" (pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')})"
