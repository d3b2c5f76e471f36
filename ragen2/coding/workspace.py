"""A task repository whose copy lives in the sandbox: shell commands run there, the host runs the tests.

A coding harness executes the shell commands its policy writes, so each one runs in ragen2's
sandbox (ragen2.envs.sandbox with `Limits.programs`: bash, the core utilities and Python with its
standard library, none of the host's files), in a copy of the task's repository under /work/repo.
One command is one sandbox run: the host sends the repository's files in, the command runs, and
the files as the command left them come back, so the host keeps the copy between commands and
nothing the command wrote reaches the host's disk.

The reward is the host's: `Workspace.test` puts the task's test files back as they were shipped
(an agent that edits or deletes them gains nothing), runs them in the sandbox without programs
(the in-interpreter audit hook on) and gives 1 when every test ran and passed, else 0.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import posixpath
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ragen2.envs.sandbox import Limits, run_program
from ragen2.errors import ConfigError

TASKS_DIR = Path(__file__).parent / "tasks"
MAX_REPO_BYTES = 4_000_000
"""The largest repository a task may ship: every command sends it into the sandbox and back."""


@dataclass(frozen=True)
class RepoTask:
    """A repository with a bug, the issue the agent is given, and the test files that decide the reward."""

    name: str
    issue: str
    files: Mapping[str, bytes]
    """The repository as the agent gets it (tests included): relative path -> content."""
    tests: tuple[str, ...]
    """Paths (in `files`) of the test files: unittest TestCases and argument-less `test_*` functions."""

    @classmethod
    def load(cls, task: str | Path) -> RepoTask:
        """A task directory (task.json with "issue" and "tests", and repo/), or the name of a shipped one."""
        path = Path(task)
        if not path.is_dir():
            shipped = TASKS_DIR / str(task)
            if not shipped.is_dir():
                names = sorted(p.name for p in TASKS_DIR.iterdir() if p.is_dir())
                raise ConfigError(f"no task {str(task)!r}: give a directory holding task.json and repo/, or one "
                                  f"of the shipped tasks: {', '.join(names)}")
            path = shipped
        try:
            spec = json.loads((path / "task.json").read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"task {path}: cannot read task.json ({e})") from e
        if not isinstance(spec, dict) or set(spec) - {"issue", "tests"}:
            raise ConfigError(f"task {path}: task.json must be an object with the keys issue and tests")
        issue, tests = spec.get("issue"), spec.get("tests")
        if not isinstance(issue, str) or not issue.strip():
            raise ConfigError(f"task {path}: task.json's issue must be a non-empty text")
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise ConfigError(f"task {path}: task.json's tests must be a non-empty list of paths in repo/")
        files = _read_repo(path / "repo")
        missing = [t for t in tests if t not in files or not t.endswith(".py")]
        if missing:
            raise ConfigError(f"task {path}: the tests {missing} are not Python files in repo/")
        return cls(path.name, issue.strip(), files, tuple(tests))


def _read_repo(repo: Path) -> dict[str, bytes]:
    if not repo.is_dir():
        raise ConfigError(f"task {repo.parent}: there is no repo/ directory")
    files = {}
    for path in sorted(repo.rglob("*")):
        if path.is_symlink():
            raise ConfigError(f"task {repo.parent}: {path} is a symbolic link; a task repository holds only files")
        if path.is_file() and "__pycache__" not in path.parts:
            files[path.relative_to(repo).as_posix()] = path.read_bytes()
    if not files:
        raise ConfigError(f"task {repo.parent}: repo/ holds no file")
    if sum(map(len, files.values())) > MAX_REPO_BYTES:
        raise ConfigError(f"task {repo.parent}: repo/ holds more than {MAX_REPO_BYTES} bytes")
    return files


@dataclass
class CommandResult:
    """One command, as it ran in the sandbox."""

    command: str
    output: str
    """stdout and stderr together, as a terminal shows them (cut to `Workspace.max_output` characters)."""
    returncode: int
    """bash's exit status; -N when killed by signal N; -1 when the sandbox ended the run before it reported."""
    timed_out: bool = False
    sandbox: dict = field(default_factory=dict)
    """The sandbox's own record: the PID and uid the command's parent had (PID 1 of a namespace of its own)."""


