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
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import marshal
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rung.errors import InputError
from rung.sandbox import cgroups, seccomp
from rung.sandbox.scratch import Scratch

log = logging.getLogger(__name__)
RUNNER = Path(__file__).with_name("runner.py").read_text()
UIDS = range(1 << 20, 1 << 30)  # root mode: each execution's uid, above any host account's
KEPT = 64 << 10  # bytes of stdout and of stderr kept in a Result
ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONHASHSEED": "0",  # set iteration order, hence some outputs, is the same in every execution
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
}


class Verdict(enum.StrEnum):
    PASSED = "passed"
    FAILED = "failed"  # an assertion or exception, a missing entry point, a non-plain result, a killed runner
    TIMEOUT = "timeout"  # wall time (the grader's kill) or CPU time (SIGXCPU)
    MEMORY = "memory"  # MemoryError at the address-space limit
    OUTPUT_LIMIT = "output_limit"  # more than Limits.output bytes on stdout and stderr: killed
    ERROR = "error"  # the grader's own failure before the code ran (bwrap did not start): unscored, not wrong


class SandboxUnavailable(InputError):
    """The isolation cannot be had here (no bwrap, no namespaces): nothing runs unconfined instead."""


@dataclass(frozen=True)
class Limits:
    wall: float = 10.0  # seconds to the verdict, from bwrap's start (run) or the program's delivery (run_many)
    cpu: int = 10  # CPU seconds per process
    memory: int = 1 << 30  # address space per process, bytes; with a cgroup, memory + disk for the whole sandbox
    processes: int = 16  # processes and threads of the sandbox, the runner's two included
    files: int = 64  # open files per process
    file_size: int = 16 << 20  # largest file written, bytes
    disk: int = 64 << 20  # /tmp and /dev/shm together, tmpfs bytes (counts against the host's memory)
    output: int = 1 << 20  # stdout plus stderr, bytes; more kills the sandbox
    cpus: float = 1.0  # CPUs the whole sandbox may use at once (a cgroup's quota)
    inodes: int = 1 << 14  # files, directories and hard links on /tmp and /dev/shm (root mode)


@dataclass(frozen=True)
class Program:
    solution: str  # untrusted: runs in its own process
    tests: str  # trusted; if it defines check(candidate), that is called with the entry point (HumanEval's form)
    entry_point: str  # the solution's function the tests call; "": none, the solution runs as a script
    context: str = ""  # trusted code the tests see, run before them (HumanEval's prompt: helpers such as poly)


@dataclass(frozen=True)
class Result:
    verdict: Verdict
    exit_code: int | None  # bwrap's; None if it did not start
    seconds: float
    stdout: str  # the first KEPT bytes
    stderr: str
    detail: str  # why, in one line: the failed assertion's line, the signal, bwrap's error

    @property
    def passed(self) -> bool:
        return self.verdict is Verdict.PASSED

    @property
    def scored(self) -> bool:
        """False for the grader's own failures, which callers count as unscored rather than wrong."""
        return self.verdict is not Verdict.ERROR


@dataclass(frozen=True)
class _Setup:
    bwrap: str
    python: str
    binds: tuple[str, ...]  # bwrap arguments that make the interpreter and its libraries visible
    root: bool
    cgroups: cgroups.Hierarchy | None  # where each sandbox gets its cgroup; None: rlimits only


# where installers put third-party packages, under /usr and the interpreter's prefix: hidden in the sandbox
PACKAGES = ("lib/python3*/site-packages", "lib/python3*/dist-packages", "lib64/python3*/site-packages")


def _binds(python: str) -> tuple[str, ...]:
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


def _jail(setup: _Setup, limits: Limits, scratch: Scratch | None = None) -> list[str]:
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


