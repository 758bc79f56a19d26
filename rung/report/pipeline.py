"""The comparison of every evaluated checkpoint: headline rows, paired comparisons of
checkpoints (rung.eval.paired on the per-prompt eval records), markdown and HTML reports."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rung.answers import formats

# The paired comparisons: a DVC metrics file of the report stage (next to report.md, outside

from rung.report import htmlpage

from rung import files

from rung import paths

from rung.eval import paired
# data/metrics, which the stage depends on).
COMPARISONS = paths.REPORTS / "comparisons.json"

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
        "zero-variance groups": f"{metrics.get('frac_reward_zero_std', float('nan')):.2f} generated, {metrics.get('frac_zero_std_trained', float('nan')):.2f} trained"
        + (f"; {metrics.get('dropped_share', 0.0):.2f} of generated groups dropped, {metrics.get('extra_generations', 0.0):.0f} extra completions" if ds else ""),
        "last reward": f"{metrics.get('reward_last', float('nan')):.3f} trained on"
        + (f", {metrics['reward_generated_last']:.3f} all generated" if ds and "reward_generated_last" in metrics else ""),
    }


def pairs(rl_inits: dict[str, str]) -> list[tuple[str, str]]:
    """(new, old) checkpoints to compare: sft against base, every RL stage against the checkpoint it
    started from and against base; each pair once, in pipeline order."""
    out = [("sft", "base")]
    for name, init in rl_inits.items():
        out += [(f"rl/{name}", init), (f"rl/{name}", "base")]
    return list(dict.fromkeys(out))


def _records(checkpoint: str, name: str) -> list[dict[str, Any]] | None:
    path = paths.EVAL / paths.checkpoint_slug(checkpoint) / name
    return files.read_jsonl(path) if path.is_file() else None


def comparisons(pairs: list[tuple[str, str]], confidence: float, resamples: int, seed: int) -> dict[str, Any]:
    """Paired comparisons of each (new, old) pair on every eval set both were evaluated on, from
    the per-prompt records under data/eval: greedy accuracy (paired bootstrap, flips, exact
    McNemar) and, where both have samples, avg@n and pass@k (paired bootstrap)."""
    out: dict[str, Any] = {}
    for new, old in pairs:
        sets: dict[str, Any] = {}
        names = sorted(p.stem for p in (paths.EVAL / paths.checkpoint_slug(new)).glob("*.jsonl") if not p.stem.endswith(".samples"))
        for name in sorted(names, key=lambda n: (n != "test", n)):  # the held-out split first
            greedy_old, greedy_new = _records(old, f"{name}.jsonl"), _records(new, f"{name}.jsonl")
            if greedy_old is None or greedy_new is None:
                continue
            what = f"{new} vs {old} on {name}"
            sets[name] = paired.compare_greedy(greedy_old, greedy_new, confidence, resamples, seed, what)
            sampled_old, sampled_new = _records(old, f"{name}.samples.jsonl"), _records(new, f"{name}.samples.jsonl")
            if sampled_old and sampled_new:
                sets[name]["sampled"] = paired.compare_sampled(sampled_old, sampled_new, confidence, resamples, seed, f"{what} (samples)")
        out[paired.key(new, old)] = {"new": new, "old": old, "sets": sets}
    return {"level": paired.level(confidence), "confidence": confidence, "resamples": resamples, "seed": seed, "comparisons": out}


def signed_points(v: float) -> str:
    """A difference of fractions in percentage points, signed, with a true minus sign."""
    return f"{100 * v:+.1f}".replace("-", "−")


def p_text(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}" if p < 0.1 else f"{p:.2f}"


def headers(result: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Column names of the (greedy, sampled) paired tables."""
    diff = f"difference, points [{100 * result['confidence']:g}% CI]"
    return (["comparison (new vs old)", "eval set", "prompts", "accuracy old → new", diff, "right → wrong", "wrong → right", "exact McNemar p", "verdict"],
            ["comparison (new vs old)", "eval set", "prompts", "metric", "old → new", diff, "verdict"])


def comparison_rows(result: dict[str, Any]) -> tuple[list[list[str]], list[list[str]]]:
    """Display rows of the paired comparisons: (greedy accuracy rows, avg@n / pass@n rows)."""
    greedy, sampled = [], []
    for c in result["comparisons"].values():
        label = f"{c['new']} vs {c['old']}"
        for name, g in c["sets"].items():
            greedy.append([label, name, str(g["n"]), f"{100 * g['accuracy_old']:.1f}% → {100 * g['accuracy_new']:.1f}%",
                           f"{signed_points(g['difference'])} [{signed_points(g['ci_low'])}, {signed_points(g['ci_high'])}]",
                           str(g["right_to_wrong"]), str(g["wrong_to_right"]), p_text(g["mcnemar_p"]), g["verdict"] + paired.power_note(g)])
            s = g.get("sampled")
            if s:
                for metric in (f"avg@{s['samples']}", f"pass@{s['samples']}"):
                    m = s[metric]
                    sampled.append([label, name, str(s["n"]), metric, f"{100 * m['old']:.1f}% → {100 * m['new']:.1f}%",
                                    f"{signed_points(m['difference'])} [{signed_points(m['ci_low'])}, {signed_points(m['ci_high'])}]", m["verdict"]])
    return greedy, sampled


