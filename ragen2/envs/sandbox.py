"""Run untrusted Python programs in a separate, limited process (Linux).

`run_program(source, stdin, limits)` runs one program and returns a `RunResult`;
`run_programs(jobs, limits, max_workers)` runs several at once from a bounded thread
pool (each thread only waits on its subprocess, so the pool size is the number of
programs running at the same time).

How one run is isolated. The host writes the program to `solution.py` in a fresh
temporary directory and hands the run to a fork server: a `python -S -P` interpreter
started once per host process with a minimal environment (nothing of the host's
environment: no secrets, tokens or proxies), which never runs untrusted code itself.
For each run it forks a launcher (`_launch`) that takes the run's stdin (a file),
stdout/stderr pipes and a status socket, leads its own process group, enters new PID
and network namespaces and forks the program's process. That process applies the
resource limits, drops to a sandbox uid, installs the audit hook and executes the
program as `__main__` (`_enter_sandbox`, `_run_program`). Forking a ready interpreter
saves the interpreter's start-up on every run.

What the operating system enforces when the host runs as root (the usual case in
containers; each item is tested in tests/envs/test_sandbox.py with the hook off):

- uid: the program runs as a uid of its own, 61000 + k, leased for the run so that no
  two concurrent runs (in any process) share it. It cannot write files it does not own
  (so only its directory and world-writable places such as /tmp), cannot signal or
  ptrace other users' processes (the host included), cannot read /proc/<pid>/environ of
  the host.
- RLIMIT_NPROC applies because the uid is not root and is unique to the run: processes
  and threads are capped at `max_processes` without touching concurrent runs.
- PID namespace: the program is PID 1 of its own namespace, so when it exits or is
  killed every process it started dies with it, even one that called setsid().
- Network namespace: only a loopback device that is down; every connection fails.
- RLIMIT_CPU (SIGKILL at `cpu_s` of CPU time), RLIMIT_AS (`memory_mb` of address space:
  allocations fail with MemoryError), RLIMIT_FSIZE (`max_file_bytes` per written file),
  RLIMIT_NOFILE, RLIMIT_CORE = 0.
- Wall time: the host kills the run's process group at `wall_s`; the launcher also
  arms its own alarm, launcher and program die with their parent (PR_SET_PDEATHSIG)
  and the fork server exits when the host does, so nothing outlives a killed host.
- Output: the host keeps at most `max_output_bytes` of stdout+stderr and kills the
  program as soon as it writes more.

What the audit hook (PEP 578, `audit_hook=True`) adds inside the interpreter: it refuses
sockets, subprocesses, os.system/exec/spawn/fork, os.kill/killpg, ctypes, changing
rlimits, links and symlinks, any open() outside the program's directory and the
standard library (reads) or outside its directory (writes), listing directories
elsewhere, and importing ctypes or _posixsubprocess. It catches what the OS allows
(reading world-readable files such as /etc/passwd, writing to /tmp) and gives a clear
PermissionError instead of an obscure failure. An audit hook is not a security
boundary against a program written to defeat it (PEP 578 says so); the OS layer is.

As a non-root user: no uid change (so no file-write or signal protection beyond your
own permissions, and RLIMIT_NPROC counts all of your processes: usually no threads or
processes at all), PID and network namespaces only where unprivileged user namespaces
are allowed; rlimits, wall-time kill, output limit, minimal environment, fresh
directory and the audit hook always apply. `isolation()` reports what is in force.

Programs can import the standard library only (no site-packages). Their stdin is a file,
so `sys.stdin.read()`, `input()` and `open(0).read()` all work.
"""

from __future__ import annotations

import fcntl
import inspect
import json
import os
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

# Sandbox uids: one per concurrently running program, leased through a lock file so that
# several host processes on one machine never share one. No account needs to exist.
SANDBOX_UIDS = range(61000, 61512)
_LOCK_DIR = os.path.join(tempfile.gettempdir(), "ragen2-sandbox-uids")


