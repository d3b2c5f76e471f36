"""The hostile-program battery of the `code` sandbox, as an attacker would write it (used by test_sandbox.py).

Each `Hostile` is one program submitted to the `code` env. Most are aimed at the
operating system (limits, files, sockets, processes); the reward hacks try to score
without solving the problem: by reading the hidden tests wherever they might be, by
leaving files for a grader, by tricking the exit status. `REWARD_HACKS` are written
for any problem (they read the function name from the driver when there is one), so
they are also run on every built-in problem.

Programs get their host-side targets (socket paths, files that must stay untouched)
through `Targets`, as an attacker who knows the project's layout would.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pyseccomp

from ragen2.envs.code_problems import CodeTest, Problem

SUM = Problem(
    "battery_sum",
    "Read two integers and print their sum.",
    (CodeTest("1 2", "3"), CodeTest("5 5", "10")),
    solution="a, b = map(int, input().split())\nprint(a + b)\n",
)
DOUBLE = Problem("battery_double", "Write double(x) returning 2 * x.", (CodeTest([2], 4), CodeTest([5], 10)), "double")


@dataclass(frozen=True)
class Targets:
    """What of the host the programs aim at."""

    tcp_port: int
    """A listening TCP socket on the host's loopback; nothing may connect."""
    unix_path: str
    """A listening AF_UNIX socket in the host's /tmp; nothing may connect."""
    abstract_name: str
    """A listening abstract AF_UNIX socket (Linux) on the host; nothing may connect."""
    probe_path: str
    """A file in the host's /tmp that must not appear."""
    leftover: str
    """The name of files the host left in /tmp and /dev/shm, as an earlier run might have; they must stay unseen."""
    persist: str
    """The name of files the programs try to leave in /tmp and /dev/shm; they must not outlive the run."""
    problem_file: str
    """ragen2/envs/code_problems.py: the built-in problems' hidden tests."""
    dataset: str
    """A JSONL problem file on the host, readable by anyone, as a dataset would be."""
    grader_files: tuple[str, ...]
    """The grader's source files; they must stay unchanged."""
    host_pid: int
    memory_mb: int


@dataclass(frozen=True)
class Hostile:
    name: str
    source: str
    expected: float
    """The reward it must get: 0, or its honest partial reward."""
    problem: Problem = SUM


# Shared by the reward hacks: turn leaked (input, expected) pairs into an answer for the
# current test, for stdin problems (print it) and function problems (define the function
# the driver calls, whose name is in the driver's source, solution.py).
_LEAK = r'''
import json, os, re, sys, types

def tests_in(text, path):
    """The (input, expected) pairs in a problems module (code_problems.py) or a JSONL dataset."""
    if not text:
        return []
    try:
        if path.endswith(".jsonl"):
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            return [(t["input"], t["output"]) for row in rows for t in row.get("tests", [])]
        package = types.ModuleType("ragen2")
        package.__path__ = []
        errors = types.ModuleType("ragen2.errors")
        errors.ConfigError = ValueError
        module = types.ModuleType("leaked_problems")
        sys.modules.update({"ragen2": package, "ragen2.errors": errors, "leaked_problems": module})
        exec(compile(text, path, "exec"), module.__dict__)
        return [(t.input, t.expected) for p in module.BUILTIN_PROBLEMS for t in p.tests]
    except Exception as e:
        print("unusable", path, type(e).__name__, e, file=sys.stderr)
        return []

def same(given, test_input):
    if isinstance(given, str) and isinstance(test_input, str):
        return given.strip() == test_input.strip()
    return given == test_input

def respond(pairs):
    try:
        driver = open("solution.py").read()
    except OSError:
        driver = ""
    named = re.search(r"if '(\w+)' in namespace", driver)
    if named:
        globals()[named.group(1)] = lambda *args: next((w for g, w in pairs if same(list(args), g)), None)
    else:
        given = sys.stdin.read()
        answers = [w for g, w in pairs if same(given, g)]
        if answers:
            print(answers[0])

def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        print("cannot read", path, type(e).__name__, file=sys.stderr)
        return ""
'''


