"""The tables of the reports: the cells every table shares (percentages, signed points, p-values,
verdicts, intervals), the rows and headers of the pipeline report's tables (checkpoints, paired
comparisons, RL stages, stage timings), the words under them, and markdown tables. A study page's tables
are rung.report.study_tables', the episodes' rung.report.episode_tables'. rung.report.pipeline and
rung.report.studypage lay these out as markdown and HTML (rung.report.htmlpage); the numbers come typed from
rung.eval.results."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rung.eval.results import ArmsTest, Comparison, Comparisons, EvalResult, GreedyTest, SeedTest

Table = tuple[list[str], list[list[str]]]  # (header, rows)
PAIR = ["comparison (new vs old)", "eval set"]  # the first two columns of every paired table

# The checkpoint table: (key of the headline view, header).
COLUMNS = [
    ("accuracy", "held-out accuracy"),
    ("accuracy_lenient", "accuracy (any format)"),
    ("format_rate", "format rate"),
    ("mean_tokens", "mean tokens"),
    ("truncation_rate", "truncated"),
]


def per_set(comparisons: Mapping[str, Comparison[Any]]) -> Iterator[tuple[str, str, Any]]:
    """("new vs old", eval set, test) for every compared pair and eval set, in order."""
    for c in comparisons.values():
        for name, g in c.sets.items():
            yield f"{c.new} vs {c.old}", name, g


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def timing_table(rows: Sequence[tuple[str, str, float | None]]) -> Table:
    """A run's wall time per stage (rung.report.timings): status, seconds and share of the stages' total;
    a cached stage has neither; the last row is the total."""
    total = sum(s for _, _, s in rows if s is not None)
    body = [
        [stage, status, "" if s is None else f"{s:.1f} s", "" if s is None or not total else f"{100 * s / total:.0f}%"]
        for stage, status, s in rows
    ]
    return ["stage", "status", "wall time", "share"], [*body, ["all stages", "", f"{total:.1f} s", ""]]


def pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def signed_points(v: float) -> str:
    """A difference of fractions in percentage points, signed, with a true minus sign."""
    return f"{100 * v:+.1f}".replace("-", "−")


def p_text(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}" if p < 0.1 else f"{p:.2f}"


def interval(difference: float, low: float, high: float) -> str:
    """'+11.7 [+0.8, +25.0]': a difference in points with its interval."""
    return f"{signed_points(difference)} [{signed_points(low)}, {signed_points(high)}]"


def mcnemar_p(test: GreedyTest) -> str:
    """The McNemar p that gives the verdict: Holm-adjusted (marked) when the test is one of a family."""
    return p_text(test.mcnemar_p) if test.p_adjusted is None else f"{p_text(test.p_adjusted)} (Holm over 2)"


def seed_verdict(test: SeedTest) -> str:
    """The procedure's verdict and, when not significant, the post-hoc seeds: '; post-hoc: about N seeds at
    this effect'."""
    if test.significant or test.p is None:
        return test.verdict
    n = test.seeds_needed
    return test.verdict + (f"; post-hoc: about {n} seeds at this effect" if n else "; no effect to detect")


def seed_p(test: SeedTest) -> str:
    return "—" if test.p is None else p_text(test.p)


def verdict(test: GreedyTest | ArmsTest, unit: str = "prompts") -> str:
    """The verdict (naming its test) and, when not significant, the post-hoc size: '; post-hoc: about
    N prompts at this effect', or that the flips balance."""
    if test.significant:
        return test.verdict
    n = test.prompts_needed
    return test.verdict + (
        f"; post-hoc: about {n} {unit} at this effect" if n else "; the flips balance: no effect to detect"
    )


# ---- the pipeline report ----


def headline(metrics: EvalResult) -> dict[str, Any]:
    """The report's view of one eval metrics file: the held-out split's numbers, with the other
    eval sets' accuracy next to the per-source accuracy."""
    test = metrics.sets["test"]
    extra = {f"{name} (eval set)": m.accuracy for name, m in metrics.sets.items() if name != "test"}
    return {**test.dump(), "accuracy_by_source": {**test.accuracy_by_source, **extra}, "sampling": metrics.sampling}


