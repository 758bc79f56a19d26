"""The `rung` command line (above the flows: it may start them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markdown import Markdown

from flows import credentials
from rung import config, paths, preflight
from rung.checks import rerank, usercode, workspace
from rung.errors import InputError, Unavailable
from rung.report import timings

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="rung: reproducible RL post-training for reasoning.",
    epilog="Guides: docs/index.md (every params key: docs/reference/params.md).",
)
console = Console()


def _project_importable() -> None:
    """Import user code (an environment class, a reward function) as the stages will: `python -m flows.<stage>`
    from the project root puts it first on sys.path, which the `rung` script does not."""
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))


@app.command(epilog="Guide: docs/pipeline.md (Validation before any compute); every key: docs/reference/params.md.")
def validate(params_file: Path = typer.Argument(paths.PARAMS, help="params file to check")) -> None:
    """Check a params file against the schema (params.yaml: every key dvc.yaml's stages read written out)
    and preflight it (sources, tasks, models, rewards, launch, the servers' credentials); one line naming
    the key or file on error (exit 2), or the server that does not answer (exit 75)."""
    try:
        params = config.load(params_file)
        workspace.dvc_params(params_file)
        _project_importable()
        preflight.check(params)
        usercode.listed(params_file, params)
        rerank.listed(params_file, params)
        workspace.warn_git_identity(params)
        credentials.check(params)
    except (InputError, Unavailable) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(Unavailable.exit_code if isinstance(e, Unavailable) else 2) from None
    console.print(
        f"{params_file}: ok ({len(params.curate.sources)} sources, checkpoints: {', '.join(params.checkpoints)})"
    )


@app.command(epilog="Guide: docs/results.md.")
def table(report: Path = typer.Argument(paths.REPORT, help="report written by the report stage")) -> None:
    """Print the results of the last pipeline run: every checkpoint, and the paired comparisons; then
    the wall time of each stage in the last run (ran, or cached: not rerun)."""
    if not report.is_file():
        typer.echo(f"error: {report}: not found; run `dvc repro` first", err=True)
        raise typer.Exit(2)
    console.print(Markdown(report.read_text()))
    # The workspace the report is in; its stage times are records beside it, not in it (rung.report.timings).
    ws = report.parents[len(paths.REPORT.parts) - 1] if report.as_posix().endswith(paths.REPORT.as_posix()) else None
    if ws is not None and (ws / timings.RUN).is_file():
        from tasks.dvc import stages_in_order  # DVC only here: the other commands stay light

        console.print(Markdown(timings.markdown(stages_in_order(ws), ws)))


@app.command(epilog="Guides: docs/mlflow.md (runs and experiments in MLflow), docs/evaluation.md (checkpoints).")
def compare(
    ids: list[str] = typer.Argument(
        None, help="MLflow run ids, or DVC experiment names with --dvc; none: the most recent"
    ),
    dvc: bool = typer.Option(False, "--dvc", help="compare DVC experiments (dvc exp show) instead of MLflow runs"),
    keys: str = typer.Option("*", "--keys", "-k", help="glob over param/metric keys, e.g. '*accuracy*'"),
    name: str = typer.Option(
        "eval@*",
        "--name",
        help="MLflow run-name glob when no ids are given; 'report' for the paired comparisons (keys paired/*)",
    ),
    last: int = typer.Option(3, "--last", help="how many recent MLflow runs when no ids are given"),
    parents: bool = typer.Option(
        False, "--parents", help="MLflow parent runs (one per experiment: params, headline metrics), any name"
    ),
    all_rows: bool = typer.Option(False, "--all", help="show keys whose values are equal too"),
    params_file: Path = typer.Option(paths.PARAMS, "--params", help="params file naming the MLflow store"),
) -> None:
    """Print MLflow runs or DVC experiments side by side (keys whose values differ).

    Experiments (one MLflow parent run each): `rung compare --parents --keys 'eval/*'`. Paired
    comparisons of checkpoints are metrics of the report run (MLflow) and of
    data/reports/comparisons.json (DVC): `rung compare --name report --keys 'paired/*test*'`,
    `rung compare --dvc --keys '*comparisons.json:*test*'`."""
    from mlflow.exceptions import MlflowException

    from rung import tracking
    from rung.report import runs_table
    from tasks.dvc import experiments

    try:
        if dvc:
            columns = experiments(ids or None)
        else:
            tracking.setup(config.load(params_file))
            experiment = config.load(params_file).tracking.experiment
            columns = runs_table.mlflow_columns(ids or [], experiment, last, "*" if parents else name, parents)
    except (InputError, MlflowException, subprocess.CalledProcessError) as e:
        typer.echo(f"error: {str(e).splitlines()[0]}", err=True)
        raise typer.Exit(2) from None
    if not columns:
        typer.echo("error: nothing to compare (no matching runs or experiments)", err=True)
        raise typer.Exit(2)
    console.print(runs_table.table(columns, keys, all_rows))


@app.command(epilog="Guide: docs/recipes.md.")
def run(
    recipe: Annotated[Path, typer.Argument(help="params file of the experiment, e.g. recipes/r1_zero.yaml")],
    sets: Annotated[
        list[str] | None,
        typer.Option(
            "--set", "-S", help="override KEY=VALUE (YAML value), repeatable: --set rl.stages.main.max_steps=50"
        ),
    ] = None,
    workdir: Annotated[
        Path | None, typer.Option("--dir", help="the run's own workspace (default runs/<recipe name>)")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="validate and write the workspace; run nothing")] = False,
) -> None:
    """Run an experiment from a params file in a workspace of its own (flows/run.py), then print its
    results table. The project's params.yaml and outputs are left as they are."""
    from flows import run as flows_run

    ws = workdir or flows_run.default_dir(recipe)
    _project_importable()
    try:
        code = flows_run.run(recipe, flows_run.overrides(sets or []), ws, dry_run)
    except InputError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if code:
        typer.echo(f"error: dvc repro failed in {ws} (exit {code})", err=True)
        raise typer.Exit(code)
    if dry_run:
        console.print(f"{ws}: ready (`cd {ws} && dvc repro`)")
    else:
        table(ws / paths.REPORT)


@app.command(epilog="Guide: docs/orchestration.md (Sweeps).")
def sweep(
    grid: Annotated[
        str,
        typer.Argument(
            help="JSON/YAML mapping {params key: list of values} or a .yaml file, e.g. '{\"seed\": [1, 2]}'"
        ),
    ],
    name: Annotated[
        str | None, typer.Option("--name", help="experiment name prefix (default sweep-<date>-<time>)")
    ] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="experiments at a time (DVC queue workers)")] = 1,
    keys: Annotated[str, typer.Option("--keys", "-k", help="glob over '<file>:<key>' rows of the comparison")] = "*",
) -> None:
    """Run every point of a params grid as a DVC experiment (flows/sweep.py) and compare them."""
    # The Prefect flow, imported here so that the other commands stay light.
    from flows import sweep as flows_sweep

    flows_sweep.cli(["--grid", grid, "--jobs", str(jobs), "--keys", keys, *(["--name", name] if name else [])])


