"""The report stage's pages: every evaluated checkpoint side by side, the paired comparisons of
checkpoints (computed by rung.eval.comparisons) and the RL stages, as markdown and as HTML; the
tables themselves come from rung.report.tables and rung.report.episode_tables."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rung import files, paths
from rung.answers import formats
from rung.eval.results import Comparisons, EvalResult
from rung.report import episode_tables, htmlpage, tables
from rung.rl import gold

# The paired comparisons: a DVC metrics file of the report stage (next to report.md, outside
# data/metrics, which the stage depends on).
COMPARISONS = paths.REPORTS / "comparisons.json"
HEADLINE = paths.REPORTS / "headline.json"
"""The headline metrics under the MLflow parent run's keys (rung.report.keys): the DVC metrics file
`dvc exp show` is read by (docs/orchestration.md)."""


def rl_summary(stage: Any, metrics: Mapping[str, float]) -> dict[str, str]:
    """One RL stage's recipe and training signal, for the report."""
    ds = stage.dynamic_sampling
    return {
        "init": stage.init,
        "recipe": (
            f"{stage.algorithm}, {stage.preset or 'custom'}: {stage.loss_type} loss, "
            f"clip {stage.epsilon}/{stage.epsilon_high or stage.epsilon}, beta {stage.beta}"
            + (f", objective {stage.objective}" if stage.objective != "group_relative" else "")
            + (f" (lambda {stage.positive_weight})" if stage.objective == "w_reinforce" else "")
        ),
        "curriculum": stage.curriculum.type + (f" + dynamic sampling ({ds.max_rounds} rounds)" if ds else ""),
        "steps": (
            f"{metrics.get('steps', 0):.0f} x {stage.prompts_per_step} prompts x {stage.num_generations}, "
            f"lr {stage.learning_rate:g}"
        ),
        "zero-variance groups": (
            f"{metrics.get('frac_reward_zero_std', float('nan')):.2f} generated, "
            f"{metrics.get('frac_zero_std_trained', float('nan')):.2f} trained"
        )
        + (
            f"; {metrics.get('dropped_share', 0.0):.2f} of generated groups dropped, "
            f"{metrics.get('extra_generations', 0.0):.0f} extra completions"
            if ds
            else ""
        ),
        "last reward": f"{metrics.get('reward_last', float('nan')):.3f} trained on"
        + (
            f", {metrics['reward_generated_last']:.3f} all generated"
            if ds and "reward_generated_last" in metrics
            else ""
        ),
        "unscored (grader errors)": _unscored(stage, metrics),
    }


def learned_summary(metrics: Mapping[str, Any]) -> dict[str, str]:
    """A learned reward's row of the report from its stage's metrics file (reward_models-<name> or
    process_reward_models-<name>): what was held out, its accuracy there, the chance level, and the AUROC of its
    score against the verifier's grade (overall, then by difficulty bucket)."""
    held = metrics["heldout"]
    if "step_accuracy" in held:  # a process reward model
        return {
            "held out": f"{held['steps']:.0f} steps",
            "accuracy": f"step {tables.pct(held['step_accuracy'])}",
            "chance": f"{tables.pct(held['majority_accuracy'])} (majority label)",
            "AUROC": "—",
        }
    buckets = ", ".join(f"{b} {v:.2f}" for b, v in held.get("auroc_by_bucket", {}).items())
    accuracy = held.get("pairwise_accuracy")
    return {
        "held out": f"{held['heldout_pairs']} pairs",
        "accuracy": "—" if accuracy is None else f"pairwise {tables.pct(accuracy)}",
        "chance": "50%",
        "AUROC": f"{held['auroc']:.2f}" + (f" ({buckets})" if buckets else "") if "auroc" in held else "—",
    }


def _unscored(stage: Any, metrics: Mapping[str, float]) -> str:
    """Completions each reward's grader crashed on (rung.rl.rewards.Guarded: unscored, not wrong); the
    total alone for a metrics file written before the per-reward counts."""
    if not any(f"reward_errors/{name}" in metrics for name in stage.rewards):
        return f"{metrics.get('reward_errors', 0.0):.0f} in all"
    return ", ".join(f"{name} {metrics.get(f'reward_errors/{name}', 0.0):.0f}" for name in stage.rewards)


