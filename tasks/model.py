from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from rung import models
from rung.config import ModelParams


@task(cache_policy=NO_CACHE)
def materialize(params: ModelParams, out_dir: Path) -> int:
    """Write the base model as an HF directory; returns its parameter count."""
    models.materialize(params.source, out_dir, params.dtype, params.revision)
    model, _ = models.load(out_dir, params.dtype)
    return model.num_parameters()
