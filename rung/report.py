"""The comparison table of every evaluated checkpoint."""
from __future__ import annotations

from typing import Any

COLUMNS = [
    ("accuracy", "held-out accuracy"),
    ("accuracy_lenient", "accuracy (any format)"),
    ("format_rate", "format rate"),
    ("mean_tokens", "mean tokens"),
    ("truncation_rate", "truncated"),
]


def rows(evals: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Table rows, one per checkpoint, in pipeline order (base, sft, rl stages)."""
    out = []
    for name, m in evals.items():
        cells = [name]
        for key, _ in COLUMNS:
            v = m[key]
            cells.append(f"{v:.1f}" if key == "mean_tokens" else f"{100 * v:.1f}%")
        out.append(cells)
    return out


def markdown(evals: dict[str, dict[str, Any]], sampling: dict[str, Any]) -> str:
    """A markdown report: the table plus the settings every number depends on."""
    header = ["checkpoint", *(title for _, title in COLUMNS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows(evals)]
    n = {m["n"] for m in evals.values()}
    settings = ", ".join(f"{k}={v}" for k, v in sorted(sampling.items()))
    return "\n".join(
        ["# rung results", "", f"Held-out split: {', '.join(map(str, sorted(n)))} prompts; sampling: {settings}.", "", *lines, ""]
    )
