"""Stage `traces`: the SFT targets — worked solutions from the data and/or verified samples of
the base model (rejection sampling / STaR) or of a teacher (distillation), tool-call episodes, or
wrong-then-right episodes of the retry environment."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect import flow, get_run_logger

from flows.stage import finish, main
from rung import config, paths, tracking
from rung.answers.rows import read_rows
from rung.checks.environments import episode_traces
from rung.checks.generation import backend
from rung.checks.models import chat_template, trace_models
from rung.config import Params
from rung.data import traces as trace_sources
from rung.seeding import derive
from tasks import generation

if TYPE_CHECKING:  # solution traces load no model, so this stage imports torch only when it samples
    from rung.generate.completion import Generator

CHECKS = (chat_template, trace_models, backend, episode_traces)
"""What this stage checks of params before any compute (flows.stage.main)."""


@flow(name="traces")
def traces(params_file: str = str(paths.PARAMS)) -> None:
    params: Params = config.load(params_file)
    sources = params.sft.traces
    logged = {
        "seed": params.seed,
        "sft.traces": [s.model_dump() for s in sources],
        "format": params.format.model_dump(),
    }
    loaded: dict[str, Generator] = {}

    def load(model: str) -> Generator:
        """'base' is the pipeline's base checkpoint; anything else a teacher path or hub id (loaded once)."""
        if model not in loaded:
            loaded[model] = generation.load(paths.BASE if model == "base" else model, params.model, params.generation)
            tracking.tag_placement(loaded[model].device, loaded[model].dtype)
        return loaded[model]

    with tracking.stage_run("traces", params, logged, inputs={"train": paths.TRAIN}):
        stats = trace_sources.run(
            read_rows(paths.TRAIN),
            params.sft,
            params.format,
            derive(params.seed, "traces"),
            load,
            params.environment,
        )
        get_run_logger().info("SFT traces: %s", stats)
        tracking.log_dataset(paths.TRACES, "sft_traces", context="training")
        finish("traces", stats)


if __name__ == "__main__":
    main(traces, checks=CHECKS)
