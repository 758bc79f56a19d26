"""Every table of the reports, in one place: the cells (percentages, signed points, p-values,
verdicts), the rows and headers of the pipeline report's tables (checkpoints, paired
comparisons, RL stages) and of a study page's (arms, paired tests between arms), the words under
them, and markdown tables. rung.report.pipeline and rung.report.studypage lay these out as
markdown and HTML (rung.report.htmlpage); the numbers come typed from rung.eval.results."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rung.eval.results import ArmsTest, Comparison, Comparisons, EvalResult, GreedyTest, SeedTest, Spread, StudyResult

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


# ---- a study page ----


def _pm(s: Spread, as_pct: bool) -> str:
    """'mean ± sd' (in % for rates, 1 decimal; else 3 decimals); only the mean for one seed."""
    scale, fmt = (100, ".1f") if as_pct else (1, ".3f")
    return f"{scale * s.mean:{fmt}}" + (f" ± {scale * s.sd:{fmt}}" if s.sd is not None else "")


def arm_table(result: StudyResult) -> Table:
    """The per-arm table: mean ± sd over seeds (accuracies and rates in %), the per-seed held-out accuracy."""
    metrics = next(iter(result.arms.values())).metrics
    sets = list(dict.fromkeys(k.split("/")[0] for k in metrics if not k.startswith("rl/")))
    samples = sorted(k.split("/", 1)[1] for k in metrics if k.startswith("test/avg@"))
    cols = [("test/accuracy", "held-out accuracy %", True)]
    cols += [(f"{s}/accuracy", f"{s} accuracy %", True) for s in sets if s != "test"]
    cols += [("test/format_rate", "format rate %", True), ("test/mean_tokens", "mean tokens", False)]
    cols += [(f"test/{k}", f"{k} %", True) for k in samples]
    cols += [
        ("rl/reward_last", "last reward", False),
        ("rl/frac_reward_zero_std", "zero-variance groups generated", False),
        ("rl/frac_zero_std_trained", "zero-variance groups trained", False),
    ]
    cols = [c for c in cols if c[0] in metrics]
    header = ["arm", "seeds", *(title for _, title, _ in cols), "held-out accuracy per seed %"]
    rows = []
    for arm, a in result.arms.items():
        m = a.metrics
        rows.append(
            [
                arm,
                str(len(a.seeds)),
                *(_pm(m[k], as_pct) for k, _, as_pct in cols),
                ", ".join(f"{100 * v:.1f}" for v in m["test/accuracy"].values),
            ]
        )
    return header, rows


def arms_test_table(result: StudyResult) -> Table:
    """The paired tests between arms, one row per pair and eval set: the procedure's verdict (over seeds)
    first, then the test over prompts about these checkpoints."""
    header = [
        *PAIR,
        "seeds",
        "units",
        "accuracy old → new",
        f"difference, points [{100 * result.confidence:g}% CI]",
        "per-seed differences",
        "t-test over seeds p (Holm-adjusted)",
        "verdict (the training procedure)",
        "prompts better / worse",
        "test over prompts p (Holm-adjusted)",
        "verdict about these checkpoints",
    ]
    rows = [
        [
            pair,
            name,
            str(len(g.seeds)),
            f"{g.units} prompts ({g.rows} rows)",
            f"{pct(g.accuracy_old)} → {pct(g.accuracy_new)}",
            interval(g.difference, g.ci_low, g.ci_high),
            ", ".join(signed_points(v) for v in g.per_seed_difference.values()),
            seed_p(g.procedure),
            seed_verdict(g.procedure),
            f"{g.units_better} / {g.units_worse}",
            p_text(g.p),
            verdict(g),
        ]
        for pair, name, g in per_set(result.comparisons)
    ]
    return header, rows


def study_explanation(result: StudyResult) -> list[str]:
    """What the per-arm table and the tests between arms mean, in words."""
    conf, alpha = result.confidence, result.level
    return [
        f"Mean ± sd over seeds (seeds at params key {result.seed_key}). "
        "The curves show training reward and training-batch "
        "accuracy per step, and held-out greedy accuracy at step 0 (the checkpoint RL starts from), every "
        "rl.stages.<name>.eval_every steps when the stage sets it, and at the last step.",
        "Paired comparisons: each later arm against each earlier one, on the same prompts in each seed. "
        "Difference: new minus old accuracy over all (seed, prompt) rows, in points, with its "
        f"{100 * conf:g}% paired bootstrap interval ({result.resamples} resamples of the prompt clusters, widened "
        f"for small samples: the expanded percentile interval; {BAND_NOTE}). "
        "The verdict is about the training procedure, and its unit is the seed, since whole checkpoints vary "
        "from run to run: the paired t-test over the seeds' accuracies (same seed index paired; scipy "
        "ttest_rel), on these prompts. The sign-flip permutation test over prompt clusters (a cluster: a prompt "
        "with its rows in every seed that answered it; exact up to 12 prompts, random flips above) holds the seeds "
        "run fixed: its verdict is about these checkpoints, not about a rerun. Each of the two p is Holm-adjusted "
        f'over every pair of arms and eval set of the page (one family each). "Not significant at {alpha:g}" '
        'does not mean the arms are equal; "post-hoc: about N seeds" (or prompts): the seeds at which this mean '
        "difference would be significant at the family's strictest level with 80% power (the noncentral t, "
        "rung.eval.paired.units_needed; for prompts, rung.eval.paired.mcnemar_prompts_needed), a restatement "
        "of the observed effect, not a plan.",
    ]


def study_spectrum_table(result: StudyResult, set_name: str) -> Table:
    """Per arm (and the init checkpoint): pass@k at every k of the spectrum, mean over seeds with the
    band over prompt clusters (metrics.share_interval), and coverage mean ± sd over seeds."""
    arms = result.spectrum.get(set_name, {})
    ks = sorted({int(p[0]) for points in arms.values() for p in points})
    header = ["arm", *(f"pass@{k} %" for k in ks), "coverage %"]
    rows = []
    for arm, points in arms.items():
        by_k = {int(p[0]): p for p in points}
        cells = [
            f"{100 * by_k[k][1]:.1f} [{100 * by_k[k][2]:.1f}, {100 * by_k[k][3]:.1f}]" if k in by_k else "—" for k in ks
        ]
        rows.append([arm, *cells, _pm(result.coverage[set_name][arm], True)])
    return header, rows


def claims_table(result: StudyResult) -> Table:
    """One row per claim, arm, eval set and k: the difference with its band, the tests, the verdict and
    what the study's reference effect would need."""
    effect = signed_points(result.definition.get("reference_effect", 0.05)).lstrip("+")
    header = [
        "claim",
        "arm vs",
        "eval set",
        "k",
        "pass@k old → new %",
        f"difference, points [{100 * result.confidence:g}% band, {UNCALIBRATED}]",
        "per-seed differences",
        "t-test over seeds p (Holm-adjusted)",
        "verdict at this k (the test over seeds)",
        "claim's verdict",
        "prompts better / worse",
        "prompt-level p (max-T over k, Holm-adjusted)",
        "about these checkpoints (prompt level)",
        f"prompts needed for {effect} points",
        f"seeds needed for {effect} points",
    ]
    rows = []
    for c in result.claims:
        for t in c.tests:
            g = t.test
            rows.append(
                [
                    c.claim,
                    f"{c.new} vs {c.old}",
                    c.eval_set,
                    str(t.k),
                    f"{100 * g.accuracy_old:.1f} → {100 * g.accuracy_new:.1f}",
                    interval(g.difference, g.ci_low, g.ci_high),
                    ", ".join(signed_points(v) for v in g.per_seed_difference.values()),
                    seed_p(g.procedure),
                    f"{t.verdict} ({g.procedure.test})",
                    c.verdict,
                    f"{g.units_better} / {g.units_worse}",
                    p_text(g.p),
                    f"{t.checkpoints or '—'} ({g.test})",
                    str(t.prompts_needed_reference or "—"),
                    str(t.seeds_needed_reference or "—"),
                ]
            )
    return header, rows


