"""Signs that an experiment is degenerate, one place for all of them: a stage's metrics are checked
when it finishes, and what is found is logged, tagged on its MLflow run and shown in the report."""

from __future__ import annotations

import fnmatch
from typing import Any

SFT_TRUNCATED = 0.2  # share of SFT examples cut by max_length (the answer line is often what is cut)
DIFFICULTY_ONE_SIDED = 0.9  # share of prompts solved by every rollout, or by none: no signal for RL
RL_ZERO_VARIANCE = 0.5  # mean share of generated groups whose rewards were all equal: no gradient from them
TRAINING_MOVED = 0.5  # share of the weights in the tensors training touched that changed since init
# RAGEN / StarPO's echo trap (multi-turn RL): the within-group reward std and the policy's entropy both fall, the
# policy repeating one pattern; flagged when both end at most this share of their level in the run's first third
ECHO_TRAP_DROP = 0.5


def warnings(stage: str, metrics: dict[str, Any]) -> list[str]:
    """What is wrong with the experiment, as the metrics of `stage` (a metrics file stem) show it."""
    out = []
    if stage == "sft" and metrics.get("truncated_fraction", 0) > SFT_TRUNCATED:
        out.append(
            f"sft: {metrics['truncated_fraction']:.0%} of SFT examples are longer than sft.max_length "
            "and were truncated"
        )
    if stage == "difficulty":
        for side in ("solved", "unsolved"):
            if metrics.get(f"{side}_fraction", 0) >= DIFFICULTY_ONE_SIDED:
                out.append(
                    f"difficulty: {metrics[f'{side}_fraction']:.0%} of prompts are {side} by every rollout: "
                    "little for RL to learn from"
                )
    if (stage == "sft" or fnmatch.fnmatch(stage, "rl-*")) and "weights_changed_share" in metrics:
        out += _barely_moved(stage, metrics)
    if fnmatch.fnmatch(stage, "rl-*") and metrics.get("frac_reward_zero_std", 0) > RL_ZERO_VARIANCE:
        out.append(
            f"{stage}: {metrics['frac_reward_zero_std']:.0%} of generated groups had zero reward variance (no gradient)"
        )
    if fnmatch.fnmatch(stage, "rl-*") and "entropy_first" in metrics:
        out += _echo_trap(stage, metrics)
    if fnmatch.fnmatch(stage, "rl-*") and "gold_first" in metrics:
        out += _overoptimized(stage, metrics)
    if fnmatch.fnmatch(stage, "eval-*"):
        for name, m in metrics.get("sets", {}).items():
            if m.get("format_rate") == 0:
                out.append(f"{stage}: the model never follows the answer format on {name} (format rate 0%)")
    return out


def _barely_moved(stage: str, metrics: dict[str, Any]) -> list[str]:
    """A trained checkpoint that is (nearly) its init: updates below the weights' precision (bf16
    weights), a learning rate too small, frozen parameters (rung.train.movement measures it)."""
    if metrics["weights_changed_share"] == 0:
        return [
            f"{stage}: no weight changed since init: the checkpoint is its init "
            "(frozen parameters or a zero learning rate?)"
        ]
    touched = metrics["weights_changed_share_touched"]
    if touched >= TRAINING_MOVED:
        return []
    return [
        f"{stage}: only {touched:.1%} of the weights in the trained tensors changed since init "
        f"(‖Δw‖/‖w‖ = {metrics['weights_relative_change']:.1e}): updates below the weights' precision "
        "(bf16 weights) or a learning rate too small"
    ]


def _overoptimized(stage: str, metrics: dict[str, Any]) -> list[str]:
    """A stage on a learned reward whose proxy rose while the verifier's accuracy (gold, never trained on) fell,
    first to last third of the steps (rung.rl.gold.summary): Gao et al. 2023's over-optimization."""
    g0, g1 = metrics["gold_first"], metrics["gold_last"]
    risen = [
        key.removeprefix("proxy/").removesuffix("_first")
        for key in metrics
        if key.startswith("proxy/")
        and key.endswith("_first")
        and metrics[key.replace("_first", "_last")] > metrics[key]
    ]
    if g1 >= g0 or not risen:
        return []
    return [
        f"{stage}: over-optimization: the verifier's accuracy fell from {g0:.1%} to {g1:.1%} while the learned "
        f"reward {', '.join(risen)} rose (first to last third of the steps): the policy exploits the reward model; "
        "fewer steps, a KL penalty (beta) or an ensemble (aggregate: min or mean_minus_std)"
    ]


def _echo_trap(stage: str, metrics: dict[str, Any]) -> list[str]:
    """An RL stage on episodes whose reward variance within groups and policy entropy collapsed together
    (rung.rl.episodes.summary: each curve's mean over the first and the last third of the steps)."""
    std0, std1 = metrics.get("reward_std_within_first"), metrics.get("reward_std_within_last")
    entropy0, entropy1 = metrics["entropy_first"], metrics.get("entropy_last")
    if std0 is None or std1 is None or entropy0 is None or entropy1 is None or not (std0 > 0 and entropy0 > 0):
        return []
    if std1 > ECHO_TRAP_DROP * std0 or entropy1 > ECHO_TRAP_DROP * entropy0:
        return []
    return [
        f"{stage}: echo trap: the reward's std within groups fell from {std0:.3f} to {std1:.3f} and the "
        f"policy's entropy from {entropy0:.3f} to {entropy1:.3f} (first to last third of the steps): the "
        "policy is collapsing onto repeated episodes (RAGEN's echo trap); fewer steps, a lower learning rate or "
        "a higher temperature, or dynamic_sampling to drop the groups without variance"
    ]
