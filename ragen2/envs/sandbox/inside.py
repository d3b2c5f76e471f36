"""What runs inside the sandbox's fork server and each program's process: the root, namespaces, limits, the filter, the audit hook.

The fork server is a separate `python -S -P -c` interpreter: these functions are sent
to it as source text (`SERVER_SOURCE`), so each imports what it uses and reads no
globals other than the functions and paths sent with it.
"""

from __future__ import annotations

import inspect
import textwrap

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
    server = {"stdlib_fd": None, "filter": _seccomp_program(config["filter"]), "keyctl": config["keyctl"]}
    if config["isolated"]:
        try:
            _build_root(libc, config["libraries"], config["rootless"], config["programs"])
        except OSError as e:
            control.send(f"error {e.strerror}".encode())
            return
    else:  # for imports after the uid change (see _enter_sandbox)
        server["stdlib_fd"] = os.open(os.path.dirname(os.__file__), os.O_RDONLY | os.O_DIRECTORY)
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
            _launch(json.loads(message), fds, libc, server)
        for fd in fds:
            os.close(fd)


def _libc_call(libc: object, name: str, *args: object, shown: str = "") -> None:
    """Call libc's `name`; on failure raise OSError naming the call (`shown`: its arguments), for the refusal."""
    import ctypes
    import os

    if getattr(libc, name)(*args) < 0:
        errno = ctypes.get_errno()
        text = ("NULL" if a is None else a.decode() if isinstance(a, bytes) else repr(a) for a in args)
        shown = shown or ", ".join(text)
        raise OSError(errno, f"{name}({shown}) failed: {os.strerror(errno)}")


