"""Run untrusted Python programs in an isolated, limited process (Linux).

`run_program(source, stdin, limits)` runs one program and returns a `RunResult`;
`run_programs(jobs, limits, max_workers)` runs several at once from a bounded thread
pool (each thread only waits on its subprocess, so the pool size is the number of
programs running at the same time). `prepare(limits)` checks up front that this
machine can isolate programs; the `code` env calls it when it is built.

Why the isolation is done by the operating system. A policy trained with RL on a
reward it can reach finds that reward: a program that reads the hidden tests (the
project's files), leaves an answer for a later run, or talks to a host process scores
without solving anything. So nothing of the host is visible to a program at all, and
the in-interpreter audit hook is only a second layer that gives clear error messages;
every item below holds with it switched off (tests/envs/test_sandbox.py).

How one run is isolated (the host runs as root, the usual case in containers; for
another user, see "Without root" below).
The host writes the program and its stdin to files and hands the run to a fork server:
a `python -S -P` interpreter started once per host process with a minimal environment
(nothing of the host's: no secrets, tokens or proxies), which never runs untrusted
code itself. At start-up the server enters a mount namespace of its own and builds
there, once, the sandbox's read-only filesystem (`_build_root`): the standard library
at /stdlib (its site-packages hidden), the shared libraries its extension modules load (found
with `ldd`), /etc/ld.so.cache, /dev/null, zero, random and urandom, and empty mount
points. For each run it forks a launcher (`_launch`) that leads its own process group
and enters new mount, PID, network, IPC and UTS namespaces (`_isolate`), mounts one
tmpfs of `4 * max_file_bytes` for the run's writable places (the working directory
/work, /tmp and /dev/shm; they vanish with the run) and forks the program's process.
That process, PID 1 of its namespace, mounts its own /proc, makes the sandbox
filesystem its root with pivot_root (`_enter_root`; the host's filesystem is then
detached, not merely hidden), applies the resource limits, drops to a sandbox uid,
installs the audit hook and runs the program as `__main__` (`_enter_sandbox`,
`_run_program`). Forking a ready interpreter saves the interpreter's start-up on
every run, so that even with the namespaces and mounts a run costs less than starting a
plain `python -c` (benchmarks/code_throughput.py).

What a program can then see and do:

- Files: the standard library (read-only), its working directory, a private /tmp and
  /dev/shm (size-capped, gone after the run). No project file, no installed package,
  no home directory, no host /tmp, no shell or other executable.
- Processes: its own /proc; the host's processes do not exist in its PID namespace,
  and every process it started dies with it, even one that called setsid().
- Network: only a loopback device that is down; abstract AF_UNIX sockets of the host
  are in another network namespace, filesystem ones are not in its filesystem.
- uid: a uid of its own, 61000 + k, leased for the run so that no two concurrent runs
  (in any process) share it, without capabilities and with no_new_privs: it cannot
  write the read-only filesystem, mount, signal or ptrace anything outside its run.
- Memory: `memory_mb` for all of its processes together. No rlimit covers several
  processes, and no memory cgroup is used (this project's machines have cgroup v1), so
  the cap is split (`process_limits`): at most `memory_mb // 128` processes and threads
  (RLIMIT_NPROC, never more than `max_processes`), each with an equal share of address
  space (RLIMIT_AS). The uid is unique to the run, so RLIMIT_NPROC counts only its tasks.
- RLIMIT_CPU (SIGKILL at `cpu_s` of CPU time), RLIMIT_FSIZE (`max_file_bytes` per
  written file), RLIMIT_NOFILE, RLIMIT_CORE = 0; hard limits, so none can be raised.
- Wall time: the host kills the run's process group at `wall_s`; the launcher also
  arms its own alarm, launcher and program die with their parent (PR_SET_PDEATHSIG)
  and the fork server exits when the host does, so nothing outlives a killed host.
- Output: the host keeps at most `max_output_bytes` of stdout+stderr and kills the
  program as soon as it writes more.

Without root, the same holds through unprivileged user namespaces, as in rootless
containers, where the kernel allows them (`_user_namespaces_missing`). The fork server
first enters a user namespace of its own (its uid and gid mapped to themselves,
setgroups denied), which owns its mount namespace and every namespace its launchers
create, so it may mount, pivot_root and mount /proc there. An unprivileged user may map
only its own uid, so there are no sandbox uids to lease; instead each program's
process, once in its root, enters a user namespace of its own and clears its
capabilities (`_enter_user_namespace`, `_drop_capabilities`). That namespace owns
nothing, so the program cannot mount, unmount or remount anything (a nested namespace
of its own gets locked copies of the mounts), and:

- RLIMIT_NPROC still counts only the program's tasks: since Linux 5.14 it counts the
  tasks of one user in one user namespace (older kernels are refused).
- Signals and ptrace reach only its own processes: the host's, the fork server's and
  other runs' are in other PID namespaces, so they do not exist for it.
- Files: it runs as the host user's uid (which it sees as its own), but nothing of the
  host's is in its filesystem; its supplementary groups stay (they show as the
  overflow gid), as they cannot be dropped once setgroups is denied.

No silent downgrade. When the machine cannot provide this (not root and no user
namespaces, no namespaces, no permission to mount), `run_program` and `prepare` raise
`SandboxUnavailable`, which says what failed and what to enable.
`Limits(allow_unsandboxed=True)` runs programs anyway, logging a warning: then only the
rlimits, the uid change (as root), best-effort PID and network namespaces, the minimal
environment, a fresh directory and the audit hook apply.

What the audit hook (PEP 578, `audit_hook=True`) adds inside the interpreter: it refuses
sockets, subprocesses, os.system/exec/spawn/fork, os.kill/killpg, ctypes, changing
rlimits, links and symlinks, any open() outside the program's directory and the
standard library (reads) or outside its writable places (writes), listing directories
elsewhere, and importing ctypes or _posixsubprocess, with a clear PermissionError. It
is not a security boundary against a program written to defeat it (PEP 578 says so,
and the battery's bypass programs show two ways); the OS layer is.

Programs can import the standard library only (no site-packages). Their stdin is a file,
so `sys.stdin.read()`, `input()` and `open(0).read()` all work.
"""

