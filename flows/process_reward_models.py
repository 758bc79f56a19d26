"""Stage `process_reward_models@<name>`: Monte-Carlo step labels of the init model's sampled solutions, a
per-step scorer trained on them (transformers' Trainer), and its held-out step accuracy."""

from __future__ import annotations

import sys

from prefect import flow, get_run_logger

from flows.stage import finish, learned_reward, learned_reward_tags, main
from rung import config, paths, tracking
from rung.answers.rows import read_rows
from rung.checks.models import chat_template
from rung.checks.rewardmodels import process_reward_models as checked
from rung.rewardmodels import heldout, pairs, steps
from rung.train import launch
from rung.train.checkpoints import discard
from rung.train.jobs import ProcessRewardModelJob
from tasks import generation

CHECKS = (chat_template, checked)
"""What this stage checks of params before any compute (flows.stage.main)."""
SECTION = "process_reward_models"


@flow(name="process_reward_models")
def process_reward_models(name: str, params_file: str = str(paths.PARAMS)) -> None:
    params = config.load(params_file)
    prm, key, seed = learned_reward(params, SECTION, name)
    init, data_dir = paths.checkpoint(prm.init), paths.learned_reward_data(SECTION, name)
    logged = {
        "global_seed": params.seed,
        "seed": seed,
        SECTION: {name: prm.model_dump()},
        "format": params.format.model_dump(),
    }
    with tracking.stage_run(
        f"{SECTION}@{name}", params, logged, inputs={"model": init, "train": paths.FILTERED}, resumable=True
    ):
        rows = read_rows(paths.FILTERED)[: prm.max_prompts]
        gen = generation.load(init, params.model, params.generation)
        labelled = steps.labelled(gen, rows, params.format, prm, seed)
        if gen.close:
            gen.close()
        del gen
        train, held = pairs.split(labelled, prm.heldout_fraction, seed, key)
        heldout.write(data_dir, train, held)
        labels = [y for row in labelled for y in row["labels"]]
        summary = {"solutions": len(labelled), "steps": len(labels), "mean_label": sum(labels) / max(1, len(labels))}
        get_run_logger().info(f"step labels: {summary}")
        job = ProcessRewardModelJob(
            key=key,
            params=prm,
            init=init,
            data=data_dir / heldout.TRAIN,
            work_dir=paths.WORK / SECTION / name,
            seed=seed,
            **ProcessRewardModelJob.shared(params),
        )
        out = paths.learned_reward(SECTION, name)
        metrics = {
            "labels": summary,
            "train": launch.train(job, prm.launch, out),
            "heldout": heldout.process_reward_model(out, data_dir, params.model.device),
        }
        learned_reward_tags(out, prm.init)
        finish(f"{SECTION}-{name}", metrics)
        discard(job.work_dir)  # once the records are complete: a rerun for want of MLflow resumes from them


if __name__ == "__main__":
    main(process_reward_models, *sys.argv[1:2], checks=CHECKS)
