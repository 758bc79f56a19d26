from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

from tests.tiny_model import build  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1.6M-parameter random Llama with the SmolLM2 tokenizer, built once per session."""
    return build(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def default_params() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "params.yaml").read_text())