def _cell(key: str, m: Mapping[str, Any]) -> str:
    v = m[key]
    if key == "mean_tokens":
        return f"{v:.1f}"
    text = pct(v)
    if key == "accuracy" and "accuracy_ci" in m:
        lo, hi = m["accuracy_ci"]
        text += f" [{100 * lo:.0f}, {100 * hi:.0f}]"
    return text


def checkpoint_table(views: Mapping[str, Mapping[str, Any]]) -> Table:
    """Checkpoints in pipeline order: the headline columns and avg@n of each."""
    sample_cols = sorted({k for v in views.values() for k in v if k.startswith("avg@")})
    header = ["checkpoint", *(title for _, title in COLUMNS), *sample_cols]
    rows = [
        [name, *(_cell(key, v) for key, _ in COLUMNS), *(pct(v[c]) if c in v else "—" for c in sample_cols)]
        for name, v in views.items()
    ]
    return header, rows


def rl_table(rl: Mapping[str, Mapping[str, str]]) -> Table:
    """One row per RL stage: its recipe and training signal (rung.report.pipeline.rl_summary)."""
    keys = list(next(iter(rl.values())))
    return ["stage", *keys], [[f"rl/{name}", *(row[k] for k in keys)] for name, row in rl.items()]


UNCALIBRATED = "uncalibrated near 0% and 100%"
"""The label of the paired bootstrap band (rung.eval.paired.intervals) wherever it is printed."""
BAND_NOTE = (
    "the band is uncalibrated near 0% and 100%: under a real effect there it covered 46% over k at 90% "
    "accuracy on 40 prompts × 8 samples, against 90% mid-range (tests/test_calibration_intervals.py); "
    "the verdicts come from the tests, not the band"
)


def paired_headers(result: Comparisons) -> tuple[list[str], list[str]]:
    """Column names of the (greedy, sampled) paired tables."""
    diff = f"difference, points [{100 * result.confidence:g}% CI]"
    return (
        [*PAIR, "prompts", "accuracy old → new", diff, "right → wrong", "wrong → right", "exact McNemar p", "verdict"],
        [*PAIR, "prompts", "metric", "old → new", diff.replace("CI", f"band, {UNCALIBRATED}"), "p (max-T)", "verdict"],
    )


def paired_rows(result: Comparisons) -> tuple[list[list[str]], list[list[str]]]:
    """Display rows of the paired comparisons: (greedy accuracy rows, avg@n / pass@n rows)."""
    greedy, sampled = [], []
    for label, name, g in per_set(result.comparisons):
        greedy.append(
            [
                label,
                name,
                str(g.n),
                f"{pct(g.accuracy_old)} → {pct(g.accuracy_new)}",
                interval(g.difference, g.ci_low, g.ci_high),
                str(g.right_to_wrong),
                str(g.wrong_to_right),
                mcnemar_p(g),
                verdict(g),
            ]
        )
        s = g.sampled
        if s:
            ks = [k for k in result.compare_k if k < s.samples]
            for metric in (f"avg@{s.samples}", *(f"pass@{k}" for k in ks), f"pass@{s.samples}"):
                m = s.metrics[metric]
                sampled.append(
                    [
                        label,
                        name,
                        str(s.n),
                        metric,
                        f"{pct(m.old)} → {pct(m.new)}",
                        interval(m.difference, m.ci_low, m.ci_high),
                        p_text(m.p),
                        m.verdict,
                    ]
                )
    return greedy, sampled


def boundary_table(result: Comparisons) -> Table:
    """Coverage (solved at least once in n samples) of each pair of checkpoints with samples, and the
    prompts one solves and the other never does (counts, exact McNemar p, the first few ids)."""
    header = [
        *PAIR,
        "prompts",
        "coverage old → new",
        "solved by old only",
        "solved by new only",
        "exact McNemar p",
        "e.g. (old only; new only)",
    ]
    rows = []
    for pair, name, g in per_set(result.comparisons):
        b = g.sampled.boundary if g.sampled else None
        if b is None:
            continue
        rows.append(
            [
                pair,
                name,
                str(g.sampled.n),
                f"{pct(b.coverage_old)} → {pct(b.coverage_new)}",
                str(len(b.solved_only_old)),
                str(len(b.solved_only_new)),
                p_text(b.mcnemar_p),
                f"{', '.join(b.solved_only_old[:3]) or '—'}; {', '.join(b.solved_only_new[:3]) or '—'}",
            ]
        )
    return header, rows