from __future__ import annotations

import fcntl
import glob
import inspect
import itertools
import json
import logging
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, fields

from ragen2.errors import ConfigError, did_you_mean

log = logging.getLogger(__name__)

# Sandbox uids: one per concurrently running program, leased through a lock file so that
# several host processes on one machine never share one. No account needs to exist.
SANDBOX_UIDS = range(61000, 61512)
_LOCK_DIR = os.path.join(tempfile.gettempdir(), "ragen2-sandbox-uids")
# Where the next lease starts looking: uids are taken in turn, not lowest first, so that the
# processes of a run the host just killed have long been reaped before their uid (whose
# process count RLIMIT_NPROC checks) is leased again.
_uid_turn = itertools.count()
# The smallest address space one process gets when the memory cap is split over processes:
# a forked interpreter maps about 30 MiB before the program allocates anything.
_MIN_PROCESS_MB = 128


class SandboxUnavailable(ConfigError):
    """This machine cannot isolate programs, and running them without isolation was not allowed."""

    def __init__(self, missing: str) -> None:
        self.missing = missing
        super().__init__(
            f"the code sandbox cannot isolate programs on this machine: {missing}. It needs Linux mount, PID "
            "and network namespaces and the right to mount, that is a host process running as root (with "
            "CAP_SYS_ADMIN, as in a default container). Without them a program can read the project's files, "
            "the hidden tests included, and RL training learns to. As a user other than root it needs "
            "unprivileged user namespaces (Linux 5.14 or later; enable them with sysctl "
            "kernel.unprivileged_userns_clone=1 where that setting exists, user.max_user_namespaces=10000, "
            "and on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0). To run programs without this "
            "isolation anyway, set the sandbox limit allow_unsandboxed: true (for the code env: "
            "limits: {allow_unsandboxed: true}); a warning is logged."
        )


@dataclass(frozen=True)
class Limits:
    """Resource limits of one program run (per test when grading code)."""

    wall_s: float = 4.0
    """Wall-clock seconds before the host kills the program."""
    cpu_s: int = 2
    """CPU seconds (RLIMIT_CPU, whole seconds); the program is killed when it uses them up."""
    memory_mb: int = 512
    """Memory of all the program's processes together, in MiB (split over them, see `process_limits`)."""
    max_output_bytes: int = 1_000_000
    """stdout plus stderr kept; a program that writes more is killed."""
    max_file_bytes: int = 1_000_000
    """Largest file the program may write (RLIMIT_FSIZE); all its files together get 4 times this."""
    max_processes: int = 16
    """Processes and threads of the run (RLIMIT_NPROC), at most; the memory split may allow fewer."""
    max_open_files: int = 64
    """File descriptors (RLIMIT_NOFILE)."""
    audit_hook: bool = True
    """Install the in-interpreter audit hook on top of the OS limits (off only to test the OS layer)."""
    allow_unsandboxed: bool = False
    """Where the machine cannot isolate programs, run them anyway (logged as a warning) instead of refusing."""

    def __post_init__(self) -> None:
        if not self.wall_s > 0:
            raise ConfigError(f"wall_s={self.wall_s} is not allowed: use a number of seconds > 0")
        for name in ("cpu_s", "memory_mb", "max_output_bytes", "max_file_bytes", "max_processes", "max_open_files"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name}={value!r} is not allowed: use an integer >= 1")
        if self.memory_mb < 64:
            raise ConfigError(f"memory_mb={self.memory_mb} is not allowed: the interpreter needs at least 64")

    @classmethod
    def from_dict(cls, cfg: dict | None) -> Limits:
        """Build from a config mapping, naming unknown keys (e.g. `{"wall_s": 2}` from YAML)."""
        cfg = dict(cfg or {})
        known = [f.name for f in fields(cls)]
        for key in cfg:
            if key not in known:
                raise ConfigError(
                    f"unknown sandbox limit {key!r}; valid: {', '.join(known)}." + did_you_mean(key, known)
                )
        return cls(**cfg)


