"""Stage `difficulty`: pass rate of each train prompt under the reference model; the filtered train set."""

from __future__ import annotations

from prefect import flow

from flows.stage import finish, main
from rung import config, paths, tracking
from rung.answers.rows import read_rows
from rung.checks.environments import environments
from rung.checks.generation import backend
from rung.checks.models import chat_template, difficulty_reference
from rung.data import difficulty as diff
from rung.seeding import derive
from tasks import generation

CHECKS = (chat_template, backend, difficulty_reference, environments)
"""What this stage checks of params before any compute (flows.stage.main)."""


@flow(name="difficulty")
def difficulty(params_file: str = str(paths.PARAMS)) -> None:
    params = config.load(params_file)
    p = params.difficulty
    reference = paths.checkpoint(p.reference)
    logged = {
        "seed": params.seed,
        "difficulty": p.model_dump(),
        "format": params.format.model_dump(),
        "generation": params.generation.model_dump(),
    }
    if params.environment:  # logged only with one: a single-turn run's params stay as they were
        logged["environment"] = params.environment.model_dump()
    with tracking.stage_run("difficulty", params, logged, inputs={"model": reference, "train": paths.TRAIN}):
        gen = generation.load(reference, params.model, params.generation)
        tracking.tag_placement(gen.device, gen.dtype)
        environment = None
        if params.environment:
            from rung import envs  # TRL's template tools: imported once the model is (tests/test_startup.py)

            environment = envs.check(params.environment, gen.tok, "environment")
        rows = read_rows(paths.TRAIN)[: p.max_prompts]
        finish("difficulty", diff.run(gen, rows, params.format, p, derive(params.seed, "difficulty"), environment))


if __name__ == "__main__":
    main(difficulty, checks=CHECKS)
