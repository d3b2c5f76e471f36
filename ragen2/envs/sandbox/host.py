"""The host side of the sandbox: limits, the public API, the fork server's client and collecting a run's results.

What runs in the fork server and in each program's process is in `inside.py`; the
package docstring says how a run is isolated.
"""

from __future__ import annotations

import fcntl
import glob
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
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, fields

from ragen2.envs.sandbox import cgroup, syscalls
from ragen2.envs.sandbox.inside import SERVER_SOURCE
from ragen2.errors import ConfigError, did_you_mean

log = logging.getLogger(__package__)

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
    """Memory of all the program's processes together, in MiB: one memory cgroup's cap, or where the machine has none
    for the run, an address-space cap split over the processes (see `process_limits`)."""
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
    programs: bool = False
    """Let the program start the machine's programs (a shell, the core utilities, Python with its standard library
    only), for harnesses whose actions are shell commands (ragen2.coding): /usr is shown read-only, less /usr/local
    and Python's package directories, and exec is allowed; what a run writes still cannot be executed, and the audit
    hook is off, since it refuses subprocesses. Everything else above holds for all of the run's processes."""

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
        f"not os.path.exists({os.path.abspath(__file__)!r}), "
        "'Seccomp:\\t2' in open('/proc/self/status').read(), "
        f"{cgroup.PREFIX!r} in open('/proc/self/cgroup').read())"
    )
    limits = Limits(audit_hook=False)
    try:
        result = _run(probe, "", limits, isolated=True)
    except SandboxUnavailable:
        result = _run(probe, "", limits, isolated=False)
    uid, pid, net, files, filtered, memory = (result.stdout.split() + ["False"] * 6)[:6]
    return {
        "separate_uid": uid == "True",
        "pid_namespace": pid == "True",
        "network_namespace": net == "True",
        "private_filesystem": files == "True",
        "syscall_filter": filtered == "True",
        "memory_cgroup": memory == "True",
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

    def __init__(self, isolated: bool, programs: bool = False) -> None:
        rootless = isolated and os.geteuid() != 0
        if rootless and (missing := _user_namespaces_missing()):
            raise SandboxUnavailable(f"the host process does not run as root, and {missing}")
        try:
            seccomp_filter, keyctl = syscalls.compiled_filter(allow_exec=programs), syscalls.keyctl_number()
        except (ImportError, OSError, RuntimeError) as e:
            raise SandboxUnavailable(
                f"the system call filter cannot be built ({e}); it needs libseccomp.so.2 (Debian and Ubuntu: "
                "apt install libseccomp2) and the pyseccomp package"
            ) from e
        config = {
            "isolated": isolated,
            "rootless": rootless,
            "libraries": _runtime_libraries() if isolated else [],
            "filter": seccomp_filter.hex(),
            "keyctl": keyctl,
            "programs": {"prefix": sys.base_prefix, "python": f"python{sys.version_info[0]}.{sys.version_info[1]}"}
            if programs else None,
        }
        host_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, "-S", "-P", "-c", SERVER_SOURCE, str(server_end.fileno()), json.dumps(config)],
            pass_fds=[server_end.fileno()],
            env={**_ENV, "PATH": "/usr/local/bin:/usr/bin:/bin"} if programs else _ENV,
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


_servers: dict[tuple[bool, bool], _ForkServer] = {}  # by (`isolated`, `Limits.programs`)
_server_lock = threading.Lock()
_isolation_error: str | None = None
"""Why this machine cannot isolate programs, once a run that allowed unsandboxed execution found out."""
_verified = False
"""An isolated run has completed in this process."""


def _fork_server(kind: tuple[bool, bool]) -> _ForkServer:
    with _server_lock:
        server = _servers.get(kind)
        if server is None or not server.alive():
            server = _servers[kind] = _ForkServer(*kind)
        return server


