"""One sandbox's life: set up its cgroup and tmpfs, start bwrap (ahead of its program, for run_many), deliver the
program, enforce wall time and output size, read the verdict, and remove what it made."""

from __future__ import annotations

import contextlib
import logging
import marshal
import os
import re
import secrets
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rung.sandbox.bwrap import UIDS, Setup, command, preloaded
from rung.sandbox.cgroups import Cgroup
from rung.sandbox.program import Limits, Program, Result, Verdict
from rung.sandbox.scratch import Scratch
from rung.sandbox.seccomp import readable_fd

log = logging.getLogger(__name__)
KEPT = 64 << 10  # bytes of stdout and of stderr kept in a Result


def result(verdict: Verdict, code: int | None, start: float, out: bytes, err: bytes, detail: str) -> Result:
    text = [b.decode(errors="replace") for b in (out, err)]
    return Result(verdict, code, time.monotonic() - start, text[0], text[1], detail)


def execute(setup: Setup, program: Program, limits: Limits) -> Result:
    """One execution, started here: the wall time counts from bwrap's start."""
    box = launch(setup, limits, preloaded(program))
    return box if isinstance(box, Result) else deliver(box, program, limits, box.started)


@dataclass
class Box:
    """A started sandbox whose runner waits on stdin for its one program (a spare, until it gets it)."""

    proc: subprocess.Popen
    verdict_fd: int  # the read end of the runner's verdict pipe
    pid: int | None  # the namespace's init, in the host's pid namespace
    started: float
    cleanup: contextlib.ExitStack  # removes its tmpfs and cgroup (on the removal thread)
    delivered: bool = False  # its program handed over: deliver owns the ending

    def discard(self) -> None:
        """End a sandbox that got no program: kill its namespace, reap bwrap, remove its tmpfs and cgroup."""
        with self.cleanup, self.proc:
            _kill(self.proc, self.pid)
            os.close(self.verdict_fd)
            assert self.proc.stdin  # started with stdin=PIPE
            self.proc.stdin.close()
            _drain(self.proc, deadline=time.monotonic() + 5)
            self.proc.wait()


def launch(setup: Setup, limits: Limits, preload: tuple[str, ...] = ()) -> Box | Result:
    """bwrap with its cgroup and tmpfs, up to the runner's wait for the job; or the ERROR result of a failed
    start (its tmpfs and cgroup then gone)."""
    start = time.monotonic()
    # last in, first out, and one removal thread: the tmpfs goes before the cgroup it is charged to
    with contextlib.ExitStack() as cleanup:
        try:
            group = scratch = None
            if setup.cgroups:
                tree = (limits.memory + limits.disk, limits.processes + 1, limits.cpus)  # +1: bwrap
                group = Cgroup(setup.cgroups, *tree)
                cleanup.callback(REMOVALS.submit, _quietly, group.remove)
            if setup.root:
                scratch = Scratch(limits.disk, limits.inodes)
                cleanup.callback(REMOVALS.submit, _quietly, scratch.remove)
        except OSError as e:
            return result(Verdict.ERROR, None, start, b"", b"", f"the sandbox could not be set up: {e}")
        box = _spawn(setup, limits, start, group, scratch, preload)
        if isinstance(box, Box):
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
    setup: Setup,
    limits: Limits,
    start: float,
    group: Cgroup | None,
    scratch: Scratch | None,
    preload: tuple[str, ...],
) -> Box | Result:
    uid = UIDS[secrets.randbelow(len(UIDS))] if setup.root else None
    verdict_r, verdict_w = os.pipe()
    info_r, info_w = os.pipe()  # bwrap writes the pid of the namespace's init there
    block_r, block_w = os.pipe() if group else (None, None)  # bwrap's child waits on it until it is in the cgroup
    theirs = {"verdict": verdict_w, "info": info_w, "seccomp": readable_fd()}
    if block_r is not None:
        theirs["block"] = block_r
    try:
        proc = subprocess.Popen(
            command(setup, limits, uid, theirs, scratch, preload),
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
        return result(Verdict.ERROR, None, start, b"", b"", f"bwrap did not start: {e}")
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
        return result(Verdict.ERROR, proc.returncode, start, b"", b"", f"joining the cgroup failed: {e}")
    finally:
        if block_w is not None:
            os.close(block_w)  # EOF lets bwrap's child go on (in the cgroup, or to fail for want of it)
    return Box(proc, verdict_r, pid, start, contextlib.ExitStack())


def deliver(box: Box, program: Program, limits: Limits, start: float) -> Result:
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
        return result(killed, code, start, out, err, f"over {limits.output} bytes of output")
    if lines[:1] != ["ready"]:
        said = err.decode(errors="replace").strip().splitlines()
        why = said[-1] if said else ("killed at the wall time" if killed else f"exit code {code}")
        return result(Verdict.ERROR, code, start, out, err, f"the sandbox did not start: {why}")
    if killed is Verdict.TIMEOUT:
        return result(killed, code, start, out, err, f"over {limits.wall} s of wall time")
    verdict, got, detail = ((lines[1] if len(lines) > 1 else "") + "  ").split(" ", 2)
    if got != nonce or verdict not in {"passed", "failed", "timeout", "memory"}:
        return result(Verdict.FAILED, code, start, out, err, "the runner gave no verdict (killed by the solution?)")
    return result(Verdict(verdict), code, start, out, err, detail.strip())


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