def paired_markdown(result: Comparisons) -> str:
    """The paired comparisons as a markdown section (also the MLflow artifact of the parent run)."""
    greedy, sampled = tables.paired_rows(result)
    greedy_header, sampled_header = tables.paired_headers(result)
    first, second = tables.paired_explanation(result)
    lines = [
        "## Paired comparisons",
        "",
        first,
        "",
        second,
        "",
        "Greedy accuracy:",
        "",
        *tables.md_table(greedy_header, greedy),
    ]
    if sampled:
        lines += [
            "",
            "Sampled (avg@n, pass@k at eval.samples.compare_k, pass@n):",
            "",
            *tables.md_table(sampled_header, sampled),
        ]
    first_answers = episode_tables.first_answer_rows(result)
    if first_answers:
        lines += ["", "First answers (episodes):", "", episode_tables.FIRST_ANSWER_NOTE, ""]
        lines += tables.md_table(greedy_header, first_answers)
    boundary_header, boundary = tables.boundary_table(result)
    if boundary:
        lines += ["", BOUNDARY_NOTE, "", *tables.md_table(boundary_header, boundary)]
    return "\n".join(lines) + "\n"


BOUNDARY_NOTE = (
    "Coverage: the share of prompts solved at least once in the n samples (pass@n). Solved by one only: "
    "prompts one checkpoint solves at least once and the other never does, the boundary RL can move; "
    "the exact McNemar test asks whether those counts lean one way more than chance would."
)
SPECTRUM_NOTE = (
    "pass@k (unbiased estimator, Chen et al. 2021) at every power of two up to n, with its {conf:g}% "
    "interval over prompts (of that checkpoint alone; Clopper-Pearson at the effective number of prompts, which "
    "holds at 0% and 100%), and coverage (solved at least once in n)."
)


def _confidence(evals: Mapping[str, EvalResult]) -> float:
    """The bootstrap confidence of the evals (the first checkpoint's; 0.95 where unrecorded)."""
    return (next(iter(evals.values())).bootstrap or {}).get("confidence", 0.95)


def _spectrum_note(evals: Mapping[str, EvalResult]) -> str:
    return SPECTRUM_NOTE.format(conf=100 * _confidence(evals))


def spectrum_markdown(evals: Mapping[str, EvalResult]) -> list[str]:
    """The pass@k spectrum of every checkpoint with samples, one table per eval set."""
    lines: list[str] = []
    for name in next(iter(evals.values())).sets:
        header, rows = tables.spectrum_table(evals, name)
        if rows:
            lines += ["", f"pass@k spectrum on {name}:", "", *tables.md_table(header, rows)]
    return ["", _spectrum_note(evals), *lines] if lines else []


def rerank_markdown(evals: Mapping[str, EvalResult]) -> list[str]:
    """Best-of-n and weighted majority beside maj@n and pass@n, when the evals reranked their samples."""
    header, rows = tables.rerank_table(evals)
    note = tables.RERANK_NOTE.format(conf=100 * _confidence(evals))
    return ["", "Best-of-n by learned rewards:", "", *tables.md_table(header, rows), "", note] if rows else []


Episode = tuple[str, list[tuple[str, str]]]
"""A whole episode as the report shows it: its title and (role, text) messages (episode_tables.episode_messages)."""

EPISODES_NOTE = (
    "Greedy episodes of each checkpoint in the environment (rung.eval.episodes): success within t turns is the "
    "share of episodes right by turn t (the multi-turn pass@k), the first answer the first one the episode "
    "states (retry: before any feedback; a tool environment: after the tool results it asked for); tool error "
    "rate per call; cut: stopped at max_turns while the environment would have gone on."
)
LEARNED_NOTE = (
    "Each learned reward on what its stage held out: a reward model's pairwise accuracy (the chosen completion "
    "scores higher) and AUROC of its score against the verifier's grade, by difficulty bucket; a process reward "
    "model's step accuracy against its Monte-Carlo labels, beside the majority label's (docs/reward_models.md)."
)
TRANSCRIPTS_NOTE = "Whole greedy episodes of the first held-out prompts, for each checkpoint."


def shown_episodes(checkpoints: list[str], count: int = episode_tables.EPISODE_PROMPTS) -> list[Episode]:
    """The greedy episodes of the first `count` held-out prompts of every checkpoint whose eval records carry
    episodes (data/eval/<ckpt>/test.jsonl), checkpoint by checkpoint; none without episodes."""
    out: list[Episode] = []
    for checkpoint in checkpoints:
        path = paths.EVAL / paths.checkpoint_slug(checkpoint) / "test.jsonl"
        if not path.is_file():
            continue
        for record in files.read_jsonl(path)[:count]:
            episode = record["samples"][0].get("episode")
            if episode is not None:
                title = f"{checkpoint}, prompt {record['id']}: " + (
                    "right" if record["samples"][0]["correct"] else "wrong"
                )
                out.append((title, episode_tables.episode_messages(episode)))
    return out


