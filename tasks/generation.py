"""Loading a model for generation as a Prefect task: retried, since a teacher may come from the hub."""
from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from rung import generation
from tasks.retry import unless_input_error


@task(cache_policy=NO_CACHE, task_run_name="load {model_dir}", retries=2, retry_delay_seconds=20, retry_condition_fn=unless_input_error)
def load(model_dir: Path | str, dtype: str, backend: str) -> generation.Generator:
    """A generator for a checkpoint directory or a hub id."""
    return generation.load(model_dir, dtype, backend)
