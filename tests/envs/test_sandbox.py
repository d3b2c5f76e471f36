"""The sandbox: limits hold, hostile programs get reward 0 (or their partial reward) without touching the host.

The hostile-program battery (tests/envs/hostile.py) runs each program as a `code` env
submission, concurrently with a correct program that must still score 1.0, twice: with
the audit hook off (the operating system alone must contain every program) and on.
Afterwards the host checks what the programs aimed at: its sockets heard nothing, its
files are unchanged, nothing was left in /tmp or /dev/shm and no process survived.
Tests named `test_os_*` also switch the hook off. Isolation needs root or, for another
user, unprivileged user namespaces. CI runs as root, so
`test_without_root_the_os_layer_holds_in_user_namespaces` reruns the OS-layer tests
(the battery with the hook off included) as an unprivileged uid.

`python tests/envs/test_sandbox.py --write-docs` reruns the battery and writes its table
into docs/environments.md.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pyseccomp
import pytest
from hostile import DOUBLE, SESSION_KEYRING_READER, SUM, Hostile, Targets, battery, battery_v3, exit42_elf, reward_hacks

import ragen2.envs.code_problems
import ragen2.envs.codeexec
from ragen2.envs.code_problems import BUILTIN_PROBLEMS
from ragen2.envs.codeexec import GradedTest, grade
import ragen2.envs.sandbox.host
import ragen2.envs.sandbox.inside
from ragen2.envs.sandbox import (
    SANDBOX_UIDS,
    Limits,
    SandboxUnavailable,
    isolation,
    process_limits,
    run_program,
    run_programs,
)
from ragen2.envs.sandbox import cgroup
from ragen2.envs.sandbox.host import _user_namespaces_missing
from ragen2.errors import ConfigError

ROOT = os.geteuid() == 0
USERNS_MISSING = _user_namespaces_missing()
as_root = pytest.mark.skipif(not ROOT, reason="what is tested here needs root")
isolated = pytest.mark.skipif(
    not ROOT and USERNS_MISSING is not None, reason=f"no root and no user namespaces: {USERNS_MISSING}"
)
with cgroup.memory_cgroup(64 << 20) as _made:
    MEMORY_CGROUP = _made is not None  # this machine lets the host make a memory cgroup per run
needs_cgroup = pytest.mark.skipif(not MEMORY_CGROUP, reason="no memory cgroup can be made here")
# The uid the OS-layer tests are rerun as without root: no account needed, outside SANDBOX_UIDS.
UNPRIVILEGED_UID = 61700
SLACK_S = 0.5  # a run may end this long after its wall limit (kill and reap)
SLACK_MB = 16  # and hold this much more than its memory cap (the interpreter's own pages counted twice)
BATTERY_LIMITS = Limits(wall_s=2.0, cpu_s=1, memory_mb=256)
SECRET = "ragen2-fake-secret-" + uuid.uuid4().hex
GRADER_FILES = tuple(
    str(Path(m.__file__).resolve())
    for m in (
        ragen2.envs.codeexec,
        ragen2.envs.code_problems,
        ragen2.envs.sandbox,
        ragen2.envs.sandbox.host,
        ragen2.envs.sandbox.inside,
    )
)


@contextmanager
def host_targets() -> Iterator[Targets]:
    """Set up what the programs aim at; afterwards check that none of it was reached."""
    tag = uuid.uuid4().hex
    tcp = socket.create_server(("127.0.0.1", 0))
    unix_path = f"/tmp/ragen2-battery-{tag}.sock"
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(unix_path)
    os.chmod(unix_path, 0o777)  # anyone may connect: only the sandbox stands in the way
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0ragen2-battery-" + tag)
    listeners = (tcp, unix, abstract)
    for s in listeners:
        s.listen()
        s.settimeout(0)
    dataset_dir = Path(tempfile.mkdtemp(prefix="ragen2-battery-data-"))
    dataset_dir.chmod(0o755)
    dataset = dataset_dir / "problems.jsonl"
    row = {"problem": SUM.statement, "tests": [{"input": t.input, "output": t.expected} for t in SUM.tests]}
    dataset.write_text(json.dumps(row) + "\n")
    dataset.chmod(0o644)
    leftover = f"ragen2-battery-leftover-{tag}"
    for folder in ("/tmp", "/dev/shm"):
        Path(folder, leftover).write_text(SECRET)
        Path(folder, leftover).chmod(0o644)
    before = {path: _digest(path) for path in GRADER_FILES}
    files_before = set() if ROOT else _sandbox_files()  # without root the programs' files are the host user's
    keys_before = _sandbox_keys()
    targets = Targets(
        tcp_port=tcp.getsockname()[1],
        unix_path=unix_path,
        abstract_name="ragen2-battery-" + tag,
        probe_path=f"/tmp/ragen2-battery-probe-{tag}",
        leftover=leftover,
        persist=f"ragen2-battery-persist-{tag}",
        problem_file=str(Path(ragen2.envs.code_problems.__file__).resolve()),
        dataset=str(dataset),
        grader_files=GRADER_FILES,
        host_pid=os.getpid(),
        memory_mb=BATTERY_LIMITS.memory_mb,
    )
    os.environ["RAGEN2_FAKE_SECRET"] = SECRET
    try:
        yield targets
        for s in listeners:
            with pytest.raises(BlockingIOError):
                s.accept()  # nothing ever connected
        assert not os.path.exists(targets.probe_path)
        for folder in ("/tmp", "/dev/shm"):
            assert not os.path.exists(os.path.join(folder, targets.persist))
            assert Path(folder, leftover).read_text() == SECRET
        assert {path: _digest(path) for path in GRADER_FILES} == before
        assert_nothing_left(files_before, keys_before, "all programs")
    finally:
        del os.environ["RAGEN2_FAKE_SECRET"]
        for s in listeners:
            s.close()
        Path(unix_path).unlink(missing_ok=True)
        for folder in ("/tmp", "/dev/shm"):
            Path(folder, leftover).unlink(missing_ok=True)
        dataset.unlink()
        dataset_dir.rmdir()


def _digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run_battery(audit_hook: bool) -> list[dict]:
    """Grade every hostile program next to a correct one, checking the host after each; one row per program."""
    limits = Limits(**{**BATTERY_LIMITS.__dict__, "audit_hook": audit_hook})
    with host_targets() as targets, ThreadPoolExecutor(max_workers=2) as pool:
        files_before = set() if ROOT else _sandbox_files()
        keys_before = _sandbox_keys()
        rows = []
        for case in battery(targets):  # each hostile program runs next to a correct one
            hostile = pool.submit(grade, case.problem, case.source + "\n", limits)
            good = pool.submit(grade, SUM, SUM.solution, limits)
            rows.append(_row(case, hostile.result(), good.result()))
            assert_nothing_left(files_before, keys_before, case.name)
        return rows


def assert_nothing_left(files_before: set[str], keys_before: dict, after: str) -> None:
    """No process of a sandbox uid alive, no key or file of one (without root: of ours) added, no run's cgroup left.

    A killed run's processes take a moment to be reaped, so this waits up to 2 s.
    """
    deadline = time.monotonic() + 2.0
    while True:
        keys = _sandbox_keys()
        left = {
            "processes": _sandbox_processes(),
            "keys": {key: n for key, n in keys.items() if n > keys_before.get(key, 0)},
            "files": sorted(_sandbox_files() - files_before),
            "cgroups": _sandbox_cgroups(),
        }
        if not any(left.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert not any(left.values()), f"after {after!r} the host has {left}"


def _sandbox_cgroups() -> list[str]:
    """The run cgroups this process made that are still there (other processes on the machine may run programs too)."""
    return glob.glob(f"{cgroup.CGROUP_ROOT}/**/{cgroup.PREFIX}{os.getpid()}-*", recursive=True)


def _row(case: Hostile, outcomes: list[GradedTest], good: list[GradedTest]) -> dict:
    failing = next((o for o in outcomes if not o.passed), outcomes[0])
    reason = failing.run.killed_reason
    said = failing.run.stderr.strip().rpartition("\n")[2] or failing.got.removeprefix("error: ") or "(no output)"
    return {
        "program": case.name,
        "outcome": f"limit: {reason}" if reason else said[:100],
        "reward": sum(o.passed for o in outcomes) / len(outcomes),
        "expected": case.expected,
        "wall_s": max(o.run.wall_s for o in outcomes),
        "good_reward": sum(o.passed for o in good) / len(good),
        "outputs": " ".join(o.run.stdout + o.run.stderr for o in outcomes),
    }


@isolated
@pytest.mark.parametrize("audit_hook", [False, True], ids=["os-alone", "with-audit-hook"])
def test_hostile_battery_gets_its_reward_and_leaves_host_and_neighbours_alone(audit_hook):
    rows = run_battery(audit_hook)
    assert len(rows) >= 50
    for r in rows:
        assert r["reward"] == r["expected"], r
        assert r["good_reward"] == 1.0, r  # the correct program running next to it was unaffected
        assert r["wall_s"] <= BATTERY_LIMITS.wall_s + SLACK_S, r
        assert SECRET not in r["outputs"] and "root:x:0:0" not in r["outputs"], r
        assert "BUILTIN_PROBLEMS" not in r["outputs"] and "the shell ran" not in r["outputs"], r
    by_name = {r["program"]: r for r in rows}
    assert by_name["huge output"]["outcome"] == "limit: output_limit"
    assert by_name["memory bomb"]["outcome"] == "limit: memory"
    assert by_name["huge file"]["outcome"] == "limit: file_size"
    assert by_name["sleeps past the wall limit"]["outcome"] == "limit: wall_time"
    assert by_name["infinite loop"]["outcome"] in ("limit: cpu_time", "limit: wall_time")  # wall on a busy machine
    assert by_name["raises its rlimits, then allocates twice the cap"]["outcome"] == "limit: memory"
    assert "raised" not in by_name["raises its rlimits, then allocates twice the cap"]["outputs"]
    assert "ok" not in by_name["ptrace of the host, its parent and itself"]["outputs"].split()
    assert "visible" not in by_name["looks for the project, home, packages and a shell"]["outputs"]
    assert "found:" not in by_name["reads what an earlier run left in /tmp and /dev/shm"]["outputs"]
    assert "patched" not in by_name["overwrites and patches the grader's files"]["outputs"]
    snooped = by_name["lists processes and their command lines in /proc"]["outputs"]
    assert "pytest" not in snooped and all(m == "1" for m in re.findall(r"(\d+) processes:", snooped))
    for held in re.findall(r"held (\d+) MiB", by_name["many processes times memory"]["outputs"]):
        assert int(held) <= BATTERY_LIMITS.memory_mb + SLACK_MB
    assert "no shell: OSError:1:" in by_name["exec bypass of the audit hook, then cat the tests"]["outputs"]  # EPERM
    if not audit_hook:  # the OS refused it, not the hook
        assert by_name["host abstract AF_UNIX socket"]["outcome"].startswith("ConnectionRefusedError")
    # Battery v3: no refused call succeeded (a call prints "name: <errno name>", or a number when it succeeded) and
    # no binary ran. Without root the program's stdin pipe belongs to its own uid, the host user's: reopening it
    # reaches only its own input.
    for case in battery_v3(_placeholder_targets()):
        if ROOT or "stdin" not in case.name:
            assert not re.search(r": (allowed|ran: .*|-?\d+)$", by_name[case.name]["outputs"], re.M), case.name
    for name, refusal in V3_REFUSALS.items():
        if not audit_hook or "execs" in name:  # the exec programs get past the hook; the others import ctypes
            assert refusal in by_name[name]["outputs"], (name, by_name[name]["outputs"])
    if ROOT and not audit_hook:
        assert "reopen and write: EACCES" in by_name["reopens its stdin for writing and makes it setuid"]["outputs"]
    scratch_mb = 4 * BATTERY_LIMITS.max_file_bytes / 2**20  # the run's tmpfs, /dev/shm included
    for held in re.findall(r"POSIX shm held (\d+) MiB", by_name["fills /dev/shm with POSIX shared memory"]["outputs"]):
        assert int(held) <= scratch_mb
    for held in re.findall(r"pipes held (\d+) MiB", by_name["holds memory in pipe buffers"]["outputs"]):
        assert int(held) <= BATTERY_LIMITS.max_open_files // 2  # 1 MiB per pipe, two descriptors each


# What the OS answers each battery-v3 program (hook off), in its output.
V3_REFUSALS = {
    "execs a static binary from a memfd": "memfd_create: EPERM",
    "execs a static binary it wrote to /tmp": "binary in /tmp: EPERM",
    "execs the interpreter through /proc/self/exe": "interpreter: EPERM",
    "mounts a tmpfs in a new user namespace and fills it past the cap": "unshare: EPERM",
    "clones into new namespaces (clone, clone3, setns)": "clone CLONE_NEWUSER: EPERM",
    "grows SysV shared memory past the cap": "shmget: EPERM",
    "leaves keys in the user, user-session and session keyrings": "add_key to the user keyring: EPERM",
    "reads keys an earlier run left (/proc/keys, KEYCTL_SEARCH)": "user keyring: EPERM",
    "joins a named session keyring for later runs": "keyctl join: EPERM",
    "reads the host's session keyring": "session keyring: EPERM",
    "io_uring_setup": "io_uring_setup: EPERM",
    "userfaultfd": "userfaultfd: EPERM",
    "perf_event_open on itself": "perf_event_open: EPERM",
    "creates a BPF map": "bpf map: EPERM",
    "reads its child's memory (ptrace, process_vm_readv)": "ptrace attach: EPERM",
    "loads modules, kexec, reboot, swapon, acct, sets the clock": "kexec_load: EPERM",
}


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the battery's binary is an x86-64 executable")
def test_the_battery_binary_runs_outside_the_sandbox():
    fd = os.memfd_create("exit42", 0)  # as the memfd program does, without the sandbox's filter
    try:
        os.write(fd, exit42_elf())
        assert subprocess.run([f"/proc/self/fd/{fd}"], pass_fds=[fd], timeout=10).returncode == 42
    finally:
        os.close(fd)


@isolated
def test_reward_hacks_score_zero_on_every_builtin_problem():
    limits = Limits(**{**BATTERY_LIMITS.__dict__, "audit_hook": False})  # the OS alone keeps the tests out of reach
    with host_targets() as targets:
        for hack in reward_hacks(targets):
            for problem in (*BUILTIN_PROBLEMS, DOUBLE):
                outcomes = grade(problem, hack.source + "\n", limits)
                assert not any(o.passed for o in outcomes), (hack.name, problem.id, outcomes[0].run.stderr)


def test_output_and_exit_status():
    result = run_program("import sys\ndata = sys.stdin.read()\nprint(data.upper(), end='')\nsys.exit(3)", "abc\n")
    assert (result.stdout, result.exit_code, result.timed_out, result.killed_reason) == ("ABC\n", 3, False, None)
    crash = run_program("1 / 0")
    assert crash.exit_code == 1 and crash.stderr.rstrip().endswith("ZeroDivisionError: division by zero")


def test_exit_keeps_interpreter_semantics():
    program = (
        "import atexit, sys, threading, time\n"
        "atexit.register(lambda: print('at exit'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n"
        "sys.stdout.write('main ')\n"
        "raise SystemExit('bye')"
    )
    result = run_program(program)
    assert result.stdout == "main thread\nat exit\n" and result.stderr == "bye\n" and result.exit_code == 1


def test_programs_get_the_standard_library_their_directory_and_a_fixed_hash_seed():
    program = (
        "import collections, decimal, fractions, heapq, json, tempfile\n"
        "open('note.txt', 'w').write('kept')\n"
        "with tempfile.TemporaryFile() as f:\n"
        "    f.write(b'x')\n"
        "print(open('note.txt').read(), open(0).read().strip(), hash('abc'))"
    )
    first, second = run_program(program, "in"), run_program(program, "in")
    assert first.exit_code == 0, first.stderr
    assert first.stdout.split()[:2] == ["kept", "in"] and first.stdout == second.stdout


@isolated
def test_os_stdin_is_a_pipe_fed_as_the_program_reads_it():
    big = "x" * 3_000_000  # many times a pipe's buffer
    program = (
        "import errno, os, stat, sys\n"
        "data = sys.stdin.read()\n"
        "print(len(data), stat.S_ISFIFO(os.fstat(0).st_mode))\n"
        "for attempt in (lambda: open('/proc/self/fd/0', 'r+b'), lambda: os.fchmod(0, 0o6755)):\n"
        "    try:\n"
        "        attempt()\n"
        "        print('ok')\n"
        "    except OSError as e:\n"
        "        print(errno.errorcode[e.errno])"
    )
    result = run_program(program, big, Limits(audit_hook=False))
    lines = result.stdout.split()
    assert lines[:2] == ["3000000", "True"], result.stderr
    if ROOT:  # the pipe is the host's: the sandbox uid can neither reopen nor change it
        assert lines[2:] == ["EACCES", "EPERM"], result.stderr
    unread = run_program("print('done')", big, Limits(audit_hook=False))  # the host stops feeding at its end
    assert unread.stdout == "done\n" and unread.killed_reason is None and unread.wall_s < 2


def test_text_that_is_not_utf8_does_not_break_the_host():
    result = run_program("print('\ud800')", "\udcff")
    assert result.exit_code != 0 and result.killed_reason is None


def test_cpu_and_wall_limits():
    busy = run_program("while True:\n    pass", limits=Limits(cpu_s=1, wall_s=5))
    assert busy.killed_reason == "cpu_time" and busy.timed_out and busy.wall_s < 5
    idle = run_program("import time\ntime.sleep(30)", limits=Limits(cpu_s=5, wall_s=0.5))
    assert idle.killed_reason == "wall_time" and idle.timed_out and idle.wall_s < 0.5 + SLACK_S


def test_pool_runs_programs_concurrently_in_job_order():
    jobs = [(f"import time\ntime.sleep(0.5)\nprint({i})", "") for i in range(4)]
    start = time.monotonic()
    results = run_programs(jobs, max_workers=4)
    elapsed = time.monotonic() - start
    assert [r.stdout for r in results] == ["0\n", "1\n", "2\n", "3\n"]
    assert elapsed < 1.5  # four 0.5 s sleeps one after the other take 2 s


def test_limits_are_validated():
    with pytest.raises(ConfigError, match="cpu_s=0"):
        Limits(cpu_s=0)
    with pytest.raises(ConfigError, match="wall_s=-1"):
        Limits(wall_s=-1)
    with pytest.raises(ConfigError, match="unknown sandbox limit 'wall'.*Did you mean: wall_s"):
        Limits.from_dict({"wall": 2})
    assert Limits.from_dict({"wall_s": 1.5}).wall_s == 1.5
    with pytest.raises(ConfigError, match="max_workers=0"):
        run_programs([("print(1)", "")], max_workers=0)


def test_memory_cap_is_split_over_processes():
    assert process_limits(Limits()) == (4, 128 << 20)  # 512 MiB: 4 processes of 128 MiB
    assert process_limits(Limits(memory_mb=256, max_processes=16)) == (2, 128 << 20)
    assert process_limits(Limits(memory_mb=256, max_processes=1)) == (1, 256 << 20)  # one process gets it all
    assert process_limits(Limits(memory_mb=64)) == (1, 64 << 20)
    for memory_mb in (64, 100, 512, 1000, 4096):
        for max_processes in (1, 3, 16):
            n, each = process_limits(Limits(memory_mb=memory_mb, max_processes=max_processes))
            assert 1 <= n <= max_processes and n * each <= memory_mb << 20


@pytest.mark.parametrize(
    "program, message",
    [
        ("open('/etc/passwd').read()", "opening '/etc/passwd' is not allowed"),
        ("open('/etc/x', 'w')", "opening '/etc/x' is not allowed"),
        ("import os\nos.listdir('/')", "os.listdir on '/' is not allowed"),
        ("import socket\nsocket.socket()", "socket.__new__ is not allowed"),
        ("import os\nos.system('true')", "os.system is not allowed"),
        ("import ctypes", "importing ctypes is not allowed"),
        ("import os\nos.symlink('/etc/passwd', 'link')", "os.symlink is not allowed"),
        ("import resource\nresource.setrlimit(resource.RLIMIT_CPU, (9, 9))", "resource.setrlimit is not allowed"),
    ],
)
def test_audit_hook_refuses_with_a_clear_message(program, message):
    result = run_program(program)
    assert result.exit_code == 1 and f"PermissionError: sandbox: {message}" in result.stderr


@as_root
def test_isolation_report_as_root():
    assert isolation() == {
        "separate_uid": True, "pid_namespace": True, "network_namespace": True, "private_filesystem": True,
        "syscall_filter": True, "memory_cgroup": MEMORY_CGROUP,
    }  # fmt: skip


@pytest.mark.skipif(ROOT or USERNS_MISSING is not None, reason="for a user other than root with user namespaces")
def test_isolation_report_without_root():
    assert isolation() == {
        "separate_uid": False, "pid_namespace": True, "network_namespace": True, "private_filesystem": True,
        "syscall_filter": True, "memory_cgroup": False,
    }  # fmt: skip


@as_root
@pytest.mark.skipif(USERNS_MISSING is not None, reason=f"no user namespaces: {USERNS_MISSING}")
def test_without_root_the_os_layer_holds_in_user_namespaces():
    tests = "os-alone or test_os_ or test_isolation_report_without_root or test_output_and_exit_status"
    with tempfile.TemporaryDirectory() as scratch:  # its tmp_path, removed afterwards
        os.chown(scratch, UNPRIVILEGED_UID, UNPRIVILEGED_UID)
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--confcutdir", str(Path(__file__).parent),
             "--basetemp", os.path.join(scratch, "pytest"), __file__, "-k", tests],
            preexec_fn=_become_unprivileged,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            capture_output=True,
            text=True,
            timeout=240,
        )  # fmt: skip
    summary = result.stdout.strip().rpartition("\n")[2]
    assert result.returncode == 0 and re.fullmatch(r"9 passed, \d+ deselected in .*", summary), result.stdout[-5000:]


def _become_unprivileged() -> None:
    """In the child, still root: make this interpreter reachable for UNPRIVILEGED_UID, then become that uid.

    The interpreter may live under a directory other users cannot enter (/root/.pyenv): a
    tmpfs over that directory, in a mount namespace of the child's own, shows only the way in.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
    prefix = Path(sys.base_prefix).resolve()
    closed = [d for d in prefix.parents if not d.stat().st_mode & 0o001]
    if closed:
        top = closed[-1]
        way_in = next(d for d in (prefix, *prefix.parents) if d.parent == top)
        bind, rec, private = 4096, 16384, 1 << 18
        if libc.unshare(0x00020000) != 0 or libc.mount(None, b"/", None, rec | private, None) != 0:  # CLONE_NEWNS
            raise OSError(ctypes.get_errno(), "no mount namespace of its own")
        fd = os.open(way_in, os.O_PATH)  # in the new namespace: a bind mount takes only its own mounts
        if libc.mount(b"tmpfs", bytes(top), b"tmpfs", 0, b"mode=755") != 0:
            raise OSError(ctypes.get_errno(), f"mounting a tmpfs on {top} failed")
        (top / way_in.name).mkdir()
        if libc.mount(f"/proc/self/fd/{fd}".encode(), bytes(top / way_in.name), None, bind | rec, None) != 0:
            raise OSError(ctypes.get_errno(), f"binding {way_in} failed")
        os.close(fd)
    os.setgroups([])
    os.setgid(UNPRIVILEGED_UID)
    os.setuid(UNPRIVILEGED_UID)


