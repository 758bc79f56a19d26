"""Stage `report`: every checkpoint side by side (markdown, HTML, Prefect artifact, MLflow)."""
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
        curves = {f"rl/{name}": io.read_json(layout.plot("rl", name)) for name in params.rl.stages}
        rl = {name: rep.rl_summary(s, io.read_json(layout.metrics(f"rl-{name}"))) for name, s in params.rl.stages.items()}
        settings = {"seed": params.seed, "model": params.model.source, "git commit": tracking.git_commit()[:12]}
        warnings = [w for path in sorted(layout.METRICS.glob("*.json")) if isinstance(m := io.read_json(path), dict) for w in m.get("warnings", [])]
        text = rep.run(evals, curves, rl, settings, warnings)
        mlflow.log_artifact(str(layout.REPORT))
        mlflow.log_artifact(str(layout.HTML_REPORT))
        create_markdown_artifact(markdown=text, key="rung-report", description="held-out results of every checkpoint")
        print(text)
    return text


if __name__ == "__main__":
    main(report)
