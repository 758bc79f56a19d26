"""A sweep: every point of a params grid as a DVC experiment, run by DVC's queue, compared.

Each point is queued with `dvc exp run --queue -n <name>-<i> -S ++key=value ...` and the queue is
run with `dvc exp run --run-all -j <jobs>` (DVC's queue workers, each experiment in a temporary
workspace under .dvc/tmp/exps that checks unchanged stages out of the shared DVC cache). DVC sets
DVC_ROOT to the main repo for queued experiments, so the default MLflow store stays
<repo>/mlflow.db: one parent run per experiment (tag `dvc.exp_name`), one child run per stage.
Results: `dvc exp show`, `rung compare --dvc`, and the table this flow prints and returns.

    python -m flows.sweep --grid '{"seed": [1, 2, 3], "rl.stages.main.preset": ["grpo", "dapo"]}'
    python -m flows.sweep --grid grid.yaml --jobs 1
"""

from __future__ import annotations

import argparse
import io
import itertools
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from rich.console import Console

from flows.stage import main
from rung import config, paths, preflight
from rung.checks import workspace
from rung.errors import InputError
from rung.report import runs_table
from tasks import dvc

CHECKS = (preflight.check, workspace.git_identity)
"""What this stage checks of params before any compute (flows.stage.main)."""


def load_grid(text: str) -> dict[str, list[Any]]:
    """A grid from JSON/YAML text or a YAML file: {dotted params key: [values]} (a scalar is one value)."""
    path = Path(text)
    data = yaml.safe_load(path.read_text() if path.suffix in {".yaml", ".yml", ".json"} and path.is_file() else text)
    if not isinstance(data, dict) or not data:
        raise InputError(f"grid: expected a mapping of params keys to lists of values, got {text!r}")
    return {str(k): v if isinstance(v, list) else [v] for k, v in data.items()}


def points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The cartesian product of the grid, first key varying slowest."""
    return [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]


def check(todo: dict[str, dict[str, Any]], params_file: str | Path = paths.PARAMS) -> dict[str, config.Params]:
    """The params of each experiment (name -> point), each checked against the schema and
    preflighted (an InputError naming the experiment and key); nothing is queued."""
    base = yaml.safe_load(Path(params_file).read_text())
    checked = {}
    for exp, point in todo.items():
        checked[exp] = config.parse(config.with_overrides(base, point), f"{params_file} with {exp} {point}")
        preflight.check(checked[exp])
    return checked


def experiments(
    grid: dict[str, list[Any]], prefix: str, params_file: str | Path = paths.PARAMS
) -> dict[str, dict[str, Any]]:
    """Experiment name -> grid point, each point checked against the params schema (ConfigError naming it)."""
    todo = {f"{prefix}-{i}": point for i, point in enumerate(points(grid), start=1)}
    check(todo, params_file)
    return todo


def run(todo: dict[str, dict[str, Any]], jobs: int) -> dict[str, dict[str, Any]]:
    """Queue one DVC experiment per (name, point), run the queue with `jobs` workers; their `dvc exp show` columns."""
    with dvc.workspace_lock():  # queuing stashes the workspace's params and git state
        for exp, point in todo.items():
            dvc.queue_experiment(exp, point)
    dvc.run_queue(jobs)
    return dvc.experiments(list(todo))


def comparison(results: dict[str, dict[str, Any]], keys: str = "*") -> str:
    """`rung compare --dvc` for the sweep's experiments: rows are the keys matching `keys` whose values differ."""
    out = io.StringIO()
    Console(file=out, width=200).print(runs_table.table(results, keys, all_rows=False))
    return out.getvalue()


@flow(name="sweep")
def sweep(
    grid: dict[str, list[Any]],
    name: str | None = None,
    jobs: int = 1,
    keys: str = "*",
    params_file: str = str(paths.PARAMS),
) -> dict[str, dict[str, Any]]:
    """Queue one DVC experiment per grid point, run the queue with `jobs` workers, compare."""
    log = get_run_logger()
    grid = {k: v if isinstance(v, list) else [v] for k, v in grid.items()}
    prefix = name or f"sweep-{datetime.now():%Y%m%d-%H%M%S}"
    todo = experiments(grid, prefix, params_file)  # every point is valid before anything is queued
    results = run(todo, jobs)
    table = comparison(results, keys)
    print(table)
    rows = "\n".join(
        f"| {exp} | {results.get(exp, {}).get('state', 'missing')} | {point} |" for exp, point in todo.items()
    )
    create_markdown_artifact(
        key="rung-sweep",
        description=f"sweep {prefix}",
        markdown=f"# sweep {prefix}\n\n| experiment | state | point |\n|---|---|---|\n{rows}\n\n```\n{table}\n```\n",
    )
    failed = [exp for exp in todo if results.get(exp, {}).get("state") != "success"]
    log.info("sweep %s: %d experiment(s), %d failed; table in artifact rung-sweep", prefix, len(todo), len(failed))
    if failed:
        raise RuntimeError(f"experiment(s) failed: {', '.join(failed)} (see `dvc queue logs <name>`)")
    return results


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flows.sweep", description=__doc__.splitlines()[0])
    parser.add_argument("--grid", required=True, help="JSON/YAML mapping or a .yaml file: {params key: [values]}")
    parser.add_argument("--name", help="experiment name prefix (default sweep-<date>-<time>)")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="experiments at a time (DVC queue workers)")
    parser.add_argument("--keys", default="*", help="glob over '<file>:<key>' rows of the table")
    args = parser.parse_args(argv)
    # load_grid inside the entry point so that a bad grid is one line and exit 2 too
    main(lambda: sweep(load_grid(args.grid), args.name, args.jobs, args.keys), checks=CHECKS)


if __name__ == "__main__":
    cli()
