"""Side-by-side comparison of MLflow runs or DVC experiments (`rung compare`): the columns of
MLflow runs, and the table of any columns (DVC experiments come from tasks.dvc.experiments)."""

from __future__ import annotations

import fnmatch
from typing import Any

import mlflow
from rich.table import Table

Columns = dict[str, dict[str, Any]]


def mlflow_columns(run_ids: list[str], experiment: str, last: int, name_glob: str, parents: bool = False) -> Columns:
    """One column per MLflow run: its params and latest metrics. Without ids: the `last` most
    recent runs of `experiment` whose name matches `name_glob` (e.g. 'eval@*'), only parent runs
    (one per experiment: params and headline metrics) if `parents`."""
    if run_ids:
        runs = [mlflow.get_run(i) for i in run_ids]
    else:
        found = mlflow.search_runs(
            experiment_names=[experiment],
            filter_string="tags.`rung.role` = 'pipeline'" if parents else "",
            order_by=["attributes.start_time DESC"],
            output_format="list",
        )
        runs = [r for r in found if fnmatch.fnmatch(r.info.run_name or "", name_glob)][:last]
    return {
        f"{r.info.run_name} {r.info.run_id[:8]}": {
            **{f"param:{k}": v for k, v in r.data.params.items()},
            **r.data.metrics,
        }
        for r in runs
    }


def table(columns: Columns, pattern: str, all_rows: bool) -> Table:
    """Rows are keys matching `pattern` (glob); by default only those whose values differ."""
    keys = sorted({k for values in columns.values() for k in values if fnmatch.fnmatch(k, pattern)})
    if not all_rows and len(columns) > 1:
        keys = [k for k in keys if len({repr(v.get(k)) for v in columns.values()}) > 1]
    t = Table(show_lines=False)
    t.add_column("key", overflow="fold", min_width=min(max(map(len, keys), default=3), 40))  # keys stay readable
    for name in columns:
        t.add_column(name, justify="right", overflow="fold")
    for k in keys:
        t.add_row(k, *(_fmt(v.get(k)) for v in columns.values()))
    return t


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
