"""Run model-written Python against trusted tests in a bubblewrap sandbox, and grade it so that the code can
neither escape nor fake a pass (issue #40; the guide is docs/sandbox.md).

A program is a solution (untrusted), its tests and an optional context (trusted: the dataset's), and the
name of the solution's entry point. Each execution is one `bwrap` process:

- namespaces: pid, net (loopback only, in its own namespace: the host's 127.0.0.1 listeners are
  unreachable), ipc, uts, cgroup, mount. The root is empty but for read-only /usr (and the interpreter's
  prefix when it lies elsewhere), /proc of its own pid namespace, a minimal /dev and /tmp: a tmpfs of
  `Limits.disk` bytes that is the working directory and HOME and goes with the sandbox. No checkout, data,
  caches or home. The environment is cleared (bwrap's own too) and only PATH, HOME, LANG and Python's
  hash seed are set;
- a uid that owns nothing: as root (here and in CI) the runner starts as root without a user namespace and
  drops to a random uid from UIDS, which no host process has, because root is exempt from RLIMIT_NPROC
  and a uid mapped onto root would be too; as another user, bwrap's user namespace (--disable-userns
  inside) and the kernel's per-namespace process count (Linux 5.14+) do it;
- rlimits set in the sandbox before any untrusted code: CPU time, address space, processes, open files,
  file size, no core files; the grader enforces wall time and output size by killing the namespace's init
  (its pid from bwrap's --info-fd), and with it every process in the namespace; --die-with-parent does
  the same if the grader dies.

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
import marshal
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rung.errors import InputError

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
    wall: float = 10.0  # seconds from bwrap's start to the verdict
    cpu: int = 10  # CPU seconds per process
    memory: int = 1 << 30  # address space per process, bytes
    processes: int = 16  # processes and threads of the sandbox's uid, the runner's two included
    files: int = 64  # open files per process
    file_size: int = 16 << 20  # largest file written, bytes
    disk: int = 64 << 20  # the /tmp tmpfs, bytes (counts against the host's memory)
    output: int = 1 << 20  # stdout plus stderr, bytes; more kills the sandbox


@dataclass(frozen=True)
class Program:
    solution: str  # untrusted: runs in its own process
    tests: str  # trusted; if it defines check(candidate), that is called with the entry point (HumanEval's form)
    entry_point: str  # the solution's function the tests call
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


def _binds(python: str) -> tuple[str, ...]:
    binds = ["--ro-bind", "/usr", "/usr"]
    for path in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(path):  # merged /usr: keep the symlink
            binds += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            binds += ["--ro-bind", path, path]
    binds += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    prefix = os.path.dirname(os.path.dirname(python))
    if prefix != "/usr" and not prefix.startswith("/usr/"):  # e.g. pyenv's: only that prefix, read-only
        # bwrap would create its parents 0700, which the dropped uid could not pass
        parents = [str(p) for p in reversed(Path(prefix).parents) if str(p) != "/"]
        binds += [arg for p in parents for arg in ("--perms", "0755", "--dir", p)]
        binds += ["--ro-bind", prefix, prefix]
    return tuple(binds)


def _jail(setup: _Setup, limits: Limits) -> list[str]:
    """bwrap and its options, up to the command."""
    env = [arg for name, value in ENV.items() for arg in ("--setenv", name, value)]
    if setup.root:
        user = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        user = ["--unshare-user", "--uid", "65534", "--gid", "65534", "--disable-userns"]
    return [
        setup.bwrap,
        *("--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"),
        *("--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv", *env, *user),
        *setup.binds,
        *("--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(limits.disk), "--tmpfs", "/tmp"),
        *("--chdir", "/tmp"),
    ]


def _command(setup: _Setup, limits: Limits, uid: int | None, verdict_fd: int, info_fd: int) -> list[str]:
    numbers = [limits.cpu, limits.memory, limits.processes, limits.files, limits.file_size]
    return [
        *_jail(setup, limits),
        *("--info-fd", str(info_fd), "--", setup.python, "-P", "-s", "-S", "-c", RUNNER, str(verdict_fd)),
        *("-" if uid is None else str(uid), *map(str, numbers)),
    ]


def _result(verdict: Verdict, code: int | None, start: float, out: bytes, err: bytes, detail: str) -> Result:
    text = [b.decode(errors="replace") for b in (out, err)]
    return Result(verdict, code, time.monotonic() - start, text[0], text[1], detail)


def _execute(setup: _Setup, program: Program, limits: Limits) -> Result:
    nonce = secrets.token_hex(16)
    job = marshal.dumps({**vars(program), "nonce": nonce})
    uid = UIDS[secrets.randbelow(len(UIDS))] if setup.root else None
    start = time.monotonic()
    verdict_r, verdict_w = os.pipe()
    info_r, info_w = os.pipe()  # bwrap writes the pid of the namespace's init there
    try:
        proc = subprocess.Popen(
            _command(setup, limits, uid, verdict_w, info_w),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(verdict_w, info_w),
            env={},  # bwrap's own environment too: its init's /proc/1/environ holds no secret
            start_new_session=True,  # its own process group, for the kill of last resort
        )
    except OSError as e:
        for fd in (verdict_r, info_r):
            os.close(fd)
        return _result(Verdict.ERROR, None, start, b"", b"", f"bwrap did not start: {e}")
    finally:
        for fd in (verdict_w, info_w):
            os.close(fd)
    with proc:
        killed, out, err, status = _communicate(proc, job, verdict_r, info_r, start + limits.wall, limits.output)
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


def _communicate(
    proc: subprocess.Popen, job: bytes, verdict_fd: int, info_fd: int, deadline: float, output: int
) -> tuple[Verdict | None, bytes, bytes, bytes]:
    """Feed the job, keep KEPT bytes of each stream and the verdict pipe, and kill the sandbox at the deadline or
    when the output passes `output` bytes (hand-written: subprocess.communicate has neither an output cap nor a
    kill on output)."""
    stdin = proc.stdin.fileno()
    os.set_blocking(stdin, False)
    kept = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    status, info, total, killed, sent = bytearray(), bytearray(), 0, None, 0
    ends = (*kept, verdict_fd)  # done when all three are at EOF: every process in the sandbox has ended
    with selectors.DefaultSelector() as sel:
        sel.register(stdin, selectors.EVENT_WRITE)
        for fd in (*ends, info_fd):
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
                elif key.fd in (verdict_fd, info_fd):
                    (status if key.fd == verdict_fd else info).extend(chunk[:4096])
                else:
                    kept[key.fd] += chunk[: KEPT - len(kept[key.fd])]
                    total += len(chunk)
                    killed = killed or (Verdict.OUTPUT_LIMIT if total > output else None)
        if killed:
            _kill(proc, info, alive=verdict_fd in sel.get_map())
    for fd in (verdict_fd, info_fd):
        os.close(fd)
    if killed:
        _drain(proc, deadline=time.monotonic() + 5)
    proc.wait()
    return killed, bytes(kept[proc.stdout.fileno()]), bytes(kept[proc.stderr.fileno()]), bytes(status)


def _kill(proc: subprocess.Popen, info: bytes, alive: bool) -> None:
    """SIGKILL the namespace's init: the kernel then kills every process in the namespace, and bwrap, its parent,
    reaps it and exits. While the verdict pipe is open some process in the namespace holds it, so the init is
    alive and its pid not reused. Before bwrap told the pid, kill bwrap's process group instead (which may leave
    its init a zombie for the host's init to reap)."""
    pid = re.search(rb'"child-pid": *(\d+)', info)
    with contextlib.suppress(ProcessLookupError):
        if pid and alive:
            os.kill(int(pid[1]), signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGKILL)