def episodes_markdown(evals: Mapping[str, EvalResult], shown: list[Episode]) -> list[str]:
    """The episode metrics per eval set and the whole episodes shown, each message fenced (its text raw)."""
    lines: list[str] = []
    for name in next(iter(evals.values())).sets:
        header, rows = episode_tables.episode_table(evals, name)
        if rows:
            lines += ["", f"Episodes on {name}:", "", *tables.md_table(header, rows)]
    if shown:
        lines += ["", TRANSCRIPTS_NOTE]
    for title, messages in shown:
        lines += ["", f"### {title}"]
        for role, text in messages:
            fence = "`" * max(3, 1 + max((len(r) for r in re.findall(r"`+", text)), default=0))
            lines += ["", f"{role}:", "", f"{fence}text", text, fence]
    return ["", "## Episodes", "", EPISODES_NOTE, *lines] if lines else []


def markdown(
    evals: Mapping[str, EvalResult],
    rl: Mapping[str, Mapping[str, str]] | None = None,
    compared: Comparisons | None = None,
    warnings: list[str] | None = None,
    shown: list[Episode] | None = None,
    learned: Mapping[str, Mapping[str, str]] | None = None,
) -> str:
    """A markdown table (checkpoints in pipeline order) plus the settings every number depends on; the
    learned rewards' held-out numbers (`learned_summary`) when the experiment trains any."""
    views = {name: tables.headline(m) for name, m in evals.items()}
    first = next(iter(evals.values()))
    n = next(iter(views.values()))["n"]
    sampling = ", ".join(f"{k}={v}" for k, v in sorted(first.sampling.items()))
    confidence = _confidence(evals)
    notes = [
        f"Held-out split: {n} prompts; headline decoding: {sampling}; "
        f"accuracy with its {100 * confidence:.0f}% Clopper-Pearson interval "
        "(of that checkpoint alone: whether two checkpoints differ is read from the paired comparisons, "
        "not from overlapping intervals)."
    ]
    if first.format is not None:  # metrics written before format.style existed have none
        notes.append(
            f"Answer format: style {first.format['style']} ({formats.STYLES[first.format['style']].description}), "
            f"{first.format['template']} template; "
            "accuracy reads the answer only where the style puts it, 'any format' also the last number, "
            "format rate is the style's strict check."
        )
    if first.samples:
        s = first.samples
        notes.append(
            f"avg@{s['n']}: {s['n']} samples per prompt at temperature {s['temperature']}, top_p {s['top_p']}."
        )
    rl_lines = ["", "RL stages:", "", *tables.md_table(*tables.rl_table(rl))] if rl else []
    learned_lines = (
        ["", "Learned rewards (held out):", "", *tables.md_table(*_learned_table(learned))] if learned else []
    )
    paired_lines = ["", paired_markdown(compared).rstrip("\n")] if compared and compared.comparisons else []
    warning_lines = ["", "Warnings (rung.health):", "", *(f"- {w}" for w in warnings)] if warnings else []
    return "\n".join(
        [
            "# rung results",
            "",
            *notes,
            "",
            *tables.md_table(*tables.checkpoint_table(views)),
            *spectrum_markdown(evals),
            *rerank_markdown(evals),
            *episodes_markdown(evals, shown or []),
            *paired_lines,
            *rl_lines,
            *learned_lines,
            *warning_lines,
            "",
        ]
    )


def _learned_table(learned: Mapping[str, Mapping[str, str]]) -> tables.Table:
    keys = list(next(iter(learned.values())))
    return ["learned reward", *keys], [[name, *(row[k] for k in keys)] for name, row in learned.items()]


def overoptimization(name: str, points: list[dict[str, float]]) -> htmlpage.Plot | None:
    """A stage on a learned reward: its proxy and the verifier's accuracy (gold) against the KL from the init."""
    xlabel, lines = gold.curve(points)
    if not lines:
        return None
    caption = (
        f"Over-optimization on {name}: the learned reward's mean score (proxy, its own units) and the verifier's "
        f"accuracy (gold, never trained on) of the completions of each logged step, against {xlabel.lower()} "
        "(Gao et al. 2023). Gold falling while the proxy rises is the policy exploiting the reward model."
    )
    return (
        f"plot-overoptimization-{name.replace('/', '-')}",
        lambda: htmlpage.band_plot(lines, xlabel, "score"),
        caption,
    )


