"""Loading a model for generation as a Prefect task: retried, since a teacher may come from the hub."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.retries import unless_input_error

if TYPE_CHECKING:
    from rung.config import GenerationParams, ModelParams
    from rung.generate.completion import Generator


@task(
    cache_policy=NO_CACHE,
    task_run_name="load {model_dir}",
    retries=2,
    retry_delay_seconds=20,
    retry_condition_fn=unless_input_error,
)
def load(model_dir: Path | str, params: ModelParams, generation: GenerationParams) -> Generator:
    """A generator for a checkpoint directory or a hub id, placed by params `model` (device, dtype)."""
    from rung.generate import api  # torch and transformers: only for a stage that loads a model (traces may not)

    return api.load(model_dir, params.dtype, generation.backend, params.device, generation.vllm)
