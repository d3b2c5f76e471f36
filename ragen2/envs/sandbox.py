"""Run untrusted Python programs in a separate, limited process (Linux).

`run_program(source, stdin, limits)` runs one program and returns a `RunResult`;
`run_programs(jobs, limits, max_workers)` runs several at once from a bounded thread
pool (each thread only waits on its subprocess, so the pool size is the number of
programs running at the same time).

How one run is isolated. The host writes the program to `solution.py` in a fresh
temporary directory and starts `python -S -P -c <launcher>` there with a minimal
environment (no inherited variables: no secrets, tokens or proxies), its stdin read
from a file and its stdout/stderr on pipes. The launcher (`_sandbox_main`, below)
enters new PID and network namespaces, forks, and in the child applies resource limits,
drops to a sandbox uid, installs an audit hook and executes the program as `__main__`.

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
- Wall time: the host kills the whole process group at `wall_s`; the launcher also
  arms its own alarm, and both launcher and program die with their parent
  (PR_SET_PDEATHSIG), so nothing outlives a host that is killed itself.
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
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
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
                raise ConfigError(f"unknown sandbox limit {key!r}; valid: {', '.join(known)}." + did_you_mean(key, known))
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
        args = [workdir, uid if uid is not None else -1, os.getpid(), limits.wall_s, limits.cpu_s,
                limits.memory_mb << 20, limits.max_file_bytes, limits.max_processes, limits.max_open_files,
                int(limits.audit_hook)]  # fmt: skip
        start = time.monotonic()
        with open(stdin_path, "rb") as stdin_file:
            proc = subprocess.Popen(
                [sys.executable, "-S", "-P", "-c", _LAUNCHER, *map(str, args)],
                stdin=stdin_file,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env=_child_env(workdir),
                start_new_session=True,
            )
        try:
            stdout, stderr, host_reason = _collect(proc, limits, deadline=start + limits.wall_s)
        finally:
            _kill_group(proc)
        wall = time.monotonic() - start
    exit_code = proc.returncode
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


def run_programs(jobs: Sequence[tuple[str, str]], limits: Limits | None = None, max_workers: int = 2) -> list[RunResult]:
    """Run (source, stdin) jobs with at most `max_workers` at a time; results in job order."""
    if max_workers < 1:
        raise ConfigError(f"max_workers={max_workers} is not allowed: use an integer >= 1")
    if len(jobs) <= 1 or max_workers == 1:
        return [run_program(source, stdin, limits) for source, stdin in jobs]
    with ThreadPoolExecutor(max_workers=min(max_workers, len(jobs))) as pool:
        return list(pool.map(lambda job: run_program(job[0], job[1], limits), jobs))


def isolation() -> dict[str, bool]:
    """Which OS-level protections this host can apply (the audit hook always can)."""
    probe = run_program(
        "import os, socket\n"
        "print(os.getuid() != 0 and os.getuid() in range(61000, 61512), os.getpid() == 1, "
        "[name for _, name in socket.if_nameindex()] == ['lo'])",
        limits=Limits(audit_hook=False),
    )
    uid, pid, net = (probe.stdout.split() + ["False"] * 3)[:3]
    return {"separate_uid": uid == "True", "pid_namespace": pid == "True", "network_namespace": net == "True"}


def _child_env(workdir: str) -> dict[str, str]:
    # Built from scratch: nothing of the host's environment reaches the program.
    # PYTHONHASHSEED fixes str hashing so set iteration order, hence output, is reproducible.
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


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


def _collect(proc: subprocess.Popen, limits: Limits, deadline: float) -> tuple[bytes, bytes, str | None]:
    """Read stdout/stderr until the program exits; returns them and the host's kill reason."""
    out = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    selector = selectors.DefaultSelector()
    for fd in out:
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    total, reason = 0, None
    try:
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                reason = "wall_time"
                break
            for key, _ in selector.select(timeout=min(remaining, 0.1)):
                data = os.read(key.fd, 1 << 16)
                if not data:
                    selector.unregister(key.fd)
                    continue
                keep = max(0, limits.max_output_bytes - total)
                out[key.fd] += data[:keep]
                total += len(data)
            if total > limits.max_output_bytes:
                reason = "output_limit"
                break
            if _exited(proc) and not selector.select(timeout=0):
                break  # exited, and whatever it wrote has been read
        if reason is None and not _exited(proc):
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                reason = "wall_time"
    finally:
        selector.close()
    return bytes(out[proc.stdout.fileno()]), bytes(out[proc.stderr.fileno()]), reason


def _exited(proc: subprocess.Popen) -> bool:
    """Whether the launcher has exited, without reaping it (its pid stays reserved for killpg)."""
    if proc.returncode is not None:
        return True
    return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher's process group (start_new_session made it the leader), then reap."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()


