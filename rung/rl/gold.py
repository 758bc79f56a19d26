"""Over-optimization, measured: a stage trained on a learned reward (the proxy) also grades every completion with
the task's verifier (the gold grade, never trained on) and logs both per step: `rewards/gold/accuracy` and
`rewards/gold/proxy/<reward>` (the proxy's mean over the completions it scored, before any normalisation), beside
the `kl` from the init (TRL's, or with beta 0 rung.rl.kl_probe's; Gao et al. 2023 plot the two against it;
rung.rl.learned_rewards.log_gold logs them).
Here: their keys, `summary` of the curves for rung.report.health's warning, and `curve` for the report's plot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import mean

PREFIX = "rewards/gold/"
GOLD = f"{PREFIX}accuracy"
PROXY = f"{PREFIX}proxy/"


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


def curve(points: Sequence[Mapping[str, float]]) -> tuple[str, dict[str, list[tuple[float, float]]]]:
    """Gold and each proxy per logged step against the KL from the init (Gao et al. 2023's figure), or against the
    step where the stage logged no KL (a run from before the KL probe); (x label, curves)."""
    logged = [c for c in points if GOLD in c]
    x = "kl" if logged and all("kl" in c for c in logged) else "step"
    out: dict[str, list[tuple[float, float]]] = {}
    for c in logged:
        for key, value in c.items():
            if key.startswith(PREFIX):
                name = "gold: verifier accuracy" if key == GOLD else f"proxy: {key.removeprefix(PROXY)}"
                out.setdefault(name, []).append((c[x], value))
    return ("KL from the init" if x == "kl" else "training step"), out
