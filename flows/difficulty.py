"""Stage `difficulty`: pass rate of each train prompt under the base model; the filtered train set."""
from __future__ import annotations

from prefect import flow

from flows.stage import finish, main
from rung import config, io, layout, tracking
from rung import difficulty as diff
from rung.errors import InputError
from rung.seeding import derive
from tasks import generation


@flow(name="difficulty")
def difficulty(params_file: str = str(layout.PARAMS)) -> None:
    params = config.load(params_file)
    p = params.difficulty
    reference = layout.checkpoint(p.reference)
    logged = {"seed": params.seed, "difficulty": p.model_dump(), "format": params.format.model_dump(), "generation": params.generation.model_dump()}
    with tracking.stage_run("difficulty", params, logged, inputs={"model": reference, "train": layout.TRAIN}):
        rows = io.read_jsonl(layout.TRAIN)[: p.max_prompts]
        scores = generation.score_difficulty(reference, rows, params.format, p, params.model.dtype, params.generation.backend, derive(params.seed, "difficulty"))
        kept = diff.keep(scores, p)
        if not kept:
            raise InputError(f"difficulty: no prompt has a pass rate in [{p.pass_rate_min}, {p.pass_rate_max}]; widen the window")
        io.write_jsonl(layout.SCORES, scores)
        # Curricula and per-bucket RL metrics read each prompt's pass rate and bucket from here.
        by_id = {s["id"]: {"pass_rate": s["pass_rate"], "bucket": s["bucket"]} for s in scores}
        io.write_jsonl(layout.FILTERED, [{**r, **by_id[r["id"]]} for r in rows if r["id"] in kept])
        io.write_json(layout.plot("difficulty", "pass_rate"), diff.histogram(scores))
        finish("difficulty", diff.summarize(scores, len(kept)))


if __name__ == "__main__":
    main(difficulty)
