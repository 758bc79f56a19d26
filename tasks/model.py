"""The base model as a Prefect task: a hub download can fail transiently and is retried."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from rung import models
from rung.config import ModelParams
from tasks.retries import unless_input_error


@task(
    cache_policy=NO_CACHE,
    task_run_name="materialize {params.source}",
    retries=2,
    retry_delay_seconds=30,
    retry_condition_fn=unless_input_error,
)
def materialize(params: ModelParams, out_dir: Path) -> int:
    """Write the base model as an HF directory at `out_dir` (with rung's tool template when
    `model.chat_template: tools`); returns its parameter count."""
    count = models.materialize(params.source, out_dir, params.dtype, params.revision)
    if params.chat_template == "tools":
        from transformers import AutoTokenizer

        from rung.envs import template

        template.apply(AutoTokenizer.from_pretrained(out_dir)).save_pretrained(out_dir)
    return count
