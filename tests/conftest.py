from __future__ import annotations

import fcntl
import importlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

# The suite runs on two xdist workers (pyproject.toml's addopts; docs/architecture.md, Tests). Each gets a Prefect
# home of its own inside the one it was given (CI's fresh one, or ~/.prefect), so that the ephemeral servers of two
# workers never create or migrate one database at once. Servers started by tests take free ports and temp dirs.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if WORKER:
    _home = Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser() / "xdist" / WORKER
    _home.mkdir(parents=True, exist_ok=True)  # Prefect creates its home's last level only
    os.environ["PREFECT_HOME"] = str(_home)

from tests.tiny_model import build  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# Longest first: the order in which xdist hands out units of work (a group, or a test of no group), so that no
# long unit starts while the other worker is nearly done (--no-loadscope-reorder: a unit sits where its first test
# is). Seconds per unit from --durations (set-up included) of a one-process run on 2 cores under a load of 4-13
# (2026-11-26); units not named here follow in file order. A rough order is enough: add a unit when --durations
# shows a new long one.
LONGEST_FIRST = {
    "pipeline": 600,  # tests/test_pipeline.py: one workspace through `dvc repro`, the flow, kills, LoRA
    "kill": 580,  # tests/test_kill.py: a workspace, a forkserver and an MLflow server; stages killed and rerun
    "tests/test_generation.py::test_greedy_on_the_default_heldout_is_model_generate": 576,
    "orchestration": 400,  # tests/test_orchestration.py: the team's servers, deployed runs, the secret scans
    "tests/test_study.py::test_rung_study_runs_two_arms_by_two_seeds": 217,
    "vllm": 160,  # tests/test_vllm.py: one vLLM CPU engine at a time
    "tests/test_recipes.py::test_rung_run_end_to_end": 104,
    "tests/test_device.py::test_gpu_bench_smoke_runs_on_the_cpu_with_only_its_dependencies": 81,
    "tests/test_first_use.py::test_with_server_runs_a_command_against_one_new_server": 70,
    "tests/test_device.py::test_gpu_learning_bench_smoke_runs_on_the_cpu_with_only_its_dependencies": 61,
}


def _unit(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    return (mark.args[0] if mark.args else mark.kwargs.get("name", "default")) if mark else item.nodeid


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker (whose collection order is the order work is handed out in), the units of LONGEST_FIRST
    first, longest first; the others keep their file order, as do the tests of a group (a stable sort). Without
    xdist (-n 0), the file order."""
    if hasattr(config, "workerinput"):
        ranks = {unit: rank for rank, unit in enumerate(sorted(LONGEST_FIRST, key=lambda u: -LONGEST_FIRST[u]))}
        items.sort(key=lambda item: ranks.get(_unit(item), len(ranks)))


class _GroupIds:
    """xdist 3.8's loadgroup tells the scheduler a test's group by renaming it `<nodeid>@<group>` through
    `item._nodeid`, which pytest 9.2's items no longer read (their id is `item._id`): the groups are then
    silently ignored (pytest-xdist#1386). Until an xdist that sets the structured id (pytest-xdist#1388), this
    sets it, after xdist's own hook, on a grouped test whose id lacks its group."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        try:
            from _pytest.nodeid import NodeId  # pytest >= 9.2
        except ImportError:
            return
        for item in items:
            marks = sorted(
                {
                    str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")
                }
            )
            if (
                marks
                and not item.nodeid.endswith("@" + "_".join(marks))
                and isinstance(getattr(item, "_id", None), NodeId)
            ):
                item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(marks)}")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") and config.getoption("loadgroup", False):
        config.pluginmanager.register(_GroupIds(), "rung-xdist-group-ids")


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Path]) -> Path:
    """`make(directory)`, which returns what it built, run once for the whole run: under xdist the first worker
    to ask builds it in the run's shared temp dir while the other waits (an flock), then both read it."""
    if not WORKER:
        return make(tmp_path_factory.mktemp(name))
    root = tmp_path_factory.getbasetemp().parent  # pytest-of-<user>/pytest-<n>, the workers' common parent
    done = root / f"{name}.built"
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            done.write_text(str(make(root / name)))
    return Path(done.read_text())


# tests/test_sandbox.py counts the sandbox's processes machine-wide (by uid, in /proc), so no test of the other
# worker may run sandboxed code (code rewards, tools) meanwhile: that module (one xdist group) holds an exclusive
# lock for as long as it runs, every other test a shared one for its own run.
ALONE = {"tests/test_sandbox.py"}


def _alone_lock(request: pytest.FixtureRequest, mode: int):
    root = request.getfixturevalue("tmp_path_factory").getbasetemp().parent  # the workers' common parent
    lock = (root / "alone.lock").open("w")
    fcntl.flock(lock, mode)
    return lock


@pytest.fixture(scope="module", autouse=True)
def _alone_module(request: pytest.FixtureRequest):
    if not WORKER or request.node.nodeid.split("::")[0] not in ALONE:
        yield
        return
    with _alone_lock(request, fcntl.LOCK_EX):
        yield


@pytest.fixture(autouse=True)
def _alone_test(request: pytest.FixtureRequest):
    if not WORKER or request.node.nodeid.split("::")[0] in ALONE:
        yield
        return
    with _alone_lock(request, fcntl.LOCK_SH):
        yield


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1.6M-parameter random Llama with the SmolLM2 tokenizer, built once per run."""
    return built_once(tmp_path_factory, "tiny", lambda d: build(d / "model"))


@pytest.fixture(scope="session")
def smollm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pipeline's base model (the embedded SmolLM2-135M-Instruct, float32), as the model stage
    writes it: converted once per run (~20 s on 2 cores)."""
    from rung import models

    def convert(d: Path) -> Path:
        models.materialize(models.EMBEDDED, d / "base")
        return d / "base"

    return built_once(tmp_path_factory, "smollm", convert)


@pytest.fixture
def default_params() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "params.yaml").read_text())


def forget(package: str) -> None:
    """Drop `package` and its submodules from sys.modules (and the finders' caches): tests that write a package of
    the same name (mypkg) in their own temp dirs must import their own, whichever ran first in this process."""
    for name in [m for m in sys.modules if m == package or m.startswith(f"{package}.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start a server process with its output in `log`."""
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def wait_healthy(proc: subprocess.Popen, url: str, log: Path, timeout: float = 120) -> None:
    """Wait until `url` answers; fail with the end of `log` if the server exits or `timeout` passes."""
    deadline = time.time() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                pytest.fail(f"{url} did not come up:\n{log.read_text()[-2000:]}")
            time.sleep(0.5)


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A Prefect server on loopback for the session: stages report to it instead of starting ephemeral servers."""
    home = tmp_path_factory.mktemp("prefect")
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.time() + 120
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            break
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("prefect server did not start")
            time.sleep(1)
    yield {"PREFECT_API_URL": url, "PREFECT_HOME": str(home)}
    proc.terminate()
    proc.wait(timeout=30)
