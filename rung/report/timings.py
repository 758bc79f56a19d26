"""Where a pipeline run's time goes: each DVC stage's wall time, recorded when its flow ends
(flows.stage.main), and the table of a run's stages: ran or failed (seconds and share), or cached
(not rerun: up to date, or restored from DVC's cache).

Records, not outputs: they live in data/timings/ (git-ignored; neither a DVC out nor a dep) and in
MLflow (rung.tracking.log_duration). A wall time differs every run, so in a stage's metrics file or
in the report, DVC outs whose md5s dvc.lock records, it would break the byte-identical outputs the
README promises and put noise in `dvc metrics diff`; anywhere under data/metrics, the report's dep, it
would make the report stale after every stage.

A run is the process that began it (`begin`: flows.with_server.run under `make demo`, `make pipeline` and
`rung run`, and the pipeline flow) or, under a plain `dvc repro`, that dvc process, marked by the first
of its stages to end. A stage belongs to the marked run when the run's process is one of its ancestors.
A plain `dvc repro` that runs nothing marks nothing: the table stays the previous run's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psutil

from rung import files, paths
from rung.report import tables

RUN = paths.TIMINGS / "run.json"
"""The current run: its process ('<pid>-<start time>') and when that process started."""

Status = Literal["ran", "failed", "cached"]


@dataclass(frozen=True)
class Timing:
    """One stage's last run: from its process's start (imports included) to its flow's end."""

    stage: str
    started: float  # epoch seconds
    seconds: float
    status: Status
    run: str  # the run it belonged to (RUN's "run")


@dataclass(frozen=True)
class Summary:
    """A run's stages in pipeline order; when the run started (None: no run recorded here) and when its
    last stage ended (None: none ran)."""

    rows: list[tuple[str, Status, float | None]]  # (stage, status, seconds; None when cached)
    started: float | None
    ended: float | None
    peak: float | None = None  # the machine's fp32 matmul GFLOP/s, measured as the run began


def _ident(proc: psutil.Process) -> str:
    return f"{proc.pid}-{proc.create_time():.3f}"


def _path(stage: str, root: Path) -> Path:
    return root / paths.TIMINGS / f"{stage}.json"


def _lineage(proc: psutil.Process) -> set[str]:
    return {_ident(p) for p in (proc, *proc.parents())}


def begin(root: Path = Path("."), proc: psutil.Process | None = None) -> None:
    """Mark the start of a run in workspace `root`: the stages that `proc` (default: this process)
    starts, directly or not, belong to it; it started when `proc` did. Inside a run already marked
    (the pipeline flow under `make pipeline`'s flows.with_server), that outer run stays the run."""
    proc = proc or psutil.Process()
    marked = _run(root)
    if not marked or marked["run"] not in _lineage(proc):
        # The demo's time scales about inversely with this (README): each run says what its machine read.
        from rung.onednn import matmul_peak  # torch: only where a run begins

        run = {"run": _ident(proc), "started": proc.create_time(), "peak": round(matmul_peak(reps=3), 1)}
        files.write_json(root / RUN, run)


def _run(root: Path) -> dict[str, Any] | None:
    try:
        return files.read_json(root / RUN)
    except (OSError, ValueError):
        return None


def record(
    stage: str,
    status: Status,
    started: float,
    seconds: float,
    invocation: psutil.Process | None,
    root: Path = Path("."),
) -> Timing:
    """Record this process's stage: in the marked run when one of its ancestors began it, else in the
    run of `invocation` (the dvc process that started this one, or this process), which it marks."""
    me = psutil.Process()
    marked = _run(root)
    if not marked or marked["run"] not in _lineage(me):
        begin(root, invocation or me)
        marked = _run(root)
    assert marked is not None
    timing = Timing(stage, started, seconds, status, marked["run"])
    files.write_json(_path(stage, root), dataclasses.asdict(timing))
    return timing


def summary(stages: Sequence[str], root: Path = Path(".")) -> Summary:
    """The current run's table: each of `stages` (pipeline order) as ran / failed with its seconds, or
    cached when its last record is of an earlier run, or it has none."""
    marked = _run(root)
    rows: list[tuple[str, Status, float | None]] = []
    ends = []
    for stage in stages:
        try:
            timing = Timing(**files.read_json(_path(stage, root)))
        except (OSError, ValueError, TypeError):
            timing = None
        if marked and timing and timing.run == marked["run"]:
            rows.append((stage, timing.status, timing.seconds))
            ends.append(timing.started + timing.seconds)
        else:
            rows.append((stage, "cached", None))
    return Summary(
        rows, marked["started"] if marked else None, max(ends, default=None), marked.get("peak") if marked else None
    )


def markdown(stages: Sequence[str], root: Path = Path(".")) -> str:
    """The wall-time table of the current run as a markdown section; '' when no run is recorded here."""
    s = summary(stages, root)
    if s.started is None:
        return ""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.started))
    notes = [f"The run that started {when}; cached: not rerun (up to date, or restored from DVC's cache)."]
    if s.ended is not None:
        in_stages = sum(sec for _, status, sec in s.rows if sec is not None)
        notes.append(
            f"{s.ended - s.started:.1f} s from its start to its last stage's end, {in_stages:.1f} s of them in "
            "the stages; the rest: start-up, and DVC hashing and caching outputs between stages."
        )
    else:
        notes.append("Nothing ran: every stage was cached.")
    if s.peak is not None:
        notes.append(
            f"This machine's fp32 matmul peak read {s.peak:.0f} GFLOP/s as the run began (rung.onednn.matmul_peak): "
            "the stages' time scales about inversely with it (README, docs/benchmarks.md)."
        )
    return "\n".join(["## Wall time per stage", "", *notes, "", *tables.md_table(*tables.timing_table(s.rows)), ""])
