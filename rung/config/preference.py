"""The preference-optimization RL stages' settings (`rl.stages.<name>.preference`, algorithms dpo, kto and
online_dpo; docs/preference.md): where the pairs come from and TRL's DPO / KTO / online DPO loss settings, and
which of a stage's keys belong to which family."""

from __future__ import annotations

from pydantic import Field

from rung.config.base import Section
from rung.config.rewardmodels import PairSource, VerifierPairs

PREFERENCE_ALGORITHMS = ("dpo", "kto", "online_dpo")
"""Algorithms trained by rung.rl.preference rather than GRPOTrainer / RLOOTrainer."""
OFFLINE = ("dpo", "kto")
"""Algorithms that train on pairs sampled once, before training (`preference.pairs`)."""

# TRL 1.16's DPOConfig.loss_type values (its 'sft' term is `rpo_alpha`) and KTOConfig's.
DPO_LOSSES = (
    "sigmoid",
    "hinge",
    "ipo",
    "exo_pair",
    "nca_pair",
    "robust",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sigmoid_norm",
)
KTO_LOSSES = ("kto", "apo_zero_unpaired")
ONLINE_DPO_LOSSES = ("sigmoid", "ipo")

GRPO_CONFIG_FIELDS = (
    "num_generations",
    "num_iterations",
    "mask_truncated_completions",
    "beta",
    "loss_type",
    "epsilon",
    "epsilon_high",
    "scale_rewards",
    "importance_sampling_level",
    "top_entropy_quantile",
    "use_vllm",
    "vllm_mode",
    "vllm_server_base_url",
    "vllm_gpu_memory_utilization",
    "vllm_max_model_length",
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_max",
)
"""Stage keys that are GRPOConfig / RLOOConfig fields under the same name (rung.rl.trainers passes them through)."""
GRPO_ONLY = (
    "preset",
    *GRPO_CONFIG_FIELDS,
    "objective",
    "positive_weight",
    "dynamic_sampling",
    "overlong",
    "eval_every",
)
"""Stage keys of GRPOTrainer / RLOOTrainer that a preference stage refuses when set (its own are under
`preference`: beta and loss_type there are DPO's, not GRPO's KL coefficient and loss aggregation)."""
ROLLOUT_ONLY = ("rewards", "curriculum", "max_completion_length", "temperature", "top_p", "prompts_per_step")
"""Keys of stages that sample while training (grpo, rloo, online_dpo): dpo and kto train on pairs sampled before
(`preference.pairs.sampling`)."""


class PreferenceParams(Section):
    """A dpo, kto or online_dpo stage's own settings; the reference model is the stage's init."""

    pairs: PairSource = VerifierPairs()
    """dpo / kto: `{type: verifier, ...}` (the init model's own samples of the train prompts, graded by the
    verifier: right vs wrong of one prompt; samples_per_prompt, pairs_per_prompt, choose, max_prompts, sampling)
    or `{type: file, path: ...}` (prompt, chosen, rejected). kto trains on each pair's chosen as desirable and its
    rejected as undesirable. Unused by online_dpo, which samples while it trains."""
    beta: float = Field(0.1, gt=0)
    """DPO's / KTO's beta: the strength of the implicit KL to the reference (TRL's default 0.1)."""
    loss_type: str | None = None
    """TRL's loss: dpo sigmoid (default), ipo, hinge, robust, ... (DPOConfig.loss_type); kto kto (default) or
    apo_zero_unpaired; online_dpo sigmoid (default) or ipo."""
    rpo_alpha: float | None = Field(None, gt=0)
    """dpo: weight of the NLL term on the chosen completion (iterative RPO, Pang et al. 2024: 1.0); TRL 1.16 adds
    it as loss type 'sft' with this weight. null: off."""
    batch_size: int = Field(8, gt=0)
    """Pairs (dpo), examples (kto) or prompts (online_dpo: two completions each) per optimizer step over all
    processes."""
    max_length: int = Field(256, gt=0)
    """Token cap of prompt + completion (TRL truncates longer ones)."""


def check_family(algorithm: str, preference: PreferenceParams | None, changed: set[str]) -> None:
    """Refuse, naming the key, a setting of the other family: `preference` on a grpo / rloo stage, GRPO's keys
    set to other than their defaults (`changed`) on a preference stage, a loss type the algorithm's TRL trainer
    lacks."""
    if algorithm not in PREFERENCE_ALGORITHMS:
        if preference is not None:
            raise ValueError(f"preference: settings of algorithms {list(PREFERENCE_ALGORITHMS)}, not of {algorithm}")
        return
    grpo = sorted(k for k in GRPO_ONLY if k in changed)
    if grpo:
        raise ValueError(
            f"{grpo[0]}: a setting of the grpo / rloo trainers, not of algorithm {algorithm}"
            + (" (its own is preference." + grpo[0] + ")" if grpo[0] in ("beta", "loss_type") else "")
        )
    rollout = sorted(k for k in ROLLOUT_ONLY if k in changed) if algorithm in OFFLINE else []
    if rollout:
        raise ValueError(
            f"{rollout[0]}: a setting of stages that sample while training, not of algorithm {algorithm} "
            "(its samples: preference.pairs)"
        )
    if preference is None:
        return
    losses = {"dpo": DPO_LOSSES, "kto": KTO_LOSSES, "online_dpo": ONLINE_DPO_LOSSES}[algorithm]
    if preference.loss_type is not None and preference.loss_type not in losses:
        raise ValueError(f"preference.loss_type: {preference.loss_type!r} is not a {algorithm} loss {list(losses)}")
    if preference.rpo_alpha is not None and algorithm != "dpo":
        raise ValueError(f"preference.rpo_alpha: a dpo setting, not of algorithm {algorithm}")
    if algorithm == "online_dpo" and preference.pairs != VerifierPairs():
        raise ValueError("preference.pairs: online_dpo samples its pairs while it trains; remove it")