@dataclass
class TestReport:
    """The host's run of the task's tests on the agent's repository."""

    __test__ = False  # not a test class, for pytest
    passed: bool
    tests_run: int
    failures: int
    errors: int
    output: str

    @property
    def reward(self) -> float:
        return 1.0 if self.passed else 0.0


# The program one command runs as, in the sandbox. It gets the repository and the command on stdin, runs the
# command with bash in /work/repo and prints, as its only line of output, what it printed and the files left.
COMMAND_PROGRAM = r'''
import base64, json, os, signal, subprocess, sys

request = json.load(sys.stdin)
repo = os.path.join(os.getcwd(), "repo")
for path in request["dirs"]:
    os.makedirs(os.path.join(repo, path), exist_ok=True)
for path, data in request["files"].items():
    os.makedirs(os.path.dirname(os.path.join(repo, path)), exist_ok=True)
    with open(os.path.join(repo, path), "wb") as f:
        f.write(base64.b64decode(data))
shell = subprocess.Popen(["bash", "-c", request["command"]], cwd=repo, env={**os.environ, **request["env"]},
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
try:
    output, timed_out = shell.communicate(timeout=request["timeout"])[0], False
except subprocess.TimeoutExpired:
    # PID 1 of the sandbox's namespace: kill(-1) reaches every other process of the run, whatever its group.
    os.kill(-1, signal.SIGKILL) if os.getpid() == 1 else os.killpg(shell.pid, signal.SIGKILL)
    output, timed_out = shell.communicate()[0], True
text, cap = output.decode("utf-8", "replace"), request["max_output"]
if len(text) > cap:
    text = text[: cap // 2] + f"\n[... {len(text) - cap} characters cut ...]\n" + text[-cap // 2 :]
files, dirs = {}, []
for root, subdirs, names in os.walk(repo):
    if root != repo:
        dirs.append(os.path.relpath(root, repo))
    for name in names:
        path = os.path.join(root, name)
        if os.path.isfile(path) and not os.path.islink(path):
            try:
                with open(path, "rb") as f:
                    files[os.path.relpath(path, repo)] = base64.b64encode(f.read()).decode()
            except OSError:
                pass
print(json.dumps({"output": text, "returncode": shell.returncode, "timed_out": timed_out, "files": files,
                  "dirs": dirs, "pid": os.getpid(), "uid": os.getuid()}))
'''

# The host's test run, in the sandbox without programs: the test files' TestCases and test_* functions,
# then one line that starts with the run's nonce and gives the counts.
TEST_PROGRAM = r'''
import base64, importlib.util, inspect, io, json, os, sys, traceback, unittest

request = json.load(sys.stdin)
nonce = request.pop("nonce")
repo = os.path.join(os.getcwd(), "repo")
for path, data in request["files"].items():
    os.makedirs(os.path.dirname(os.path.join(repo, path)), exist_ok=True)
    with open(os.path.join(repo, path), "wb") as f:
        f.write(base64.b64decode(data))
os.chdir(repo)
sys.path.insert(0, repo)
suite, import_errors = unittest.TestSuite(), 0
for path in request["tests"]:
    name = path[:-3].replace("/", ".")
    try:
        spec = importlib.util.spec_from_file_location(name, os.path.join(repo, path))
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except BaseException:
        import_errors += 1
        print(f"ERROR importing {path}:\n{traceback.format_exc()}")
        continue
    suite.addTests(unittest.defaultTestLoader.loadTestsFromModule(module))
    for key, value in vars(module).items():
        if key.startswith("test") and inspect.isfunction(value) and value.__module__ == name:
            suite.addTest(unittest.FunctionTestCase(value))
stream = io.StringIO()
result = unittest.TextTestRunner(stream=stream, verbosity=2).run(suite)
print(stream.getvalue()[-20000:])
print(nonce + json.dumps({"run": result.testsRun, "failures": len(result.failures),
                          "errors": len(result.errors) + import_errors}))
'''