@isolated
def test_os_only_the_runtime_and_private_writable_places(tmp_path):
    secret = tmp_path / "root_only.txt"
    secret.write_text("classified")
    probe = f"/tmp/ragen2-os-probe-{uuid.uuid4().hex}"
    program = (
        "import errno, os\n"
        f"paths = [('/etc/ragen2-probe', 'w'), ({str(secret)!r}, 'r'), ({probe!r}, 'w'), ('/etc/passwd', 'r'),\n"
        f"         ({GRADER_FILES[0]!r}, 'r'), ('/stdlib/os.py', 'a'), ('/dev/shm/x', 'w'), ('note.txt', 'w')]\n"
        "for path, mode in paths:\n"
        "    try:\n"
        "        open(path, mode).close()\n"
        "        print('ok')\n"
        "    except OSError as e:\n"
        "        print(errno.errorcode[e.errno])\n"
        "print(sorted(os.listdir('/')), os.getcwd())"
    )
    result = run_program(program, limits=Limits(audit_hook=False))
    # The read-only root, nothing of the host, its own /tmp, /dev/shm and working directory.
    lines = result.stdout.splitlines()
    assert lines[:8] == ["EROFS", "ENOENT", "ok", "ENOENT", "ENOENT", "EACCES", "ok", "ok"], result.stderr
    assert lines[8] == "['dev', 'etc', 'lib', 'proc', 'stdlib', 'tmp', 'work'] /work"
    assert not os.path.exists(probe)


