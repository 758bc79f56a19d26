"""DVC as Prefect tasks: DVC decides what is stale and runs stages and experiments; Prefect
retries and logs them, and a workspace lock keeps one DVC run per workspace at a time."""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import networkx as nx
from dvc.repo import Repo
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from rung.files import flatten

INPUT_ERROR = 2  # exit code of a stage that rejected its input: retrying cannot help


def env() -> dict[str, str]:
    """The environment of `dvc` commands: this interpreter's bin directory first on PATH, so that
    `dvc` and the stage commands (`python -m flows.<stage>`) use the same venv as the flow."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


LOCK = Path(".dvc/tmp/rung-workspace.lock")  # in DVC's own ignored tmp folder


@contextlib.contextmanager
def workspace_lock() -> Iterator[Path]:
    """Hold this workspace's lock while DVC runs here (another holder makes this wait); yields its path.

    An exclusive flock: the kernel releases it when the holding process ends, however it ends (killed,
    its Prefect server restarted or gone), so a lock never stays taken, with or without a Prefect
    server. Each node works in its own checkout, so the lock is local to the workspace's machine."""
    log = get_run_logger()
    path = LOCK.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            log.info("waiting for workspace lock %s (held by %s)", path, f.read().strip() or "another run")
            fcntl.flock(f, fcntl.LOCK_EX)
        f.truncate(0)
        f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        f.flush()
        log.info("workspace lock %s taken", path)
        try:
            yield path
        finally:
            f.truncate(0)
            fcntl.flock(f, fcntl.LOCK_UN)


def stages_in_order(root: Path | None = None) -> list[str]:
    """Stage names (e.g. 'rl@main') of the workspace at `root` (default: the one around the current
    directory) in an order that runs dependencies first, ties in dvc.yaml order. Names, not DVC's addresses,
    which carry the dvc.yaml's path from the current directory (runs/tools/dvc.yaml:model under `rung run`)."""
    with Repo(root) as repo:
        position = {s.addressing: i for i, s in enumerate(repo.index.stages)}
        # DVC's graph points from a stage to the stages it depends on; reverse it to run deps first.
        graph = repo.index.graph.reverse()
        ordered = nx.lexicographical_topological_sort(graph, key=lambda s: position.get(s.addressing, len(position)))
        return [s.name for s in ordered if s.addressing in position]


@task(cache_policy=NO_CACHE, task_run_name="is_stale[{stage}]")  # the UI's timeline reads as the DAG
def is_stale(stage: str) -> bool:
    """True when DVC reports changed deps, params, outs or command for `stage` alone."""
    with Repo() as repo:
        return bool(repo.status(targets=[stage]))


def _retryable(task, task_run, state) -> bool:  # Prefect's retry_condition_fn signature
    try:
        state.result()
    except subprocess.CalledProcessError as e:
        return e.returncode != INPUT_ERROR
    except Exception:  # noqa: BLE001 - anything else may be transient
        return True
    return False


def _run(cmd: list[str]) -> None:
    """Run a dvc command; on failure raise CalledProcessError with the *stage's* exit code when DVC
    names one ('failed to run: <cmd>, exited with 2'): dvc itself exits 255 whatever the stage did."""
    tail: collections.deque[str] = collections.deque(maxlen=20)
    with subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env()) as proc:
        try:
            for line in proc.stderr:  # type: ignore[union-attr]  # tee: stream stderr and keep its end
                sys.stderr.write(line)
                tail.append(line)
        except BaseException:  # as subprocess.run: do not leave DVC running
            proc.kill()
            raise
    if proc.returncode:
        codes = re.findall(r"failed to run: .*, exited with (-?\d+)", "".join(tail))
        raise subprocess.CalledProcessError(int(codes[-1]) if codes else proc.returncode, cmd, stderr="".join(tail))


@task(
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=exponential_backoff(backoff_factor=30),
    retry_jitter_factor=0.5,
    retry_condition_fn=_retryable,
    task_run_name="repro[{stage}]",
)
def repro(stage: str) -> None:
    """`dvc repro --single-item <stage>`; retried after ~30 s then ~60 s unless the stage rejected its input."""
    get_run_logger().info("dvc repro %s", stage)
    _run(["dvc", "repro", "--single-item", stage])


def set_args(point: dict[str, Any]) -> list[str]:
    """`-S` arguments of one grid point. Values are JSON (valid Hydra override syntax: "grpo" stays a
    string, [1, 2] a list); `++` sets keys that params.yaml does not have yet."""
    return [a for key, value in point.items() for a in ("-S", f"++{key}={json.dumps(value)}")]


@task(cache_policy=NO_CACHE, task_run_name="queue[{name}]")
def queue_experiment(name: str, point: dict[str, Any]) -> None:
    """`dvc exp run --queue -n <name> -S key=value ...`: queued, run later in a temp workspace."""
    get_run_logger().info("queue %s: %s", name, point)
    _run(["dvc", "exp", "run", "--queue", "-n", name, *set_args(point)])


@task(cache_policy=NO_CACHE, task_run_name="run_queue[-j {jobs}]")
def run_queue(jobs: int = 1) -> None:
    """`dvc exp run --run-all -j <jobs>`: start queue workers (they inherit this environment) and
    wait for every queued experiment. Exits 0 even when experiments failed: see `experiments`."""
    _run(["dvc", "exp", "run", "--run-all", "-j", str(jobs)])


def experiments(names: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Params, metrics and state from `dvc exp show --json`, keyed '<file>:<dotted key>': of the
    named experiments (in the order of `names`), or without names of the workspace, each baseline
    commit and every experiment."""
    out = subprocess.run(["dvc", "exp", "show", "--json"], capture_output=True, text=True, check=True, env=env()).stdout
    found: dict[str, dict[str, Any]] = {}
    for baseline in json.loads(out):
        if not names:
            found[baseline.get("name") or baseline["rev"]] = _columns(baseline, "success")
        for exp in baseline.get("experiments") or []:
            found[exp["name"]] = _columns(exp["revs"][0], (exp.get("executor") or {}).get("state", "success"))
    return {name: found[name] for name in names if name in found} if names else found


def _columns(rev: dict[str, Any], state: str) -> dict[str, Any]:
    data = rev.get("data") or {}
    row: dict[str, Any] = {"state": state}
    for kind in ("params", "metrics"):
        for file, content in (data.get(kind) or {}).items():
            row.update({f"{file}:{k}": v for k, v in flatten(content.get("data") or {}).items()})
    return row
