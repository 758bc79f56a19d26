"""Run a training job (rung.train.jobs) in this process, or distributed: torchrun (DDP over gloo) on CPU,
`accelerate launch` with a DDP / FSDP / DeepSpeed config on GPUs; resume it from its last complete
checkpoint, and publish the trained model at the stage's output directory.

A distributed job is written once as job.json and read by its kind's entry point on every rank
(`python -m rung.train.sft|rung.rl.trainers job.json`); rank 0 writes the result into the work directory.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

from rung import files, models
from rung.config import PREFERENCE_ALGORITHMS, LaunchParams
from rung.errors import InputError
from rung.train.checkpoints import CURRICULUM_STATE, FINAL, resume_point
from rung.train.jobs import RESULT, JobResult, RLJob, TrainJob

log = logging.getLogger(__name__)
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "accelerate"


def accelerate_config(name: str, key: str) -> Path:
    """configs/accelerate/<name>.yaml for a short name, else the path itself."""
    path = CONFIGS / f"{name}.yaml" if "/" not in name and not name.endswith((".yaml", ".yml")) else Path(name)
    if not path.is_file():
        raise InputError(
            f"{key}.accelerate_config: {path} not found (short names: {sorted(p.stem for p in CONFIGS.glob('*.yaml'))})"
        )
    return path


def check(launch: LaunchParams, key: str) -> None:
    """Reject what cannot run on this machine before anything starts."""
    if launch.accelerate_config is None:
        return
    import torch  # here, not at the top: preflight checks every launch, most stages train none

    path = accelerate_config(launch.accelerate_config, key)
    text = path.read_text()
    if not torch.cuda.is_available() and ("FSDP" in text or "DEEPSPEED" in text):
        raise InputError(f"{key}.accelerate_config: {path.name} (FSDP / DeepSpeed) needs CUDA GPUs and none is visible")
    if "DEEPSPEED" in text and importlib.util.find_spec("deepspeed") is None:
        raise InputError(f"{key}.accelerate_config: {path.name} needs DeepSpeed (pip install deepspeed)")


def command(launch: LaunchParams, job_path: Path, entry: str, key: str) -> list[str] | None:
    """The launcher command for a distributed job of module `entry`, or None to run in this process."""
    if launch.num_processes == 1 and launch.accelerate_config is None:
        return None
    worker = ["-m", entry, str(job_path)]
    if launch.accelerate_config is not None:
        return [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(accelerate_config(launch.accelerate_config, key)),
            "--num_processes",
            str(launch.num_processes),
            *worker,
        ]
    # torchrun, not `accelerate launch --cpu`, which starts a single process on CPU.
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(launch.num_processes),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        *worker,
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(job: TrainJob, launch: LaunchParams, out_dir: Path) -> dict[str, float]:
    """Train (resuming from the last checkpoint in the work directory when it was written for the
    same job and inputs) and publish the model at `out_dir`; returns the job's summary metrics. The
    checkpoints stay until the stage's records are complete (its flow then calls `discard`): a stage
    that fails after training, for want of its MLflow server, resumes from them."""
    key = f"{job.key}.launch"
    check(launch, key)
    # An RL checkpoint is complete with the curriculum state (written before TRL's files) and TRL's
    # trainer_state.json (written last).
    # (TRL's preference trainers have no curriculum: transformers' files alone)
    curriculum = isinstance(job, RLJob) and job.params.algorithm not in PREFERENCE_ALGORITHMS
    complete = ("trainer_state.json", CURRICULUM_STATE) if curriculum else ("trainer_state.json",)
    resume = resume_point(
        job.work_dir, {**job.fingerprint(), "init": files.md5(job.init), "data": files.md5(job.data)}, complete
    )
    if resume:
        log.info("resuming from %s", resume)
    job = job.model_copy(update={"resume": resume})
    result = run(job, launch)
    models.publish(job.work_dir / FINAL, out_dir, {"stage": job.kind, **job.fingerprint()})  # type: ignore[attr-defined]
    return result.metrics


def run(job: TrainJob, launch: LaunchParams) -> JobResult:
    """Execute `job` here or on `launch.num_processes` processes; returns the main process's result."""
    key = f"{job.key}.launch"
    check(launch, key)
    job.work_dir.mkdir(parents=True, exist_ok=True)
    job_path = job.work_dir / "job.json"
    job_path.write_text(job.model_dump_json(by_alias=True))
    cmd = command(launch, job_path, job.entry, key)
    if cmd is None:  # the entry module's train(), in this process
        return importlib.import_module(job.entry).train(job)
    import mlflow
    import torch

    # The ranks log into the stage's MLflow run: rank 0's rung.train.run_log sends to MLFLOW_RUN_ID.
    active = mlflow.active_run()
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": mlflow.get_tracking_uri(),
        **({"MLFLOW_RUN_ID": active.info.run_id} if active else {}),
    }
    if not torch.cuda.is_available():
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // launch.num_processes))
    done = subprocess.run(cmd, env=env, check=False)  # the exit code is turned into one error below
    if done.returncode != 0:
        raise RuntimeError(f"{key}: distributed job failed with exit code {done.returncode}: {' '.join(cmd)}")
    return JobResult.model_validate_json((job.work_dir / RESULT).read_text())