def _command(
    setup: _Setup,
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
        *_jail(setup, limits, scratch),
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


def _preload(program: Program) -> tuple[str, ...]:
    """The PRELOADABLE modules `program` imports (solution or context, top-level statements): the runner imports
    them before its fork, once instead of in both processes (HumanEval's typing: ~12 ms each), and for a sandbox
    started ahead (run_many) before the program is there."""
    names: set[str] = set()
    for found in IMPORT.finditer(program.solution + "\n" + program.context):
        names |= {name.strip().split(".")[0] for name in (found[1] or found[2]).split(",")} & PRELOADABLE
    return tuple(sorted(names))


def _result(verdict: Verdict, code: int | None, start: float, out: bytes, err: bytes, detail: str) -> Result:
    text = [b.decode(errors="replace") for b in (out, err)]
    return Result(verdict, code, time.monotonic() - start, text[0], text[1], detail)


def _execute(setup: _Setup, program: Program, limits: Limits) -> Result:
    """One execution, started here: the wall time counts from bwrap's start."""
    box = _start(setup, limits, _preload(program))
    return box if isinstance(box, Result) else _deliver(box, program, limits, box.started)


@dataclass
class _Box:
    """A started sandbox whose runner waits on stdin for its one program (a spare, until it gets it)."""

    proc: subprocess.Popen
    verdict_fd: int  # the read end of the runner's verdict pipe
    pid: int | None  # the namespace's init, in the host's pid namespace
    started: float
    cleanup: contextlib.ExitStack  # removes its tmpfs and cgroup (on the removal thread)
    delivered: bool = False  # its program handed over: _deliver owns the ending

    def discard(self) -> None:
        """End a sandbox that got no program: kill its namespace, reap bwrap, remove its tmpfs and cgroup."""
        with self.cleanup, self.proc:
            _kill(self.proc, self.pid)
            os.close(self.verdict_fd)
            assert self.proc.stdin  # started with stdin=PIPE
            self.proc.stdin.close()
            _drain(self.proc, deadline=time.monotonic() + 5)
            self.proc.wait()


def _start(setup: _Setup, limits: Limits, preload: tuple[str, ...] = ()) -> _Box | Result:
    """bwrap with its cgroup and tmpfs, up to the runner's wait for the job; or the ERROR result of a failed
    start (its tmpfs and cgroup then gone)."""
    start = time.monotonic()
    # last in, first out, and one removal thread: the tmpfs goes before the cgroup it is charged to
    with contextlib.ExitStack() as cleanup:
        try:
            group = scratch = None
            if setup.cgroups:
                tree = (limits.memory + limits.disk, limits.processes + 1, limits.cpus)  # +1: bwrap
                group = cgroups.Cgroup(setup.cgroups, *tree)
                cleanup.callback(REMOVALS.submit, _quietly, group.remove)
            if setup.root:
                scratch = Scratch(limits.disk, limits.inodes)
                cleanup.callback(REMOVALS.submit, _quietly, scratch.remove)
        except OSError as e:
            return _result(Verdict.ERROR, None, start, b"", b"", f"the sandbox could not be set up: {e}")
        box = _spawn(setup, limits, start, group, scratch, preload)
        if isinstance(box, _Box):
            box.cleanup = cleanup.pop_all()
        return box


# removes each execution's tmpfs and cgroup after its result is out: an unmount waits ~2.5 ms for the kernel (an RCU
# grace period), 6% of a one-line program's execution; its threads finish their queue before the interpreter exits
REMOVALS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rung-sandbox-removal")


def _quietly(remove: Callable[[], None]) -> None:
    """A cgroup or tmpfs that will not go away is the host's leak, not the program's verdict: say so, go on (the
    next grader's sweep takes it)."""
    try:
        remove()
    except OSError as e:
        log.warning(f"sandbox cleanup: {e}")


def _spawn(
    setup: _Setup,
    limits: Limits,
    start: float,
    group: cgroups.Cgroup | None,
    scratch: Scratch | None,
    preload: tuple[str, ...],
) -> _Box | Result:
    uid = UIDS[secrets.randbelow(len(UIDS))] if setup.root else None
    verdict_r, verdict_w = os.pipe()
    info_r, info_w = os.pipe()  # bwrap writes the pid of the namespace's init there
    block_r, block_w = os.pipe() if group else (None, None)  # bwrap's child waits on it until it is in the cgroup
    theirs = {"verdict": verdict_w, "info": info_w, "seccomp": seccomp.readable_fd()}
    if block_r is not None:
        theirs["block"] = block_r
    try:
        proc = subprocess.Popen(
            _command(setup, limits, uid, theirs, scratch, preload),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=tuple(theirs.values()),
            env={},  # bwrap's own environment too: the runner's /proc/1/environ holds no secret
            start_new_session=True,  # its own process group, for the kill of last resort
        )
    except OSError as e:
        for fd in (verdict_r, info_r, block_w):
            if fd is not None:
                os.close(fd)
        return _result(Verdict.ERROR, None, start, b"", b"", f"bwrap did not start: {e}")
    finally:
        for fd in theirs.values():
            os.close(fd)
    try:
        # bwrap first, while it starts: the first move into a cgroup waits for an RCU grace period (ms), and
        # moves within the next one are quick; a child it makes after that is born in the cgroup
        if group:
            group.add(proc.pid)
        pid = _init_pid(info_r, start + limits.wall)
        if group and pid:
            group.add(pid)  # in case bwrap made it before it was moved
    except OSError as e:  # not in its cgroup: it must not run
        with proc:
            _kill(proc, None)
            proc.communicate()
        os.close(verdict_r)
        return _result(Verdict.ERROR, proc.returncode, start, b"", b"", f"joining the cgroup failed: {e}")
    finally:
        if block_w is not None:
            os.close(block_w)  # EOF lets bwrap's child go on (in the cgroup, or to fail for want of it)
    return _Box(proc, verdict_r, pid, start, contextlib.ExitStack())


def _deliver(box: _Box, program: Program, limits: Limits, start: float) -> Result:
    """Hand `program` to the started sandbox `box` and grade it; the wall time counts from `start`."""
    box.delivered = True
    nonce = secrets.token_hex(16)
    job = marshal.dumps({**vars(program), "nonce": nonce})
    proc = box.proc
    with box.cleanup, proc:
        killed, out, err, status = _communicate(proc, job, box.verdict_fd, box.pid, start + limits.wall, limits.output)
    lines = status.decode(errors="replace").splitlines()
    code = proc.returncode
    if killed is Verdict.OUTPUT_LIMIT:
        return _result(killed, code, start, out, err, f"over {limits.output} bytes of output")
    if lines[:1] != ["ready"]:
        said = err.decode(errors="replace").strip().splitlines()
        why = said[-1] if said else ("killed at the wall time" if killed else f"exit code {code}")
        return _result(Verdict.ERROR, code, start, out, err, f"the sandbox did not start: {why}")
    if killed is Verdict.TIMEOUT:
        return _result(killed, code, start, out, err, f"over {limits.wall} s of wall time")
    verdict, got, detail = ((lines[1] if len(lines) > 1 else "") + "  ").split(" ", 2)
    if got != nonce or verdict not in {"passed", "failed", "timeout", "memory"}:
        return _result(Verdict.FAILED, code, start, out, err, "the runner gave no verdict (killed by the solution?)")
    return _result(Verdict(verdict), code, start, out, err, detail.strip())


def _init_pid(info_fd: int, deadline: float) -> int | None:
    """The pid (in the host's namespace) of bwrap's child, the namespace's init (the runner): bwrap writes it to the
    info fd right after the clone, then closes it. None if bwrap ended first or the deadline passed."""
    info = bytearray()
    with selectors.DefaultSelector() as sel:
        sel.register(info_fd, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0 and sel.select(left):
            chunk = os.read(info_fd, 4096)
            if not chunk:
                break
            info += chunk[: 4096 - len(info)]
    os.close(info_fd)
    pid = re.search(rb'"child-pid": *(\d+)', info)
    return int(pid[1]) if pid else None


def _communicate(
    proc: subprocess.Popen, job: bytes, verdict_fd: int, pid: int | None, deadline: float, output: int
) -> tuple[Verdict | None, bytes, bytes, bytes]:
    """Feed the job, keep KEPT bytes of each stream and the verdict pipe, and kill the sandbox at the deadline or
    when the output passes `output` bytes (hand-written: subprocess.communicate has neither an output cap nor a
    kill on output)."""
    assert proc.stdin and proc.stdout and proc.stderr  # started with all three PIPEs
    stdin = proc.stdin.fileno()
    os.set_blocking(stdin, False)
    kept = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    status, total, killed, sent = bytearray(), 0, None, 0
    ends = (*kept, verdict_fd)  # done when all three are at EOF: every process in the sandbox has ended
    with selectors.DefaultSelector() as sel:
        sel.register(stdin, selectors.EVENT_WRITE)
        for fd in ends:
            sel.register(fd, selectors.EVENT_READ)
        while any(fd in sel.get_map() for fd in ends) and not killed:
            left = deadline - time.monotonic()
            events = sel.select(left) if left > 0 else []
            if not events:
                killed = Verdict.TIMEOUT
            for key, _ in events:
                if key.fd == stdin:
                    try:
                        sent += os.write(stdin, job[sent : sent + (1 << 16)])
                    except BrokenPipeError:
                        sent = len(job)
                    if sent == len(job):
                        sel.unregister(stdin)
                        proc.stdin.close()
                    continue
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fd)
                elif key.fd == verdict_fd:
                    status.extend(chunk[:4096])
                else:
                    kept[key.fd] += chunk[: KEPT - len(kept[key.fd])]
                    total += len(chunk)
                    killed = killed or (Verdict.OUTPUT_LIMIT if total > output else None)
        if killed:
            # while the verdict pipe is open the runner holds it: the namespace's init is alive, its pid ours
            _kill(proc, pid if verdict_fd in sel.get_map() else None)
    os.close(verdict_fd)
    if killed:
        _drain(proc, deadline=time.monotonic() + 5)
    proc.wait()
    return killed, bytes(kept[proc.stdout.fileno()]), bytes(kept[proc.stderr.fileno()]), bytes(status)


def _kill(proc: subprocess.Popen, init: int | None) -> None:
    """SIGKILL the namespace's init (the runner): the kernel then kills every process in the namespace, and bwrap,
    its parent, reaps it and exits. Without its pid (bwrap had not told it), kill bwrap's process group instead:
    its child, in a session of its own, dies with it (--die-with-parent) and may stay a zombie for the host's init
    to reap."""
    with contextlib.suppress(ProcessLookupError):
        if init:
            os.kill(init, signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGKILL)


def _drain(proc: subprocess.Popen, deadline: float) -> None:
    """Read stdout and stderr to their end after a kill: they close when the last process in the sandbox is gone."""
    assert proc.stdout and proc.stderr  # started with both PIPEs
    with selectors.DefaultSelector() as sel:
        for f in (proc.stdout, proc.stderr):
            sel.register(f.fileno(), selectors.EVENT_READ)
        while sel.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                if not os.read(key.fd, 1 << 16):
                    sel.unregister(key.fd)


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
def _setup(bwrap: str | None, python: str | None) -> _Setup:
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
    setup = _Setup(bwrap, python, _binds(python), os.geteuid() == 0, hierarchy)
    probe = _execute(setup, PROBE, Limits(wall=60))
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
    return _execute(_setup(bwrap, python), program, limits)


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

    def __init__(self, setup: _Setup, limits: Limits, programs: Sequence[Program], ahead: int):
        self.setup, self.limits, self.programs, self.ahead = setup, limits, programs, max(1, ahead)
        self.starter = ThreadPoolExecutor(max_workers=self.ahead, thread_name_prefix="rung-sandbox-start")
        self.started: dict[int, Future] = {}  # program index: its sandbox's start (a _Box or an ERROR Result)
        self.next = 0  # the next program whose sandbox is to start
        self.lock = threading.Lock()

    def __enter__(self) -> _Spares:
        return self

    def execute(self, index: int) -> Result:
        with self.lock:
            while self.next < min(index + 1 + self.ahead, len(self.programs)):
                program = self.programs[self.next]
                self.started[self.next] = self.starter.submit(_start, self.setup, self.limits, _preload(program))
                self.next += 1
            mine = self.started.pop(index)
        box = mine.result()
        if isinstance(box, Result):
            return box
        try:
            return _deliver(box, self.programs[index], self.limits, time.monotonic())
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
                    if isinstance(box, _Box):
                        box.discard()
        finally:
            self.starter.shutdown(wait=True, cancel_futures=True)
