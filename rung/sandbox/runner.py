"""The sandbox's trusted half: `python -P -s -S -c <this file> ...` run by bubblewrap (see rung/sandbox/__init__.py
for the design). Standard library only, and only modules that start fast: it runs once per execution.

argv: the verdict fd, the uid to drop to ('-' keeps the uid: user-namespace mode), then the limits: cpu seconds,
address space bytes, processes, open files, file size bytes, then the standard library modules to import before
the fork (the batch's common imports, such as HumanEval's typing: imported once, not in both processes).
stdin: the job, marshalled by the grader (solution, context, tests, entry point, nonce). The runner forks the
solution's process before it reads the job, runs the trusted context and tests itself with the entry point as a
proxy into that process, and writes one verdict line with the nonce to the verdict fd, which the solution's
process never holds. It is the pid namespace's init (bwrap --as-pid-1): the kernel drops the signals it has no
handler for when they come from inside, SIGKILL and SIGSTOP always. It reaps the solution's process only: an
orphan of that process stays a zombie, one of `processes`, until the sandbox ends.
"""

import _signal  # signal's C half: the signal module imports enum, 6 ms of a ~40 ms start
import builtins
import marshal
import os
import resource
import struct
import sys

TYPE_CHECKING = False  # typing's import is ~2 ms of the start; mypy reads the block as true
if TYPE_CHECKING:
    from typing import Any

PR_SET_DUMPABLE = 4
PLAIN = frozenset({type(None), bool, int, float, complex, str, bytes, type(...)})
CONTAINERS = frozenset({list, tuple, set, frozenset, dict})
MAX_MESSAGE = 16 << 20  # one reply from the solution's process; more fails the call


class SolutionDied(Exception):
    def __init__(self, status: int):
        self.signal = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        code = os.waitstatus_to_exitcode(status)
        how = f"signal {self.signal}: {_signal.strsignal(self.signal)}" if self.signal else f"exit code {code}"
        super().__init__(f"the solution's process ended ({how})")


class SolutionError(Exception):
    """An exception of the solution's that is not a builtin Exception (its type name and message are the solution's)."""


class MemoryLimit(MemoryError):
    """The solution's process hit the address-space limit: a MemoryError to the tests, `memory` to the grader."""


LIMIT = "memory limit"  # the name solution_process() gives a MemoryLimit: no class of the solution's can have it


def at_limit(error: MemoryError) -> bool:
    """Whether the interpreter raised `error` because an allocation was refused, rather than a raise statement
    (the instruction that raised it, in the innermost frame of its traceback)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    try:
        from opcode import opmap  # here, not at the start: 0.4 ms of every execution for a rare case

        return tb.tb_frame.f_code.co_code[tb.tb_lasti] not in (opmap["RAISE_VARARGS"], opmap["RERAISE"])
    except MemoryError:
        return True  # not even this fits


def send(fd: int, data: bytes) -> None:
    data = struct.pack("<I", len(data)) + data
    while data:
        data = data[os.write(fd, data) :]


def read_exact(fd: int, n: int) -> bytes | None:
    parts = []
    while n:
        part = os.read(fd, min(n, 1 << 20))
        if not part:
            return None
        parts.append(part)
        n -= len(part)
    return b"".join(parts)


def recv(fd: int) -> object | None:
    head = read_exact(fd, 4)
    if head is None:
        return None
    (n,) = struct.unpack("<I", head)
    if n > MAX_MESSAGE:
        raise SolutionError(f"the solution's reply is {n} bytes, over {MAX_MESSAGE}")
    data = read_exact(fd, n)
    return None if data is None else marshal.loads(data)


def plain(value: object, depth: int = 0) -> bool:
    """Whether `value` is data of exact builtin types: nothing whose __eq__ or __hash__ the solution wrote."""
    kind = type(value)
    if kind in PLAIN:
        return True
    if kind not in CONTAINERS or depth > 100:
        return False
    # exact container types past the line above, so isinstance admits no subclass here
    if isinstance(value, dict):
        return all(plain(x, depth + 1) for kv in value.items() for x in kv)
    return isinstance(value, list | tuple | set | frozenset) and all(plain(x, depth + 1) for x in value)


def solution_process(rfd: int, wfd: int) -> None:
    """The solution's process: run the solution, then answer calls of its entry point until the runner ends it."""
    namespace: dict[str, Any] = {"__name__": "solution"}
    entry: Any = None  # whatever the solution bound to the name: calling a non-callable raises back its TypeError
    while (message := recv(rfd)) is not None:
        assert type(message) is tuple  # the runner's own: ("exec", source, name) or ("call", args, kwargs)
        reply: tuple[Any, ...]  # the entry's return value is anything: marshal.dumps decides below
        try:
            if message[0] == "exec":
                exec(compile(message[1], "<solution>", "exec"), namespace)
                entry = namespace.get(message[2])
                reply = ("ok", callable(entry))
            else:
                reply = ("ok", entry(*message[1], **message[2]))
        except BaseException as e:  # SystemExit and KeyboardInterrupt too: the runner decides what they mean
            try:
                name = LIMIT if isinstance(e, MemoryError) and at_limit(e) else type(e).__name__
                reply = ("raise", name, str(e)[:500])
            except BaseException:
                reply = ("raise", "Exception", "an exception whose str() failed")
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        try:
            data = marshal.dumps(reply)
        except ValueError:  # marshal takes builtin types only (not even subclasses)
            kind = type(reply[1]).__name__
            data = marshal.dumps(("raise", "TypeError", f"the solution returned a {kind}, not plain data"))
        send(wfd, data)


