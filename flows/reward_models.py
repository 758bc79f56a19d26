"""Stage `reward_models@<name>`: preference pairs (the init model's verifier-graded samples, or a file), the
reward models of an ensemble trained on them with TRL's RewardTrainer, and their held-out metrics."""

from __future__ import annotations

import sys
from pathlib import Path

from prefect import flow

from flows.stage import finish, learned_reward, learned_reward_tags, main
from rung import config, paths, tracking
from rung.answers.rows import read_rows
from rung.checks.models import chat_template
from rung.checks.rewardmodels import reward_models as checked
from rung.config import PreferenceFile
from rung.errors import InputError
from rung.rewardmodels import heldout, pairs, scoring
from rung.seeding import derive
from rung.train import launch
from rung.train.checkpoints import discard
from rung.train.jobs import RewardModelJob
from tasks import generation

CHECKS = (chat_template, checked)
"""What this stage checks of params before any compute (flows.stage.main)."""
SECTION = "reward_models"


@flow(name="reward_models")
def reward_models(name: str, params_file: str = str(paths.PARAMS)) -> None:
    params = config.load(params_file)
    rm, key, seed = learned_reward(params, SECTION, name)
    init, data_dir, out = (
        paths.checkpoint(rm.init),
        paths.learned_reward_data(SECTION, name),
        paths.learned_reward(SECTION, name),
    )
    logged = {
        "global_seed": params.seed,
        "seed": seed,
        SECTION: {name: rm.model_dump()},
        "format": params.format.model_dump(),
    }
    source = paths.FILTERED if not isinstance(rm.pairs, PreferenceFile) else Path(rm.pairs.path)
    with tracking.stage_run(
        f"{SECTION}@{name}", params, logged, inputs={"model": init, "train": source}, resumable=True
    ):
        if isinstance(rm.pairs, PreferenceFile):
            made = pairs.from_file(rm.pairs, rm.heldout_fraction, seed, f"{key}.pairs")
        else:
            gen = generation.load(init, params.model, params.generation)
            rows = read_rows(paths.FILTERED)[: rm.pairs.max_prompts]
            samples = pairs.graded(gen, rows, params.format, rm.pairs, seed)
            if gen.close:
                gen.close()
            del gen  # its memory, before training
            made = pairs.from_samples(samples, rm.pairs, rm.heldout_fraction, seed, f"{key}.pairs")
        train, held, graded, stats = made
        if not train:
            raise InputError(f"{key}.pairs: no pair to train on ({stats}); sample more per prompt or from more prompts")
        heldout.write(data_dir, train, held, graded)
        trained = {}
        for i in range(rm.ensemble):
            job = RewardModelJob(
                key=key,
                params=rm,
                init=init,
                data=data_dir / heldout.TRAIN,
                work_dir=paths.WORK / SECTION / name / str(i),
                seed=derive(seed, "member", str(i)),
                **RewardModelJob.shared(params),
            )
            trained[str(i)] = launch.train(job, rm.launch, scoring.member_dir(out, i))
        metrics = {
            "pairs": stats,
            "train": trained["0"] if rm.ensemble == 1 else trained,
            "heldout": heldout.reward_model(out, data_dir, params.format, key, params.model.device),
        }
        learned_reward_tags(out, rm.init)
        finish(f"{SECTION}-{name}", metrics)
        for i in range(rm.ensemble):
            discard(paths.WORK / SECTION / name / str(i))  # once the records are complete


if __name__ == "__main__":
    main(reward_models, *sys.argv[1:2], checks=CHECKS)
