"""Stage `report`: every checkpoint side by side, with paired comparisons (markdown, HTML, DVC
metrics files of the comparisons and of the headline numbers, Prefect artifact, MLflow: metrics
`paired/<new>-vs-<old>/<set>/...` of the report run; on the parent run the headline metrics, the
comparison tables and the report itself)."""

from __future__ import annotations

from typing import Any

import mlflow
from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows.stage import main
from rung import config, files, paths, tracking
from rung.config import PREFERENCE_ALGORITHMS
from rung.eval import comparisons
from rung.eval.results import EvalResult
from rung.report import health, keys, tables
from rung.report import pipeline as rep

CHECKS = ()
"""What this stage checks of params before any compute (flows.stage.main)."""


def _numeric(tree: Any) -> Any:
    """Booleans (significant or not) as 1/0, so that MLflow keeps them as metrics."""
    if isinstance(tree, dict):
        return {k: _numeric(v) for k, v in tree.items()}
    return int(tree) if isinstance(tree, bool) else tree


@flow(name="report")
def report(params_file: str = str(paths.PARAMS)) -> str:
    params = config.load(params_file)
    with tracking.stage_run("report", params, logged={"checkpoints": params.checkpoints}, inputs={}) as run:
        evals = {
            c: EvalResult.model_validate(files.read_json(paths.metrics(f"eval-{paths.checkpoint_slug(c)}")))
            for c in params.checkpoints
        }
        curves = {f"rl/{name}": files.read_json(paths.plot("rl", name)) for name in params.rl.stages}
        rl = {
            name: rep.rl_summary(s, files.read_json(paths.metrics(f"rl-{name}")))
            for name, s in params.rl.stages.items()
        }
        learned = {
            f"{section}/{name}": rep.learned_summary(files.read_json(paths.metrics(f"{section}-{name}")))
            for section in ("reward_models", "process_reward_models")
            for name in getattr(params, section)
        }
        # a DVC output is a function of its declared deps: the commit is on the MLflow runs (git.commit), not here
        settings = {"seed": params.seed, "model": params.model.source}
        boot = params.eval.bootstrap
        inits = {n: s.init for n, s in params.rl.stages.items()}
        episodic = comparisons.episode_trained(params)
        preference = [n for n, s in params.rl.stages.items() if s.algorithm in PREFERENCE_ALGORITHMS]
        pairs = comparisons.pairs(inits, episodic, preference)
        compare_k = params.eval.samples.compare_k if params.eval.samples else []
        compared = comparisons.comparisons(pairs, boot.confidence, boot.resamples, params.seed, compare_k)
        warnings = [
            w
            for path in sorted(paths.METRICS.glob("*.json"))
            if isinstance(m := files.read_json(path), dict)
            for w in health.warnings(path.stem, m)
        ]
        text = rep.run(evals, curves, rl, settings, compared, warnings, learned)
        headline = keys.headline_metrics(evals, compared, inits, comparisons.single_turn_controls(inits, episodic))
        files.write_json(rep.HEADLINE, headline)
        # The comparisons file is the stage's DVC metrics; the same numbers (significance as 0/1) on its MLflow run.
        tracking.log_metrics({k: _numeric(c.dump()["sets"]) for k, c in compared.comparisons.items()}, prefix="paired")
        mlflow.log_artifact(str(rep.COMPARISONS))
        mlflow.log_artifact(str(paths.REPORT))
        mlflow.log_artifact(str(paths.HTML_REPORT))
        parent = mlflow.get_run(run.info.run_id).data.tags.get("mlflow.parentRunId")
        if parent:
            (greedy, sampled), (greedy_header, sampled_header) = (
                tables.paired_rows(compared),
                tables.paired_headers(compared),
            )
            tracking.log_tables(
                parent,
                {"paired_greedy.json": (greedy_header, greedy), "paired_sampled.json": (sampled_header, sampled)},
            )
            client = mlflow.MlflowClient()
            client.log_text(parent, rep.paired_markdown(compared), "paired_comparisons.md")
            tracking.log_headlines(parent, headline)
            for path in (paths.REPORT, paths.HTML_REPORT):
                client.log_artifact(parent, str(path))
        create_markdown_artifact(
            markdown=text,
            key="rung-report",
            description="held-out results of every checkpoint, with paired comparisons",
        )
        print(text)
        print(f"(git commit {tracking.git_commit()[:12]}, tagged git.commit on the MLflow runs)")
    return text


if __name__ == "__main__":
    main(report, checks=CHECKS)