def _seccomp_program(bpf_hex: str) -> object:
    """A pointer to the `struct sock_fprog` that PR_SET_SECCOMP takes, for the filter the host compiled (syscalls.py)."""
    import ctypes

    class SockFprog(ctypes.Structure):
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_char_p))

    bpf = bytes.fromhex(bpf_hex)
    return ctypes.byref(SockFprog(len(bpf) // 8, bpf))  # 8 bytes per instruction (struct sock_filter)


def _build_root(libc: object, libraries: list, rootless: bool, programs: dict | None = None) -> None:
    """Once per fork server: a private mount namespace whose `_ROOT` is the sandbox's read-only filesystem.

    It holds the standard library at `_STDLIB` (site-packages hidden by an empty
    tmpfs), the shared libraries its extension modules load and /etc/ld.so.cache (so
    that dlopen finds them), four harmless devices, and empty mount points for /proc,
    /work, /tmp and /dev/shm, which every run fills with its own.

    `programs` (`Limits.programs`: {"prefix": the interpreter's sys.base_prefix,
    "python": its pythonX.Y}) also shows the machine's programs, read-only: /usr with
    /bin, /lib and the like, less /usr/local (software of the machine's own) and every
    Python package directory, and the host's interpreter at its own path (its
    site-packages hidden), run as `python` and `python3` from /usr/local/bin.

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
    if programs:
        _show_programs(libc, show, programs)
    for path in [*libraries, "/etc/ld.so.cache"]:
        if os.path.exists(path) and not os.path.lexists(_ROOT + path):  # with `programs`, /usr may hold it
            show(path)
    for device in ("null", "zero", "random", "urandom"):
        show("/dev/" + device, writable=True)
    for name in ("proc", "work", "tmp", "dev/shm"):
        os.makedirs(os.path.join(_ROOT, name), exist_ok=True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):  # fmt: skip
        os.symlink(target, os.path.join(_ROOT, "dev", name))
    _libc_call(libc, "mount", None, _ROOT.encode(), None, remount | rdonly | nosuid | nodev, None)


def _show_programs(libc: object, show: object, programs: dict) -> None:
    """The part of `_build_root` for `Limits.programs`: /usr and the interpreter, read-only, packages hidden."""
    import glob
    import os

    rdonly, nosuid, nodev, noexec, remount = 1, 2, 4, 8, 32

    def hide(path, writable=False):  # an empty tmpfs over `path` in the sandbox
        flags = nosuid | nodev | (0 if writable else rdonly | noexec)
        _libc_call(libc, "mount", b"tmpfs", (_ROOT + path).encode(), b"tmpfs", flags, b"size=64k,mode=755")

    show("/usr")
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):  # merged-/usr links, or directories
        if os.path.islink("/" + name):
            os.symlink(os.readlink("/" + name), _ROOT + "/" + name)
        elif os.path.isdir("/" + name):
            show("/" + name)
    if os.path.isdir("/etc/alternatives"):  # Debian's awk, which, ...: links to links in /usr
        show("/etc/alternatives")
    hide("/usr/local", writable=True)  # filled below, then made read-only
    prefix, python = programs["prefix"], programs["python"]
    os.makedirs(_ROOT + "/usr/local/bin")
    for name in ("python", "python3"):
        os.symlink(os.path.join(prefix, "bin", python), f"{_ROOT}/usr/local/bin/{name}")
    if prefix.startswith("/usr/local") or not (prefix + "/").startswith("/usr/"):  # else /usr shows it already
        show(prefix)
    packages = [f"{prefix}/lib/{python}/site-packages", *glob.glob("/usr/lib/python3*/*-packages")]
    for path in packages:
        if os.path.isdir(_ROOT + path):
            hide(path)
    _libc_call(libc, "mount", None, (_ROOT + "/usr/local").encode(), None, remount | rdonly | nosuid | nodev, None)


def _launch(request: dict, fds: list, libc: object, server: dict) -> None:
    """The launcher of one run: new namespaces, fork the program, wait for it, report its status.

    `fds` are the program's stdin, its source, stdout, stderr and the status socket. The
    launcher leads its own process group, reports `pid N`, then `error E` if the run
    could not be isolated or else `status S`, and finally kills its whole group.
    `server` holds what the fork server prepared for every run (see `_server_main`).
    """
    import os
    import signal

    stdin_fd, source_fd, out_fd, err_fd, status_fd = fds
    os.setsid()
    if request["cgroup_join"]:  # before anything of the run's: the program and its children are born in it
        try:  # "0": this thread moves itself, the whole launcher (a fresh fork has one thread); see cgroup.py
            with open(request["cgroup_join"], "w") as f:
                f.write("0")
        except OSError:  # the run goes on under the address-space cap split over its processes
            request["processes"], request["memory_bytes"] = request["split"]
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
        try:
            if request["isolated"]:
                _enter_root(libc)
                if request["rootless"]:
                    # A user namespace per program, owning none of its other namespaces: RLIMIT_NPROC
                    # (Linux 5.14+) counts the tasks of one user in one user namespace, so only this
                    # program's, and its capabilities there reach neither its mounts nor anything else.
                    _enter_user_namespace(libc, 0, "CLONE_NEWUSER")
                    _drop_capabilities(libc)
            _enter_sandbox(request, libc, server, status_fd)
        except OSError as e:
            os.write(status_fd, f"error {e.strerror}\n".encode())
            os._exit(1)
        os.close(status_fd)
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

    Kernel keys are not namespaced: /proc/keys would list every key the program may
    view, those of the host's user included when it runs as that user (without root), so
    /proc/keys and /proc/key-users show /dev/null instead, as Docker does.
    pivot_root(".", ".") stacks the old root on top of the new one; detaching it leaves
    no path, mount or descriptor to the host's filesystem.
    """
    import os

    _libc_call(libc, "mount", b"proc", (_ROOT + "/proc").encode(), b"proc", 2 | 4 | 8, None)  # nosuid nodev noexec
    for masked in ("keys", "key-users"):
        _libc_call(libc, "mount", (_ROOT + "/dev/null").encode(), f"{_ROOT}/proc/{masked}".encode(), None, 4096, None)
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


def _enter_sandbox(request: dict, libc: object, server: dict, status_fd: int) -> None:
    """In the program's process: limits, a session keyring, uid, import paths, the system call filter, the audit hook.

    `status_fd` stays open for the launcher's report of a failure; the caller closes it.
    """
    import os
    import resource
    import signal
    import sys

    if request["isolated"]:  # nothing open of the fork server's reaches the program
        os.closerange(3, status_fd)
        os.closerange(status_fd + 1, 1 << 16)
    for limit, value in (
        (resource.RLIMIT_CPU, request["cpu_s"]),  # soft == hard: SIGKILL (a PID 1 ignores SIGXCPU)
        (resource.RLIMIT_AS, request["memory_bytes"]),
        (resource.RLIMIT_FSIZE, request["file_bytes"]),
        (resource.RLIMIT_NPROC, request["processes"]),
        (resource.RLIMIT_NOFILE, request["open_files"]),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(limit, (value, value))
    # A new, empty session keyring: the one inherited from the host (through the fork server) would stay this
    # process's across the uid change, with the host's keys. Joined before it, so the sandbox uid owns no key.
    _libc_call(libc, "syscall", server["keyctl"], 1, None, shown="SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, NULL")
    uid = request["uid"]
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: a uid change hides /proc/self/fd from the process
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: no exec can gain privileges
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG (a uid change clears it): die with the launcher
    # Imports from here on find the standard library at its place in the sandbox, or (unsandboxed)
    # through a descriptor: the interpreter may live where the sandbox uid cannot enter (/root/.pyenv).
    stdlib, workdir = os.path.dirname(os.__file__), request["workdir"]
    seen = _STDLIB if request["isolated"] else f"/proc/self/fd/{server['stdlib_fd']}"
    sys.path[:] = [workdir, seen, os.path.join(seen, "lib-dynload")]
    for module in list(sys.modules.values()):  # packages already imported (encodings, collections, ...)
        paths = getattr(module, "__path__", None)
        if isinstance(paths, list):
            paths[:] = [seen + p[len(stdlib) :] if p.startswith(stdlib) else p for p in paths]
    sys.path_importer_cache.clear()
    sys.dont_write_bytecode = True
    sys.argv = ["solution.py"]
    # From here on every system call of the program, its threads and its children passes the filter.
    _libc_call(libc, "prctl", 22, 2, server["filter"], 0, 0, shown="PR_SET_SECCOMP, SECCOMP_MODE_FILTER")
    for name in [m for m in sys.modules if m == "_ctypes" or m.split(".")[0] == "ctypes"]:
        del sys.modules[name]  # a program's `import ctypes` is an import again, which the audit hook sees
    if request["audit_hook"]:  # last: it refuses ctypes, which the calls above go through
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
    _launch, _show_programs, _build_root, _seccomp_program, _libc_call, _server_main,
)  # fmt: skip
SERVER_SOURCE = (
    f"_ROOT, _SCRATCH, _STDLIB = {_ROOT!r}, {_SCRATCH!r}, {_STDLIB!r}\n\n"
    + "\n\n".join(textwrap.dedent(inspect.getsource(f)) for f in _SERVER_FUNCTIONS)
    + "\n\n_server_main()\n"
)