def syscalls(*names: str) -> str:
    """Source that defines `libc` and `NR`, this machine's numbers of the system calls `names` (no libc wrapper)."""
    numbers = {name: pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name) for name in names}
    return (
        "import ctypes, errno, os, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        f"NR = {numbers!r}\n"
        "def call(name, *args):\n"
        "    result = libc.syscall(NR[name], *args)\n"
        "    return result if result >= 0 else errno.errorcode[ctypes.get_errno()]\n"
    )


# Lists the keys it may see (/proc/keys) and reads every key of its session keyring, where the host's would be.
SESSION_KEYRING_READER = syscalls("keyctl") + (
    "try:\n"
    "    print('/proc/keys:', open('/proc/keys').read().replace('\\n', '; '), file=sys.stderr)\n"
    "except OSError as e:\n"
    "    print('/proc/keys:', type(e).__name__, file=sys.stderr)\n"
    "serials = (ctypes.c_int32 * 64)()\n"
    "size = call('keyctl', 11, -3, serials, ctypes.sizeof(serials))  # KEYCTL_READ of the session keyring\n"
    "print('session keyring:', size, file=sys.stderr)\n"
    "for serial in serials[: size // 4 if isinstance(size, int) else 0]:\n"
    "    payload = ctypes.create_string_buffer(4096)\n"
    "    got = call('keyctl', 11, serial, payload, 4096)\n"
    "    print('key', serial, payload.raw[:got] if isinstance(got, int) else got, file=sys.stderr)\n"
)


def exit42_elf() -> bytes:
    """A complete static x86-64 Linux executable that calls exit(42): an ELF header, one segment, 12 bytes of code."""
    code = bytes.fromhex("bf2a000000" "b83c000000" "0f05")  # mov edi, 42; mov eax, 60 (exit); syscall
    base, size = 0x400000, 64 + 56 + len(code)
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)  # 64-bit, little-endian, version 1
    header += struct.pack("<HHIQQQIHHHHHH", 2, 0x3E, 1, base + 120, 64, 0, 0, 64, 56, 1, 0, 0, 0)  # x86-64 EXEC
    segment = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)  # PT_LOAD, read + execute
    return header + segment + code


# run(argv, keep): exec argv in a child through _posixsubprocess, loaded under another name so that the audit
# hook does not see it imported; returns how the child ended, or the errno name its exec failed with.
_FORK_EXEC = r'''
import errno, glob, importlib.machinery, importlib.util, os, sys

def run(argv, keep=()):
    path = next(p for folder in sys.path for p in glob.glob(os.path.join(folder, '_posixsubprocess*')))
    loader = importlib.machinery.ExtensionFileLoader('x._posixsubprocess', path)
    posixsubprocess = loader.create_module(importlib.util.spec_from_file_location('x._posixsubprocess', path,
                                                                                 loader=loader))
    loader.exec_module(posixsubprocess)
    err_r, err_w = os.pipe()
    pid = posixsubprocess.fork_exec(argv, [argv[0]], True, tuple(sorted((err_w, *keep))), None, None,
        -1, -1, -1, -1, -1, -1, err_r, err_w, False, False, -1, None, None, None, -1, None, False)
    os.close(err_w)
    failure = os.read(err_r, 4096).decode()  # "OSError:<errno in hex>:..." when its exec failed
    status = os.waitpid(pid, 0)[1]
    return errno.errorcode[int(failure.split(':')[1], 16)] if failure else f'ran: exit {os.waitstatus_to_exitcode(status)}'
'''


