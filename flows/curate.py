"""Stage `curate`: sources -> one schema -> dedup -> train / held-out test splits."""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows.stage import finish, main
from rung import config, paths, tracking
from rung.checks import sources
from rung.data import curate as curation

CHECKS = (sources.sources,)
"""What this stage checks of params before any compute (flows.stage.main)."""


@flow(name="curate")
def curate(params_file: str = str(paths.PARAMS)) -> None:
    params = config.load(params_file)
    logged = {
        "seed": params.seed,
        "curate": params.curate.model_dump(),
        "eval.sets": [s.model_dump() for s in params.eval.sets],
    }
    with tracking.stage_run("curate", params, logged, inputs={}):
        stats = curation.run(params.curate, params.eval, params.seed)
        get_run_logger().info(
            "curated %d train / %d test rows, %d extra eval sets",
            stats["train"],
            stats["test"],
            len(stats["eval_sets"]),
        )
        tracking.log_dataset(paths.TRAIN, "train", context="training")
        tracking.log_dataset(paths.TEST, "test", context="evaluation")
        finish("curate", stats)


if __name__ == "__main__":
    main(curate, checks=CHECKS)