@dataclass(frozen=True)
class Limits:
    """Resource limits of one program run (per test when grading code)."""

    wall_s: float = 4.0
    """Wall-clock seconds before the host kills the program."""
    cpu_s: int = 2
    """CPU seconds (RLIMIT_CPU, whole seconds); the program is killed when it uses them up."""
    memory_mb: int = 512
    """Address-space limit (RLIMIT_AS) in MiB; allocations beyond it raise MemoryError."""
    max_output_bytes: int = 1_000_000
    """stdout plus stderr kept; a program that writes more is killed."""
    max_file_bytes: int = 1_000_000
    """Largest file the program may write (RLIMIT_FSIZE)."""
    max_processes: int = 16
    """Processes and threads of the sandbox uid (RLIMIT_NPROC)."""
    max_open_files: int = 64
    """File descriptors (RLIMIT_NOFILE)."""
    audit_hook: bool = True
    """Install the in-interpreter audit hook on top of the OS limits (off only to test the OS layer)."""

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



def run_program(source: str, stdin: str = "", limits: Limits | None = None) -> RunResult:
    """Run `source` as a Python program with `stdin` as its input, under `limits`."""
    limits = limits or Limits()
    with _leased_uid() as uid, _workdir(uid) as workdir:
        _write(os.path.join(workdir, "solution.py"), source, uid)
        stdin_path = os.path.join(workdir, "stdin.txt")
        _write(stdin_path, stdin, uid)
        request = {
            "workdir": workdir,
            "uid": uid,
            "wall_s": limits.wall_s,
            "cpu_s": limits.cpu_s,
            "memory_bytes": limits.memory_mb << 20,
            "file_bytes": limits.max_file_bytes,
            "processes": limits.max_processes,
            "open_files": limits.max_open_files,
            "audit_hook": limits.audit_hook,
        }
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        status, status_child = socket.socketpair()
        stdin_fd = os.open(stdin_path, os.O_RDONLY)
        start = time.monotonic()
        try:
            _spawn(request, [stdin_fd, out_w, err_w, status_child.fileno()])
        finally:  # the launcher holds its own copies now
            for fd in (stdin_fd, out_w, err_w):
                os.close(fd)
            status_child.close()
        try:
            stdout, stderr, raw_status, host_reason = _collect(out_r, err_r, status, limits, start + limits.wall_s)
        finally:
            for fd in (out_r, err_r):
                os.close(fd)
            status.close()
        wall = time.monotonic() - start
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


def isolation() -> dict[str, bool]:
    """Which OS-level protections this host applies (the audit hook does not depend on the host)."""
    probe = run_program(
        "import os, socket\n"
        f"print(os.getuid() in range({SANDBOX_UIDS.start}, {SANDBOX_UIDS.stop}), os.getpid() == 1, "
        "[name for _, name in socket.if_nameindex()] == ['lo'])",
        limits=Limits(audit_hook=False),
    )
    uid, pid, net = (probe.stdout.split() + ["False"] * 3)[:3]
    return {"separate_uid": uid == "True", "pid_namespace": pid == "True", "network_namespace": net == "True"}


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
    from the same state. It exits when the host closes its end of the socket (the
    host exiting included).
    """

    def __init__(self) -> None:
        host_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, "-S", "-P", "-c", _SERVER_SOURCE, str(server_end.fileno())],
            pass_fds=[server_end.fileno()],
            env=_ENV,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C meant for the host does not reach it
        )
        server_end.close()
        self.sock = host_end
        self.owner = os.getpid()
        self.lock = threading.Lock()

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.proc.poll() is None

    def spawn(self, request: dict, fds: list[int]) -> None:
        with self.lock:
            socket.send_fds(self.sock, [json.dumps(request).encode()], fds)


_server: _ForkServer | None = None
_server_lock = threading.Lock()


def _fork_server() -> _ForkServer:
    global _server
    with _server_lock:
        if _server is None or not _server.alive():
            _server = _ForkServer()
        return _server


def _spawn(request: dict, fds: list[int]) -> None:
    """Send a run to the fork server, starting a new one if the last one is gone."""
    global _server
    try:
        _fork_server().spawn(request, fds)
    except OSError:  # it died between the liveness check and the send
        with _server_lock:
            _server = None
        _fork_server().spawn(request, fds)


@contextmanager
def _leased_uid() -> Iterator[int | None]:
    """A sandbox uid no other run holds (None when not root: the uid cannot change)."""
    if os.geteuid() != 0:
        yield None
        return
    os.makedirs(_LOCK_DIR, mode=0o700, exist_ok=True)
    for uid in SANDBOX_UIDS:
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
) -> tuple[bytes, bytes, int | None, str | None]:
    """Read the program's output and the launcher's status lines until the run ends or a limit hits.

    Returns stdout, stderr, the raw wait status (None when the host killed the run) and
    the host's kill reason. The launcher writes `pid N` when it starts and `status S`
    when the program has ended; it closes everything when it exits.
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
        return bytes(out[out_r]), bytes(out[err_r]), None, reason
    raw = int(lines["status"]) if "status" in lines else None
    return bytes(out[out_r]), bytes(out[err_r]), raw, reason


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
# functions are sent as source text, so each imports what it uses and reads no globals.