@dataclass(frozen=True)
class RunResult:
    """What one run produced and how it ended."""

    stdout: str
    stderr: str
    exit_code: int
    """The program's exit status; -N when it was killed by signal N (subprocess's convention)."""
    timed_out: bool
    """It hit the wall-clock or the CPU-time limit."""
    wall_s: float
    killed_reason: str | None
    """None for a normal exit (any status), else wall_time, cpu_time, output_limit, file_size or memory."""


def process_limits(limits: Limits) -> tuple[int, int]:
    """(processes and threads, address-space bytes of each): together they stay within `memory_mb`.

    RLIMIT_AS holds per process, so `n` processes could use `n * memory_mb`; splitting the
    cap keeps their sum under it. Threads share their process's address space, but
    RLIMIT_NPROC counts them too, so the bound is safe either way.
    """
    processes = max(1, min(limits.max_processes, limits.memory_mb // _MIN_PROCESS_MB))
    return processes, (limits.memory_mb << 20) // processes


def run_program(source: str, stdin: str = "", limits: Limits | None = None) -> RunResult:
    """Run `source` as a Python program with `stdin` as its input, under `limits`.

    Raises `SandboxUnavailable` when the machine cannot isolate the program and
    `limits.allow_unsandboxed` is false.
    """
    limits = limits or Limits()
    if _isolation_error is not None and limits.allow_unsandboxed:
        return _run(source, stdin, limits, isolated=False)
    try:
        return _run(source, stdin, limits, isolated=True)
    except SandboxUnavailable as e:
        if not limits.allow_unsandboxed:
            raise
        _fall_back(e.missing)
        return _run(source, stdin, limits, isolated=False)


def run_programs(
    jobs: Sequence[tuple[str, str]], limits: Limits | None = None, max_workers: int = 4
) -> list[RunResult]:
    """Run (source, stdin) jobs with at most `max_workers` at a time; results in job order."""
    if max_workers < 1:
        raise ConfigError(f"max_workers={max_workers} is not allowed: use an integer >= 1")
    if len(jobs) <= 1 or max_workers == 1:
        return [run_program(source, stdin, limits) for source, stdin in jobs]
    with ThreadPoolExecutor(max_workers=min(max_workers, len(jobs))) as pool:
        return list(pool.map(lambda job: run_program(job[0], job[1], limits), jobs))


def prepare(limits: Limits | None = None) -> None:
    """Fail now, with `SandboxUnavailable`, if programs cannot run under `limits` on this machine.

    The first call in a process runs an empty program (a few tens of milliseconds);
    later calls return at once.
    """
    if not _verified:
        run_program("", limits=limits)


def isolation() -> dict[str, bool]:
    """Which OS-level protections are in force for a program (the audit hook does not depend on the host).

    Where the machine cannot isolate programs, it reports what an unsandboxed run gets.
    """
    probe = (
        "import os, socket\n"
        f"print(os.getuid() in range({SANDBOX_UIDS.start}, {SANDBOX_UIDS.stop}), os.getpid() == 1, "
        "[name for _, name in socket.if_nameindex()] == ['lo'], "
        f"not os.path.exists({os.path.abspath(__file__)!r}))"
    )
    limits = Limits(audit_hook=False)
    try:
        result = _run(probe, "", limits, isolated=True)
    except SandboxUnavailable:
        result = _run(probe, "", limits, isolated=False)
    uid, pid, net, files = (result.stdout.split() + ["False"] * 4)[:4]
    return {
        "separate_uid": uid == "True",
        "pid_namespace": pid == "True",
        "network_namespace": net == "True",
        "private_filesystem": files == "True",
    }


# Built from scratch: nothing of the host's environment reaches a program. PYTHONHASHSEED
# fixes str hashing, so set iteration order, hence output, is the same on every run.
_ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}


class _ForkServer:
    """A clean interpreter that forks one launcher per run (`_server_main`).

    Forking a ready interpreter instead of starting one per run saves most of the
    start-up time. The server never runs untrusted code itself, so every run starts
    from the same state. An isolated server first builds the sandbox filesystem and
    reports `ready` or `error <what failed>`. It exits when the host closes its end of
    the socket (the host exiting included).
    """

    def __init__(self, isolated: bool) -> None:
        rootless = isolated and os.geteuid() != 0
        if rootless and (missing := _user_namespaces_missing()):
            raise SandboxUnavailable(f"the host process does not run as root, and {missing}")
        config = {"isolated": isolated, "rootless": rootless, "libraries": _runtime_libraries() if isolated else []}
        host_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, "-S", "-P", "-c", _SERVER_SOURCE, str(server_end.fileno()), json.dumps(config)],
            pass_fds=[server_end.fileno()],
            env=_ENV,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C meant for the host does not reach it
        )
        server_end.close()
        host_end.settimeout(60)
        try:
            hello = host_end.recv(4096).decode()
        except OSError:
            hello = ""
        if hello != "ready":
            host_end.close()
            self.proc.kill()
            self.proc.wait()
            raise SandboxUnavailable(hello.removeprefix("error ") or "the fork server did not start")
        host_end.settimeout(None)
        self.isolated = isolated
        self.sock = host_end
        self.owner = os.getpid()
        self.lock = threading.Lock()

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.proc.poll() is None

    def spawn(self, request: dict, fds: list[int]) -> None:
        with self.lock:
            socket.send_fds(self.sock, [json.dumps(request).encode()], fds)


