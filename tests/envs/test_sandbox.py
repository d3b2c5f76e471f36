"""The sandbox: limits hold, hostile programs get reward 0 (or their partial reward) without touching the host.

The hostile-program battery runs each program as a `code` env submission, concurrently
with a correct program that must still score 1.0. Tests named `test_os_*` switch the
audit hook off to check what the operating system enforces by itself (as root).

`python tests/envs/test_sandbox.py --write-docs` reruns the battery and writes its table
into docs/environments.md.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ragen2.envs.code_problems import CodeTest, Problem
from ragen2.envs.codeexec import GradedTest, grade
from ragen2.envs.sandbox import SANDBOX_UIDS, Limits, isolation, run_program, run_programs
from ragen2.errors import ConfigError

ROOT = os.geteuid() == 0
as_root = pytest.mark.skipif(not ROOT, reason="the OS-level protections tested here need root (see sandbox docstring)")
SLACK_S = 0.5  # a run may end this long after its wall limit (kill and reap)

SUM = Problem(
    "battery_sum",
    "Read two integers and print their sum.",
    (CodeTest("1 2", "3"), CodeTest("5 5", "10")),
    solution="a, b = map(int, input().split())\nprint(a + b)\n",
)
BATTERY_LIMITS = Limits(wall_s=2.0, cpu_s=1, memory_mb=256)
SECRET = "ragen2-fake-secret-" + uuid.uuid4().hex


def battery(port: int, probe_path: str) -> list[tuple[str, str, float]]:
    """(name, program, expected reward) of each hostile program; `port` is a host socket that must stay silent."""
    return [
        ("infinite loop", "while True:\n    pass", 0.0),
        ("sleeps past the wall limit", "import time\ntime.sleep(60)", 0.0),
        ("fork bomb", "import os\nwhile True:\n    os.fork()", 0.0),
        ("memory bomb", "blocks = []\nwhile True:\n    blocks.append(bytearray(1 << 24))", 0.0),
        ("huge output", "while True:\n    print('x' * 10_000)", 0.0),
        ("huge file", "open('big.txt', 'w').write('x' * 50_000_000)", 0.0),
        ("reads /etc/passwd", "print(open('/etc/passwd').read())", 0.0),
        ("writes outside its directory", f"open({probe_path!r}, 'w').write('owned')", 0.0),
        ("opens a network socket", f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)", 0.0),
        ("shell via subprocess", "import subprocess\nsubprocess.run('cat /etc/passwd', shell=True)", 0.0),
        ("kills its parent and the host", f"import os\nos.kill(os.getppid(), 9)\nos.kill({os.getpid()}, 9)", 0.0),
        ("prints the environment", "import os\nprint(dict(os.environ))", 0.0),
        ("reads the host's /proc environ", f"print(open('/proc/{os.getpid()}/environ').read())", 0.0),
        (
            "passes one test, loops on the other",
            "a, b = map(int, input().split())\nwhile a == 5:\n    pass\nprint(a + b)",
            0.5,
        ),
    ]


def run_battery() -> list[dict]:
    """Grade every hostile program next to a correct one; one row per hostile program."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0)
    probe = "/tmp/ragen2-battery-probe"
    Path(probe).unlink(missing_ok=True)
    cases = battery(server.getsockname()[1], probe)
    os.environ["RAGEN2_FAKE_SECRET"] = SECRET
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:  # each hostile program runs next to a correct one
            pairs = [
                (pool.submit(grade, SUM, source, BATTERY_LIMITS), pool.submit(grade, SUM, SUM.solution, BATTERY_LIMITS))
                for _, source, _ in cases
            ]
            rows = [_row(name, expected, h.result(), g.result()) for (name, _, expected), (h, g) in zip(cases, pairs)]
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing ever connected
    finally:
        del os.environ["RAGEN2_FAKE_SECRET"]
        server.close()
    assert not os.path.exists(probe)
    return rows


def _row(name: str, expected: float, outcomes: list[GradedTest], good: list[GradedTest]) -> dict:
    failing = next((o for o in outcomes if not o.passed), outcomes[0])
    reason = failing.run.killed_reason
    return {
        "program": name,
        "outcome": f"limit: {reason}" if reason else failing.got.removeprefix("error: ")[:100],
        "reward": sum(o.passed for o in outcomes) / len(outcomes),
        "expected": expected,
        "wall_s": max(o.run.wall_s for o in outcomes),
        "limit_s": BATTERY_LIMITS.wall_s,
        "good_reward": sum(o.passed for o in good) / len(good),
        "outputs": " ".join(o.run.stdout + o.run.stderr for o in outcomes),
    }


