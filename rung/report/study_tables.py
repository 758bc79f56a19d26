"""A seed study's tables (rung.report.studypage lays them out): the arms' metrics over seeds, the paired tests
between arms, the pass@k spectrum and the claims, and the words under them; the cells are rung.report.tables'."""

from __future__ import annotations

from rung.eval.results import Spread, StudyResult
from rung.report.tables import (
    BAND_NOTE,
    PAIR,
    UNCALIBRATED,
    Table,
    interval,
    p_text,
    pct,
    per_set,
    seed_p,
    seed_verdict,
    signed_points,
    verdict,
)


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
