"""Stage `rl@<name>`: one GRPO stage on the difficulty-filtered train set."""

from __future__ import annotations

import shutil
import sys

from prefect import flow

from flows.stage import finish, main, record_checkpoint
from rung import config, files, paths, tracking
from rung.checks.environments import environments
from rung.checks.models import chat_template
from rung.checks.rl import rl_stages
from rung.config import PreferenceFile, PreferenceParams
from rung.config.preference import OFFLINE
from rung.errors import InputError
from rung.report import keys
from rung.rl import pairs
from rung.train import launch
from rung.train.checkpoints import discard
from rung.train.jobs import RLJob
from tasks import generation

CHECKS = (chat_template, rl_stages, environments)
"""What this stage checks of params before any compute (flows.stage.main)."""


@flow(name="rl")
def rl(stage_name: str, params_file: str = str(paths.PARAMS)) -> None:
    params = config.load(params_file)
    if stage_name not in params.rl.stages:
        raise InputError(f"rl.stages: no stage named {stage_name!r} (have {list(params.rl.stages)})")
    stage = params.rl.stages[stage_name]
    job = RLJob.of(params, stage_name)
    # "seed" is the trainer's own (TRL logs it too; MLflow refuses a second value for a param).
    logged = {
        "global_seed": params.seed,
        "seed": job.seed,
        "rl": {stage_name: stage.model_dump()},
        "format": params.format.model_dump(),
    }
    if job.environment:  # logged only with one: a single-turn stage's params stay as they were
        logged["environment"] = job.environment.model_dump()
    inputs = {"model": job.init, "train": job.data}
    out = paths.checkpoint(f"rl/{stage_name}")
    with tracking.stage_run(f"rl@{stage_name}", params, logged, inputs=inputs, resumable=True):
        made: list[dict] = []
        counts: dict[str, int] = {}
        if stage.algorithm in OFFLINE:  # dpo / kto: the init's graded samples (or a file) first, then training
            made, counts = _pairs(params, job)
            # beside the work directory, which launch clears when it holds another experiment's checkpoints
            data = job.work_dir.parent / f"{stage_name}.{pairs.PAIRS}"
            data.parent.mkdir(parents=True, exist_ok=True)
            files.write_jsonl(data, made)
            job = job.model_copy(update={"data": data})
        metrics = launch.train(job, stage.launch, out)
        if made:  # published beside the model: the pairs the stage trained on, for other stages to reuse
            shutil.move(job.data, out / pairs.PAIRS)
        metrics.update({f"pairs/{k}": float(v) for k, v in counts.items()})
        record_checkpoint(params, f"rl/{stage_name}", trained=True)
        # One key per quantity: `rl/<metric>` for every RL stage (the stage is the run's rung.checkpoint tag).
        finish(f"rl-{stage_name}", metrics, keys.metric_keys(metrics, prefix="rl"))
        discard(job.work_dir)  # once the records are complete: a rerun for want of MLflow resumes from them


def _pairs(params: config.Params, job: RLJob) -> tuple[list[dict], dict[str, int]]:
    """A dpo / kto stage's pairs and their counts: its init loaded for sampling only when the pairs are verifier's,
    and released before training."""
    pref = job.params.preference or PreferenceParams()
    gen = None if isinstance(pref.pairs, PreferenceFile) else generation.load(job.init, params.model, params.generation)
    try:
        return pairs.build(pref, gen, job.data, params.format, job.seed, job.key)
    finally:
        if gen is not None and gen.close:
            gen.close()


if __name__ == "__main__":
    main(rl, *sys.argv[1:2], checks=CHECKS)