# Fills `pipes` pipes of 1 MiB (kernel memory, outside RLIMIT_AS), then allocates and touches `mb` MiB.
PIPES_THEN_MEMORY = (
    "import fcntl, os\n"
    "held = []\n"
    "for _ in range({pipes}):\n"
    "    r, w = os.pipe()\n"
    "    fcntl.fcntl(w, 1031, 1 << 20)\n"  # F_SETPIPE_SZ
    "    os.set_blocking(w, False)\n"
    "    try:\n"
    "        while True:\n"
    "            os.write(w, bytes(1 << 16))\n"
    "    except BlockingIOError:\n"
    "        held.append((r, w))\n"
    "block = b'x' * ({mb} << 20)\n"
    "print('allocated')"
)


@needs_cgroup
def test_memory_cgroup_caps_pipe_buffers_and_memory_together():
    assert isolation()["memory_cgroup"]
    limits = Limits(memory_mb=128, audit_hook=False)
    fits = run_program(PIPES_THEN_MEMORY.format(pipes=0, mb=110), limits=limits)
    assert fits.stdout == "allocated\n", fits
    # 28 MiB of pipe buffers (accounted here: cgroup v2, or v1's kernel memory) and the same 110 MiB: over the cap.
    over = run_program(PIPES_THEN_MEMORY.format(pipes=28, mb=110), limits=limits)
    assert over.killed_reason == "memory" and over.stdout == "", over
    assert not _sandbox_cgroups()


