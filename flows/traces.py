"""Stage `traces`: the SFT targets — worked solutions from the data and/or verified samples of
the base model (rejection sampling / STaR) or of a teacher (distillation)."""
from __future__ import annotations

from pathlib import Path

from prefect import flow

from flows.stage import finish, main
from rung import config, io, layout, tracking
from rung.config import Params
from rung.seeding import derive
from tasks import generation


def model_dir(model: str) -> Path | str:
    """'base' is the pipeline's base checkpoint; anything else is a teacher path or hub id."""
    return layout.BASE if model == "base" else model


@flow(name="traces")
def traces(params_file: str = str(layout.PARAMS)) -> None:
    params: Params = config.load(params_file)
    sources = params.sft.traces
    logged = {"seed": params.seed, "sft.traces": [s.model_dump() for s in sources], "format": params.format.model_dump()}
    with tracking.stage_run("traces", params, logged, inputs={"train": layout.TRAIN}):
        rows = io.read_jsonl(layout.TRAIN)
        out, stats = generation.build_traces(rows, sources, params.format, params.model.dtype, params.generation.backend, derive(params.seed, "traces"), model_dir)
        io.write_jsonl(layout.TRACES, out)
        tracking.log_dataset(layout.TRACES, "sft_traces", context="training")
        finish("traces", stats)


if __name__ == "__main__":
    main(traces)