def _spawn(kind: tuple[bool, bool], request: dict, fds: list[int]) -> None:
    """Send a run to the fork server of its `kind` (isolated, programs), starting a new one if the last one is gone."""
    try:
        _fork_server(kind).spawn(request, fds)
    except OSError:  # it died between the liveness check and the send
        with _server_lock:
            _servers.pop(kind, None)
        _fork_server(kind).spawn(request, fds)


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
    split = process_limits(limits)
    with _leased_uid() as uid, _workdir(uid) as workdir, cgroup.memory_cgroup(limits.memory_mb << 20) as memory_cgroup:
        # In the cgroup every process may use the whole cap: the cgroup holds their sum to it.
        processes, memory_bytes = (limits.max_processes, limits.memory_mb << 20) if memory_cgroup else split
        source_path = os.path.join(workdir, "solution.py")
        _write(source_path, source, uid)
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
            "audit_hook": limits.audit_hook and not limits.programs,
            "cgroup_join": memory_cgroup.join if memory_cgroup else None,
            "split": split,
        }
        # stdin is a pipe the host fills: a file, even read-only, could be reopened through /proc/self/fd/0
        # by the uid that owns it, and a host file is not the program's to change.
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        status, status_child = socket.socketpair()
        source_fd = os.open(source_path, os.O_RDONLY)
        try:
            _spawn((isolated, limits.programs), request, [in_r, source_fd, out_w, err_w, status_child.fileno()])
        except BaseException:
            for fd in (in_w, out_r, err_r):
                os.close(fd)
            status.close()
            raise
        finally:  # the launcher holds its own copies now
            for fd in (in_r, source_fd, out_w, err_w):
                os.close(fd)
            status_child.close()
        start = time.monotonic()  # after a fork server's start-up, which _spawn may have waited for
        data = stdin.encode("utf-8", "surrogatepass")  # as _write: the program fails to decode, not the host
        try:
            stdout, stderr, lines, host_reason = _collect(out_r, err_r, status, in_w, data, limits, start + limits.wall_s)
        finally:
            for fd in (out_r, err_r):
                os.close(fd)
            status.close()
        oom_kills = memory_cgroup.oom_kills() if memory_cgroup else 0
        wall = time.monotonic() - start
    if "error" in lines:
        raise SandboxUnavailable(lines["error"])
    raw_status = int(lines["status"]) if "status" in lines and host_reason is None else None
    if isolated and raw_status is not None:
        _verified = True
    exit_code = -signal.SIGKILL if raw_status is None else os.waitstatus_to_exitcode(raw_status)
    err = stderr.decode("utf-8", "replace")
    if host_reason is None and oom_kills and exit_code != 0:
        reason: str | None = "memory"  # the OOM killer ended a process of the run at the cgroup's cap
    else:
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
    out_r: int, err_r: int, status: socket.socket, in_w: int, stdin: bytes, limits: Limits, deadline: float
) -> tuple[bytes, bytes, dict[str, str], str | None]:
    """Feed the program's stdin and read its output and the launcher's status lines until the run ends or a limit hits.

    Returns stdout, stderr, the launcher's lines by key and the host's kill reason. The
    launcher writes `pid N` when it starts, `error E` when it could not isolate the run,
    and `status S` when the program has ended; it closes everything when it exits.
    `stdin` goes into the pipe `in_w` as the program reads it; `in_w` is closed (end of
    input) once it is all written or the program stopped reading, and in any case on return.
    """
    out = {out_r: bytearray(), err_r: bytearray()}
    report = bytearray()
    pending = memoryview(stdin)
    selector = selectors.DefaultSelector()
    for fd in (out_r, err_r, status.fileno(), in_w):
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_WRITE if fd == in_w else selectors.EVENT_READ)
    total, reason = 0, None
    try:
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                reason = "wall_time"
                break
            for key, _ in selector.select(timeout=remaining):
                if key.fd == in_w:
                    try:
                        pending = pending[os.write(in_w, pending[: 1 << 16]) :]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # nothing reads it any more: the program has ended
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(in_w)
                        os.close(in_w)
                    continue
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
        if in_w in selector.get_map():  # not all written
            os.close(in_w)
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