@needs_cgroup
def test_memory_cgroup_holds_every_process_and_thread_of_a_run():
    # The launcher moves only its own thread in (cgroup.py): what it and the program start must be born there.
    program = (
        "import os, threading\n"
        "def where(who):\n"
        "    lines = open('/proc/thread-self/cgroup').read().splitlines()\n"
        "    v1 = [line for line in lines if ':memory:' in line]\n"
        "    line = (v1 or [line for line in lines if line.startswith('0::')])[0]\n"
        "    print(who, line.rpartition(':')[2], flush=True)\n"
        "where('program')\n"
        "thread = threading.Thread(target=where, args=('thread',))\n"
        "thread.start()\n"
        "thread.join()\n"
        "if os.fork() == 0:\n"
        "    if os.fork() == 0:\n"
        "        where('grandchild')\n"
        "        os._exit(0)\n"
        "    os.wait()\n"
        "    where('child')\n"
        "    os._exit(0)\n"
        "os.wait()\n"
    )
    result = run_program(program, limits=Limits(audit_hook=False))
    places = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert sorted(places) == ["child", "grandchild", "program", "thread"], result
    assert len(set(places.values())) == 1 and cgroup.PREFIX in places["program"], places
    assert not _sandbox_cgroups()


@needs_cgroup
def test_memory_cgroup_is_removed_after_a_run_killed_for_time():
    result = run_program("import time\nblock = b'x' * (32 << 20)\ntime.sleep(60)", limits=Limits(wall_s=0.5))
    assert result.killed_reason == "wall_time"
    assert not _sandbox_cgroups()