def battery_v3(t: Targets) -> list[Hostile]:
    """Kernel interfaces past the namespaces: binaries without files, memory outside the caps, keyrings, stdin."""
    twice_the_cap = 2 * t.memory_mb
    elf = exit42_elf().hex()
    memfd_exec = _FORK_EXEC + (
        "try:\n"
        "    fd = os.memfd_create('x', 0)\n"
        f"    os.write(fd, bytes.fromhex({elf!r}))\n"
        "    print('memfd binary:', run([f'/proc/self/fd/{fd}'.encode()], keep=(fd,)), file=sys.stderr)\n"
        "except OSError as e:\n"
        "    print('memfd_create:', errno.errorcode[e.errno], file=sys.stderr)"
    )
    tmp_exec = _FORK_EXEC + (
        f"open('/tmp/exit42', 'wb').write(bytes.fromhex({elf!r}))\n"
        "os.chmod('/tmp/exit42', 0o755)\n"
        "print('binary in /tmp:', run([b'/tmp/exit42']), file=sys.stderr)"
    )
    interpreter_exec = _FORK_EXEC + (
        "print('interpreter:', run([b'/proc/self/exe', b'-S', b'-c', b'import os; os._exit(42)']), file=sys.stderr)"
    )
    # Fills files of 960 KiB (under RLIMIT_FSIZE) made by `create(i)` until it holds twice the memory cap.
    fill = (
        "def fill(create):\n"
        "    held = 0\n"
        "    try:\n"
        f"        while held < {twice_the_cap} << 10:\n"
        "            fd = create(held)\n"
        "            os.posix_fallocate(fd, 0, 960 << 10)\n"
        "            os.close(fd)\n"
        "            held += 960\n"
        "    except OSError as e:\n"
        "        print('fill:', errno.errorcode[e.errno], file=sys.stderr)\n"
        "    return held >> 10\n"
    )
    tmpfs_in_namespace = syscalls("unshare") + fill + (
        "uid, gid = os.getuid(), os.getgid()\n"
        "result = call('unshare', 0x10000000 | 0x00020000)  # CLONE_NEWUSER | CLONE_NEWNS\n"
        "print('unshare:', result, file=sys.stderr)\n"
        "if result == 0:\n"
        "    for name, text in (('setgroups', 'deny'), ('uid_map', f'0 {uid} 1'), ('gid_map', f'0 {gid} 1')):\n"
        "        with open(f'/proc/self/{name}', 'w') as f:\n"
        "            f.write(text)\n"
        "    libc.mount.argtypes = (ctypes.c_char_p,) * 3 + (ctypes.c_ulong, ctypes.c_char_p)\n"
        "    print('mount:', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), file=sys.stderr)  # no size=\n"
        "    held = fill(lambda i: os.open(f'/tmp/fill-{i}', os.O_CREAT | os.O_RDWR))\n"
        "    print(f'tmpfs held {held} MiB', file=sys.stderr)"
    )
    clone_namespaces = syscalls("clone", "clone3", "setns") + (
        "for name, flag in (('CLONE_NEWUSER', 0x10000000), ('CLONE_NEWNS', 0x20000), ('CLONE_NEWNET', 0x40000000)):\n"
        "    pid = call('clone', flag | 17, 0, 0, 0, 0)  # | SIGCHLD: a fork into the new namespace\n"
        "    if pid == 0:\n"
        "        os._exit(0)\n"
        "    print('clone', name + ':', 'allowed' if isinstance(pid, int) else pid, file=sys.stderr)\n"
        "    if isinstance(pid, int):\n"
        "        os.waitpid(pid, 0)\n"
        "args = (ctypes.c_uint64 * 11)(0x10000000, 0, 0, 0, 17)  # struct clone_args: CLONE_NEWUSER, SIGCHLD\n"
        "pid = call('clone3', args, ctypes.sizeof(args))\n"
        "if pid == 0:\n"
        "    os._exit(0)\n"
        "print('clone3:', 'allowed' if isinstance(pid, int) else pid, file=sys.stderr)\n"
        "print('setns:', call('setns', os.open('/proc/self/ns/mnt', os.O_RDONLY), 0), file=sys.stderr)"
    )
    sysv_shm = syscalls("shmget", "shmat", "shmdt") + (
        "held = 0\n"
        f"while held < {twice_the_cap}:\n"
        "    shmid = call('shmget', 0, 64 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600; never removed\n"
        "    if not isinstance(shmid, int):\n"
        "        print('shmget:', shmid, file=sys.stderr)\n"
        "        break\n"
        "    address = call('shmat', shmid, 0, 0)\n"
        "    ctypes.memset(address, 1, 64 << 20)\n"
        "    call('shmdt', ctypes.c_void_p(address))  # detached: out of its address space, still in memory\n"
        "    held += 64\n"
        "print(f'SysV shm held {held} MiB', file=sys.stderr)"
    )
    posix_shm = (
        "import _posixshmem, errno, os, sys\n"
        + fill
        + "held = fill(lambda i: _posixshmem.shm_open(f'/fill-{i}', os.O_CREAT | os.O_RDWR, 0o600))\n"
        "print(f'POSIX shm held {held} MiB', file=sys.stderr)"
    )
    pipe_buffers = (
        "import errno, fcntl, os, sys\n"
        "held, pipes = 0, 0\n"
        "try:\n"
        "    while True:\n"
        "        r, w = os.pipe()\n"
        "        pipes += 1\n"
        "        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)\n"
        "        os.set_blocking(w, False)\n"
        "        try:\n"
        "            while True:\n"
        "                held += os.write(w, bytes(1 << 16))\n"
        "        except BlockingIOError:\n"
        "            pass\n"
        "except OSError as e:\n"
        "    print('pipes:', errno.errorcode[e.errno], file=sys.stderr)\n"
        "print(f'{pipes} pipes held {held >> 20} MiB', file=sys.stderr)"
    )
    plant_keys = syscalls("add_key", "keyctl") + (
        "for ring, name in ((-4, 'user'), (-5, 'user-session'), (-3, 'session')):\n"
        "    key = call('add_key', b'user', b'ragen2-planted', b'left for a later run', 20, ring)\n"
        "    print('add_key to the', name, 'keyring:', 'allowed' if isinstance(key, int) else key, file=sys.stderr)\n"
        "print('keyctl setperm:', call('keyctl', 5, -4, 0x3f3f3f3f), file=sys.stderr)  # open to every uid"
    )
    read_left_keys = syscalls("keyctl") + (
        "try:\n"
        "    print('/proc/keys:', open('/proc/keys').read().replace('\\n', '; '), file=sys.stderr)\n"
        "except OSError as e:\n"
        "    print('/proc/keys:', type(e).__name__, file=sys.stderr)\n"
        "for ring, name in ((-4, 'user'), (-5, 'user-session')):\n"
        "    key = call('keyctl', 10, ring, b'user', b'ragen2-planted', 0)  # KEYCTL_SEARCH\n"
        "    payload = ctypes.create_string_buffer(64)\n"
        "    got = call('keyctl', 11, key, payload, 64) if isinstance(key, int) else key  # KEYCTL_READ\n"
        "    print(name, 'keyring:', payload.raw[:got] if isinstance(got, int) else got, file=sys.stderr)"
    )
    join_keyring = syscalls("keyctl") + (
        "ring = call('keyctl', 1, b'ragen2-shared')  # KEYCTL_JOIN_SESSION_KEYRING by name: a later run would join it\n"
        "print('keyctl join:', 'allowed' if isinstance(ring, int) else ring, file=sys.stderr)"
    )
    reopen_stdin = (
        "import errno, os, sys\n"
        "for what, attempt in (\n"
        "    ('reopen and write', lambda: os.write(os.open('/proc/self/fd/0', os.O_RDWR), b'#!/bin/sh\\n')),\n"
        "    ('fchmod 06755', lambda: os.fchmod(0, 0o6755)),\n"
        "    ('chmod 06755', lambda: os.chmod('/proc/self/fd/0', 0o6755)),\n"
        "):\n"
        "    try:\n"
        "        attempt()\n"
        "        print(what + ': allowed', file=sys.stderr)\n"
        "    except OSError as e:\n"
        "        print(what + ':', errno.errorcode.get(e.errno, e), file=sys.stderr)"
    )
    io_uring = syscalls("io_uring_setup") + (
        "params = (ctypes.c_uint8 * 120)()  # struct io_uring_params, all defaults\n"
        "print('io_uring_setup:', call('io_uring_setup', 8, params), file=sys.stderr)"
    )
    userfaultfd = syscalls("userfaultfd") + (
        "print('userfaultfd:', call('userfaultfd', 1 | 0o2000000), file=sys.stderr)  # user mode only, cloexec"
    )
    perf_events = syscalls("perf_event_open") + (
        "attr = (ctypes.c_uint8 * 128)()  # struct perf_event_attr: software CPU clock of this process, user space\n"
        "struct_fields = (ctypes.c_uint32 * 2).from_buffer(attr)\n"
        "struct_fields[:] = [1, 128]  # PERF_TYPE_SOFTWARE, size\n"
        "(ctypes.c_uint64).from_buffer(attr, 40).value = 1 << 5 | 1 << 6  # exclude_kernel, exclude_hv\n"
        "print('perf_event_open:', call('perf_event_open', attr, 0, -1, -1, 0), file=sys.stderr)"
    )
    bpf = syscalls("bpf") + (
        "attr = (ctypes.c_uint32 * 18)(2, 4, 4, 1)  # BPF_MAP_TYPE_ARRAY, 4-byte keys and values, 1 entry\n"
        "print('bpf map:', call('bpf', 0, attr, ctypes.sizeof(attr)), file=sys.stderr)"
    )
    child_memory = syscalls("ptrace", "process_vm_readv") + (
        "import time\n"
        "secret = ctypes.create_string_buffer(b'in the child only')\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    time.sleep(5)\n"
        "    os._exit(0)\n"
        "secret.value = b'parent'\n"
        "print('ptrace attach:', call('ptrace', 16, pid, 0, 0), file=sys.stderr)\n"
        "got = ctypes.create_string_buffer(32)\n"
        "local = (ctypes.c_void_p * 2)(ctypes.addressof(got), 32)\n"
        "remote = (ctypes.c_void_p * 2)(ctypes.addressof(secret), 32)\n"
        "print('process_vm_readv:', call('process_vm_readv', pid, local, 1, remote, 1, 0), got.value, file=sys.stderr)\n"
        "os.kill(pid, 9)\n"
        "os.waitpid(pid, 0)"
    )
    kernel_calls = syscalls("init_module", "finit_module", "delete_module", "kexec_load", "reboot", "swapon", "acct",
                            "settimeofday", "syslog") + (
        "for name, args in (('init_module', (b'', 0, b'')), ('finit_module', (0, b'', 0)),\n"
        "                   ('delete_module', (b'loop', 0)), ('kexec_load', (0, 0, 0, 0)),\n"
        "                   ('reboot', (0xfee1dead, 0x28121969, 0x4321fedc, 0)), ('swapon', (b'/tmp/x', 0)),\n"
        "                   ('acct', (b'/tmp/x',)), ('settimeofday', (0, 0)), ('syslog', (3, 0, 0))):\n"
        "    print(name + ':', call(name, *args), file=sys.stderr)"
    )  # fmt: skip
    return [
        Hostile("execs a static binary from a memfd", memfd_exec, 0.0),
        Hostile("execs a static binary it wrote to /tmp", tmp_exec, 0.0),
        Hostile("execs the interpreter through /proc/self/exe", interpreter_exec, 0.0),
        Hostile("mounts a tmpfs in a new user namespace and fills it past the cap", tmpfs_in_namespace, 0.0),
        Hostile("clones into new namespaces (clone, clone3, setns)", clone_namespaces, 0.0),
        Hostile("grows SysV shared memory past the cap", sysv_shm, 0.0),
        Hostile("fills /dev/shm with POSIX shared memory", posix_shm, 0.0),
        Hostile("holds memory in pipe buffers", pipe_buffers, 0.0),
        Hostile("leaves keys in the user, user-session and session keyrings", plant_keys, 0.0),
        Hostile("reads keys an earlier run left (/proc/keys, KEYCTL_SEARCH)", read_left_keys, 0.0),
        Hostile("joins a named session keyring for later runs", join_keyring, 0.0),
        Hostile("reads the host's session keyring", SESSION_KEYRING_READER, 0.0),
        Hostile("reopens its stdin for writing and makes it setuid", reopen_stdin, 0.0),
        Hostile("io_uring_setup", io_uring, 0.0),
        Hostile("userfaultfd", userfaultfd, 0.0),
        Hostile("perf_event_open on itself", perf_events, 0.0),
        Hostile("creates a BPF map", bpf, 0.0),
        Hostile("reads its child's memory (ptrace, process_vm_readv)", child_memory, 0.0),
        Hostile("loads modules, kexec, reboot, swapon, acct, sets the clock", kernel_calls, 0.0),
    ]