def _reason_from_status(exit_code: int, stderr: str) -> str | None:
    if exit_code in (-signal.SIGKILL, -signal.SIGXCPU):
        return "cpu_time"  # the host did not kill it, so RLIMIT_CPU did
    if exit_code == -signal.SIGXFSZ:
        return "file_size"
    if exit_code != 0:
        last_line = stderr.rstrip().rpartition("\n")[2]
        if last_line == "MemoryError" or last_line.startswith("MemoryError:"):
            return "memory"
        if last_line.startswith("OSError: [Errno 27]"):  # EFBIG: Python ignores SIGXFSZ, the write fails
            return "file_size"
    return None


def _sandbox_main() -> None:
    """The launcher: runs in the child interpreter, started as `python -S -P -c`.

    It only uses the standard library and its own names: its source is sent as the `-c`
    argument. Arguments: workdir, uid (-1: keep), host pid, wall_s, cpu_s, memory bytes,
    file bytes, processes, open files, audit hook flag.
    """
    import ctypes
    import os
    import resource
    import signal
    import sys

    workdir, uid, host_pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    wall_s = float(sys.argv[4])
    cpu_s, memory, file_bytes, processes, open_files, hook = map(int, sys.argv[5:11])
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig, pr_set_dumpable = 1, 4
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != host_pid:  # the host died before the line above took effect
        os._exit(1)
    # Imports after the uid change go through this descriptor: the interpreter may live
    # under a directory the sandbox uid cannot enter (e.g. /root/.pyenv).
    stdlib = os.path.dirname(os.__file__)
    stdlib_fd = os.open(stdlib, os.O_RDONLY | os.O_DIRECTORY)
    new_user, new_pid, new_net = 0x10000000, 0x20000000, 0x40000000
    if libc.unshare(new_pid | new_net) != 0 and uid < 0:
        libc.unshare(new_user | new_pid | new_net)  # without root: only where user namespaces are allowed

    child = os.fork()
    if child:
        # The launcher waits, enforces the wall limit even if the host is gone, and exits
        # the way the program did, so the host sees the program's status.
        signal.signal(signal.SIGALRM, lambda *_: os.kill(child, signal.SIGKILL))
        signal.setitimer(signal.ITIMER_REAL, wall_s + 0.5)
        _, status = os.waitpid(child, 0)
        if os.WIFSIGNALED(status):
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            sig = os.WTERMSIG(status)
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        os._exit(os.waitstatus_to_exitcode(status))

    for limit, value in (
        (resource.RLIMIT_CPU, cpu_s),  # soft == hard: SIGKILL (SIGXCPU is ignored by a PID 1)
        (resource.RLIMIT_AS, memory),
        (resource.RLIMIT_FSIZE, file_bytes),
        (resource.RLIMIT_NPROC, processes),
        (resource.RLIMIT_NOFILE, open_files),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(limit, (value, value))
    if uid >= 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        libc.prctl(pr_set_dumpable, 1, 0, 0, 0)  # a uid change hides /proc/self/fd from the process itself
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)  # the uid change cleared it
    del libc
    for name in [m for m in sys.modules if m == "_ctypes" or m.split(".")[0] == "ctypes"]:
        del sys.modules[name]
    stdlib_path = f"/proc/self/fd/{stdlib_fd}"
    sys.path[:] = [workdir, stdlib_path, os.path.join(stdlib_path, "lib-dynload")]
    for module in list(sys.modules.values()):  # packages already imported (encodings, collections...)
        paths = getattr(module, "__path__", None)
        if isinstance(paths, list):
            paths[:] = [stdlib_path + p[len(stdlib) :] if p.startswith(stdlib) else p for p in paths]
    sys.path_importer_cache.clear()
    sys.dont_write_bytecode = True

    if hook:
        real_stdlib, real_workdir = os.path.realpath(stdlib), os.path.realpath(workdir)

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
                "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
                "os.kill", "os.killpg", "signal.pthread_kill", "subprocess.Popen", "os.link",
                "os.symlink", "resource.setrlimit", "resource.prlimit", "pty.spawn",
            }),  # fmt: skip
            deny_prefixes=("socket.", "ctypes."),
            deny_imports=frozenset({"ctypes", "_ctypes", "_posixsubprocess"}),
            write_events=frozenset({
                "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
                "os.truncate", "os.utime", "os.setxattr", "os.removexattr",
            }),  # fmt: skip
            list_events=frozenset({"os.listdir", "os.scandir"}),
            write_flags=os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND,
            readable=(real_workdir, real_stdlib),
            writable=(real_workdir,),
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

        sys.addaudithook(audit)

    sys.argv = ["solution.py"]
    with open("solution.py", "rb") as f:
        code = compile(f.read(), "solution.py", "exec")
    exec(code, {"__name__": "__main__", "__file__": "solution.py", "__builtins__": __builtins__})


_LAUNCHER = textwrap.dedent(inspect.getsource(_sandbox_main)) + "\n_sandbox_main()\n"