@isolated
def test_without_a_memory_cgroup_runs_fall_back_to_the_split_cap(monkeypatch):
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", "/nonexistent/cgroup")
    assert run_program("print(6 * 7)").stdout == "42\n"
    assert isolation()["memory_cgroup"] is False
    bomb = run_program("blocks = []\nwhile True:\n    blocks.append(b'x' * (1 << 24))", limits=Limits(audit_hook=False))
    assert bomb.killed_reason == "memory"


@isolated
def test_os_process_cap_and_no_survivors():
    program = (
        "import os, time\n"
        "count = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            os.setsid()\n"  # escapes the process group, not the PID namespace
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        count += 1\n"
        "except OSError as e:\n"
        "    print(count, e.errno)"
    )
    result = run_program(program, limits=Limits(audit_hook=False, max_processes=8, memory_mb=1024))
    count, errno_ = map(int, result.stdout.split())
    assert count == 7 and errno_ == 11  # EAGAIN from RLIMIT_NPROC: it and 7 children; no other task counts
    time.sleep(0.2)
    assert not _sandbox_processes()


@isolated
def test_os_network_signals_and_environment():
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0)
    os.environ["RAGEN2_FAKE_SECRET"] = SECRET
    program = (
        "import errno, os, socket\n"
        "def attempt(f):\n"
        "    try:\n"
        "        f()\n"
        "        return 'ok'\n"
        "    except OSError as e:\n"
        "        return errno.errorcode[e.errno]\n"
        f"print(attempt(lambda: socket.create_connection(('127.0.0.1', {server.getsockname()[1]}), timeout=1)))\n"
        f"print(attempt(lambda: os.kill({os.getpid()}, 9)))\n"  # the host's pid means nothing in its namespace
        f"print(attempt(lambda: open('/proc/{os.getpid()}/environ').read()))\n"
        "print('RAGEN2_FAKE_SECRET' in os.environ, os.getuid())"
    )
    try:
        result = run_program(program, limits=Limits(audit_hook=False))
        *refused, uid = result.stdout.split()
        assert refused == ["ENETUNREACH", "ESRCH", "ENOENT", "False"], result.stderr
        assert int(uid) in SANDBOX_UIDS if ROOT else int(uid) == os.getuid()  # without root: its own user namespace
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        del os.environ["RAGEN2_FAKE_SECRET"]
        server.close()


