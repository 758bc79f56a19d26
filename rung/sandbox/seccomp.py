"""The seccomp filter of every sandbox (bwrap --seccomp FD): default allow, and the system calls below fail with
EPERM (clone3 with ENOSYS, so that glibc falls back to clone, whose namespace flags a filter can see). Built once
per process with libseccomp (pyseccomp, ctypes over the system's libseccomp.so.2) for the machine's own
architecture by name, so the numbers are right on x86_64 and aarch64 alike; a system call of another ABI on the
same machine (i386's int 0x80, x32) kills the process. The list is docs/sandbox.md's."""

from __future__ import annotations

import errno
import functools
import os

DENIED: dict[str, tuple[str, ...]] = {
    # kernel keys outlive the sandbox: a keyring per uid, and root mode's uid is new in every execution
    "kernel keys": ("add_key", "keyctl", "request_key"),
    # another process's memory, registers and file descriptors: the runner's
    "tracing": ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd"),
    # memory that RLIMIT_AS does not count (SysV segments, queues and semaphores; memfds), which without a cgroup
    # nothing else bounds: each would be the host's
    "memory outside the address space": ("shmget", "msgget", "semget", "memfd_create", "memfd_secret"),
    # large kernel attack surfaces no solution needs
    "bpf": ("bpf",),
    "perf": ("perf_event_open",),
    "userfaultfd": ("userfaultfd",),
    "io_uring": ("io_uring_setup", "io_uring_enter", "io_uring_register"),
    # the mount tree, the old API and the new one
    "mounts": (
        "mount",
        "umount2",
        "pivot_root",
        "open_tree",
        "move_mount",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "mount_setattr",
    ),
    # new namespaces (clone's namespace flags below, clone3 by ENOSYS): in root mode there is no user namespace
    "namespaces": ("unshare", "setns"),
    "kernel modules": ("init_module", "finit_module", "delete_module"),
    "kexec": ("kexec_load", "kexec_file_load"),
    "reboot": ("reboot",),
    "swap": ("swapon", "swapoff"),
}
# clone(2)'s flags argument (the first on x86_64 and aarch64): any of these fails with EPERM
CLONE_NAMESPACES = {
    "CLONE_NEWTIME": 0x00000080,
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}


@functools.cache
def program() -> bytes:
    """The filter as the BPF program bwrap loads (a few hundred bytes); pyseccomp raises if libseccomp is missing."""
    import pyseccomp as seccomp  # ctypes loads libseccomp.so.2: imported here, not by `import rung.sandbox`

    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    for names in DENIED.values():
        for name in names:
            rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")  # its flags sit in memory a filter cannot read
    for flag in CLONE_NAMESPACES.values():
        rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    fd = os.memfd_create("seccomp")
    try:
        rules.export_bpf(open(fd, "rb", closefd=False))
        os.lseek(fd, 0, os.SEEK_SET)
        return os.read(fd, 1 << 20)
    finally:
        os.close(fd)


def readable_fd() -> int:
    """A pipe's read end holding the filter, for one bwrap (which reads it to EOF); the caller closes it."""
    r, w = os.pipe()
    try:
        os.write(w, program())  # far below a pipe's 64 KiB: never blocks
    finally:
        os.close(w)
    return r