_servers: dict[bool, _ForkServer] = {}  # by `isolated`
_server_lock = threading.Lock()
_isolation_error: str | None = None
"""Why this machine cannot isolate programs, once a run that allowed unsandboxed execution found out."""
_verified = False
"""An isolated run has completed in this process."""


def _fork_server(isolated: bool) -> _ForkServer:
    with _server_lock:
        server = _servers.get(isolated)
        if server is None or not server.alive():
            server = _servers[isolated] = _ForkServer(isolated)
        return server


def _spawn(isolated: bool, request: dict, fds: list[int]) -> None:
    """Send a run to the fork server, starting a new one if the last one is gone."""
    try:
        _fork_server(isolated).spawn(request, fds)
    except OSError:  # it died between the liveness check and the send
        with _server_lock:
            _servers.pop(isolated, None)
        _fork_server(isolated).spawn(request, fds)


def _fall_back(missing: str) -> None:
    global _isolation_error
    with _server_lock:
        if _isolation_error is None:
            _isolation_error = missing
            log.warning(
                "running programs WITHOUT the code sandbox's isolation (allow_unsandboxed is set): %s. They can "
                "read the project's files, the hidden tests included.",
                missing,
            )


def _user_namespaces_missing() -> str | None:
    """Why a user other than root cannot have the sandbox through user namespaces here, or None if it can."""
    release = re.match(r"(\d+)\.(\d+)", os.uname().release)
    if release is None or (int(release[1]), int(release[2])) < (5, 14):
        # Before 5.14 RLIMIT_NPROC counts all of the user's processes, not those of one user namespace.
        return f"Linux {os.uname().release} is older than 5.14"
    for setting, disabled in (
        ("kernel/unprivileged_userns_clone", "0"),
        ("user/max_user_namespaces", "0"),
        ("kernel/apparmor_restrict_unprivileged_userns", "1"),  # Ubuntu: the namespace gets no capabilities
    ):
        with suppress(OSError), open(f"/proc/sys/{setting}") as f:
            if f.read().strip() == disabled:
                return f"unprivileged user namespaces are disabled ({setting.replace('/', '.')} = {disabled})"
    return None