# System calls the filter refuses, with arguments that would make each succeed (or fail otherwise) without it.
FILTERED_CALLS = (
    ("memfd_create", (b"x", 0), "EPERM"),
    ("execve", (b"/proc/self/exe", 0, 0), "EPERM"),
    ("unshare", (0x10000000 | 0x00020000,), "EPERM"),  # CLONE_NEWUSER | CLONE_NEWNS
    ("clone", (0x10000000 | 17, 0, 0, 0, 0), "EPERM"),  # CLONE_NEWUSER | SIGCHLD
    ("clone3", (0, 0), "ENOSYS"),
    ("setns", (0, 0), "EPERM"),
    ("mount", (b"none", b"/tmp", b"tmpfs", 0, 0), "EPERM"),
    ("keyctl", (1, 0), "EPERM"),  # KEYCTL_JOIN_SESSION_KEYRING
    ("add_key", (b"user", b"k", b"v", 1, -3), "EPERM"),  # into the session keyring
    ("shmget", (0, 1 << 20, 0o1600), "EPERM"),  # IPC_PRIVATE, IPC_CREAT | 0600
    ("msgget", (0, 0o1600), "EPERM"),
    ("semget", (0, 1, 0o1600), "EPERM"),
    ("io_uring_setup", (1, 0), "EPERM"),
    ("userfaultfd", (1,), "EPERM"),  # UFFD_USER_MODE_ONLY: allowed to anyone without the filter
    ("perf_event_open", (0, 0, -1, -1, 0), "EPERM"),
    ("bpf", (0, 0, 0), "EPERM"),
    ("ptrace", (0, 0, 0, 0), "EPERM"),  # PTRACE_TRACEME
    ("process_vm_readv", (1, 0, 0, 0, 0, 0), "EPERM"),
    ("kexec_load", (0, 0, 0, 0), "EPERM"),
    ("init_module", (0, 0, b""), "EPERM"),
    ("reboot", (0, 0, 0, 0), "EPERM"),
)


