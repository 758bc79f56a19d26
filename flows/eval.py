"""Stage `eval_*`: one checkpoint on the held-out split and every extra eval set.

Outputs: per-sample records (data/eval/<ckpt>/), DVC metrics (data/metrics/eval-<ckpt>.json)
recording sampling settings, seed and the md5 of the model and of every eval set, DVC plots
(pass@k and maj@k curves, accuracy by difficulty), and the same in the stage's MLflow run.
"""
from __future__ import annotations

import sys

import mlflow
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
    set_paths = {name: layout.eval_set(name) for name in ["test", *(s.name for s in params.eval.sets)]}
    logged = {"seed": params.seed, "eval": params.eval.model_dump(exclude={"sets"}), "format": params.format.model_dump(), "checkpoint": checkpoint}
    with tracking.stage_run(f"eval@{slug}", params, logged, inputs={"model": model_dir, **set_paths}):
        seed = derive(params.seed, "eval")
        results = generation.evaluate_checkpoint(model_dir, {n: io.read_jsonl(p) for n, p in set_paths.items()}, params.format, params.eval, params.model.dtype, params.generation.backend, seed)
        out = layout.EVAL / slug
        with io.atomic_path(out) as tmp:
            tmp.mkdir()
            for name, (greedy, sampled, _) in results.items():
                io.write_jsonl(tmp / f"{name}.jsonl", greedy)
                if sampled:
                    io.write_jsonl(tmp / f"{name}.samples.jsonl", sampled)
        test = results["test"][2]
        io.write_json(layout.plot("accuracy_by_difficulty", slug), [{"difficulty": d, "accuracy": a} for d, a in test["accuracy_by_difficulty"].items()])
        curve = [{"k": int(k), "pass_at_k": v, "maj_at_k": test["maj_at_k"][k]} for k, v in test.get("pass_at_k", {}).items()]
        io.write_json(layout.plot("pass_at_k", slug), curve)  # empty without eval.samples
        metrics = {
            "checkpoint": checkpoint, "seed": seed, "model_md5": io.md5(model_dir),
            "data_md5": {n: io.md5(p) for n, p in set_paths.items()},
            "sampling": params.eval.sampling.model_dump(),
            "samples": params.eval.samples.model_dump() if params.eval.samples else None,
            "bootstrap": params.eval.bootstrap.model_dump(),
            "sets": {name: m for name, (_, _, m) in results.items()},
        }
        finish(f"eval-{slug}", metrics)
        mlflow.log_artifacts(str(out), artifact_path="samples")


if __name__ == "__main__":
    main(eval_checkpoint, *sys.argv[1:2])
