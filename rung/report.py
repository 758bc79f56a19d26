"""The comparison of every evaluated checkpoint: headline rows, markdown and HTML reports."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rung import html_report, io, layout

COLUMNS = [
    ("accuracy", "held-out accuracy"),
    ("accuracy_lenient", "accuracy (any format)"),
    ("format_rate", "format rate"),
    ("mean_tokens", "mean tokens"),
    ("truncation_rate", "truncated"),
]


def headline(metrics: dict[str, Any]) -> dict[str, Any]:
    """The report's view of one eval metrics file: the held-out split's numbers, with the other
    eval sets' accuracy next to the per-source accuracy."""
    sets = metrics["sets"]
    extra = {f"{name} (eval set)": m["accuracy"] for name, m in sets.items() if name != "test"}
    return {**sets["test"], "accuracy_by_source": {**sets["test"]["accuracy_by_source"], **extra}, "sampling": metrics["sampling"]}


def _cell(key: str, m: dict[str, Any]) -> str:
    v = m[key]
    if key == "mean_tokens":
        return f"{v:.1f}"
    text = f"{100 * v:.1f}%"
    if key == "accuracy" and "accuracy_ci" in m:
        lo, hi = m["accuracy_ci"]
        text += f" [{100 * lo:.0f}, {100 * hi:.0f}]"
    return text


def rl_summary(stage: Any, metrics: dict[str, Any]) -> dict[str, str]:
    """One RL stage's recipe and training signal, for the report."""
    ds = stage.dynamic_sampling
    return {
        "init": stage.init,
        "recipe": f"{stage.algorithm}, {stage.preset or 'custom'}: {stage.loss_type} loss, clip {stage.epsilon}/{stage.epsilon_high or stage.epsilon}, beta {stage.beta}",
        "curriculum": stage.curriculum.type + (f" + dynamic sampling ({ds.max_rounds} rounds)" if ds else ""),
        "steps": f"{metrics.get('steps', 0):.0f} x {stage.prompts_per_step} prompts x {stage.num_generations}, lr {stage.learning_rate:g}",
        "zero-variance groups": f"{metrics.get('frac_reward_zero_std', float('nan')):.2f} generated, {metrics.get('frac_zero_std_trained', float('nan')):.2f} trained",
    }


def markdown(evals: dict[str, dict[str, Any]], rl: dict[str, dict[str, str]] | None = None, warnings: list[str] | None = None) -> str:
    """A markdown table (checkpoints in pipeline order) plus the settings every number depends on."""
    views = {name: headline(m) for name, m in evals.items()}
    sample_cols = sorted({k for v in views.values() for k in v if k.startswith("avg@")})
    header = ["checkpoint", *(title for _, title in COLUMNS), *sample_cols]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for name, v in views.items():
        cells = [name, *(_cell(key, v) for key, _ in COLUMNS), *(f"{100 * v[c]:.1f}%" if c in v else "—" for c in sample_cols)]
        lines.append("| " + " | ".join(cells) + " |")
    first = next(iter(evals.values()))
    n = next(iter(views.values()))["n"]
    sampling = ", ".join(f"{k}={v}" for k, v in sorted(first["sampling"].items()))
    confidence = first.get("bootstrap", {}).get("confidence", 0.95)
    notes = [f"Held-out split: {n} prompts; headline decoding: {sampling}; accuracy with its {100 * confidence:.0f}% bootstrap interval."]
    if first.get("samples"):
        s = first["samples"]
        notes.append(f"avg@{s['n']}: {s['n']} samples per prompt at temperature {s['temperature']}, top_p {s['top_p']}.")
    rl_lines = []
    if rl:
        keys = list(next(iter(rl.values())))
        rl_lines = ["", "RL stages:", "", "| stage | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys),
                    *(f"| rl/{name} | " + " | ".join(row[k] for k in keys) + " |" for name, row in rl.items())]
    warning_lines = ["", "Warnings (rung.health):", "", *(f"- {w}" for w in warnings)] if warnings else []
    return "\n".join(["# rung results", "", *notes, "", *lines, *rl_lines, *warning_lines, ""])


def html(evals: dict[str, dict[str, Any]], reward_curves: dict[str, list[dict[str, float]]], settings: dict[str, Any], path: Path, warnings: list[str] | None = None) -> None:
    """The self-contained HTML report (tables and inline SVG plots)."""
    curves = {name: [(int(c["step"]), c["reward"]) for c in points] for name, points in reward_curves.items()}
    html_report.write(path, {name: headline(m) for name, m in evals.items()}, curves, title="rung results", settings=settings, warnings=warnings or ())


def run(evals: dict[str, dict[str, Any]], curves: dict[str, list[dict[str, float]]], rl: dict[str, dict[str, str]], settings: dict[str, Any],
        warnings: list[str] | None = None) -> str:
    """The report stage: write the markdown and HTML reports at their layout paths; returns the markdown."""
    text = markdown(evals, rl, warnings)
    settings = {**settings, **{f"rl/{name}": "; ".join(row.values()) for name, row in rl.items()}}
    with io.atomic_path(layout.REPORT) as tmp:
        tmp.write_text(text)
    with io.atomic_path(layout.HTML_REPORT) as tmp:
        html(evals, curves, settings, tmp, warnings)
    return text