@isolated
def test_os_system_call_filter_refuses_and_ordinary_programs_still_work():
    calls = [(name, pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name), args) for name, args, _ in FILTERED_CALLS]
    program = (
        "import ctypes, errno, mmap, os, select, threading\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"for name, number, args in {calls!r}:\n"
        "    result = libc.syscall(number, *args)\n"
        "    print(name, 'allowed' if result >= 0 else errno.errorcode[ctypes.get_errno()])\n"
        "with ThreadPoolExecutor(2) as pool:\n"
        "    squares = list(pool.map(lambda x: x * x, range(4)))\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(7)\n"
        "r, w = os.pipe()\n"
        "os.write(w, b'x')\n"
        "ready = select.select([r], [], [], 1)[0] == [r]\n"
        "with mmap.mmap(-1, 1 << 20) as m:\n"
        "    m[:2] = b'ok'\n"
        "    print('works', squares, os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), ready, m[:2].decode())"
    )
    result = run_program(program, limits=Limits(audit_hook=False))
    lines = result.stdout.splitlines()
    assert lines[:-1] == [f"{name} {refusal}" for name, _, refusal in FILTERED_CALLS], result.stderr
    assert lines[-1] == "works [0, 1, 4, 9] 7 True ok", result.stderr


# A host process whose session keyring holds a secret key, as a developer's or a CI job's may: it runs the
# program with the audit hook off and on, and then counts the keys in its own session keyring.
HOST_WITH_A_SESSION_KEYRING = """
import ctypes, json, sys
from ragen2.envs.sandbox import Limits, run_program
keyctl, add_key, program, secret = json.loads(sys.stdin.read())
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
assert libc.syscall(keyctl, 1, b"ragen2-host-session") > 0  # KEYCTL_JOIN_SESSION_KEYRING, before the fork server
assert libc.syscall(add_key, b"user", b"ragen2-host-secret", secret.encode(), len(secret), -3) > 0
outputs = [run_program(program, limits=Limits(audit_hook=hook)) for hook in (False, True)]
serials = (ctypes.c_int32 * 64)()
size = libc.syscall(keyctl, 11, -3, serials, ctypes.sizeof(serials))  # KEYCTL_READ: the keys' serials
print(json.dumps({"outputs": [r.stdout + r.stderr for r in outputs], "keys": size // 4}))
"""


