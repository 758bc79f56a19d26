"""Stage `eval_*`: one checkpoint on the held-out split and every extra eval set.

Outputs (written by rung.eval.evaluate.run): per-sample records (data/eval/<ckpt>/), DVC plots (pass@k
and maj@k curves, accuracy by difficulty); this flow adds the DVC metrics file
(data/metrics/eval-<ckpt>.json) and logs its numbers to the stage's MLflow run under the same keys
for every checkpoint (`<set>/<metric>`: `test/accuracy`, `test/pass_at_4`), the checkpoint and its
init as tags and the settings as params, so MLflow's compare and chart views line checkpoints up.
"""

from __future__ import annotations

import sys

import mlflow
from prefect import flow

from flows.stage import finish, main, record_checkpoint
from rung import config, files, paths, tracking
from rung.checks.generation import backend
from rung.checks.models import chat_template
from rung.eval import evaluate
from rung.eval.results import EvalResult
from rung.report import keys
from rung.seeding import derive
from tasks import evaluate as evaluate_task
from tasks import generation

CHECKS = (chat_template, backend)
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
    with tracking.stage_run(f"eval@{slug}", params, logged, inputs={"model": model_dir, **set_paths}):
        seed = derive(params.seed, "eval")
        gen = generation.load(model_dir, params.model, params.generation)
        tracking.tag_placement(gen.device, gen.dtype)
        record_checkpoint(params, checkpoint)
        results = {
            name: evaluate_task.evaluate_set(gen, name, files.read_jsonl(path), params.format, params.eval, seed)
            for name, path in set_paths.items()
        }
        metrics = evaluate.run(checkpoint, results, set_paths, params.eval, params.format, seed)
        finish(f"eval-{slug}", metrics, keys.eval_metrics(EvalResult.model_validate(metrics)))
        mlflow.log_artifacts(str(paths.EVAL / slug), artifact_path="samples")


if __name__ == "__main__":
    main(eval_checkpoint, *sys.argv[1:2], checks=CHECKS)
