"""The eval stages' schema: greedy and sampled decoding, the bootstrap and the extra eval sets."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rung.config.base import Section
from rung.config.common import SamplingParams
from rung.config.data import Source


class RerankParams(Section):
    """Learned rewards that rerank the n samples of each prompt (rung.eval.rerank): best-of-k (the answer of
    the highest-scored of the first k samples) and weighted maj@k (each answer's votes weighted by the sigmoid
    of its sample's score), at the spectrum's k, beside maj@k and pass@k on the same samples, with best-of-n
    against maj@n tested per prompt (exact McNemar). docs/reward_models.md (Best-of-N)."""

    reward_model: str | None = None
    """A reward model: a `reward_models` stage's name (its directory, which the eval stages then depend on) or
    a checkpoint directory; an ensemble scores by its members' mean."""
    process_reward_model: str | None = None
    """A process reward model: a `process_reward_models` stage's name or a checkpoint directory."""
    aggregate: Literal["min", "last", "mean"] = "min"
    """How a PRM's step scores (logits) make a sample's score: min, the weakest step ("Let's Verify Step by
    Step" and "Stop Summation" score a solution by it), last, or mean."""

    @model_validator(mode="after")
    def _one_at_least(self) -> RerankParams:
        if self.reward_model is None and self.process_reward_model is None:
            raise ValueError(
                "reward_model: name a reward model or a process_reward_model to rerank with (or drop rerank)"
            )
        return self


class SampledEvalParams(SamplingParams):
    """n samples per prompt for avg@n, pass@k (k = 1..n), maj@k (at the spectrum's k: powers of two, n
    and compare_k), the pass@k spectrum (a band over prompts at every power of two up to n,
    rung.eval.metrics.share_interval) and coverage (the share of prompts solved at least once)."""

    n: int = Field(4, ge=1)
    """Samples per prompt; pass@k is reported for every k <= n, maj@k at the spectrum's k."""
    max_prompts: int | None = Field(None, gt=0)
    """Sample only the first N prompts of each eval set (id order); None samples all."""
    compare_k: list[int] = [1]
    """k at which the report's paired comparisons test pass@k, besides avg@n and pass@n (= coverage)."""
    checkpoints: list[str] | None = None
    """Checkpoints that get the sampled evaluation ('base', 'sft', 'rl/<stage>'); None: all. Cost grows
    with n: a study of RL against its init can leave the base model out."""
    rerank: RerankParams | None = None
    """Best-of-n and weighted majority by a reward model and/or a PRM on the same samples; None: no reranking."""

    @model_validator(mode="after")
    def _k_within_n(self) -> SampledEvalParams:
        if any(not 1 <= k <= self.n for k in self.compare_k):
            raise ValueError(f"compare_k: every k must be within 1..n={self.n}, got {self.compare_k}")
        return self


class BootstrapParams(Section):
    resamples: int = Field(1000, ge=100)
    """Bootstrap resamples of the prompts (seeded) for the paired comparisons' intervals."""
    confidence: float = Field(0.95, gt=0, lt=1)
    """Interval coverage; 1 - confidence is the level of the paired tests' verdicts."""


class EvalParams(Section):
    sampling: SamplingParams = SamplingParams(temperature=0.0, max_new_tokens=48)
    """Headline decoding; greedy (temperature 0) by default, so the accuracy is deterministic."""
    samples: SampledEvalParams | None = SampledEvalParams()
    """Sampled decoding for avg@n / pass@k / maj@k; null skips it."""
    bootstrap: BootstrapParams = BootstrapParams()
    """Confidence of every interval (the headline accuracy's Clopper-Pearson interval, the pass@k bands, the
    paired comparisons' intervals) and the resamples of the paired comparisons' bootstrap."""
    sets: list[Source] = Field(default_factory=list)
    """Eval sets besides the held-out in-domain split ('test'): out-of-domain reasoning-gym
    tasks, benchmark files (GSM8K / MATH-500 / AIME style) or HF datasets. The curate stage
    writes them to data/curated/eval/<name>.jsonl and decontaminates train against them."""

    @model_validator(mode="after")
    def _set_names(self) -> EvalParams:
        names = [s.name for s in self.sets]
        if "test" in names or len(set(names)) != len(names):
            raise ValueError(f"sets: names must be unique and not 'test' (the held-out split): {names}")
        if self.samples is not None and self.samples.temperature == 0 and self.samples.n > 1:
            raise ValueError("samples.temperature: 0 (greedy) gives n identical samples; use temperature > 0")
        return self
