"""Over-optimization, measured: a stage trained on a learned reward (the proxy) also grades every completion with
the task's verifier (the gold grade, never trained on) and logs both per step: `rewards/gold/accuracy` and
`rewards/gold/proxy/<reward>` (the proxy's mean over the completions it scored, before any normalisation), beside
TRL's `kl` from the init (Gao et al. 2023 plot the two against it). `summary` condenses the curves for
rung.report.health's warning."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from statistics import mean
from typing import Any

from rung.answers.grading import grade
from rung.answers.rows import problem
from rung.config import FormatParams
from rung.rl.completions import text

PREFIX = "rewards/gold/"
GOLD = f"{PREFIX}accuracy"
PROXY = f"{PREFIX}proxy/"


def log(
    name: str,
    proxy: Sequence[float | None],
    completions: list[Any],
    fmt: FormatParams,
    log_metric: Callable[[str, float], None] | None = None,
    **columns: Any,
) -> None:
    """Log the batch's mean proxy score and its verifier accuracy through TRL's `log_metric`; a completion the
    grader fails on counts in neither side of the accuracy (unscored, as the accuracy reward leaves it)."""
    if log_metric is None:  # called outside a trainer (best-of-N, tests)
        return
    keys = ("answer", "task", "prompt_text", "meta")
    rows = [problem(dict(zip(keys, values, strict=True))) for values in zip(*(columns[k] for k in keys), strict=True)]
    graded = [grade(text(c), row, fmt).correct for c, row in zip(completions, rows, strict=True)]
    scored = [float(g) for g in graded if g is not None]
    if scored:
        log_metric(GOLD, mean(scored))
    proxied = [p for p in proxy if p is not None]
    if proxied:
        log_metric(f"{PROXY}{name}", mean(proxied))


def summary(curves: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Gold's and each proxy's mean over the first and the last third of the logged steps (`gold_first`,
    `gold_last`, `proxy/<reward>_first`, ...), and the last step's `kl`; empty without gold logs."""
    logged = [c for c in curves if GOLD in c]
    if len(logged) < 3:
        return {}
    third = len(logged) // 3
    out: dict[str, float] = {}
    for key in sorted({k for c in logged for k in c if k.startswith(PREFIX)}):
        name = "gold" if key == GOLD else f"proxy/{key.removeprefix(PROXY)}"
        values = [c[key] for c in logged if key in c]
        out[f"{name}_first"], out[f"{name}_last"] = mean(values[:third]), mean(values[-third:])
    if "kl" in logged[-1]:
        out["kl_last"] = logged[-1]["kl"]
    return out


def curve(points: Sequence[Mapping[str, float]]) -> dict[str, list[tuple[float, float]]]:
    """Gold and each proxy against the KL from the init, one (kl, value) a logged step: Gao et al. 2023's figure."""
    out: dict[str, list[tuple[float, float]]] = {}
    for c in points:
        if "kl" not in c:
            continue
        for key, value in c.items():
            if key.startswith(PREFIX):
                name = "gold (verifier)" if key == GOLD else f"proxy: {key.removeprefix(PROXY)}"
                out.setdefault(name, []).append((c["kl"], value))
    return out
