"""Run a training job in this process, or distributed: torchrun (DDP over gloo) on CPU,
`accelerate launch` with a DDP / FSDP / DeepSpeed config on GPUs.

The job is described by a JSON spec that rung.worker executes on every process; rank 0 writes
the job's result next to the model in the work directory.
"""
from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import mlflow
import torch

from rung import io
from rung.config import LaunchParams
from rung.errors import InputError

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "accelerate"
RESULT = "result.json"


def accelerate_config(name: str, key: str) -> Path:
    """configs/accelerate/<name>.yaml for a short name, else the path itself."""
    path = CONFIGS / f"{name}.yaml" if "/" not in name and not name.endswith((".yaml", ".yml")) else Path(name)
    if not path.is_file():
        raise InputError(f"{key}.accelerate_config: {path} not found (short names: {sorted(p.stem for p in CONFIGS.glob('*.yaml'))})")
    return path


def check(launch: LaunchParams, key: str) -> None:
    """Reject what cannot run on this machine before anything starts."""
    if launch.accelerate_config is None:
        return
    path = accelerate_config(launch.accelerate_config, key)
    text = path.read_text()
    if not torch.cuda.is_available() and ("FSDP" in text or "DEEPSPEED" in text):
        raise InputError(f"{key}.accelerate_config: {path.name} (FSDP / DeepSpeed) needs CUDA GPUs and none is visible")
    if "DEEPSPEED" in text and importlib.util.find_spec("deepspeed") is None:
        raise InputError(f"{key}.accelerate_config: {path.name} needs DeepSpeed (pip install deepspeed)")


def command(launch: LaunchParams, spec_path: Path, key: str) -> list[str] | None:
    """The launcher command for a distributed job, or None to run in this process."""
    if launch.num_processes == 1 and launch.accelerate_config is None:
        return None
    worker = ["-m", "rung.worker", str(spec_path)]
    if launch.accelerate_config is not None:
        return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(accelerate_config(launch.accelerate_config, key)),
                "--num_processes", str(launch.num_processes), *worker]
    # torchrun, not `accelerate launch --cpu`, which starts a single process on CPU.
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(launch.num_processes),
            "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), *worker]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(spec: dict[str, Any], launch: LaunchParams, work_dir: Path, key: str) -> dict[str, Any]:
    """Execute the job `spec` (see rung.worker) and return its result."""
    from rung import worker  # imports the trainers; kept out of `rung validate`

    check(launch, key)
    work_dir.mkdir(parents=True, exist_ok=True)
    spec_path = work_dir / "job.json"
    io.write_json(spec_path, spec)
    cmd = command(launch, spec_path, key)
    if cmd is None:
        worker.run(spec)
    else:
        # The ranks log into the stage's MLflow run: TRL's callback resumes MLFLOW_RUN_ID.
        active = mlflow.active_run()
        env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow.get_tracking_uri(), **({"MLFLOW_RUN_ID": active.info.run_id} if active else {})}
        if not torch.cuda.is_available():
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // launch.num_processes))
        done = subprocess.run(cmd, env=env, check=False)  # the exit code is turned into one error below
        if done.returncode != 0:
            raise RuntimeError(f"{key}: distributed job failed with exit code {done.returncode}: {' '.join(cmd)}")
    return io.read_json(work_dir / RESULT)