def explanation(result: dict[str, Any]) -> list[str]:
    """What the paired tables mean, in words."""
    conf, alpha = result["confidence"], result["level"]
    return [
        f"Each row compares two checkpoints on the same prompts. Difference: new minus old, in percentage points, with its "
        f"{100 * conf:g}% paired bootstrap interval ({result['resamples']} resamples of the prompts). "
        "Right → wrong and wrong → right count the prompts whose greedy answer changed grade; the exact McNemar test asks "
        "whether those flips lean one way more than chance would, and gives the verdict of the accuracy row. "
        f"For avg@n and pass@n the verdict is whether the {100 * conf:g}% paired interval excludes 0.",
        f"\"Not significant at {alpha:g}\" means these prompts do not establish a difference either way; "
        "it does not mean the checkpoints are equal. \"Needs about N prompts\": the number of prompts at which the exact "
        f"McNemar test would find the observed effect significant at {alpha:g} with 80% power, taking these flip rates as "
        "the truth (Connor 1987; rung.eval.paired.mcnemar_prompts_needed).",
    ]


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|", *("| " + " | ".join(r) + " |" for r in rows)]


def paired_markdown(result: dict[str, Any]) -> str:
    """The paired comparisons as a markdown section (also the MLflow artifact of the parent run)."""
    greedy, sampled = comparison_rows(result)
    greedy_header, sampled_header = headers(result)
    first, second = explanation(result)
    lines = ["## Paired comparisons", "", first, "", second, "", "Greedy accuracy:", "", *md_table(greedy_header, greedy)]
    if sampled:
        lines += ["", "Sampled (avg@n, pass@n):", "", *md_table(sampled_header, sampled)]
    return "\n".join(lines) + "\n"


def markdown(evals: dict[str, dict[str, Any]], rl: dict[str, dict[str, str]] | None = None, compared: dict[str, Any] | None = None,
             warnings: list[str] | None = None) -> str:
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
    notes = [f"Held-out split: {n} prompts; headline decoding: {sampling}; accuracy with its {100 * confidence:.0f}% bootstrap interval "
             "(of that checkpoint alone: whether two checkpoints differ is read from the paired comparisons, not from overlapping intervals)."]
    if "format" in first:  # metrics written before format.style existed have none
        notes.append(f"Answer format: style {first['format']['style']} ({formats.STYLES[first['format']['style']].description}), {first['format']['template']} template; "
                     "accuracy reads the answer only where the style puts it, 'any format' also the last number, format rate is the style's strict check.")
    if first.get("samples"):
        s = first["samples"]
        notes.append(f"avg@{s['n']}: {s['n']} samples per prompt at temperature {s['temperature']}, top_p {s['top_p']}.")
    rl_lines = []
    if rl:
        keys = list(next(iter(rl.values())))
        rl_lines = ["", "RL stages:", "", "| stage | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys),
                    *(f"| rl/{name} | " + " | ".join(row[k] for k in keys) + " |" for name, row in rl.items())]
    paired_lines = ["", paired_markdown(compared).rstrip("\n")] if compared and compared["comparisons"] else []
    warning_lines = ["", "Warnings (rung.health):", "", *(f"- {w}" for w in warnings)] if warnings else []
    return "\n".join(["# rung results", "", *notes, "", *lines, *paired_lines, *rl_lines, *warning_lines, ""])


def html(evals: dict[str, dict[str, Any]], reward_curves: dict[str, list[dict[str, float]]], settings: dict[str, Any], path: Path,
         compared: dict[str, Any] | None = None, warnings: list[str] | None = None) -> None:
    """The self-contained HTML report (tables and inline SVG plots)."""
    curves = {name: [(int(c["step"]), c["reward"]) for c in points] for name, points in reward_curves.items()}
    for name, points in reward_curves.items():  # with dynamic sampling the reward of all generated groups differs
        if any(c.get("reward_generated", c["reward"]) != c["reward"] for c in points):
            curves[f"{name} (all generated)"] = [(int(c["step"]), c["reward_generated"]) for c in points if "reward_generated" in c]
    tables = []
    if compared and compared["comparisons"]:
        greedy, sampled = comparison_rows(compared)
        greedy_header, sampled_header = headers(compared)
        tables.append(htmlpage.Extra("paired", "Paired comparisons: greedy accuracy (same prompts)", greedy_header, greedy, explanation(compared)))
        if sampled:
            tables.append(htmlpage.Extra("paired-sampled", "Paired comparisons: avg@n and pass@n (same prompts)", sampled_header, sampled, []))
    htmlpage.write(path, {name: headline(m) for name, m in evals.items()}, curves, title="rung results", settings=settings, extra=tables,
                      warnings=warnings or ())


def run(evals: dict[str, dict[str, Any]], curves: dict[str, list[dict[str, float]]], rl: dict[str, dict[str, str]], settings: dict[str, Any],
        compared: dict[str, Any] | None = None, warnings: list[str] | None = None) -> str:
    """The report stage: write the paired comparisons (DVC metrics file), the markdown and the HTML
    report at their layout paths; returns the markdown."""
    if compared is not None:
        files.write_json(COMPARISONS, compared)
    text = markdown(evals, rl, compared, warnings)
    settings = {**settings, **{f"rl/{name}": "; ".join(row.values()) for name, row in rl.items()}}
    with files.atomic_path(paths.REPORT) as tmp:
        tmp.write_text(text)
    with files.atomic_path(paths.HTML_REPORT) as tmp:
        html(evals, curves, settings, tmp, compared, warnings)
    return text