@isolated
def test_os_the_host_session_keyring_stays_out_of_reach():
    numbers = [pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name) for name in ("keyctl", "add_key")]
    result = subprocess.run(
        [sys.executable, "-c", HOST_WITH_A_SESSION_KEYRING],
        input=json.dumps([*numbers, SESSION_KEYRING_READER, SECRET]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(result.stdout.strip().rpartition("\n")[2] or "{}")
    alone, hooked = report["outputs"]
    assert SECRET not in alone + hooked and "ragen2-host" not in alone + hooked, report
    assert "/proc/keys: \n" in alone and "session keyring: EPERM" in alone, alone  # masked; keyctl refused
    assert "sandbox: importing ctypes is not allowed" in hooked, hooked
    assert report["keys"] == 1, report  # the host's key, and nothing the program planted


NO_SYS_ADMIN = """
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(message)s")
from ragen2.envs import make
from ragen2.envs.sandbox import SandboxUnavailable
try:
    make("code")
except SandboxUnavailable as e:
    print("REFUSED", e)
env = make("code", limits={"allow_unsandboxed": True})
env.reset(options={"problem": "sum_two"})
print("REWARD", env.step(env.solve()[0])[1])
"""


@as_root
def test_a_machine_that_cannot_isolate_refuses_unless_allowed_explicitly():
    libc = ctypes.CDLL(None, use_errno=True)
    drop_sys_admin = lambda: libc.prctl(24, 21, 0, 0, 0)  # PR_CAPBSET_DROP, CAP_SYS_ADMIN: no mounts, no namespaces
    result = subprocess.run(
        [sys.executable, "-c", NO_SYS_ADMIN], preexec_fn=drop_sys_admin, capture_output=True, text=True, timeout=120
    )
    lines = result.stdout.splitlines()
    assert lines[0].startswith("REFUSED the code sandbox cannot isolate programs on this machine: unshare(CLONE_NEWNS)")
    assert "allow_unsandboxed: true" in lines[0]
    assert lines[1].startswith("WARNING running programs WITHOUT the code sandbox's isolation"), result.stderr
    assert lines[2] == "REWARD 1.0"


def test_refusal_names_what_is_missing_and_the_config_key():
    message = str(SandboxUnavailable("unshare(CLONE_NEWNS) failed: Operation not permitted"))
    assert "Operation not permitted" in message and "limits: {allow_unsandboxed: true}" in message
    assert isinstance(SandboxUnavailable("x"), ConfigError)


def test_without_root_or_user_namespaces_the_refusal_says_what_to_enable(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: UNPRIVILEGED_UID)
    monkeypatch.setattr(os, "uname", lambda: os.uname_result(("Linux", "host", "5.10.0", "#1", "x86_64")))
    with pytest.raises(SandboxUnavailable) as refused:
        ragen2.envs.sandbox.host._ForkServer(isolated=True)
    message = str(refused.value)
    assert "does not run as root, and Linux 5.10.0 is older than 5.14" in message
    assert "kernel.unprivileged_userns_clone=1" in message and "limits: {allow_unsandboxed: true}" in message


def _sandbox_processes() -> list[int]:
    """Pids of live processes owned by a sandbox uid; without root, of ours in another PID namespace."""
    found = []
    own_pid_namespace = os.readlink("/proc/self/ns/pid")
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
                pid_namespace = os.readlink(f"/proc/{entry}/ns/pid")
            except OSError:
                continue
            uid = int(re.search(r"^Uid:\s+(\d+)", status, flags=re.M).group(1))
            program = uid in SANDBOX_UIDS if ROOT else uid == os.getuid() and pid_namespace != own_pid_namespace
            if program and "State:\tZ" not in status:
                found.append(int(entry))
    return found


def _sandbox_keys() -> dict:
    """Kernel keys a program could have left, counted by owner (root) or by key (without root).

    As root: the keys of each sandbox uid, from /proc/key-users (a program's session
    keyring is root's). Without root the programs' keys are ours, so ours from /proc/keys,
    less the empty session keyring each run joins, which the kernel may free seconds
    after the run.
    """
    found = {}
    if ROOT:
        for line in Path("/proc/key-users").read_text().splitlines():  # "  uid: usage nkeys/nikeys ..."
            uid, counts = line.split(":", 1)
            if int(uid) in SANDBOX_UIDS:
                found[int(uid)] = int(counts.split()[1].split("/")[0])
        return found
    for line in Path("/proc/keys").read_text().splitlines():  # "serial flags usage timeout perm uid gid type desc"
        serial, *_, uid, _, kind, description = line.split(None, 8)
        if int(uid) == os.getuid() and not (kind == "keyring" and description.startswith("_ses:")):
            found[f"{serial} {kind} {description.split(':')[0]}"] = 1
    return found


def _sandbox_files() -> set[str]:
    """Files owned by a sandbox uid (without root: by us) in the host's /tmp and /dev/shm."""
    owners = SANDBOX_UIDS if ROOT else (os.getuid(),)
    found = set()
    for folder in ("/tmp", "/dev/shm"):
        for entry in os.scandir(folder):
            try:
                if entry.stat(follow_symlinks=False).st_uid in owners:
                    found.add(entry.path)
            except FileNotFoundError:  # removed meanwhile
                continue
    return found


DOCS = Path(__file__).resolve().parents[2] / "docs" / "environments.md"
BEGIN, END = "<!-- sandbox-battery:begin -->", "<!-- sandbox-battery:end -->"


def battery_table(alone: list[dict], hooked: list[dict]) -> str:
    lines = [
        "| program | OS alone (hook off): outcome | reward | with the audit hook: outcome | reward | wall time (s) |",
        "|---|---|---|---|---|---|",
    ]
    for a, h in zip(alone, hooked):
        cells = [c["outcome"].replace("|", "\\|").replace("\n", " ").strip() for c in (a, h)]
        wall = max(a["wall_s"], h["wall_s"])
        rewards = f"{a['reward']:.1f}", f"{h['reward']:.1f}"
        lines.append(f"| {a['program']} | {cells[0]} | {rewards[0]} | {cells[1]} | {rewards[1]} | {wall:.2f} |")
    return "\n".join(lines)


def _placeholder_targets() -> Targets:
    return Targets(0, "", "", "", "", "", "", "", (), 0, 0)


def test_docs_hold_the_battery_table():
    docs = DOCS.read_text(encoding="utf-8")
    block = docs[docs.index(BEGIN) : docs.index(END)]
    for case in battery(_placeholder_targets()):
        assert f"| {case.name} |" in block


def write_docs() -> None:
    alone, hooked = run_battery(audit_hook=False), run_battery(audit_hook=True)
    note = ", ".join(f"{k}={v}" for k, v in isolation().items())
    block = (
        f"{BEGIN}\n`python tests/envs/test_sandbox.py --write-docs` (as root; isolation(): {note}; "
        "each program's tests run with `Limits(wall_s=2.0, cpu_s=1, memory_mb=256)`, "
        "next to a correct program that scored "
        f"{min(r['good_reward'] for r in alone + hooked):.1f}; the outcome is the limit hit, else the last "
        f"line of stderr, else what the grader got):\n\n{battery_table(alone, hooked)}\n{END}"
    )
    docs = DOCS.read_text(encoding="utf-8")
    docs = docs[: docs.index(BEGIN)] + block + docs[docs.index(END) + len(END) :]
    DOCS.write_text(docs, encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-docs"]:
        write_docs()
    else:
        print(battery_table(run_battery(audit_hook=False), run_battery(audit_hook=True)))