class Solution:
    """The runner's side of the solution's process: a call of the entry point is a message there and back."""

    def __init__(self, pid: int, wfd: int, rfd: int):
        self.pid, self.wfd, self.rfd = pid, wfd, rfd
        self.reaped = False

    def ask(self, message: tuple) -> object:
        try:
            send(self.wfd, marshal.dumps(message))
            reply = recv(self.rfd)
        except BrokenPipeError:
            reply = None
        if reply is None:
            status = os.waitpid(self.pid, 0)[1]
            self.reaped = True
            raise SolutionDied(status)
        # the reply is the solution's: marshal can also carry code objects, so check every type in it
        if type(reply) is tuple and len(reply) == 2 and reply[0] == "ok" and plain(reply[1]):
            return reply[1]
        if not (type(reply) is tuple and len(reply) == 3 and reply[0] == "raise" and plain(reply)):
            raise SolutionError("the solution's process sent a malformed reply")
        name, text = reply[1], str(reply[2])
        if name == LIMIT:
            raise MemoryLimit(text)
        kind = getattr(builtins, str(name), None)
        # as PEP 479 does for generators: map(), zip(), all(), any() and for loops in the tests would take a
        # StopIteration from the candidate for the end of their iteration, and a wrong solution would pass
        if kind in (StopIteration, StopAsyncIteration):
            raise RuntimeError(f"the solution raised {name}: {text}")
        # builtin Exception types only: a test may expect ValueError; SystemExit must not end the runner
        if isinstance(kind, type) and issubclass(kind, Exception):
            raise kind(text)
        raise SolutionError(f"{name}: {text}")

    def candidate(self, *args: object, **kwargs: object) -> object:
        if not plain((args, kwargs)):
            raise TypeError("the tests passed arguments that are not plain data")
        return self.ask(("call", args, kwargs))

    def end(self) -> None:
        if not self.reaped:  # else its pid is no longer its own
            os.kill(self.pid, _signal.SIGKILL)


def grade(job: dict, solution: Solution) -> tuple[str, str]:
    """(verdict, detail): the solution runs in its process, the context and tests here, on pristine builtins."""
    try:
        entry = job["entry_point"]  # "": a script, which passes if it runs to its end (then the tests, if any)
        if not solution.ask(("exec", job["solution"], entry)) and entry:
            return "failed", f"the solution defines no function {entry}"
        namespace: dict[str, Any] = {"__name__": "tests"}
        exec(compile(job["context"], "<context>", "exec"), namespace)
        if entry:
            namespace[entry] = solution.candidate
        exec(compile(job["tests"], "<tests>", "exec"), namespace)
        if entry and callable(namespace.get("check")):  # HumanEval's convention: the tests define check(candidate)
            namespace["check"](solution.candidate)
    except SolutionDied as e:
        return ("timeout" if e.signal == _signal.SIGXCPU else "failed"), str(e)
    except BaseException as e:
        # the solution's process at its limit, or the tests' own allocation at the runner's; not a raise statement
        if isinstance(e, MemoryLimit) or (isinstance(e, MemoryError) and at_limit(e)):
            return "memory", "MemoryError at the address-space limit"
        return "failed", f"{type(e).__name__}: {e}{where(e)}"
    return "passed", ""


def where(error: BaseException) -> str:
    tb, line = error.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<tests>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" (tests line {line})" if line else ""


def main() -> None:
    verdict_fd, uid = int(sys.argv[1]), sys.argv[2]
    cpu, memory, processes, files, file_size = map(int, sys.argv[3:8])
    if uid != "-":  # root mode: a uid of no one on the host, so that RLIMIT_NPROC binds (root is exempt)
        os.setgroups([])
        os.setgid(int(uid))
        os.setuid(int(uid))
    # Not dumpable: the solution's process (same uid) cannot ptrace this one or read its memory and fds. The
    # kernel makes a process that changed its uid so unless fs.suid_dumpable is 1; else prctl, by ctypes (8 ms).
    with open("/proc/sys/fs/suid_dumpable") as f:
        changed = uid != "-" and f.read().strip() in ("0", "2")
    if not changed:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0):
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")
    for limit, value in [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (memory, memory)),
        (resource.RLIMIT_NPROC, (processes, processes)),
        (resource.RLIMIT_NOFILE, (files, files)),
        (resource.RLIMIT_FSIZE, (file_size, file_size)),
        (resource.RLIMIT_CORE, (0, 0)),
    ]:
        resource.setrlimit(limit, value)
    for name in sys.argv[8:]:  # trusted code, before any model code; the solution's process inherits them
        __import__(name)
    os.write(verdict_fd, b"ready\n")
    from_runner, to_solution = os.pipe()
    from_solution, to_runner = os.pipe()
    # fork before reading the job: the solution's process never holds the tests or the nonce
    pid = os.fork()
    if pid == 0:
        os.close(verdict_fd)
        os.close(to_solution)
        os.close(from_solution)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        solution_process(from_runner, to_runner)
        os._exit(0)
    os.close(from_runner)
    os.close(to_runner)
    job = marshal.loads(sys.stdin.buffer.read())
    os.close(0)
    solution = Solution(pid, to_solution, from_solution)
    verdict, detail = grade(job, solution)
    sys.stdout.flush()
    detail = " ".join(detail.split())[:300]
    os.write(verdict_fd, f"{verdict} {job['nonce']} {detail}\n".encode(errors="replace"))
    solution.end()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown (~6 ms under load): nothing is left to flush, the sandbox is done


if __name__ == "__main__":
    main()