def _runtime_libraries() -> list[str]:
    """The shared libraries the standard library's extension modules load, which the sandbox must show."""
    extensions = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "lib-dynload", "*.so")))
    if not extensions:  # a statically linked interpreter
        return []
    try:
        listing = subprocess.run(["ldd", *extensions], capture_output=True, text=True, env=_ENV, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxUnavailable(f"cannot list the interpreter's shared libraries with ldd ({e})") from e
    return sorted(set(re.findall(r"=> (/\S+) \(", listing)))


def _run(source: str, stdin: str, limits: Limits, isolated: bool) -> RunResult:
    global _verified
    processes, memory_bytes = process_limits(limits)
    with _leased_uid() as uid, _workdir(uid) as workdir:
        source_path, stdin_path = os.path.join(workdir, "solution.py"), os.path.join(workdir, "stdin.txt")
        _write(source_path, source, uid)
        _write(stdin_path, stdin, uid)
        request = {
            "isolated": isolated,
            "rootless": isolated and uid is None,
            "workdir": "/work" if isolated else workdir,
            "uid": uid,
            "wall_s": limits.wall_s,
            "cpu_s": limits.cpu_s,
            "memory_bytes": memory_bytes,
            "file_bytes": limits.max_file_bytes,
            "scratch_bytes": 4 * limits.max_file_bytes,
            "processes": processes,
            "open_files": limits.max_open_files,
            "audit_hook": limits.audit_hook,
        }
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        status, status_child = socket.socketpair()
        stdin_fd = os.open(stdin_path, os.O_RDONLY)
        source_fd = os.open(source_path, os.O_RDONLY)
        try:
            _spawn(isolated, request, [stdin_fd, source_fd, out_w, err_w, status_child.fileno()])
        finally:  # the launcher holds its own copies now
            for fd in (stdin_fd, source_fd, out_w, err_w):
                os.close(fd)
            status_child.close()
        start = time.monotonic()  # after a fork server's start-up, which _spawn may have waited for
        try:
            stdout, stderr, lines, host_reason = _collect(out_r, err_r, status, limits, start + limits.wall_s)
        finally:
            for fd in (out_r, err_r):
                os.close(fd)
            status.close()
        wall = time.monotonic() - start
    if "error" in lines:
        raise SandboxUnavailable(lines["error"])
    raw_status = int(lines["status"]) if "status" in lines and host_reason is None else None
    if isolated and raw_status is not None:
        _verified = True
    exit_code = -signal.SIGKILL if raw_status is None else os.waitstatus_to_exitcode(raw_status)
    err = stderr.decode("utf-8", "replace")
    reason = host_reason or _reason_from_status(exit_code, err)
    return RunResult(
        stdout=stdout.decode("utf-8", "replace"),
        stderr=err,
        exit_code=exit_code,
        timed_out=reason in ("wall_time", "cpu_time"),
        wall_s=wall,
        killed_reason=reason,
    )


@contextmanager
def _leased_uid() -> Iterator[int | None]:
    """A sandbox uid no other run holds (None when not root: the uid cannot change)."""
    if os.geteuid() != 0:
        yield None
        return
    os.makedirs(_LOCK_DIR, mode=0o700, exist_ok=True)
    start = next(_uid_turn) % len(SANDBOX_UIDS)
    for uid in itertools.chain(SANDBOX_UIDS[start:], SANDBOX_UIDS[:start]):
        fd = os.open(os.path.join(_LOCK_DIR, f"{uid}.lock"), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield uid
        finally:
            os.close(fd)  # releases the lock
        return
    raise RuntimeError(f"all {len(SANDBOX_UIDS)} sandbox uids are in use: run fewer programs at once")


@contextmanager
def _workdir(uid: int | None) -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="ragen2-sandbox-")
    try:
        if uid is not None:
            os.chown(path, uid, uid)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _write(path: str, text: str, uid: int | None) -> None:
    # surrogatepass: any str can be written; the program then fails to decode, not the host.
    with open(path, "wb") as f:
        f.write(text.encode("utf-8", "surrogatepass"))
    if uid is not None:
        os.chown(path, uid, uid)


def _collect(
    out_r: int, err_r: int, status: socket.socket, limits: Limits, deadline: float
) -> tuple[bytes, bytes, dict[str, str], str | None]:
    """Read the program's output and the launcher's status lines until the run ends or a limit hits.

    Returns stdout, stderr, the launcher's lines by key and the host's kill reason. The
    launcher writes `pid N` when it starts, `error E` when it could not isolate the run,
    and `status S` when the program has ended; it closes everything when it exits.
    """
    out = {out_r: bytearray(), err_r: bytearray()}
    report = bytearray()
    selector = selectors.DefaultSelector()
    for fd in (out_r, err_r, status.fileno()):
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    total, reason = 0, None
    try:
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                reason = "wall_time"
                break
            for key, _ in selector.select(timeout=remaining):
                data = os.read(key.fd, 1 << 16)
                if not data:
                    selector.unregister(key.fd)
                elif key.fd == status.fileno():
                    report += data
                else:
                    out[key.fd] += data[: max(0, limits.max_output_bytes - total)]
                    total += len(data)
            if total > limits.max_output_bytes:
                reason = "output_limit"
                break
    finally:
        selector.close()
    lines = dict(line.split(" ", 1) for line in report.decode().splitlines())
    if reason is not None and "status" not in lines:
        if "pid" not in lines:  # it is starting: its pid line is on the way
            status.setblocking(True)
            status.settimeout(1.0)
            with suppress(OSError):
                lines.update(line.split(" ", 1) for line in status.recv(64).decode().splitlines())
        if "pid" in lines:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(int(lines["pid"]), signal.SIGKILL)  # launcher, program and anything they started
    return bytes(out[out_r]), bytes(out[err_r]), lines, reason


def _reason_from_status(exit_code: int, stderr: str) -> str | None:
    if exit_code in (-signal.SIGKILL, -signal.SIGXCPU):
        return "cpu_time"  # the host did not kill it, so RLIMIT_CPU did
    if exit_code != 0:
        last_line = stderr.rstrip().rpartition("\n")[2]
        if last_line == "MemoryError" or last_line.startswith("MemoryError:"):
            return "memory"
        if last_line.startswith("OSError: [Errno 27]"):  # EFBIG: Python ignores SIGXFSZ, the write fails
            return "file_size"
    return None


# The rest runs in the fork server, a separate `python -S -P -c` interpreter: these
# functions are sent as source text, so each imports what it uses and reads no globals
# other than the functions sent with it.

# Paths in the fork server's own mount namespace: the sandbox's root, and the mount point of
# each run's writable tmpfs. The server's /tmp is a tmpfs of its own, so the host sees neither.
# In the sandbox the standard library is at _STDLIB, a path that tells nothing of the host's.
_ROOT, _SCRATCH, _STDLIB = "/tmp/root", "/tmp/run", "/stdlib"


def _server_main() -> None:
    """Build the sandbox filesystem (isolated mode), then fork one launcher per request until the host leaves."""
    import ctypes
    import json
    import os
    import resource  # noqa: F401  (for _enter_sandbox, which runs where the host's path to it is gone)
    import signal
    import socket
    import sys

    control = socket.socket(fileno=int(sys.argv[1]))
    config = json.loads(sys.argv[2])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
    stdlib_fd = None
    if config["isolated"]:
        try:
            _build_root(libc, config["libraries"], config["rootless"])
        except OSError as e:
            control.send(f"error {e.strerror}".encode())
            return
    else:  # for imports after the uid change (see _enter_sandbox)
        stdlib_fd = os.open(os.path.dirname(os.__file__), os.O_RDONLY | os.O_DIRECTORY)
    control.send(b"ready")
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps finished launchers
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 1 << 16, 5)
        except OSError:
            return
        if not message:
            return
        if os.fork() == 0:
            control.close()
            _launch(json.loads(message), fds, libc, stdlib_fd)
        for fd in fds:
            os.close(fd)