def spectrum_explanation(result: StudyResult) -> list[str]:
    """What the spectrum and claims tables mean, in words."""
    conf = 100 * result.confidence
    return [
        "pass@k: the unbiased estimator (Chen et al. 2021) from the first n samples per prompt (n: the smallest "
        "count of the eval set), over all (seed, prompt) rows; in brackets its "
        f"{conf:g}% bootstrap interval over prompt clusters ({result.resamples} resamples, widened for small "
        "samples). Coverage: the share of prompts solved at least once in the n samples "
        "(= pass@n), mean ± sd over seeds. The init checkpoint (the one every arm starts from) is evaluated once.",
        "Claims: a claim is about the training procedure, so its verdict is a test whose unit is the seed: at "
        "each k the t-test of the per-seed differences new − old (pass@k at the common n of the two arms; "
        "against a checkpoint held fixed, e.g. the init, the one-sample t-test of the arm's per-seed differences "
        "from it, valid with that checkpoint taken as given; arm against arm, the paired t-test over seeds), "
        "Holm-adjusted over every k of every claim, arm and eval set. Verdict: reproduced when that p is below "
        "the level and the difference has the claimed sign, contradicted when below with the other sign, else "
        "inside the noise. A ≥ or ≤ claim is tested against its non-inferiority margin (the study's `margin`, "
        f"{signed_points(result.definition.get('margin', 0.0)).lstrip('+')} points): reproduced when the "
        "difference is shown above −margin (≥) or below +margin (≤), contradicted when shown beyond it. A claim "
        "over several k is contradicted when any k is, reproduced when every k is. Beside it, about these "
        "checkpoints (the seeds run held fixed): a unit is a prompt cluster (its pass@k in every seed that "
        f"answered it); the k of a claim share the {conf:g}% bootstrap band ({BAND_NOTE}) and the sign-flip "
        "test's max-T p, "
        "Holm-adjusted across the members, read the same way against 0. "
        "Prompts and seeds needed: a paired t-test at 80% power for the study's "
        "reference effect at the family's strictest level (the level over the members; over the members × k "
        "for seeds), by the noncentral t from the sd of the per-prompt and per-seed differences "
        "(rung.eval.paired.units_needed): a planning figure, not post-hoc power.",
    ]


