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
The host writes the program to a file and hands the run to a fork server:
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
That process, PID 1 of its namespace, mounts its own /proc (/proc/keys and
/proc/key-users masked), makes the sandbox filesystem its root with pivot_root
(`_enter_root`; the host's filesystem is then detached, not merely hidden), applies the
resource limits, joins a new, empty session keyring, drops to a sandbox uid, installs
the system call filter (`syscalls.py`) and the audit hook and runs the program as
`__main__` (`_enter_sandbox`, `_run_program`). Forking a ready interpreter saves the interpreter's start-up on
every run, so that even with the namespaces and mounts a run costs less than starting a
plain `python -c` (benchmarks/code_throughput.py).

What a program can then see and do:

- Files: the standard library (read-only), its working directory, a private /tmp and
  /dev/shm (size-capped, gone after the run). No project file, no installed package,
  no home directory, no host /tmp, no shell or other executable.
- System calls (seccomp, `syscalls.py`): no exec of anything (a memfd, a file, the
  interpreter), no memfd, no new namespaces or mounts, no kernel keyrings, no SysV IPC,
  no io_uring, userfaultfd, perf events or BPF, no ptrace or access to other processes'
  memory, no calls on the kernel or the machine (modules, kexec, reboot, swap, clock).
  The filter is compiled on the host with libseccomp (pyseccomp) and installed with
  PR_SET_SECCOMP just before the program runs; its threads and children inherit it.
- Keys: kernel keyrings are not namespaced. The program's session keyring is a new,
  empty one (the host's, inherited through fork, would otherwise stay its own across
  the uid change), the filter refuses keyctl, add_key and request_key, and /proc/keys
  shows nothing, so it can neither read the host's keys nor leave any for a later run.
- Processes: its own /proc; the host's processes do not exist in its PID namespace,
  and every process it started dies with it, even one that called setsid().
- Network: only a loopback device that is down; abstract AF_UNIX sockets of the host
  are in another network namespace, filesystem ones are not in its filesystem.
- uid: a uid of its own, 61000 + k, leased for the run so that no two concurrent runs
  (in any process) share it, without capabilities and with no_new_privs: it cannot
  write the read-only filesystem, mount, signal or ptrace anything outside its run.
- Memory: `memory_mb` for all of its processes together. Where the host can make one
  (`cgroup.py`; root with a writable cgroup v1 memory hierarchy or v2 delegation), a
  memory cgroup per run holds everything the run allocates (pages, tmpfs, pipe and
  socket buffers, kernel objects) to it; each process gets RLIMIT_AS = `memory_mb`, and
  the OOM killer ends a run over the cap (reported as `memory`). Elsewhere no rlimit
  covers several processes, so
  the cap is split (`process_limits`): at most `memory_mb // 128` processes and threads
  (RLIMIT_NPROC, never more than `max_processes`), each with an equal share of address
  space (RLIMIT_AS). The uid is unique to the run, so RLIMIT_NPROC counts only its tasks.
  Memory that RLIMIT_AS does not count is bounded apart: its files, POSIX shared memory
  included, by the run's tmpfs; pipe buffers by RLIMIT_NOFILE (at most 1 MiB a pipe);
  a tmpfs of its own or SysV shared memory the filter refuses.
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

Programs (`Limits(programs=True)`), for harnesses whose actions are shell commands
(ragen2.coding runs each command of a coding agent this way). The fork server of such
runs adds to the read-only root the machine's /usr (with /bin, /lib and the like, and
Debian's /etc/alternatives), with /usr/local and every Python package directory hidden,
and the host's interpreter at its own path (site-packages hidden), run as `python` and
`python3` from /usr/local/bin; its filter allows execve and execveat (`syscalls.EXEC`),
and the audit hook is off, since it refuses subprocesses. Everything else above holds
for every process of the run: the namespaces, the uid, the filter's other rules, the
limits (RLIMIT_CPU is per process; the wall limit and the memory cgroup are the run's),
and the run's tmpfs is noexec, so what a run writes can be read by an interpreter
(`bash x.sh`, `python x.py`) but not executed itself (`./x.sh`) or loaded as a library.

No silent downgrade. When the machine cannot provide this (not root and no user
namespaces, no namespaces, no permission to mount), `run_program` and `prepare` raise
`SandboxUnavailable`, which says what failed and what to enable.
`Limits(allow_unsandboxed=True)` runs programs anyway, logging a warning: then only the
rlimits, the uid change (as root), best-effort PID and network namespaces, the system
call filter, a new session keyring, the minimal environment, a fresh directory and the
audit hook apply. The filter needs libseccomp.so.2 in both cases.

What the audit hook (PEP 578, `audit_hook=True`) adds inside the interpreter: it refuses
sockets, subprocesses, os.system/exec/spawn/fork, os.kill/killpg, ctypes, changing
rlimits, links and symlinks, any open() outside the program's directory and the
standard library (reads) or outside its writable places (writes), listing directories
elsewhere, and importing ctypes or _posixsubprocess, with a clear PermissionError. It
is not a security boundary against a program written to defeat it (PEP 578 says so,
and the battery's bypass programs show two ways); the OS layer is.

Programs can import the standard library only (no site-packages). Their stdin is a pipe
the host fills as the program reads it (not a file, which the program could reopen for
writing through /proc/self/fd/0), so `sys.stdin.read()`, `input()` and `open(0).read()`
all work; seeking in it does not.

The host side (limits, the public API, the fork server's client, collecting results) is
`host.py`; what runs in the fork server and the program's process (the root, the
namespaces, limits and uid, installing the filter, the audit hook), named above by its
functions, is `inside.py`; the filter's rules are `syscalls.py`.
"""

from ragen2.envs.sandbox.host import (
    SANDBOX_UIDS,
    Limits,
    RunResult,
    SandboxUnavailable,
    isolation,
    prepare,
    process_limits,
    run_program,
    run_programs,
)

__all__ = [
    "SANDBOX_UIDS",
    "Limits",
    "RunResult",
    "SandboxUnavailable",
    "isolation",
    "prepare",
    "process_limits",
    "run_program",
    "run_programs",
]