def _libc_call(libc: object, name: str, *args: object, shown: str = "") -> None:
    """Call libc's `name`; on failure raise OSError naming the call (`shown`: its arguments), for the refusal."""
    import ctypes
    import os

    if getattr(libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        text = ("NULL" if a is None else a.decode() if isinstance(a, bytes) else repr(a) for a in args)
        shown = shown or ", ".join(text)
        raise OSError(errno, f"{name}({shown}) failed: {os.strerror(errno)}")


def _build_root(libc: object, libraries: list, rootless: bool) -> None:
    """Once per fork server: a private mount namespace whose `_ROOT` is the sandbox's read-only filesystem.

    It holds the standard library at `_STDLIB` (site-packages hidden by an empty
    tmpfs), the shared libraries its extension modules load and /etc/ld.so.cache (so
    that dlopen finds them), four harmless devices, and empty mount points for /proc,
    /work, /tmp and /dev/shm, which every run fills with its own.

    `rootless`: the host is not root, so the server first enters a user namespace of
    its own, which owns the new mount namespace and in which it may mount. The host's
    mounts are then locked: their nodev and noexec cannot be cleared on a bind of them.
    """
    import os

    rdonly, nosuid, nodev, noexec, remount, bind, rec, private = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
    if rootless:
        _enter_user_namespace(libc, 0x00020000, "CLONE_NEWUSER | CLONE_NEWNS")
    else:
        _libc_call(libc, "unshare", 0x00020000, shown="CLONE_NEWNS")  # from here on the host sees none of our mounts
    _libc_call(libc, "mount", None, b"/", None, rec | private, None)  # nor we any of its later ones
    _libc_call(libc, "mount", b"tmpfs", b"/tmp", b"tmpfs", nosuid | nodev, b"mode=755,size=1m")
    os.mkdir(_SCRATCH)
    os.mkdir(_ROOT)
    _libc_call(libc, "mount", b"tmpfs", _ROOT.encode(), b"tmpfs", nosuid | nodev, b"mode=755,size=1m")

    def show(path, writable=False, at=None):  # bind `path` at `at` in the sandbox, by default the same place
        target = _ROOT + (at or path)
        if os.path.isdir(path):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "a").close()
        _libc_call(libc, "mount", path.encode(), target.encode(), None, bind, None)
        flags = remount | bind | nosuid | (0 if writable else rdonly)  # devices: not nodev
        if rootless:
            flags |= os.statvfs(target).f_flag & (nodev | noexec)
        _libc_call(libc, "mount", None, target.encode(), None, flags, None)

    stdlib = os.path.dirname(os.__file__)
    show(stdlib, at=_STDLIB)
    for packages in ("site-packages", "dist-packages"):
        if os.path.isdir(os.path.join(stdlib, packages)):
            hidden = f"{_ROOT}{_STDLIB}/{packages}".encode()
            _libc_call(libc, "mount", b"tmpfs", hidden, b"tmpfs", rdonly | nosuid | nodev | noexec, b"size=4k")
    for path in [*libraries, "/etc/ld.so.cache"]:
        if os.path.exists(path):
            show(path)
    for device in ("null", "zero", "random", "urandom"):
        show("/dev/" + device, writable=True)
    for name in ("proc", "work", "tmp", "dev/shm"):
        os.makedirs(os.path.join(_ROOT, name), exist_ok=True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):  # fmt: skip
        os.symlink(target, os.path.join(_ROOT, "dev", name))
    _libc_call(libc, "mount", None, _ROOT.encode(), None, remount | rdonly | nosuid | nodev, None)


def _launch(request: dict, fds: list, libc: object, stdlib_fd: int | None) -> None:
    """The launcher of one run: new namespaces, fork the program, wait for it, report its status.

    `fds` are the program's stdin, its source, stdout, stderr and the status socket. The
    launcher leads its own process group, reports `pid N`, then `error E` if the run
    could not be isolated or else `status S`, and finally kills its whole group.
    """
    import os
    import signal

    stdin_fd, source_fd, out_fd, err_fd, status_fd = fds
    os.setsid()
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the fork server
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target, fd in ((0, stdin_fd), (1, out_fd), (2, err_fd)):
        os.dup2(fd, target)
        os.close(fd)
    os.write(status_fd, b"pid %d\n" % os.getpid())
    if request["isolated"]:
        try:
            _isolate(request, source_fd, libc)
        except OSError as e:
            os.write(status_fd, f"error {e.strerror}\n".encode())
            os._exit(1)
        os.environ.update(HOME="/work", TMPDIR="/tmp")
    else:
        os.chdir(request["workdir"])
        os.environ.update(HOME=request["workdir"], TMPDIR=request["workdir"])
        new_user, new_pid, new_net = 0x10000000, 0x20000000, 0x40000000
        if libc.unshare(new_pid | new_net) != 0 and request["uid"] is None:
            libc.unshare(new_user | new_pid | new_net)  # without root: where user namespaces are allowed
    os.close(source_fd)

    child = os.fork()
    if child == 0:
        if request["isolated"]:
            try:
                _enter_root(libc)
                if request["rootless"]:
                    # A user namespace per program, owning none of its other namespaces: RLIMIT_NPROC
                    # (Linux 5.14+) counts the tasks of one user in one user namespace, so only this
                    # program's, and its capabilities there reach neither its mounts nor anything else.
                    _enter_user_namespace(libc, 0, "CLONE_NEWUSER")
                    _drop_capabilities(libc)
            except OSError as e:
                os.write(status_fd, f"error {e.strerror}\n".encode())
                os._exit(1)
        os.close(status_fd)
        _enter_sandbox(request, libc, stdlib_fd)
        _run_program()
    # The wall limit holds even if the host is gone.
    signal.signal(signal.SIGALRM, lambda *_: os.kill(child, signal.SIGKILL))
    signal.setitimer(signal.ITIMER_REAL, request["wall_s"] + 0.5)
    _, status = os.waitpid(child, 0)
    os.write(status_fd, b"status %d\n" % status)
    os.killpg(0, signal.SIGKILL)


