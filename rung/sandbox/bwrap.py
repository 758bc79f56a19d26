"""The bwrap command of one sandbox: namespaces, mounts, environment, the uid, and the trusted runner with its
limits (the design: rung/sandbox/__init__.py)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from rung.sandbox.cgroups import Hierarchy
from rung.sandbox.program import Limits, Program
from rung.sandbox.scratch import Scratch

RUNNER = Path(__file__).with_name("runner.py").read_text()
UIDS = range(1 << 20, 1 << 30)  # root mode: each execution's uid, above any host account's
ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONHASHSEED": "0",  # set iteration order, hence some outputs, is the same in every execution
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
}


@dataclass(frozen=True)
class Setup:
    bwrap: str
    python: str
    binds: tuple[str, ...]  # bwrap arguments that make the interpreter and its libraries visible
    root: bool
    cgroups: Hierarchy | None  # where each sandbox gets its cgroup; None: rlimits only


# where installers put third-party packages, under /usr and the interpreter's prefix: hidden in the sandbox
PACKAGES = ("lib/python3*/site-packages", "lib/python3*/dist-packages", "lib64/python3*/site-packages")


def binds(python: str) -> tuple[str, ...]:
    binds = ["--ro-bind", "/usr", "/usr"]
    for path in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(path):  # merged /usr: keep the symlink
            binds += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            binds += ["--ro-bind", path, path]
    binds += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    prefix = os.path.dirname(os.path.dirname(python))
    roots = [Path("/usr"), Path("/usr/local")]
    if prefix != "/usr" and not prefix.startswith("/usr/"):  # e.g. pyenv's: only that prefix, read-only
        # bwrap would create its parents 0700, which the dropped uid could not pass
        parents = [str(p) for p in reversed(Path(prefix).parents) if str(p) != "/"]
        binds += [arg for p in parents for arg in ("--perms", "0755", "--dir", p)]
        binds += ["--ro-bind", prefix, prefix]
        roots.append(Path(prefix))
    # the standard library only: an empty read-only tmpfs over every site-packages, whatever sys.path says
    for packages in sorted({str(d) for root in roots for pattern in PACKAGES for d in root.glob(pattern)}):
        binds += ["--tmpfs", packages, "--remount-ro", packages]
    return tuple(binds)


def jail(setup: Setup, limits: Limits, scratch: Scratch | None = None) -> list[str]:
    """bwrap and its options, up to the command. /tmp and /dev/shm: `scratch` (root mode), else bwrap's tmpfs
    with /dev/shm an eighth of the disk (bwrap sets no inode bound)."""
    env = [arg for name, value in ENV.items() for arg in ("--setenv", name, value)]
    if setup.root:
        user = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        user = ["--unshare-user", "--uid", "65534", "--gid", "65534", "--disable-userns"]
    if scratch:
        writable = scratch.binds
    else:
        shm = limits.disk // 8
        writable = [
            *("--perms", "1777", "--size", str(limits.disk - shm), "--tmpfs", "/tmp"),
            *("--perms", "1777", "--size", str(shm), "--tmpfs", "/dev/shm"),
        ]
    return [
        setup.bwrap,
        *("--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"),
        # --as-pid-1: the runner is the namespace's init, not bwrap's reaper, which the solution's process (same
        # uid in non-root mode, and dumpable) could write through /proc/1/mem
        *("--as-pid-1", "--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv", *env, *user),
        *setup.binds,
        *("--proc", "/proc", "--dev", "/dev", *writable),
        *("--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp"),  # writable: /tmp and /dev/shm only
    ]


def command(
    setup: Setup,
    limits: Limits,
    uid: int | None,
    fds: dict[str, int],
    scratch: Scratch | None,
    preload: tuple[str, ...] = (),
) -> list[str]:
    """`fds`: the verdict pipe, bwrap's info and seccomp fds, and the block fd when there is a cgroup to join;
    `preload`: modules the runner imports before it forks the solution's process."""
    numbers = [limits.cpu, limits.memory, limits.processes, limits.files, limits.file_size]
    block = ["--block-fd", str(fds["block"])] if "block" in fds else []
    return [
        *jail(setup, limits, scratch),
        *("--seccomp", str(fds["seccomp"]), "--info-fd", str(fds["info"]), *block),
        *("--", setup.python, "-P", "-s", "-S", "-c", RUNNER, str(fds["verdict"])),
        *("-" if uid is None else str(uid), *map(str, numbers), *preload),
    ]


# standard library modules that import without side effects: the runner may import them before the fork
PRELOADABLE = frozenset(
    "bisect collections copy dataclasses datetime decimal fractions functools hashlib heapq itertools json math "
    "operator random re statistics string typing".split()
)
IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+(\w+)|import[ \t]+([\w., \t]+))", re.M)


def preloaded(program: Program) -> tuple[str, ...]:
    """The PRELOADABLE modules `program` imports (solution or context, top-level statements): the runner imports
    them before its fork, once instead of in both processes (HumanEval's typing: ~12 ms each), and for a sandbox
    started ahead (run_many) before the program is there."""
    names: set[str] = set()
    for found in IMPORT.finditer(program.solution + "\n" + program.context):
        names |= {name.strip().split(".")[0] for name in (found[1] or found[2]).split(",")} & PRELOADABLE
    return tuple(sorted(names))
