"""One cgroup per sandbox, so that memory, processes and CPU are bounded for its whole process tree (rlimits bind
per process, and a process that setsid()s or forks is still in its cgroup).

cgroup v2 (systemd machines, GPU nodes) when its hierarchy has the memory, pids and cpu controllers and a
writable place for them: a sibling of the grader's own cgroup (v2 lets no cgroup with processes enable
controllers for its children), or a child of the root cgroup when the grader is there. Else v1, where each of
the memory, pids and cpu hierarchies is mounted and the grader's own cgroup in it is writable (root on this
machine and CI): children of the grader's cgroups, so that limits set above it still apply. Else none, and only
the rlimits hold (docs/sandbox.md).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path

CONTROLLERS = ("memory", "pids", "cpu")
PERIOD = 100_000  # µs of the CPU quota's period
_names = itertools.count()


@dataclass(frozen=True)
class Hierarchy:
    version: int  # 1 or 2
    parents: tuple[Path, ...]  # v2: one directory; v1: one per controller, in CONTROLLERS order


def _mounts() -> list[tuple[str, Path, str, set[str]]]:
    """(root within the hierarchy, mount point, fs type, super options) of every cgroup mount."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        fs, _, options = rest.split(" ")[:3]
        if fs in ("cgroup", "cgroup2"):
            parts = fields.split(" ")
            found.append((parts[3], Path(parts[4].replace("\\040", " ")), fs, set(options.split(","))))
    return found


def _own() -> dict[str, str]:
    """The grader's cgroup path per v1 controller, and under "" its v2 path, from /proc/self/cgroup."""
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _within(root: str, path: str) -> str:
    """The cgroup's path relative to the mount's root (a container's mount may start below the hierarchy's)."""
    return path[len(root) :].lstrip("/") if root != "/" and path.startswith(root) else path.lstrip("/")


def find() -> Hierarchy | None:
    """Where this process can make sandbox cgroups with memory, pids and cpu limits, or None."""
    mounts, own = _mounts(), _own()
    for root, point, fs, _ in mounts:
        if fs != "cgroup2" or "" not in own:
            continue
        with contextlib.suppress(OSError):
            if not set(CONTROLLERS) <= set((point / "cgroup.controllers").read_text().split()):
                continue
            mine = point / _within(root, own[""])
            parent = mine if mine == point else mine.parent
            enabled = set((parent / "cgroup.subtree_control").read_text().split())
            if set(CONTROLLERS) <= enabled and os.access(parent, os.W_OK):
                return Hierarchy(2, (parent,))
    parents = []
    for controller in CONTROLLERS:
        where = [point / _within(root, own.get(controller, "/")) for root, point, fs, options in mounts]
        where = [p for p, m in zip(where, mounts, strict=True) if m[2] == "cgroup" and controller in m[3]]
        if not where or controller not in own or not os.access(where[0], os.W_OK):
            return None
        parents.append(where[0])
    return Hierarchy(1, tuple(parents))


class Cgroup:
    """A sandbox's cgroup: made with its limits, joined by bwrap's child (add), removed when the sandbox is gone."""

    def __init__(self, hierarchy: Hierarchy, memory: int, processes: int, cpus: float):
        name = f"rung-sandbox-{os.getpid()}-{next(_names)}"
        self.dirs = tuple(parent / name for parent in hierarchy.parents)
        quota = max(1000, int(cpus * PERIOD))
        if hierarchy.version == 2:
            settings = [
                {"memory.max": memory, "memory.swap.max": 0, "pids.max": processes, "cpu.max": f"{quota} {PERIOD}"}
            ]
        else:
            settings = [
                {"memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory},  # memsw: with swap only
                {"pids.max": processes},
                {"cpu.cfs_period_us": PERIOD, "cpu.cfs_quota_us": quota},
            ]
        made = []
        try:
            for path, values in zip(self.dirs, settings, strict=True):
                path.mkdir()
                made.append(path)
                for file, value in values.items():
                    try:
                        (path / file).write_text(str(value))
                    except FileNotFoundError:
                        if not file.startswith(("memory.memsw", "memory.swap")):  # absent without swap accounting
                            raise
        except BaseException:
            self.dirs = tuple(made)
            self.remove()
            raise

    def add(self, pid: int) -> None:
        """Move `pid` (bwrap's sandbox child, before it forks anything) into the cgroup: its descendants follow."""
        for path in self.dirs:
            (path / "cgroup.procs").write_text(str(pid))

    def remove(self, wait: float = 2.0) -> None:
        """rmdir each directory; a process that is still exiting keeps its cgroup busy for a moment."""
        deadline = time.monotonic() + wait
        for path in self.dirs:
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise
                    time.sleep(0.005)


def sweep(hierarchy: Hierarchy) -> None:
    """Remove the empty cgroups of graders that died before removing theirs (their pid is gone)."""
    for parent in hierarchy.parents:
        for path in parent.glob("rung-sandbox-*-*"):
            pid = int(path.name.split("-")[2])
            if not Path(f"/proc/{pid}").exists():
                with contextlib.suppress(OSError):  # still busy, or another grader's sweep took it
                    path.rmdir()