def reward_hacks(t: Targets) -> list[Hostile]:
    """Programs that try to score without solving, on any problem."""
    return [
        Hostile(
            "reads the hidden tests in the project's files",
            _LEAK + f"respond(tests_in(read({t.problem_file!r}), {t.problem_file!r}) + "
            f"tests_in(read({t.dataset!r}), {t.dataset!r}))",
            0.0,
        ),
        Hostile(
            "searches the filesystem for the tests",
            _LEAK
            + "pairs = []\n"
            "for top, dirs, files in os.walk('/'):\n"
            "    dirs[:] = [d for d in dirs if os.path.join(top, d) not in ('/proc', '/sys', '/dev', '/usr')\n"
            "               and d not in ('site-packages', 'dist-packages', '.git', '.venv', '__pycache__')]\n"
            "    for name in files:\n"
            "        if name == 'code_problems.py' or name.endswith('.jsonl'):\n"
            "            path = os.path.join(top, name)\n"
            "            pairs += tests_in(read(path), path)\n"
            "respond(pairs)",
            0.0,
        ),
        Hostile(
            "exec bypass of the audit hook, then cat the tests",
            _LEAK
            + "import glob, importlib.machinery, importlib.util\n"
            "path = next(p for folder in sys.path for p in glob.glob(os.path.join(folder, '_posixsubprocess*')))\n"
            "loader = importlib.machinery.ExtensionFileLoader('x._posixsubprocess', path)\n"
            "spec = importlib.util.spec_from_file_location('x._posixsubprocess', path, loader=loader)\n"
            "posixsubprocess = loader.create_module(spec)\n"
            "loader.exec_module(posixsubprocess)\n"
            "out_r, out_w = os.pipe()\n"
            "err_r, err_w = os.pipe()\n"
            f"command = b'cat {t.problem_file}'\n"
            "try:\n"
            "    pid = posixsubprocess.fork_exec([b'/bin/sh', b'-c', command], [b'/bin/sh'], True, (err_w,),\n"
            "        None, None, -1, -1, -1, out_w, -1, -1, err_r, err_w,\n"
            "        False, False, -1, None, None, None, -1, None, False)\n"
            "    os.close(out_w)\n"
            "    os.close(err_w)\n"
            "    failure = os.read(err_r, 4096).decode()  # what the child's exec raised, if it did\n"
            "    text = b''.join(iter(lambda: os.read(out_r, 65536), b'')).decode()\n"
            "    os.waitpid(pid, 0)\n"
            "    print('no shell: ' + failure if failure else 'the shell ran', file=sys.stderr)\n"
            f"    respond(tests_in(text, {t.problem_file!r}))\n"
            "except OSError as e:\n"
            "    print('no shell:', type(e).__name__, e.strerror, file=sys.stderr)",
            0.0,
        ),
        Hostile(
            "path bypass of the audit hook, then read the tests",
            _LEAK
            + "import posixpath\n"
            "inside = os.path.join(os.getcwd(), 'x')\n"
            "posixpath.abspath = lambda path: inside  # os.path.realpath returns abspath(...) of its result\n"
            f"respond(tests_in(read({t.problem_file!r}), {t.problem_file!r}))",
            0.0,
        ),
        Hostile(
            "writes expected-output files for a grader",
            "import os\n"
            "for folder in ('.', '/tmp', '/dev/shm', os.path.expanduser('~')):\n"
            "    for name in ('expected_output.txt', 'expected.txt', 'output.txt', 'answer.txt', 'result.json'):\n"
            "        try:\n"
            "            with open(os.path.join(folder, name), 'w') as f:\n"
            "                f.write('PASSED')\n"
            "        except OSError:\n"
            "            pass",
            0.0,
        ),
        Hostile(
            "overwrites and patches the grader's files",
            "import os, sys\n"
            "patch = '\\ndef same_output(got, expected):\\n    return True\\n'\n"
            "patch += 'def same_value(got, expected):\\n    return True\\n'\n"
            f"targets = {list(t.grader_files)!r} + [os.path.join(os.path.dirname(os.__file__), 'sitecustomize.py'),\n"
            "    os.path.join(os.path.dirname(os.__file__), 'json', '__init__.py')]\n"
            "for path in targets:\n"
            "    try:\n"
            "        with open(path, 'a') as f:\n"
            "            f.write(patch)\n"
            "        print('patched', path, file=sys.stderr)\n"
            "    except OSError as e:\n"
            "        print('cannot patch', os.path.basename(path), type(e).__name__, file=sys.stderr)",
            0.0,
        ),
        Hostile("exits with status 0 at once", "import os\nos._exit(0)", 0.0),
        Hostile("kills its own process group", "import os\nos.killpg(0, 9)", 0.0),
    ]