def html(
    evals: Mapping[str, EvalResult],
    reward_curves: Mapping[str, list[dict[str, float]]],
    settings: Mapping[str, Any],
    path: Path,
    compared: Comparisons | None = None,
    warnings: list[str] | None = None,
    shown: list[Episode] | None = None,
    learned: Mapping[str, Mapping[str, str]] | None = None,
) -> None:
    """The self-contained HTML report (tables and inline SVG plots)."""
    # dpo and kto stages train on pairs sampled before training: no reward per step to plot
    rewarded = {name: points for name, points in reward_curves.items() if all("reward" in c for c in points)}
    curves = {name: [(int(c["step"]), c["reward"]) for c in points] for name, points in rewarded.items()}
    for name, points in rewarded.items():  # with dynamic sampling the reward of all generated groups differs
        if any(c.get("reward_generated", c["reward"]) != c["reward"] for c in points):
            curves[f"{name} (all generated)"] = [
                (int(c["step"]), c["reward_generated"]) for c in points if "reward_generated" in c
            ]
    extra = [
        htmlpage.Extra(f"spectrum-{name}", f"pass@k spectrum on {name}", *table, [_spectrum_note(evals)])
        for name in next(iter(evals.values())).sets
        if (table := tables.spectrum_table(evals, name))[1]
    ]
    extra += [
        htmlpage.Extra(f"episodes-{name}", f"Episodes on {name}", *table, [EPISODES_NOTE])
        for name in next(iter(evals.values())).sets
        if (table := episode_tables.episode_table(evals, name))[1]
    ]
    if (rerank := tables.rerank_table(evals))[1]:
        note = tables.RERANK_NOTE.format(conf=100 * _confidence(evals))
        extra.append(htmlpage.Extra("rerank", "Best-of-n by learned rewards", *rerank, [note]))
    if learned:
        extra.append(htmlpage.Extra("learned", "Learned rewards (held out)", *_learned_table(learned), [LEARNED_NOTE]))
    if compared and compared.comparisons:
        greedy, sampled = tables.paired_rows(compared)
        greedy_header, sampled_header = tables.paired_headers(compared)
        extra.append(
            htmlpage.Extra(
                "paired",
                "Paired comparisons: greedy accuracy (same prompts)",
                greedy_header,
                greedy,
                tables.paired_explanation(compared),
            )
        )
        first_answers = episode_tables.first_answer_rows(compared)
        if first_answers:
            extra.append(
                htmlpage.Extra(
                    "paired-first-answer",
                    "Paired comparisons: first answers of the episodes (same prompts)",
                    greedy_header,
                    first_answers,
                    [episode_tables.FIRST_ANSWER_NOTE],
                )
            )
        if sampled:
            extra.append(
                htmlpage.Extra(
                    "paired-sampled", "Paired comparisons: avg@n and pass@k (same prompts)", sampled_header, sampled, []
                )
            )
        boundary_header, boundary = tables.boundary_table(compared)
        if boundary:
            extra.append(
                htmlpage.Extra(
                    "boundary", "Coverage and the boundary (same prompts)", boundary_header, boundary, [BOUNDARY_NOTE]
                )
            )
    htmlpage.write(
        path,
        htmlpage.render(
            {name: tables.headline(m) for name, m in evals.items()},
            curves,
            title="rung results",
            settings=settings,
            extra=extra,
            warnings=warnings or (),
            sections=[htmlpage.episodes_section(shown, TRANSCRIPTS_NOTE)] if shown else [],
            plots=[plot for name, points in reward_curves.items() if (plot := overoptimization(name, points))],
        ),
    )


def run(
    evals: Mapping[str, EvalResult],
    curves: Mapping[str, list[dict[str, float]]],
    rl: Mapping[str, Mapping[str, str]],
    settings: Mapping[str, Any],
    compared: Comparisons | None = None,
    warnings: list[str] | None = None,
    learned: Mapping[str, Mapping[str, str]] | None = None,
) -> str:
    """The report stage: write the paired comparisons (DVC metrics file), the markdown and the HTML
    report at their layout paths; returns the markdown."""
    if compared is not None:
        files.write_json(COMPARISONS, compared.dump())
    shown = shown_episodes(list(evals))
    text = markdown(evals, rl, compared, warnings, shown, learned)
    settings = {**settings, **{f"rl/{name}": "; ".join(row.values()) for name, row in rl.items()}}
    with files.atomic_path(paths.REPORT) as tmp:
        tmp.write_text(text)
    with files.atomic_path(paths.HTML_REPORT) as tmp:
        html(evals, curves, settings, tmp, compared, warnings, shown, learned)
    return text
