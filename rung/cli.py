"""The `rung` command line."""
from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markdown import Markdown

from rung import config, layout
from rung.errors import InputError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="rung: reproducible RL post-training for reasoning.")
console = Console()


@app.command()
def validate(params_file: Path = typer.Argument(layout.PARAMS, help="params file to check")) -> None:
    """Check a params file against the schema; one line naming the key on error (exit 2)."""
    try:
        params = config.load(params_file)
    except InputError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    console.print(f"{params_file}: ok ({len(params.curate.sources)} sources, checkpoints: {', '.join(params.checkpoints)})")


@app.command()
def table(report: Path = typer.Argument(layout.REPORT, help="report written by the report stage")) -> None:
    """Print the results table of the last pipeline run."""
    if not report.is_file():
        typer.echo(f"error: {report}: not found; run `dvc repro` first", err=True)
        raise typer.Exit(2)
    console.print(Markdown(report.read_text()))


if __name__ == "__main__":
    app()
