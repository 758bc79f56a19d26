"""The project's dvc.yaml as the checks read it: its stages, and the deps one of them lists (a `foreach` stage's
under `do`). Light on purpose: every stage's checks may import it without taking on another stage's code deps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def stages(dag_file: Path) -> dict[str, Any]:
    """dvc.yaml's stages by name (a `foreach` stage as one)."""
    return yaml.safe_load(dag_file.read_text()).get("stages", {})


def stage_deps(stage: dict[str, Any]) -> list[Any]:
    return (stage.get("do", stage)).get("deps") or []
