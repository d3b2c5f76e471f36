"""The coding workspace (ragen2/coding/workspace.py) and the sandbox mode its commands run in (`Limits.programs`).

What must hold: a task directory is read, or refused with a message that says what is wrong; a command runs with
bash and the machine's programs, the host's files out of sight; what a run writes still cannot be executed, and a
run without `programs` still cannot execute anything; the copy of the repository is kept between commands, and
paths the sandbox reports that would leave it are refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ragen2.coding import RepoTask, Workspace
from ragen2.coding.workspace import _checked
from ragen2.envs.sandbox import Limits, run_program
from ragen2.errors import ConfigError


def write_task(root, spec, files=None):
    (root / "repo").mkdir(parents=True)
    (root / "task.json").write_text(json.dumps(spec))
    for path, text in (files or {"pkg/code.py": "x = 1\n", "tests/test_code.py": "def test_x():\n    pass\n"}).items():
        (root / "repo" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "repo" / path).write_text(text)
    return root


def test_a_task_directory_loads_and_bad_ones_are_refused_with_the_reason(tmp_path):
    task = RepoTask.load(write_task(tmp_path / "ok", {"issue": " Fix x. ", "tests": ["tests/test_code.py"]}))
    assert task.name == "ok" and task.issue == "Fix x." and task.tests == ("tests/test_code.py",)
    assert set(task.files) == {"pkg/code.py", "tests/test_code.py"}
    assert RepoTask.load("mean").tests == ("tests/test_core.py",)  # a shipped task, by name
    with pytest.raises(ConfigError, match="no task 'nope'.*shipped tasks: mean"):
        RepoTask.load("nope")
    with pytest.raises(ConfigError, match="tests must be a non-empty list"):
        RepoTask.load(write_task(tmp_path / "a", {"issue": "Fix.", "tests": []}))
    with pytest.raises(ConfigError, match=r"the tests \['tests/missing.py'\] are not Python files in repo/"):
        RepoTask.load(write_task(tmp_path / "b", {"issue": "Fix.", "tests": ["tests/missing.py"]}))
    with pytest.raises(ConfigError, match="issue must be a non-empty text"):
        RepoTask.load(write_task(tmp_path / "c", {"issue": "", "tests": ["tests/test_code.py"]}))
    with pytest.raises(ConfigError, match="keys issue and tests"):
        RepoTask.load(write_task(tmp_path / "d", {"issue": "Fix.", "tests": ["tests/test_code.py"], "test": 1}))
    link = write_task(tmp_path / "e", {"issue": "Fix.", "tests": ["tests/test_code.py"]})
    (link / "repo" / "secret").symlink_to("/etc/passwd")
    with pytest.raises(ConfigError, match="symbolic link"):
        RepoTask.load(link)


def test_paths_the_sandbox_reports_must_stay_in_the_repository():
    assert _checked("pkg/code.py") == "pkg/code.py"
    for bad in ("", ".", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a\0b", 3):
        with pytest.raises(ValueError, match="bad path"):
            _checked(bad)


def test_programs_run_in_the_sandbox_and_what_a_run_writes_cannot_be_executed():
    program = ("import subprocess\n"
               "print(subprocess.run(['bash', '-c', 'echo $PPID; echo $(ls /usr/local/bin); python3 -c \"import sys; "
               "print(sys.prefix)\"; python3 -c \"import pytest\" 2>&1 | tail -1; cp /usr/bin/true t; ./t; "
               f"echo exec=$?; ls {os.getcwd()} 2>&1'], capture_output=True, text=True).stdout)")
    result = run_program(program, limits=Limits(programs=True, wall_s=20))
    parent, local_bin, prefix, no_pytest, copied, host = result.stdout.strip().splitlines()
    assert parent == "1" and local_bin == "python python3"  # PID 1 of its own namespace; /usr/local: Python
    assert prefix == sys.base_prefix  # the host's interpreter, standard library only
    assert no_pytest.startswith("ModuleNotFoundError")
    assert copied == "exec=126"  # a binary copied into the run's tmpfs is refused (noexec)
    assert "No such file or directory" in host  # the project is not there
    exec_true = "import os\ntry:\n    os.execv('/bin/true', ['true'])\nexcept OSError as e:\n    print(e.errno)"
    plain = run_program(exec_true, limits=Limits(audit_hook=False))
    assert plain.stdout.strip() == "1"  # without `programs`, exec is still refused (EPERM)


def test_the_workspace_keeps_the_copy_between_commands(tmp_path):
    workspace = Workspace(RepoTask.load(write_task(tmp_path / "t", {"issue": "Fix.", "tests": ["tests/test_code.py"]})))
    assert workspace.run("mkdir -p empty/dir && echo 2 > pkg/new.txt && rm pkg/code.py").returncode == 0
    assert set(workspace.files) == {"pkg/new.txt", "tests/test_code.py"} and "empty/dir" in workspace.dirs
    listed = workspace.run("find . | sort").output.split()
    assert listed == [".", "./empty", "./empty/dir", "./pkg", "./pkg/new.txt", "./tests", "./tests/test_code.py"]
    slow = workspace.run("echo started; sleep 30", timeout=1)
    assert slow.timed_out and slow.returncode < 0 and "started" in slow.output
    assert workspace.test().passed  # the test function ran (tests restored, pkg/code.py not needed)
    with pytest.raises(ValueError, match="timeout=0"):
        workspace.run("true", timeout=0)
    with pytest.raises(ConfigError, match="programs=True"):
        Workspace(workspace.task, command_limits=Limits())
    exported = workspace.export(tmp_path / "out")
    assert (exported / "pkg" / "new.txt").read_text() == "2\n" and (exported / "empty" / "dir").is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_without_root_commands_run_in_user_namespaces():
    """The tests above, rerun as an unprivileged uid: the sandbox then isolates through user namespaces
    (tests/envs/test_sandbox.py does the same for its OS-layer tests, and lends the way to become that uid)."""
    envs = str(Path(__file__).parents[1] / "envs")
    sys.path.insert(0, envs)
    try:
        from test_sandbox import UNPRIVILEGED_UID, USERNS_MISSING, _become_unprivileged
    finally:
        sys.path.remove(envs)
    if USERNS_MISSING:
        pytest.skip(f"no unprivileged user namespaces here: {USERNS_MISSING}")
    with tempfile.TemporaryDirectory() as scratch:  # its tmp_path: pytest's own is closed to other users
        os.chown(scratch, UNPRIVILEGED_UID, UNPRIVILEGED_UID)
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", f"{scratch}/pytest",
             __file__, "-k", "programs_run or keeps_the_copy"],
            preexec_fn=_become_unprivileged, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0 and "2 passed" in result.stdout, result.stdout[-5000:]
