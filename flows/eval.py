"""Stage `eval_*`: one checkpoint on the held-out split; per-sample records and DVC metrics."""
from __future__ import annotations

import sys

from prefect import flow

from flows.stage import finish, main
from rung import config, io, layout, tracking
from rung.seeding import derive
from tasks import generation


@flow(name="eval")
def eval_checkpoint(checkpoint: str, params_file: str = str(layout.PARAMS)) -> None:
    params = config.load(params_file)
    slug = layout.checkpoint_slug(checkpoint)
    model_dir = layout.checkpoint(checkpoint)
    logged = {"seed": params.seed, "eval": params.eval.model_dump(), "format": params.format.model_dump(), "checkpoint": checkpoint}
    with tracking.stage_run(f"eval@{slug}", params, logged, inputs={"model": model_dir, "test": layout.TEST}):
        rows = io.read_jsonl(layout.TEST)
        records, metrics = generation.evaluate_checkpoint(model_dir, rows, params.format, params.eval.sampling, params.model.dtype, derive(params.seed, "eval"))
        io.write_jsonl(layout.EVAL / f"{slug}.jsonl", records)
        finish(f"eval-{slug}", {**metrics, "sampling": params.eval.sampling.model_dump()})


if __name__ == "__main__":
    main(eval_checkpoint, *sys.argv[1:2])
