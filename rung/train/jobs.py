"""The job a training process runs, typed: one pydantic model per kind, written once as job.json
(`model_dump_json`) and read once by the kind's entry point (`python -m rung.train.sft JOB.json`,
`python -m rung.rl.trainers JOB.json`, `python -m rung.rewardmodels.train|process JOB.json`, started on every
rank by rung.train.launch) or handed over in-process."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from rung import paths
from rung.config import (
    EnvironmentParams,
    FormatParams,
    Params,
    ProcessRewardModelParams,
    RewardModelParams,
    RLStageParams,
    SamplingParams,
    SFTParams,
)
from rung.seeding import derive

RESULT = "result.json"  # written by the main process into the work directory


class TrainJob(BaseModel):
    """What every training job reads."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    entry: ClassVar[str]
    """The module whose `train(job)` runs this kind, and whose `__main__` reads its job.json."""

    key: str
    """The params key of the stage (e.g. 'rl.stages.main'), for error messages."""
    init: Path
    data: Path
    work_dir: Path
    format: FormatParams
    seed: int
    dtype: str
    """params `model.dtype` ('auto' resolves where the job runs: rung.placement)."""
    device: str = "auto"
    """params `model.device`."""
    cpu_matmul: Literal["default", "onednn"] = "default"
    """params `model.cpu_matmul`: a kernel choice, like the thread count not part of the fingerprint."""
    resume: str | None = None
    outage_wait: float = 300.0
    """params `tracking.outage_wait`: how long the end of training waits for MLflow (rung.train.run_log)."""
    callbacks: list[str] = []
    """Import paths ('module:Class') of extra TRL callbacks, e.g. for tests that observe training."""

    @staticmethod
    def shared(params: Params) -> dict[str, Any]:
        """What every kind of job takes from params besides its stage's own section: the answer format, the model's
        dtype, device and CPU matmul, and how long the end of training waits for MLflow."""
        return dict(
            format=params.format,
            dtype=params.model.dtype,
            device=params.model.device,
            cpu_matmul=params.model.cpu_matmul,
            outage_wait=params.tracking.outage_wait,
        )

    def fingerprint(self) -> dict[str, Any]:
        """The settings a checkpoint depends on (resume only from a checkpoint written for them)."""
        return self.model_dump(
            mode="json", by_alias=True, exclude={"work_dir", "resume", "outage_wait", "callbacks", "cpu_matmul"}
        )

    def trainer_callbacks(self) -> list[Any]:
        """Instances of the `callbacks` import paths."""
        out = []
        for path in self.callbacks:
            module, _, name = path.partition(":")
            out.append(getattr(importlib.import_module(module), name)())
        return out


class SFTJob(TrainJob):
    entry: ClassVar[str] = "rung.train.sft"
    kind: Literal["sft"] = "sft"
    params: SFTParams


class RLJob(TrainJob):
    entry: ClassVar[str] = "rung.rl.trainers"
    kind: Literal["rl"] = "rl"
    params: RLStageParams
    buckets: dict[str, float]
    """Difficulty bucket bounds (params difficulty.buckets), for curricula and per-bucket metrics."""
    curves: Path
    """Where the per-step curves (a DVC plot) are written."""
    heldout: Path | None = None
    """The held-out split, graded every `params.eval_every` steps with `heldout_sampling`."""
    heldout_sampling: SamplingParams | None = None
    environment: EnvironmentParams | None = None
    """The environment the stage trains episodes in (params.environment_of(stage)); None: single-turn."""

    @classmethod
    def of(cls, params: Params, name: str, stage: RLStageParams | None = None) -> RLJob:
        """The job of RL stage `name` of `params`, run as given or as `stage` (its params changed: bench/)."""
        stage = params.rl.stages[name] if stage is None else stage
        return cls(
            key=f"rl.stages.{name}",
            params=stage,
            init=paths.checkpoint(stage.init),
            data=paths.FILTERED,
            work_dir=paths.WORK / "rl" / name,
            curves=paths.plot("rl", name),
            seed=derive(params.seed if stage.seed is None else stage.seed, "rl", name),
            buckets=params.difficulty.buckets,
            heldout=paths.TEST if stage.eval_every else None,
            heldout_sampling=params.eval.sampling,
            environment=params.environment_of(name),
            **cls.shared(params),
        )

    def fingerprint(self) -> dict[str, Any]:
        out = super().fingerprint()
        if self.environment is None:  # a single-turn job's fingerprint (and published model) as before episodes
            del out["environment"]
        return out


class RewardModelJob(TrainJob):
    """One member of a reward model's ensemble, on the pairs file `data`."""

    entry: ClassVar[str] = "rung.rewardmodels.train"
    kind: Literal["reward_model"] = "reward_model"
    params: RewardModelParams


class ProcessRewardModelJob(TrainJob):
    """A process reward model, on the step-labels file `data`."""

    entry: ClassVar[str] = "rung.rewardmodels.process"
    kind: Literal["process_reward_model"] = "process_reward_model"
    params: ProcessRewardModelParams


JOBS: tuple[type[TrainJob], ...] = (SFTJob, RLJob, RewardModelJob, ProcessRewardModelJob)
"""Every kind of job, for whoever maps a flow's imports to the job entry modules it runs."""


class JobResult(BaseModel):
    metrics: dict[str, float]


J = TypeVar("J", bound=TrainJob)


def main(job_type: type[J], train: Callable[[J], JobResult]) -> None:
    """Entry point of a kind's module: read the job, train, and (main process) write the result."""
    job = job_type.model_validate_json(Path(sys.argv[1]).read_text())
    result = train(job)
    import torch.distributed as dist  # here, not at the top: the flows build jobs without torch

    if not dist.is_initialized() or dist.get_rank() == 0:
        (job.work_dir / RESULT).write_text(result.model_dump_json())