RERANK_NOTE = (
    "Best-of-n: the answer of each prompt's highest-scored sample; weighted maj@n: votes weighted by the sigmoid "
    "of each sample's score; both on the samples that give maj@n and pass@n. Best-of-n against maj@n: paired "
    "difference in points with its {conf:.0f}% Bonett-Price interval and the exact McNemar test "
    "(docs/reward_models.md, Best-of-N)."
)


def rerank_table(evals: Mapping[str, EvalResult]) -> Table:
    """Per checkpoint, eval set and reranker: maj@n, pass@n, best-of-n and weighted maj@n on the same samples, and
    best-of-n against maj@n (difference with its interval, McNemar p, verdict)."""
    header = ["checkpoint", "eval set", "reranker", "n", "maj@n", "pass@n", "best-of-n", "weighted maj@n"]
    header += ["best-of-n − maj@n (pts)", "McNemar p", "verdict"]
    rows = []
    for c, result in evals.items():
        for name, m in result.sets.items():
            for reranker, r in m.rerank.items():
                n = max(r.best_of_k, key=int)
                test = r.versus_maj
                rows.append(
                    [c, name, reranker, n, pct(m.maj_at_k[n]), pct(m.pass_at_k[n]), pct(r.best_of_k[n])]
                    + [pct(r.weighted_maj_at_k[n]), interval(test.difference, test.ci_low, test.ci_high)]
                    + [mcnemar_p(test), verdict(test)]
                )
    return header, rows


def spectrum_table(evals: Mapping[str, EvalResult], set_name: str = "test") -> Table:
    """pass@k at every k of the spectrum (with its band over prompts) and coverage, per checkpoint
    that has samples on `set_name`."""
    sampled = {c: m.sets[set_name] for c, m in evals.items() if set_name in m.sets and m.sets[set_name].pass_at_k}
    ks = sorted({int(k) for m in sampled.values() for k in (m.pass_at_k_band or m.pass_at_k)})
    header = ["checkpoint", *(f"pass@{k} %" for k in ks), "coverage %"]
    rows = []
    for c, m in sampled.items():
        cells = []
        for k in ks:
            v, band = m.pass_at_k.get(str(k)), m.pass_at_k_band.get(str(k))
            cells.append(
                "—"
                if v is None
                else f"{100 * v:.1f}" + (f" [{100 * band[0]:.1f}, {100 * band[1]:.1f}]" if band else "")
            )
        rows.append([c, *cells, "—" if m.coverage is None else f"{100 * m.coverage:.1f}"])
    return header, rows


def paired_explanation(result: Comparisons) -> list[str]:
    """What the paired tables mean, in words."""
    conf, alpha = result.confidence, result.level
    return [
        "Each row compares two checkpoints on the same prompts. Difference: new minus old, in percentage points, "
        f"with its {100 * conf:g}% paired interval (Bonett and Price's adjusted Wald interval from the flips, which "
        "holds near 0% and 100% and with few flips). "
        "Right → wrong and wrong → right count the prompts whose greedy answer changed grade; "
        "the exact McNemar test asks whether those flips lean one way more than chance would, and gives the "
        "verdict of the accuracy row. avg@n and pass@k at every k of a row's eval set are one family: their "
        f"interval is the {100 * conf:g}% paired bootstrap band over the family ({result.resamples} resamples of the "
        f"prompts; sup-t, widened for small samples: the expanded percentile interval; {BAND_NOTE}) and their "
        "verdict the sign-flip permutation test over prompts with the max-T statistic over the family (exact, "
        "all sign patterns, up to 12 prompts; random flips above), so that a verdict read at every k keeps "
        "the level. Each verdict names its test.",
        f'"Not significant at {alpha:g}" means these prompts do not establish a difference either way; '
        'it does not mean the checkpoints are equal. "Post-hoc: about N prompts at this effect": the number of '
        f"prompts at which the exact McNemar test would find the observed effect significant at {alpha:g} with 80% "
        "power, taking these flip rates as the truth (Connor 1987; rung.eval.paired.mcnemar_prompts_needed): "
        "computed from the observed effect, it restates the p-value, not what a planned study would need.",
    ]
