"""The names rung's numbers go under in MLflow. One key per quantity: every checkpoint's eval run logs
`<set>/<metric>`, every RL stage `rl/<metric>`, so MLflow's compare and chart views line them up;
the parent run of an experiment holds the headline numbers, one key per checkpoint
(`eval/<ckpt>/test/...`, `paired/<rl>-vs-<init>/test/...`, `paired/<rl>-vs-<control>/test/...`)."""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from rung.eval.results import Comparisons, EvalResult, GreedyTest
from rung.files import flatten


def metric_name(key: str) -> str:
    """A dotted metrics-file key as an MLflow metric name: dots become '/', '@' becomes '_at_'
    (avg@4 -> avg_at_4), and any other character MLflow refuses becomes '_' (difficulty labels have
    '=' and ',')."""
    return re.sub(r"[^0-9A-Za-z_\-. :/]", "_", key.replace(".", "/").replace("@", "_at_"))


def metric_keys(metrics: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric leaves of a (nested) metrics dict as MLflow metrics `<prefix>/<key>`."""
    return {
        metric_name("/".join(filter(None, [prefix, k]))): float(v)
        for k, v in flatten(metrics).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


STAGE_DURATION = "stage/duration_s"
"""A stage run's wall time (rung.report.timings: from its process's start to its flow's end)."""


def stage_duration(stage: str) -> str:
    """The same on the parent run, one key per DVC stage: `duration_s/<stage>` (rl@main: duration_s/rl_at_main)."""
    return metric_name(f"duration_s/{stage}")


def eval_metrics(result: EvalResult) -> dict[str, float]:
    """An eval stage's numbers as MLflow metrics under the same keys for every checkpoint,
    `<set>/<metric>` (names as SetMetrics.flat gives them); its settings are params, not metrics."""
    return {k: v for name, m in result.sets.items() for k, v in metric_keys(m.flat(), name).items()}


def headline_metrics(
    evals: dict[str, EvalResult],
    compared: Comparisons,
    rl_inits: dict[str, str],
    controls: Collection[tuple[str, str]] = (),
) -> dict[str, float]:
    """The parent run's metrics, so that experiments compare on one row each: per checkpoint the
    held-out accuracy, avg@n and pass@k at the largest k (`eval/<ckpt>/test/...`), with episodes also
    `episodes/success_within_<max_turns>` and `episodes/first_answer_accuracy`; per RL stage the
    paired difference against its init with its interval and McNemar p (`paired/<rl>-vs-<init>/test/...`),
    and the same for each episode-trained stage against its single-turn control (`controls`:
    rung.eval.comparisons.single_turn_controls; `paired/<rl>-vs-<control>/test/...`); with episodes each pair
    also the first answers' difference and McNemar p (`.../test/first_answer/...`)."""
    out: dict[str, float] = {}
    for checkpoint, result in evals.items():
        test = result.sets["test"]
        keep = ["accuracy", *test.avg_at_n()]
        keep += [f"pass_at_{max(test.pass_at_k, key=int)}"] if test.pass_at_k else []
        flat = test.flat()
        if test.episodes:  # with an environment: success within max_turns and the first answer's accuracy
            within = max(test.episodes["success_within"], key=int)
            keep += [f"episodes.success_within_{within}", "episodes.first_answer_accuracy"]
            flat = flatten(flat)
        out |= metric_keys(
            {k: flat[k] for k in keep if flat[k] is not None}, f"eval/{checkpoint.replace('/', '-')}/test"
        )
    headlined = {(f"rl/{name}", init) for name, init in rl_inits.items()} | set(controls)
    for key, c in compared.comparisons.items():
        if (c.new, c.old) in headlined and "test" in c.sets:
            out |= paired_headline(f"paired/{key}/test", c.sets["test"])
    return out


def paired_headline(prefix: str, test: GreedyTest) -> dict[str, float]:
    """A headline pair's numbers on one eval set: the difference with its interval and the exact McNemar p
    of the final answers, and with episodes the first answers' difference and p (`<prefix>/first_answer/...`)."""
    out = {f"{prefix}/{k}": float(getattr(test, k)) for k in ("difference", "ci_low", "ci_high", "mcnemar_p")}
    if test.first_answer is not None:
        out |= {f"{prefix}/first_answer/{k}": float(getattr(test.first_answer, k)) for k in ("difference", "mcnemar_p")}
    return out