def battery_table(rows: list[dict]) -> str:
    lines = ["| program | outcome | reward | wall time (s) | wall limit (s) |", "|---|---|---|---|---|"]
    for r in rows:
        outcome = r["outcome"].replace("|", "\\|").strip()
        lines.append(f"| {r['program']} | {outcome} | {r['reward']:.1f} | {r['wall_s']:.2f} | {r['limit_s']:.1f} |")
    return "\n".join(lines)


def test_hostile_battery_gets_its_reward_and_leaves_host_and_neighbours_alone():
    rows = run_battery()
    for r in rows:
        assert r["reward"] == r["expected"], r
        assert r["good_reward"] == 1.0, r  # the correct program running next to it was unaffected
        assert r["wall_s"] <= r["limit_s"] + SLACK_S, r
        assert SECRET not in r["outputs"] and "root:x:0:0" not in r["outputs"], r
    by_name = {r["program"]: r["outcome"] for r in rows}
    assert by_name["huge output"] == "limit: output_limit"
    assert by_name["memory bomb"] == "limit: memory"
    assert by_name["huge file"] == "limit: file_size"
    assert by_name["sleeps past the wall limit"] == "limit: wall_time"
    assert by_name["infinite loop"] in ("limit: cpu_time", "limit: wall_time")  # wall first on a busy machine


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


@pytest.mark.parametrize(
    "program, message",
    [
        ("open('/etc/passwd').read()", "opening '/etc/passwd' is not allowed"),
        ("open('/tmp/x', 'w')", "opening '/tmp/x' is not allowed"),
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
    assert isolation() == {"separate_uid": True, "pid_namespace": True, "network_namespace": True}


@as_root
def test_os_files_only_own_and_world_writable_places(tmp_path):
    secret = tmp_path / "root_only.txt"  # pytest's tmp_path is under a 0700 root directory
    secret.write_text("classified")
    probe = f"/tmp/ragen2-os-probe-{uuid.uuid4().hex}"
    program = (
        "import errno\n"
        f"paths = [('/etc/ragen2-probe', 'w'), ({str(secret)!r}, 'r'), ({probe!r}, 'w'), ('/etc/passwd', 'r')]\n"
        "for path, mode in paths:\n"
        "    try:\n"
        "        open(path, mode).close()\n"
        "        print('ok')\n"
        "    except OSError as e:\n"
        "        print(errno.errorcode[e.errno])"
    )
    result = run_program(program, limits=Limits(audit_hook=False))
    try:
        # Written: its own directory and world-writable /tmp; read: world-readable files (the hook blocks both).
        assert result.stdout.split() == ["EACCES", "EACCES", "ok", "ok"], result.stderr
    finally:
        Path(probe).unlink(missing_ok=True)


@as_root
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
    result = run_program(program, limits=Limits(audit_hook=False, max_processes=8))
    count, errno_ = map(int, result.stdout.split())
    assert count <= 8 and errno_ == 11  # EAGAIN from RLIMIT_NPROC
    time.sleep(0.2)
    assert not _sandbox_processes()


@as_root
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
        "print('RAGEN2_FAKE_SECRET' in os.environ, os.getuid() in range(61000, 61512))"
    )
    try:
        result = run_program(program, limits=Limits(audit_hook=False))
        assert result.stdout.split() == ["ENETUNREACH", "ESRCH", "EACCES", "False", "True"], result.stderr
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        del os.environ["RAGEN2_FAKE_SECRET"]
        server.close()


def _sandbox_processes() -> list[int]:
    """Pids of live processes owned by a sandbox uid."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            uid = int(re.search(r"^Uid:\s+(\d+)", status, flags=re.M).group(1))
            if uid in SANDBOX_UIDS and "State:\tZ" not in status:
                found.append(int(entry))
    return found


DOCS = Path(__file__).resolve().parents[2] / "docs" / "environments.md"
BEGIN, END = "<!-- sandbox-battery:begin -->", "<!-- sandbox-battery:end -->"


def test_docs_hold_the_battery_table():
    docs = DOCS.read_text(encoding="utf-8")
    block = docs[docs.index(BEGIN) : docs.index(END)]
    for name, _, _ in battery(0, ""):
        assert f"| {name} |" in block


def write_docs() -> None:
    rows = run_battery()
    report = isolation()
    table = battery_table(rows)
    note = ", ".join(f"{k}={v}" for k, v in report.items())
    block = (
        f"{BEGIN}\n`python tests/envs/test_sandbox.py --write-docs` (as root; isolation(): {note}; "
        "each program's tests run with `Limits(wall_s=2.0, cpu_s=1, memory_mb=256)`, "
        "next to a correct program that scored "
        f"{min(r['good_reward'] for r in rows):.1f}):\n\n{table}\n{END}"
    )
    docs = DOCS.read_text(encoding="utf-8")
    docs = docs[: docs.index(BEGIN)] + block + docs[docs.index(END) + len(END) :]
    DOCS.write_text(docs, encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-docs"]:
        write_docs()
    else:
        print(battery_table(run_battery()))
