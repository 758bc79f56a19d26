"""DVC as Prefect tasks: DVC decides what is stale and runs stages; Prefect retries and logs."""
from __future__ import annotations

import subprocess

import networkx as nx
from dvc.repo import Repo
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

INPUT_ERROR = 2  # exit code of a stage that rejected its input: retrying cannot help


def stages_in_order() -> list[str]:
    """Stage addresses (e.g. 'rl@main') in an order that runs dependencies first, ties in dvc.yaml order."""
    with Repo() as repo:
        position = {s.addressing: i for i, s in enumerate(repo.index.stages)}
        # DVC's graph points from a stage to the stages it depends on; reverse it to run deps first.
        graph = repo.index.graph.reverse()
        ordered = nx.lexicographical_topological_sort(graph, key=lambda s: position.get(s.addressing, len(position)))
        return [s.addressing for s in ordered if s.addressing in position]


@task(cache_policy=NO_CACHE)
def is_stale(stage: str) -> bool:
    """True when DVC reports changed deps, params, outs or command for `stage` alone."""
    with Repo() as repo:
        return bool(repo.status(targets=[stage]))


def _retryable(task, task_run, state) -> bool:  # noqa: ANN001 - Prefect's retry_condition_fn signature
    try:
        state.result()
    except subprocess.CalledProcessError as e:
        return e.returncode != INPUT_ERROR
    except Exception:  # noqa: BLE001 - anything else may be transient
        return True
    return False


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[10, 60], retry_condition_fn=_retryable)
def repro(stage: str) -> None:
    """`dvc repro --single-item <stage>` (DVC takes the repo lock, so stages run one at a time)."""
    get_run_logger().info("dvc repro %s", stage)
    subprocess.run(["dvc", "repro", "--single-item", stage], check=True)
