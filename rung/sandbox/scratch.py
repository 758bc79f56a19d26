"""A sandbox's writable space in root mode: one tmpfs of `size` bytes and `inodes` inodes (hard links count as
inodes on tmpfs), mounted by the grader under a root-only directory and bound by bwrap as the sandbox's /tmp and
/dev/shm, so that the two share one bound. bwrap's own --tmpfs takes a size but no nr_inodes, and an unbounded
number of links or directories costs the host kernel memory. Unmounted when the sandbox is gone."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
from pathlib import Path

BASE = Path("/run/rung-sandbox")  # 0700 root: no host user reaches the sandboxes' files
MS_NOSUID, MS_NODEV, MNT_DETACH = 0x2, 0x4, 0x2  # <sys/mount.h>
_names = itertools.count()
_libc = ctypes.CDLL(None, use_errno=True)  # Python has no mount(2)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


class Scratch:
    def __init__(self, size: int, inodes: int):
        BASE.mkdir(mode=0o700, exist_ok=True)
        self.path = BASE / f"rung-sandbox-{os.getpid()}-{next(_names)}"  # as the cgroups
        self.path.mkdir(mode=0o700)
        options = f"size={size},nr_inodes={inodes},mode=0700".encode()
        try:
            _check(_libc.mount(b"tmpfs", bytes(self.path), b"tmpfs", MS_NOSUID | MS_NODEV, options), "mount tmpfs")
        except OSError:
            self.path.rmdir()
            raise
        for name in ("tmp", "shm"):  # the sandbox's uid is not known to them: world-writable, sticky
            (self.path / name).mkdir()
            os.chmod(self.path / name, 0o1777)

    @property
    def binds(self) -> list[str]:
        return ["--bind", str(self.path / "tmp"), "/tmp", "--bind", str(self.path / "shm"), "/dev/shm"]

    @staticmethod
    def sweep() -> None:
        """Unmount the scratch spaces of graders that died before removing theirs (their pid is gone)."""
        for path in BASE.glob("rung-sandbox-*-*") if BASE.is_dir() else []:
            if not Path(f"/proc/{path.name.split('-')[2]}").exists():
                with contextlib.suppress(OSError):
                    _libc.umount2(bytes(path), MNT_DETACH)
                    path.rmdir()

    def remove(self) -> None:
        _check(_libc.umount2(bytes(self.path), MNT_DETACH), "umount tmpfs")
        self.path.rmdir()
