"""Stage `report`: the comparison table of every checkpoint (markdown, Prefect artifact, MLflow)."""
from __future__ import annotations

import mlflow
from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows.stage import main
from rung import config, io, layout, report as rep, tracking


@flow(name="report")
def report(params_file: str = str(layout.PARAMS)) -> str:
    params = config.load(params_file)
    with tracking.stage_run("report", params, logged={"checkpoints": params.checkpoints}, inputs={}):
        evals = {c: io.read_json(layout.metrics(f"eval-{layout.checkpoint_slug(c)}")) for c in params.checkpoints}
        text = rep.markdown(evals, params.eval.sampling.model_dump())
        with io.atomic_path(layout.REPORT) as tmp:
            tmp.write_text(text)
        mlflow.log_text(text, "report.md")
        create_markdown_artifact(markdown=text, key="rung-report", description="held-out results of every checkpoint")
        print(text)
    return text


if __name__ == "__main__":
    main(report)
