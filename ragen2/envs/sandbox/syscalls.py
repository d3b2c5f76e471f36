"""The system calls a sandboxed program may not make, compiled by libseccomp into the filter it runs under.

The namespaces, the read-only root and the sandbox uid decide what a program can reach;
this filter takes away kernel interfaces that none of those cover and a test program
never needs: running any binary (a memfd needs no executable file, the interpreter is
reachable as /proc/self/exe), new namespaces and mounts (a tmpfs of its own is memory
outside every cap), kernel keyrings (not namespaced, they outlive the run), SysV shared
memory (not counted by RLIMIT_AS), and interfaces with a long record of kernel exploits
(io_uring, userfaultfd, perf events, BPF). Everything else is allowed, so ordinary
programs, threads and fork() included, behave as usual. A refused call fails with EPERM
(clone3 with ENOSYS, so that the C library falls back to clone, whose flags the filter
can read); a system call of another ABI (32-bit, x32) kills the process.

The rules are written with pyseccomp, libseccomp's Python binding, on the host; the fork
server only installs the compiled BPF program (`inside._confine`), so neither needs to
exist inside the sandbox.
"""

from __future__ import annotations

import errno
import functools
import tempfile

DENIED = (
    # No binary runs, the interpreter included: a program stays the forked interpreter it was given.
    "execve", "execveat",
    # Anonymous files: memory outside the run's tmpfs cap, and the way to an executable without a file.
    "memfd_create", "memfd_secret",
    # Namespaces and mounts (clone with a namespace flag: `_CLONE_NAMESPACES`).
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr",
    # Kernel keyrings: not namespaced, so keys would reach the host and later runs of the same uid.
    "keyctl", "add_key", "request_key",
    # SysV IPC: shared memory that no rlimit counts once detached.
    "shmget", "shmat", "shmdt", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semtimedop",
    "semctl",
    # Kernel interfaces with a record of privilege escalations, which no test program uses.
    "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd", "perf_event_open", "bpf",
    # Other processes' memory and descriptors.
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # The kernel and the machine (Docker's default profile refuses these too).
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "acct", "swapon", "swapoff",
    "reboot", "settimeofday", "clock_settime", "clock_adjtime", "ioperm", "iopl", "lookup_dcookie",
    "name_to_handle_at", "open_by_handle_at", "quotactl", "quotactl_fd", "syslog", "sysfs", "_sysctl", "uselib",
    "ustat", "vhangup", "fanotify_init",
)  # fmt: skip
_CLONE_NAMESPACES = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}


EXEC = ("execve", "execveat")
"""Allowed where a run may start the machine's programs (`Limits.programs`): they are read-only files of the
sandbox's root, and a file the run wrote cannot be executed (its tmpfs is noexec; memfds stay refused)."""


@functools.cache
def compiled_filter(allow_exec: bool = False) -> bytes:
    """The filter as a classic BPF program (an array of `struct sock_filter`) for PR_SET_SECCOMP.

    `allow_exec` leaves out `EXEC` (`Limits.programs`). Raises OSError or RuntimeError
    (pyseccomp's, when libseccomp.so.2 is missing) if it cannot be built.
    """
    import pyseccomp as seccomp

    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    rules.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)
    for name in DENIED:
        if allow_exec and name in EXEC:
            continue
        rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
    for flag in _CLONE_NAMESPACES.values():
        rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")  # its flags are in memory, out of the filter's reach
    with tempfile.TemporaryFile() as f:
        rules.export_bpf(f)
        f.seek(0)
        return f.read()


@functools.cache
def keyctl_number() -> int:
    """keyctl's system call number on this machine (the C library has no wrapper for it)."""
    import pyseccomp as seccomp

    return seccomp.resolve_syscall(seccomp.Arch.NATIVE, "keyctl")
