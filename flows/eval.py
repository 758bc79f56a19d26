"""Stage `eval_*`: one checkpoint on the held-out split and every extra eval set.

Outputs (written by rung.eval.evaluate.run): per-sample records (data/eval/<ckpt>/), DVC plots (pass@k
and maj@k curves, accuracy by difficulty); this flow adds the DVC metrics file
(data/metrics/eval-<ckpt>.json) and logs its numbers to the stage's MLflow run under the same keys
for every checkpoint (`<set>/<metric>`: `test/accuracy`, `test/pass_at_4`; with an `environment`, its
episodes' `test/episodes/...`; with eval.samples.rerank, `test/rerank/<reranker>/...`), the checkpoint and its
init as tags and the settings as params, so MLflow's compare and chart views line checkpoints up;
with the pass@k curve of every set as an SVG artifact and the stage's generation throughput
(tokens/s, MLflow only: it depends on the machine).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import mlflow
from prefect import flow, get_run_logger

from flows.stage import finish, main, record_checkpoint
from rung import config, paths, tracking
from rung.answers.rows import read_rows
from rung.checks.environments import environments
from rung.checks.generation import backend
from rung.checks.models import chat_template
from rung.checks.rerank import rerank as rerankers
from rung.eval import evaluate, rerank
from rung.eval.results import EvalResult, SetMetrics
from rung.report import htmlpage, keys
from rung.seeding import derive
from tasks import evaluate as evaluate_task
from tasks import generation

CHECKS = (chat_template, backend, environments, rerankers)
"""What this stage checks of params before any compute (flows.stage.main)."""


@flow(name="eval")
def eval_checkpoint(checkpoint: str, params_file: str = str(paths.PARAMS)) -> None:
    params = config.load(params_file)
    slug = paths.checkpoint_slug(checkpoint)
    model_dir = paths.checkpoint(checkpoint)
    set_paths = {name: paths.eval_set(name) for name in ["test", *(s.name for s in params.eval.sets)]}
    logged = {
        "seed": params.seed,
        "eval": params.eval.model_dump(exclude={"sets"}),
        "format": params.format.model_dump(),
        "checkpoint": checkpoint,
        "init": params.init_of(checkpoint),
    }
    rerankers = rerank.directories(params)  # their md5s tagged as the model's: what the reranked numbers read
    inputs = {"model": model_dir, **set_paths, **{f"rerank.{k}": d for k, d in rerankers.items()}}
    with tracking.stage_run(f"eval@{slug}", params, logged, inputs=inputs):
        seed = derive(params.seed, "eval")
        gen = generation.load(model_dir, params.model, params.generation)
        tracking.tag_placement(gen.device, gen.dtype)
        environment = None
        if params.environment:
            from rung import envs  # TRL's template tools: imported once the model is (tests/test_startup.py)

            environment = envs.check(params.environment, gen.tok, "environment")
        record_checkpoint(params, checkpoint)
        sampled = params.eval.samples and params.eval.samples.checkpoints
        eval_params = (
            params.eval if not sampled or checkpoint in sampled else params.eval.model_copy(update={"samples": None})
        )
        scorers = {}
        if eval_params.samples and eval_params.samples.rerank:
            scorers = rerank.load(eval_params.samples.rerank, rerankers, params.format, params.model.device)
        results, tokens, start = {}, 0, time.perf_counter()
        for name, path in set_paths.items():
            results[name] = evaluate_task.evaluate_set(
                gen, name, read_rows(path), params.format, eval_params, seed, environment, scorers
            )
            tokens += sum(s["tokens"] for records in results[name][:2] for r in records for s in r["samples"])
        seconds = time.perf_counter() - start
        get_run_logger().info(
            "eval %s: %d tokens generated in %.0f s: %.0f tokens/s", checkpoint, tokens, seconds, tokens / seconds
        )
        mlflow.log_metrics({"throughput/tokens": tokens, "throughput/tokens_per_s": tokens / seconds})
        metrics = evaluate.run(checkpoint, results, set_paths, eval_params, params.format, seed)
        finish(f"eval-{slug}", metrics, keys.eval_metrics(EvalResult.model_validate(metrics)))
        mlflow.log_artifacts(str(paths.EVAL / slug), artifact_path="samples")
        _log_pass_at_k_plots(results)


def _log_pass_at_k_plots(results: dict[str, tuple[list[Any], list[Any], SetMetrics]]) -> None:
    """The pass@k curve (with its band over prompts) of every sampled set: artifacts plots/pass_at_k-<set>.svg."""
    plots = [
        (f"pass_at_k-{name}", lambda name=name, m=m: htmlpage.pass_at_k_plot({name: m.dump()}), "")
        for name, (_, _, m) in results.items()
        if m.pass_at_k
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for path in htmlpage.save_figures(plots, Path(tmp)):
            mlflow.log_artifact(str(path), artifact_path="plots")


if __name__ == "__main__":
    main(eval_checkpoint, *sys.argv[1:2], checks=CHECKS)
