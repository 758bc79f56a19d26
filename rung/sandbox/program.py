"""What a sandbox runs and what comes back: a program, its limits, its result and verdict. Data only, so that the
command builder (bwrap.py), the execution (execution.py) and the package's API share them without a cycle."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rung.errors import InputError


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
    stdout: str  # the first execution.KEPT bytes
    stderr: str
    detail: str  # why, in one line: the failed assertion's line, the signal, bwrap's error

    @property
    def passed(self) -> bool:
        return self.verdict is Verdict.PASSED

    @property
    def scored(self) -> bool:
        """False for the grader's own failures, which callers count as unscored rather than wrong."""
        return self.verdict is not Verdict.ERROR
