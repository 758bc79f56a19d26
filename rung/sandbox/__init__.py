"""Run model-written Python against trusted tests in a bubblewrap sandbox, and grade it so that the code can
neither escape nor fake a pass (the guide is docs/sandbox.md).

A program is a solution (untrusted), its tests and an optional context (trusted: the dataset's), and the
name of the solution's entry point. Each execution is one `bwrap` process:

- namespaces: pid, net (loopback only, in its own namespace: the host's 127.0.0.1 listeners are
  unreachable), ipc, uts, cgroup, mount. The root is empty but for read-only /usr (and the interpreter's
  prefix when it lies elsewhere, every site-packages in them hidden: the standard library only), /proc of its
  own pid namespace, a read-only /dev, and /tmp and /dev/shm, the only writable places: one tmpfs of
  `Limits.disk` bytes and `Limits.inodes` inodes (root mode; bwrap's tmpfs otherwise), gone with the sandbox.
  No checkout, data, caches or home. The environment is cleared (bwrap's own too) and only PATH, HOME, LANG
  and Python's hash seed are set;
- a seccomp filter (seccomp.py: kernel keys, tracing, SysV IPC and memfds, bpf, perf, userfaultfd, io_uring,
  mounts, new namespaces, modules, kexec, reboot, swap fail with EPERM), the runner's process included;
- a uid that owns nothing: as root (here and in CI) the runner starts as root without a user namespace and
  drops to a random uid from UIDS, which no host process has, because root is exempt from RLIMIT_NPROC
  and a uid mapped onto root would be too; as another user, bwrap's user namespace (--disable-userns
  inside) and the kernel's per-namespace process count (Linux 5.14+) do it;
- rlimits set in the sandbox before any untrusted code: CPU time, address space, processes, open files,
  file size, no core files; and a cgroup per sandbox (cgroups.py) that bounds memory, processes and CPU of
  its whole process tree, where one can be made (v2, or v1 as root; else a one-line warning). The grader
  enforces wall time and output size by killing the namespace's init, the runner (bwrap --as-pid-1: no reaper
  of bwrap's; its pid from bwrap's --info-fd), and with it every process in the namespace; --die-with-parent
  does the same if the grader dies.

Passing cannot be faked from inside. In the sandbox a trusted runner (runner.py) forks the solution's
process before it reads the job (so that process never holds the tests or the nonce), makes itself
non-dumpable (the solution's process, same uid, cannot ptrace it, read its memory or take its fds) and runs
the context and tests itself, on builtins and modules no untrusted code touched. The entry point the tests
call is a proxy: each call is a message to the solution's process, and the reply must be data of exact
builtin types (marshal), so an object whose __eq__ always says True, patched builtins, unittest or
AssertionError, and sys.exit(0) or os._exit(0) in the solution do not reach the tests. Only when the tests
ran to the end does the runner write "passed <nonce>" to a pipe of the grader's that the solution's process
never holds; the nonce (random per execution) reaches the runner on stdin after the fork. Output on
stdout/stderr, the exit code and atexit hooks decide nothing. What is not isolated: docs/sandbox.md.

Here: the probe (check) and the API (run, run_many, with its sandboxes started ahead); program.py: the data
(Program, Limits, Result, Verdict); bwrap.py: the command; execution.py: one sandbox's start, delivery and end.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from rung.sandbox import cgroups, execution, seccomp
from rung.sandbox.bwrap import Setup, binds, preloaded
from rung.sandbox.program import Limits, Program, Result, SandboxUnavailable, Verdict
from rung.sandbox.scratch import Scratch

__all__ = ["Limits", "Program", "Result", "SandboxUnavailable", "Verdict", "check", "run", "run_many"]
log = logging.getLogger(__name__)


NO_CGROUPS = (
    "no writable cgroup with memory, pids and cpu controllers (v2, or v1 as root): memory, processes and CPU "
    "time are bounded per process only (rlimits), not for a solution's whole process tree (docs/sandbox.md)"
)
PROBE = Program(
    solution="import os\ndef probe():\n    return os.getuid()\n",
    tests="assert probe() != 0, 'the sandbox runs as root'\n",
    entry_point="probe",
)


@functools.cache
def _setup(bwrap: str | None, python: str | None) -> Setup:
    bwrap = bwrap or shutil.which("bwrap") or "/usr/bin/bwrap"
    if not os.access(bwrap, os.X_OK):
        raise SandboxUnavailable(f"code rewards need bubblewrap (`apt-get install bubblewrap`): {bwrap} not found")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    python = os.path.realpath(python or Path(sys.base_prefix) / "bin" / version)  # the base interpreter: no venv
    if not os.access(python, os.X_OK):
        raise SandboxUnavailable(f"the sandbox's interpreter {python} not found")
    try:
        seccomp.program()
    except (ImportError, RuntimeError, OSError) as e:  # pyseccomp absent, or libseccomp.so.2 (RuntimeError)
        raise SandboxUnavailable(f"the sandbox's seccomp filter needs libseccomp and pyseccomp: {e}") from e
    hierarchy = cgroups.find()
    if hierarchy:
        cgroups.sweep(hierarchy)
    else:
        log.warning(f"sandbox: {NO_CGROUPS}")
    if os.geteuid() == 0:
        Scratch.sweep()
    setup = Setup(bwrap, python, binds(python), os.geteuid() == 0, hierarchy)
    probe = execution.execute(setup, PROBE, Limits(wall=60))
    if not probe.passed:
        raise SandboxUnavailable(f"bwrap cannot run the sandbox here: {probe.detail}")
    return setup


def check(bwrap: str | None = None, python: str | None = None) -> str:
    """Probe the sandbox once per process (a trivial program through it); raise SandboxUnavailable in one line
    if it cannot isolate here. Returns what runs: bwrap, interpreter, uid mode."""
    setup = _setup(bwrap, python)
    mode = "a random uid (root mode)" if setup.root else "a user namespace"
    where = f"cgroup v{setup.cgroups.version}" if setup.cgroups else "no cgroup"
    return f"bwrap {setup.bwrap}, {setup.python}, as {mode}, seccomp filter, {where}"


def run(program: Program, limits: Limits = Limits(), *, bwrap: str | None = None, python: str | None = None) -> Result:
    """One execution of `program` in the sandbox (check() first, cached)."""
    return execution.execute(_setup(bwrap, python), program, limits)


def run_many(
    programs: Sequence[Program],
    workers: int = 2,
    limits: Limits = Limits(),
    *,
    bwrap: str | None = None,
    python: str | None = None,
) -> list[Result]:
    """Each program in its own sandbox, `workers` at a time (threads waiting on bwrap); results in input order.
    The sandboxes of the next `workers` + 1 programs start while these run (_Spares), so that bwrap's namespaces
    and mounts and the interpreter's start are off the critical path (one ahead with one worker: 1.19x the peer's
    time; two: 1.02x, docs/sandbox.md); each is fresh and gets one program only."""
    setup = _setup(bwrap, python)
    with _Spares(setup, limits, programs, ahead=workers + 1) as spares, ThreadPoolExecutor(workers) as pool:
        return list(pool.map(spares.execute, range(len(programs))))


class _Spares:
    """Sandboxes started ahead of their programs: the sandbox of program i starts when program i - `ahead` is
    delivered (the first `ahead` at once), for that program only (with its preloaded modules). Its wall time counts
    from the delivery; its CPU time from its runner's start, as without a spare (the solution's process waits,
    using none, until the program comes). On exit, normal or not, every sandbox that got no program is killed
    and its tmpfs and cgroup removed.

    bwrap's --die-with-parent follows the thread that started it: the starting threads live until the exit."""

    def __init__(self, setup: Setup, limits: Limits, programs: Sequence[Program], ahead: int):
        self.setup, self.limits, self.programs, self.ahead = setup, limits, programs, max(1, ahead)
        self.starter = ThreadPoolExecutor(max_workers=self.ahead, thread_name_prefix="rung-sandbox-start")
        self.started: dict[int, Future] = {}  # program index: its sandbox's start (an execution.Box or an ERROR Result)
        self.next = 0  # the next program whose sandbox is to start
        self.lock = threading.Lock()

    def __enter__(self) -> _Spares:
        return self

    def execute(self, index: int) -> Result:
        with self.lock:
            while self.next < min(index + 1 + self.ahead, len(self.programs)):
                program = self.programs[self.next]
                self.started[self.next] = self.starter.submit(
                    execution.launch, self.setup, self.limits, preloaded(program)
                )
                self.next += 1
            mine = self.started.pop(index)
        box = mine.result()
        if isinstance(box, Result):
            return box
        try:
            return execution.deliver(box, self.programs[index], self.limits, time.monotonic())
        except BaseException:
            if not box.delivered:
                box.discard()
            raise

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            left, self.started, self.next = list(self.started.values()), {}, len(self.programs)
        try:
            for future in left:
                if not future.cancel():
                    box = future.result()
                    if isinstance(box, execution.Box):
                        box.discard()
        finally:
            self.starter.shutdown(wait=True, cancel_futures=True)