# ---- episodes (an experiment with an environment: rung.eval.episodes) ----

EPISODE_PROMPTS = 3
"""Whole episodes the report shows: the first prompts of the held-out split, for each checkpoint."""


def episode_table(evals: Mapping[str, EvalResult], set_name: str) -> Table:
    """The greedy episodes' metrics of each checkpoint evaluated on `set_name` with episodes (SetMetrics.episodes):
    success within t turns for t = 1..max_turns, first-answer accuracy, mean turns, tool calls per episode, tool
    error rate, cut at max_turns. No rows without episodes."""
    found = {c: e for c, m in evals.items() if set_name in m.sets and (e := m.sets[set_name].episodes)}
    if not found:
        return [], []
    turns = sorted({t for e in found.values() for t in e["success_within"]}, key=int)
    header = ["checkpoint", "episodes", *(f"success within {t}" for t in turns), "first answer", "mean turns"]
    header += ["tool calls / episode", "tool error rate", "cut at max_turns"]

    def share(v: float | None) -> str:
        return "—" if v is None else pct(v)

    rows = [
        [
            checkpoint,
            str(e["episodes"]),
            *(share(e["success_within"].get(t)) for t in turns),
            share(e["first_answer_accuracy"]),
            f"{e['mean_turns']:.2f}",
            f"{e['tool_calls_per_episode']:.2f}",
            share(e["tool_error_rate"]),
            pct(e["cut_at_max_turns"]),
        ]
        for checkpoint, e in found.items()
    ]
    return header, rows


FIRST_ANSWER_NOTE = (
    "With episodes the greedy table compares the final answers; this one the first answers (the first one each "
    "episode states: retry's before any feedback), with the same exact McNemar test on the prompts whose first "
    "answer flipped. The final- and first-answer tests of a pair on a set are one family (same prompts, same "
    "checkpoints): their p (here and in the greedy table) are Holm-adjusted over the two, so that the pair's "
    'verdicts together say "different" by chance at most at the level; each verdict names its test.'
)


def first_answer_rows(result: Comparisons) -> list[list[str]]:
    """The paired comparisons' first-answer tests (GreedyTest.first_answer), as the greedy table's rows."""
    return [
        [
            label,
            name,
            str(f.n),
            f"{pct(f.accuracy_old)} → {pct(f.accuracy_new)}",
            interval(f.difference, f.ci_low, f.ci_high),
            str(f.right_to_wrong),
            str(f.wrong_to_right),
            mcnemar_p(f),
            verdict(f),
        ]
        for label, name, g in per_set(result.comparisons)
        if (f := g.first_answer) is not None
    ]


def episode_messages(episode: Mapping[str, Any]) -> list[tuple[str, str]]:
    """An episode's conversation as (role, text) pairs: each message's content and, for an assistant's tool
    calls, `name(arguments as JSON)`; the text is raw (the caller escapes or fences it). `episode` is an eval
    record's (rung.envs.trajectory.Trajectory dumped), read as JSON: its messages are all the report shows, and
    importing rung.envs would put torch and the environments' code in the report stage."""
    out = []
    for m in episode["messages"]:
        calls = [c.get("function", c) for c in m.get("tool_calls") or []]
        text = "\n".join(
            [
                *([str(m["content"])] if m.get("content") else []),
                *(f"→ {c['name']}({json.dumps(c.get('arguments'), ensure_ascii=False)})" for c in calls),
            ]
        )
        out.append((str(m["role"]), text))
    return out
