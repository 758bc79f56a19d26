from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
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


@pytest.fixture(scope="session")
def smollm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pipeline's base model (the embedded SmolLM2-135M-Instruct, float32), as the model stage
    writes it: converted once per session (~20 s on 2 cores)."""
    from rung import models

    out = tmp_path_factory.mktemp("smollm") / "base"
    models.materialize(models.EMBEDDED, out)
    return out


@pytest.fixture
def default_params() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "params.yaml").read_text())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start a server process with its output in `log`."""
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def wait_healthy(proc: subprocess.Popen, url: str, log: Path, timeout: float = 120) -> None:
    """Wait until `url` answers; fail with the end of `log` if the server exits or `timeout` passes."""
    deadline = time.time() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                pytest.fail(f"{url} did not come up:\n{log.read_text()[-2000:]}")
            time.sleep(0.5)


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A Prefect server on loopback for the session: stages report to it instead of starting ephemeral servers."""
    home = tmp_path_factory.mktemp("prefect")
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.time() + 120
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            break
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("prefect server did not start")
            time.sleep(1)
    yield {"PREFECT_API_URL": url, "PREFECT_HOME": str(home)}
    proc.terminate()
    proc.wait(timeout=30)