class Workspace:
    """The agent's copy of a task's repository: `run` executes a command in it, `test` scores it."""

    def __init__(self, task: RepoTask, *, max_output: int = 100_000, command_limits: Limits | None = None,
                 test_limits: Limits | None = None) -> None:
        self.task = task
        self.files: dict[str, bytes] = dict(task.files)
        self.dirs: list[str] = []  # directories, empty ones included, as the last command left them
        self.max_output = max_output
        self.command_limits = command_limits or Limits(
            wall_s=30, cpu_s=30, memory_mb=1024, max_output_bytes=16 * MAX_REPO_BYTES, max_file_bytes=MAX_REPO_BYTES,
            max_processes=32, max_open_files=256, programs=True)
        if not self.command_limits.programs:
            raise ConfigError("Workspace command_limits need programs=True: the commands run bash")
        self.test_limits = test_limits or Limits(wall_s=30, cpu_s=20, memory_mb=512, max_file_bytes=MAX_REPO_BYTES,
                                                 max_output_bytes=4 * MAX_REPO_BYTES)
        self.commands: list[CommandResult] = []

    def run(self, command: str, timeout: float = 30, env: Mapping[str, str] | None = None) -> CommandResult:
        """Run `command` with bash in the sandbox, in the repository's root, for at most `timeout` seconds."""
        if not isinstance(command, str):
            raise TypeError(f"command must be a string, not {type(command).__name__}")
        if not timeout > 0:
            raise ValueError(f"timeout={timeout} is not allowed: use a number of seconds > 0")
        request = {"command": command, "timeout": timeout, "env": dict(env or {}), "max_output": self.max_output,
                   "files": _encode(self.files), "dirs": self.dirs}
        # The sandbox's own wall limit leaves time to copy the repository in and out around the command.
        limits = dataclasses.replace(self.command_limits, wall_s=max(self.command_limits.wall_s, timeout + 15))
        run = run_program(COMMAND_PROGRAM, json.dumps(request), limits)
        try:
            reply = json.loads(run.stdout.rstrip("\n").rpartition("\n")[2])
            files = {_checked(p): base64.b64decode(d, validate=True) for p, d in reply["files"].items()}
            dirs = [_checked(p) for p in reply["dirs"]]
            result = CommandResult(command, str(reply["output"]), int(reply["returncode"]), bool(reply["timed_out"]),
                                   {"pid": reply["pid"], "uid": reply["uid"]})
        except (ValueError, KeyError, TypeError, AttributeError):  # the sandbox ended the run, or its output is broken
            why = run.killed_reason or f"exit status {run.exit_code}"
            result = CommandResult(command, f"the sandbox ended the command ({why}); the repository is as it was "
                                   f"before it\n{run.stderr[-2000:]}", -1, run.timed_out)
        else:
            self.files, self.dirs = files, dirs
        self.commands.append(result)
        return result

    def test(self) -> TestReport:
        """The task's tests, as shipped, run by the host on the repository as the agent left it."""
        files = {**self.files, **{path: self.task.files[path] for path in self.task.tests}}
        nonce = secrets.token_hex(16)
        request = {"files": _encode(files), "tests": list(self.task.tests), "nonce": nonce}
        run = run_program(TEST_PROGRAM, json.dumps(request), self.test_limits)
        counts = None
        for line in run.stdout.splitlines():
            if line.startswith(nonce):
                counts = json.loads(line[len(nonce):])
        output = run.stdout.replace(nonce, "") + run.stderr[-2000:]
        if counts is None or run.exit_code != 0:
            why = run.killed_reason or f"exit status {run.exit_code}"
            return TestReport(False, 0, 0, 1, f"the test run did not finish ({why})\n{output}")
        passed = counts["run"] > 0 and counts["failures"] == 0 and counts["errors"] == 0
        return TestReport(passed, counts["run"], counts["failures"], counts["errors"], output)

    def export(self, directory: str | Path) -> Path:
        """Write the repository as the agent left it into `directory` (which must not exist), to look at it."""
        root = Path(directory)
        root.mkdir(parents=True)
        for path in self.dirs:
            (root / path).mkdir(parents=True, exist_ok=True)
        for path, data in self.files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(data)
        return root


def _encode(files: Mapping[str, bytes]) -> dict[str, str]:
    return {path: base64.b64encode(data).decode() for path, data in files.items()}


def _checked(path: object) -> str:
    """A path the sandbox reported, refused unless it is relative and stays inside the repository."""
    if (not isinstance(path, str) or path in ("", ".") or "\0" in path or path.startswith("/")
            or posixpath.normpath(path) != path or path.split("/")[0] == ".."):
        raise ValueError(f"the sandbox reported a bad path: {path!r}")
    return path