def _server_main() -> None:
    """Fork one launcher per request; exit when the host's end of the socket closes."""
    import ctypes
    import json
    import os
    import signal
    import socket
    import sys

    control = socket.socket(fileno=int(sys.argv[1]))
    libc = ctypes.CDLL(None, use_errno=True)
    # Imports after the uid change go through this descriptor: the interpreter may live
    # under a directory the sandbox uid cannot enter (e.g. /root/.pyenv).
    stdlib_fd = os.open(os.path.dirname(os.__file__), os.O_RDONLY | os.O_DIRECTORY)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps finished launchers
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 1 << 16, 4)
        except OSError:
            return
        if not message:
            return
        if os.fork() == 0:
            control.close()
            _launch(json.loads(message), fds, libc, stdlib_fd)
        for fd in fds:
            os.close(fd)


def _launch(request: dict, fds: list, libc: object, stdlib_fd: int) -> None:
    """The launcher of one run: new namespaces, fork the program, wait for it, report its status.

    `fds` are the program's stdin, stdout, stderr and the status socket. The launcher
    leads its own process group, reports `pid N` then `status S` on the socket, and
    finally kills its whole group.
    """
    import os
    import signal

    stdin_fd, out_fd, err_fd, status_fd = fds
    os.setsid()
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the fork server
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target, fd in ((0, stdin_fd), (1, out_fd), (2, err_fd)):
        os.dup2(fd, target)
        os.close(fd)
    os.write(status_fd, b"pid %d\n" % os.getpid())
    workdir = request["workdir"]
    os.chdir(workdir)
    os.environ.update(HOME=workdir, TMPDIR=workdir)
    new_user, new_pid, new_net = 0x10000000, 0x20000000, 0x40000000
    if libc.unshare(new_pid | new_net) != 0 and request["uid"] is None:
        libc.unshare(new_user | new_pid | new_net)  # without root: where user namespaces are allowed

    child = os.fork()
    if child == 0:
        os.close(status_fd)
        _enter_sandbox(request, libc, stdlib_fd)
        _run_program()
    # The wall limit holds even if the host is gone.
    signal.signal(signal.SIGALRM, lambda *_: os.kill(child, signal.SIGKILL))
    signal.setitimer(signal.ITIMER_REAL, request["wall_s"] + 0.5)
    _, status = os.waitpid(child, 0)
    os.write(status_fd, b"status %d\n" % status)
    os.killpg(0, signal.SIGKILL)


def _enter_sandbox(request: dict, libc: object, stdlib_fd: int) -> None:
    """In the program's process, as PID 1 of its namespace: limits, uid, import paths, audit hook."""
    import os
    import resource
    import signal
    import sys

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
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG (a uid change clears it): die with the launcher
    for name in [m for m in sys.modules if m == "_ctypes" or m.split(".")[0] == "ctypes"]:
        del sys.modules[name]
    stdlib = os.path.dirname(os.__file__)
    via_fd = f"/proc/self/fd/{stdlib_fd}"
    sys.path[:] = [request["workdir"], via_fd, os.path.join(via_fd, "lib-dynload")]
    for module in list(sys.modules.values()):  # packages already imported (encodings, collections, ...)
        paths = getattr(module, "__path__", None)
        if isinstance(paths, list):
            paths[:] = [via_fd + p[len(stdlib) :] if p.startswith(stdlib) else p for p in paths]
    sys.path_importer_cache.clear()
    sys.dont_write_bytecode = True
    sys.argv = ["solution.py"]
    if request["audit_hook"]:
        sys.addaudithook(_audit_hook(os.path.realpath(request["workdir"]), os.path.realpath(stdlib)))


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


def _audit_hook(workdir: str, stdlib: str) -> object:
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
        readable=(workdir, stdlib),
        writable=(workdir,),
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


_SERVER_FUNCTIONS = (_audit_hook, _run_program, _enter_sandbox, _launch, _server_main)
_SERVER_SOURCE = "\n\n".join(textwrap.dedent(inspect.getsource(f)) for f in _SERVER_FUNCTIONS) + "\n\n_server_main()\n"
