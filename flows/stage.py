"""What every stage flow shares: the entry point and how a stage finishes."""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from rung import compat, config, io, layout, tracking
from rung.errors import InputError


def main(flow: Callable[..., Any], *args: str) -> None:
    """Entry of `python -m flows.<stage>`: params.yaml is validated before any compute, and input
    errors end with one line naming the key, file or field and exit code 2."""
    try:
        config.load(layout.PARAMS)
        compat.check()
        flow(*args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def finish(stage: str, metrics: dict[str, Any]) -> None:
    """Write the stage's DVC metrics file and log the same numbers to its MLflow run."""
    io.write_json(layout.metrics(stage), metrics)
    tracking.log_metrics(metrics, prefix=stage)