def battery(t: Targets) -> list[Hostile]:
    """(name, program, expected reward) of every hostile program, in the order of the docs' table."""
    # Each process of "many processes times memory" allocates what it can and reports it through a pipe.
    grab = (
        "import os, sys\n"
        "r, w = os.pipe()\n"
        "def grab():\n"
        "    held, got = [], 0\n"
        "    try:\n"
        "        while True:\n"
        "            held.append(bytearray(8 << 20))\n"
        "            got += 8\n"
        "    except MemoryError:\n"
        "        pass\n"
        "    os.write(w, b'%d\\n' % got)\n"
        "children = 0\n"
        "for _ in range(32):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        grab()\n"
        "        os._exit(0)\n"
        "    children += 1\n"
        "grab()\n"
        "for _ in range(children):\n"
        "    os.wait()\n"
        "os.close(w)\n"
        "total = sum(int(x) for x in os.read(r, 1 << 16).split())\n"
        "print(f'{children + 1} processes held {total} MiB', file=sys.stderr)"
    )
    snoop = (
        "import os, sys\n"
        "seen = []\n"
        "for pid in sorted(os.listdir('/proc')):\n"
        "    if pid.isdigit():\n"
        "        try:\n"
        "            seen.append(open(f'/proc/{pid}/cmdline').read().replace('\\0', ' ').strip())\n"
        "        except OSError as e:\n"
        "            seen.append(type(e).__name__)\n"
        "print(len(seen), 'processes:', seen, file=sys.stderr)"
    )
    ptrace = (
        "import ctypes, errno, os, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"for pid in ({t.host_pid}, os.getppid(), 1):\n"
        "    ok = libc.ptrace(16, pid, 0, 0) == 0  # PTRACE_ATTACH\n"
        "    print('ptrace', pid, 'ok' if ok else errno.errorcode[ctypes.get_errno()], file=sys.stderr)"
    )
    raise_limits = (
        "import resource, sys\n"
        "for limit in (resource.RLIMIT_AS, resource.RLIMIT_NPROC, resource.RLIMIT_CPU, resource.RLIMIT_FSIZE):\n"
        "    try:\n"
        "        resource.setrlimit(limit, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "        print('raised', limit, file=sys.stderr)\n"
        "    except (OSError, ValueError) as e:\n"
        "        print('kept', limit, type(e).__name__, file=sys.stderr)\n"
        f"held = bytearray({2 * t.memory_mb} << 20)"
    )
    connect_unix = (
        "import socket\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.settimeout(1)\n"
        "s.connect({address!r})\n"
        "s.sendall(b'owned')"
    )
    looks_around = (
        "import os, sys\n"
        "print('/:', sorted(os.listdir('/')), file=sys.stderr)\n"
        f"for path in ({t.problem_file!r}, {t.dataset!r}, '/root', '/home', '/usr/lib/python3/dist-packages', "
        f"'/etc/passwd', '/bin/sh', {__file__!r}):\n"
        "    print(path, 'visible' if os.path.exists(path) else 'absent', file=sys.stderr)"
    )
    return [
        Hostile("infinite loop", "while True:\n    pass", 0.0),
        Hostile("sleeps past the wall limit", "import time\ntime.sleep(60)", 0.0),
        Hostile("fork bomb", "import os\nwhile True:\n    os.fork()", 0.0),
        Hostile("memory bomb", "blocks = []\nwhile True:\n    blocks.append(bytearray(1 << 24))", 0.0),
        Hostile("huge output", "while True:\n    print('x' * 10_000)", 0.0),
        Hostile("huge file", "open('big.txt', 'w').write('x' * 50_000_000)", 0.0),
        Hostile("reads /etc/passwd", "print(open('/etc/passwd').read())", 0.0),
        Hostile("writes outside its directory", f"open({t.probe_path!r}, 'w').write('owned')", 0.0),
        Hostile(
            "opens a network socket",
            f"import socket\nsocket.create_connection(('127.0.0.1', {t.tcp_port}), timeout=1)",
            0.0,
        ),
        Hostile("shell via subprocess", "import subprocess\nsubprocess.run('cat /etc/passwd', shell=True)", 0.0),
        Hostile(
            "kills its parent and the host", f"import os\nos.kill(os.getppid(), 9)\nos.kill({t.host_pid}, 9)", 0.0
        ),
        Hostile("prints the environment", "import os\nprint(dict(os.environ))", 0.0),
        Hostile("reads the host's /proc environ", f"print(open('/proc/{t.host_pid}/environ').read())", 0.0),
        Hostile(
            "passes one test, loops on the other",
            "a, b = map(int, input().split())\nwhile a == 5:\n    pass\nprint(a + b)",
            0.5,
        ),
        *reward_hacks(t),
        Hostile(
            "prints the answer, then crashes",
            "a, b = map(int, input().split())\nprint(a + b, flush=True)\nraise RuntimeError('crash')",
            0.0,
        ),
        Hostile(
            "prints the answer, then aborts",
            "import os\nprint(sum(map(int, input().split())), flush=True)\nos.abort()",
            0.0,
        ),
        Hostile(
            "raises SystemExit(0) before the driver calls it",
            "def double(x):\n    return 2 * x\nraise SystemExit(0)",
            0.0,
            DOUBLE,
        ),
        Hostile("host AF_UNIX socket in /tmp", connect_unix.format(address=t.unix_path), 0.0),
        Hostile("host abstract AF_UNIX socket", connect_unix.format(address="\0" + t.abstract_name), 0.0),
        Hostile(
            "leaves files in /tmp and /dev/shm",
            f"for folder in ('/tmp', '/dev/shm'):\n    open(folder + '/' + {t.persist!r}, 'w').write('persisted')",
            0.0,
        ),
        Hostile(
            "reads what an earlier run left in /tmp and /dev/shm",
            "import sys\n"
            "for folder in ('/tmp', '/dev/shm'):\n"
            "    try:\n"
            f"        print('found:', open(folder + '/' + {t.leftover!r}).read(), file=sys.stderr)\n"
            "    except OSError as e:\n"
            "        print(folder, type(e).__name__, file=sys.stderr)",
            0.0,
        ),
        Hostile("lists processes and their command lines in /proc", snoop, 0.0),
        Hostile("looks for the project, home, packages and a shell", looks_around, 0.0),
        Hostile("many processes times memory", grab, 0.0),
        Hostile("raises its rlimits, then allocates twice the cap", raise_limits, 0.0),
        Hostile("ptrace of the host, its parent and itself", ptrace, 0.0),
        *battery_v3(t),
    ]