def _drain(proc: subprocess.Popen, deadline: float) -> None:
    """Read stdout and stderr to their end after a kill: they close when the last process in the sandbox is gone."""
    with selectors.DefaultSelector() as sel:
        for f in (proc.stdout, proc.stderr):
            sel.register(f.fileno(), selectors.EVENT_READ)
        while sel.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                if not os.read(key.fd, 1 << 16):
                    sel.unregister(key.fd)


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
    setup = _Setup(bwrap, python, _binds(python), os.geteuid() == 0)
    probe = _execute(setup, PROBE, Limits(wall=60))
    if not probe.passed:
        raise SandboxUnavailable(f"bwrap cannot run the sandbox here: {probe.detail}")
    return setup


def check(bwrap: str | None = None, python: str | None = None) -> str:
    """Probe the sandbox once per process (a trivial program through it); raise SandboxUnavailable in one line
    if it cannot isolate here. Returns what runs: bwrap, interpreter, uid mode."""
    setup = _setup(bwrap, python)
    mode = "a random uid (root mode)" if setup.root else "a user namespace"
    return f"bwrap {setup.bwrap}, {setup.python}, as {mode}"


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
    """Each program in its own sandbox, `workers` at a time (threads waiting on bwrap); results in input order."""
    setup = _setup(bwrap, python)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda p: _execute(setup, p, limits), programs))