@app.command(epilog="Guide: docs/orchestration.md (Seed studies).")
def study(
    definition: Annotated[
        Path,
        typer.Argument(help="study definition (YAML): name, seeds, seed_key, params, arms; e.g. bench/curriculum.yaml"),
    ],
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="experiments at a time (DVC queue workers)")] = 1,
    aggregate_only: Annotated[
        bool,
        typer.Option(help="run nothing: aggregate the experiments wherever they ran, with this commit's statistics"),
    ] = False,
    experiments_at: Annotated[
        str | None, typer.Option(help="with --aggregate-only: the commit the experiments ran at, when several")
    ] = None,
) -> None:
    """Run every arm for every seed as DVC experiments (flows/study.py), then write the study page
    (mean ± sd over seeds, paired tests between arms, learning curves) to data/studies/<name>/."""
    from flows import study as flows_study

    extra = ["--aggregate-only"] if aggregate_only else []
    extra += ["--experiments-at", experiments_at] if experiments_at else []
    flows_study.cli([str(definition), "--jobs", str(jobs), *extra])


@app.command(epilog="Guide: docs/orchestration.md (A team's servers).")
def serve(
    host: Annotated[str, typer.Option(help="address to bind; 0.0.0.0 for every interface")] = "127.0.0.1",
    name: Annotated[
        str | None, typer.Option(help="the name GPU nodes reach this host by (default: the host, or its FQDN)")
    ] = None,
    prefect_port: Annotated[int, typer.Option(help="Prefect API and UI port")] = 4200,
    mlflow_port: Annotated[int, typer.Option(help="MLflow tracking server port")] = 5000,
    state: Annotated[
        Path, typer.Option("--dir", help="databases, artifacts, logs and the 0600 credentials files")
    ] = Path("~/.rung/servers"),
    no_auth: Annotated[bool, typer.Option("--no-auth", help="no authentication (loopback only)")] = False,
    open_network: Annotated[
        bool,
        typer.Option("--allow-unauthenticated-network", help="with --no-auth: bind a non-loopback address anyway"),
    ] = False,
    tls_cert: Annotated[
        Path | None,
        typer.Option(help="HTTPS with this certificate (PEM, its chain after it), signed by a CA the nodes trust"),
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="the certificate's private key (PEM, mode 0600)")] = None,
    tls_self_signed: Annotated[
        bool,
        typer.Option(help="HTTPS with a CA generated into --dir (ca.pem), which client.env tells the nodes to trust"),
    ] = False,
    plain_http: Annotated[
        bool,
        typer.Option("--allow-plain-http", help="bind a non-loopback address without TLS (credentials in clear)"),
    ] = False,
) -> None:
    """Start the team's Prefect and MLflow servers with authentication (credentials generated on the
    first start, mode 0600) and, off loopback, HTTPS; print what each GPU node exports."""
    from flows import serve as team

    try:
        team.serve(
            host,
            prefect_port,
            mlflow_port,
            state.expanduser(),
            name,
            no_auth,
            open_network,
            tls_cert.expanduser() if tls_cert else None,
            tls_key.expanduser() if tls_key else None,
            tls_self_signed,
            plain_http,
        )
    except (InputError, RuntimeError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2 if isinstance(e, InputError) else 1) from None


if __name__ == "__main__":
    app()