def _isolate(request: dict, source_fd: int, libc: object) -> None:
    """In the launcher: new namespaces, and the run's writable places on one size-capped tmpfs.

    The tmpfs holds the working directory (with the program as solution.py), /tmp and
    /dev/shm, each bound at its place in the sandbox's root; it is noexec, so no file
    the program writes can be executed or loaded as a library, and it disappears with
    the run's mount namespace.
    """
    import os

    namespaces = "CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET"  # PID: for the children
    _libc_call(libc, "unshare", 0x00020000 | 0x04000000 | 0x08000000 | 0x20000000 | 0x40000000, shown=namespaces)
    nosuid_nodev_noexec, bind = 2 | 4 | 8, 4096
    size = b"size=%d,mode=755" % request["scratch_bytes"]
    _libc_call(libc, "mount", b"tmpfs", _SCRATCH.encode(), b"tmpfs", nosuid_nodev_noexec, size)
    uid = request["uid"]  # None without root: the program keeps the host's uid, which owns these already
    for name, place in (("work", "/work"), ("tmp", "/tmp"), ("shm", "/dev/shm")):
        path = os.path.join(_SCRATCH, name)
        os.mkdir(path, 0o700)
        if uid is not None:
            os.chown(path, uid, uid)
        _libc_call(libc, "mount", path.encode(), (_ROOT + place).encode(), None, bind, None)
    program = os.path.join(_SCRATCH, "work", "solution.py")
    with open(program, "wb") as f:
        while chunk := os.read(source_fd, 1 << 16):
            f.write(chunk)
    if uid is not None:
        os.chown(program, uid, uid)


def _enter_root(libc: object) -> None:
    """In the program's process, PID 1 of the new namespaces: its own /proc, then the sandbox root becomes `/`.

    pivot_root(".", ".") stacks the old root on top of the new one; detaching it leaves
    no path, mount or descriptor to the host's filesystem.
    """
    import os

    _libc_call(libc, "mount", b"proc", (_ROOT + "/proc").encode(), b"proc", 2 | 4 | 8, None)  # nosuid nodev noexec
    os.chdir(_ROOT)
    _libc_call(libc, "pivot_root", b".", b".")
    _libc_call(libc, "umount2", b".", 2)  # MNT_DETACH
    os.chdir("/work")


def _enter_user_namespace(libc: object, also: int, shown: str) -> None:
    """unshare(CLONE_NEWUSER | `also`), mapping only this process's uid and gid to themselves.

    One id each is all an unprivileged process may map (more takes newuidmap, a setuid
    helper). Denying setgroups first is what allows the gid map; the process keeps its
    supplementary groups (they show as the overflow gid) and can neither drop nor add any.
    """
    import os

    uid, gid = os.geteuid(), os.getegid()
    _libc_call(libc, "unshare", 0x10000000 | also, shown=shown)
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        try:
            fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
            try:
                os.write(fd, text.encode())  # one write(): the kernel takes a map only whole
            finally:
                os.close(fd)
        except OSError as e:
            raise OSError(e.errno, f"writing {text!r} to /proc/self/{name} failed: {e.strerror}") from None


def _drop_capabilities(libc: object) -> None:
    """Clear the effective, permitted and inheritable capabilities (those a new user namespace grants)."""
    import ctypes

    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    sets = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable of both 32-bit halves: none
    _libc_call(libc, "capset", header, sets, shown="no capabilities")


