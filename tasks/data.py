from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rung import data, io
from rung.config import CurateParams


@task(cache_policy=NO_CACHE)
def curate(params: CurateParams, seed: int, train_path: Path, test_path: Path) -> dict[str, Any]:
    """Generate, dedup and split the sources; write both splits; returns the stats."""
    train, test, stats = data.curate(params, seed)
    io.write_jsonl(train_path, train)
    io.write_jsonl(test_path, test)
    get_run_logger().info("curated %d train / %d test rows", stats["train"], stats["test"])
    return stats