def _enter_sandbox(request: dict, libc: object, stdlib_fd: int | None) -> None:
    """In the program's process: limits, uid, import paths, audit hook."""
    import os
    import resource
    import signal
    import sys

    if request["isolated"]:
        os.closerange(3, 1 << 16)  # nothing open of the fork server's reaches the program
    for limit, value in (
        (resource.RLIMIT_CPU, request["cpu_s"]),  # soft == hard: SIGKILL (a PID 1 ignores SIGXCPU)
        (resource.RLIMIT_AS, request["memory_bytes"]),
        (resource.RLIMIT_FSIZE, request["file_bytes"]),
        (resource.RLIMIT_NPROC, request["processes"]),
        (resource.RLIMIT_NOFILE, request["open_files"]),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(limit, (value, value))
    uid = request["uid"]
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: a uid change hides /proc/self/fd from the process
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: no exec can gain privileges
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG (a uid change clears it): die with the launcher
    for name in [m for m in sys.modules if m == "_ctypes" or m.split(".")[0] == "ctypes"]:
        del sys.modules[name]
    # Imports from here on find the standard library at its place in the sandbox, or (unsandboxed)
    # through a descriptor: the interpreter may live where the sandbox uid cannot enter (/root/.pyenv).
    stdlib, workdir = os.path.dirname(os.__file__), request["workdir"]
    seen = _STDLIB if request["isolated"] else f"/proc/self/fd/{stdlib_fd}"
    sys.path[:] = [workdir, seen, os.path.join(seen, "lib-dynload")]
    for module in list(sys.modules.values()):  # packages already imported (encodings, collections, ...)
        paths = getattr(module, "__path__", None)
        if isinstance(paths, list):
            paths[:] = [seen + p[len(stdlib) :] if p.startswith(stdlib) else p for p in paths]
    sys.path_importer_cache.clear()
    sys.dont_write_bytecode = True
    sys.argv = ["solution.py"]
    if request["audit_hook"]:
        if request["isolated"]:
            writable, readable = (workdir, "/tmp", "/dev/shm"), (workdir, "/tmp", "/dev/shm", _STDLIB)
        else:
            writable = (os.path.realpath(workdir),)
            readable = (*writable, os.path.realpath(stdlib))
        sys.addaudithook(_audit_hook(writable, readable))


def _run_program() -> None:
    """Run solution.py as `__main__` and exit as the interpreter would, minus the module teardown.

    What a program can observe of an exit is kept: the exit status and message of
    SystemExit, the traceback of an uncaught exception, non-daemon threads joined,
    atexit callbacks run, stdout and stderr flushed. Tearing down the modules the fork
    server imported is skipped: it is most of the run time of a short program.
    """
    import atexit
    import os
    import sys
    import threading

    try:
        with open("solution.py", "rb") as f:
            code = compile(f.read(), "solution.py", "exec")
        exec(code, {"__name__": "__main__", "__file__": "solution.py", "__builtins__": __builtins__})
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, int) and e.code is not None:
            sys.stderr.write(f"{e.code}\n")
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or broken stream: the interpreter ignores these at exit too
            pass
    os._exit(status & 0xFF)


def _audit_hook(writable: tuple, readable: tuple) -> object:
    """The audit hook: refuses what a test program never needs (see the module docstring)."""
    import os

    def inside(path, roots, realpath=os.path.realpath, fspath=os.fspath, fsdecode=os.fsdecode):
        if path is None or isinstance(path, int):
            return True  # the working directory, or an already open descriptor
        real = realpath(fsdecode(fspath(path)))
        return any(real == root or real.startswith(root + "/") for root in roots)

    # Defaults, not closures or globals: the program cannot rebind what the hook reads.
    def audit(
        event,
        args,
        deny=frozenset({
            "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill",
            "os.killpg", "signal.pthread_kill", "subprocess.Popen", "os.link", "os.symlink",
            "resource.setrlimit", "resource.prlimit", "pty.spawn",
        }),  # fmt: skip
        deny_prefixes=("socket.", "ctypes."),
        deny_imports=frozenset({"ctypes", "_ctypes", "_posixsubprocess"}),
        write_events=frozenset({
            "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
            "os.utime", "os.setxattr", "os.removexattr",
        }),  # fmt: skip
        list_events=frozenset({"os.listdir", "os.scandir"}),
        write_flags=os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND,
        readable=readable,
        writable=writable,
        inside=inside,
    ):
        if event in deny or event.startswith(deny_prefixes):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args[0] in deny_imports:
            raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
        if event == "open":
            path, mode, flags = args
            writing = bool(flags & write_flags) or any(c in (mode or "") for c in "wax+")
            if not inside(path, writable if writing else readable):
                raise PermissionError(f"sandbox: opening {path!r} is not allowed")
        elif event in write_events or event in list_events:
            paths = args[:2] if event == "os.rename" else args[:1]
            roots = readable if event in list_events else writable
            for path in paths:
                if not inside(path, roots):
                    raise PermissionError(f"sandbox: {event} on {path!r} is not allowed")

    return audit


_SERVER_FUNCTIONS = (
    _audit_hook, _run_program, _enter_sandbox, _drop_capabilities, _enter_user_namespace, _enter_root, _isolate,
    _launch, _build_root, _libc_call, _server_main,
)  # fmt: skip
_SERVER_SOURCE = (
    f"_ROOT, _SCRATCH, _STDLIB = {_ROOT!r}, {_SCRATCH!r}, {_STDLIB!r}\n\n"
    + "\n\n".join(textwrap.dedent(inspect.getsource(f)) for f in _SERVER_FUNCTIONS)
    + "\n\n_server_main()\n"
)
