"""The learned-reward stages' schema: a reward model (`reward_models.<name>`, Bradley-Terry on preference
pairs) and a process reward model (`process_reward_models.<name>`, per-step scores from Monte-Carlo labels).
Both are mappings of named settings; the default, none, adds no stage to the pipeline."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from rung.config.base import Section
from rung.config.common import LaunchParams, SamplingParams

STAGE_NAME = r"^[A-Za-z0-9_-]+$"


class VerifierPairs(Section):
    """Pairs from the init model's own samples graded by the verifier: a right and a wrong completion of the same
    prompt (the prompts of the difficulty stage's train set)."""

    type: Literal["verifier"] = "verifier"
    """Selects verifier-graded pairs."""
    samples_per_prompt: int = Field(8, ge=2)
    """Completions sampled per prompt; a prompt needs a right and a wrong one to give a pair."""
    pairs_per_prompt: int = Field(2, ge=1)
    """Pairs taken from a prompt at most (fewer where it has fewer right x wrong combinations)."""
    choose: Literal["random", "all"] = "random"
    """random: `pairs_per_prompt` (right, wrong) combinations drawn without replacement (seeded); all: every
    combination, up to `pairs_per_prompt` in sample order (the first right with each wrong, ...)."""
    max_prompts: int | None = Field(256, gt=0)
    """Prompts sampled at most (the first of the difficulty stage's train set); null: all."""
    sampling: SamplingParams = SamplingParams(temperature=1.0, max_new_tokens=48)
    """How the completions are sampled; temperature > 0 gives right and wrong samples of one prompt."""

    @model_validator(mode="after")
    def _pairs(self) -> VerifierPairs:
        # k samples split into r right and k - r wrong give at most floor(k/2) * ceil(k/2) pairs.
        most = (self.samples_per_prompt // 2) * ((self.samples_per_prompt + 1) // 2)
        if self.pairs_per_prompt > most:
            raise ValueError(
                f"pairs_per_prompt: {self.pairs_per_prompt} pairs cannot come from {self.samples_per_prompt} samples "
                f"(at most {most}); raise samples_per_prompt or lower pairs_per_prompt"
            )
        if self.sampling.temperature == 0:
            raise ValueError("sampling.temperature: 0 samples one completion per prompt; a pair needs two (use > 0)")
        return self


class PreferenceFile(Section):
    """Pairs from a local JSON Lines file, a local dataset directory or a Hugging Face hub dataset (the same
    `datasets.load_dataset` call), with text columns prompt, chosen and rejected."""

    type: Literal["file"] = "file"
    """Selects a preference file or dataset."""
    path: str = Field(min_length=1)
    """A .jsonl file (relative to the repository root; add it to the stage's deps), a local dataset directory or
    a hub id ('org/name', needs network)."""
    split: str = "train"
    """The dataset split a directory or hub id is read from."""
    max_pairs: int | None = Field(None, gt=0)
    """Pairs read at most (the first); null: all."""


def _verifier_by_default(value: Any) -> Any:
    # `pairs: {samples_per_prompt: 4}` means verifier pairs, as `pairs:` left out does.
    return {"type": "verifier", **value} if isinstance(value, dict) and "type" not in value else value


PairSource = Annotated[
    VerifierPairs | PreferenceFile, Field(discriminator="type"), BeforeValidator(_verifier_by_default)
]


class _LearnedReward(Section):
    """What both learned-reward stages share: where they start, how they train, and the held-out share."""

    init: Literal["base", "sft"] = "sft"
    """The checkpoint the model starts from (a scalar head is added on it) and, for verifier pairs and step
    labels, the policy whose samples are graded."""
    max_steps: int = Field(40, gt=0)
    """Optimizer steps."""
    learning_rate: float = Field(1e-5, gt=0)
    """Peak learning rate of AdamW (linear decay). TRL's RewardConfig default is 1e-4; a head on a small
    model learns at 1e-5 without moving the backbone far."""
    per_device_train_batch_size: int = Field(8, gt=0)
    """Examples (pairs, or solutions) per process per forward pass."""
    max_length: int = Field(256, gt=0)
    """Token cap of prompt + completion; longer examples are dropped from training (TRL's RewardTrainer)."""
    heldout_fraction: float = Field(0.2, gt=0, lt=1)
    """Share of the prompts (or file pairs) kept out of training for the held-out metrics."""
    save_steps: int = Field(10, gt=0)
    """Checkpoint interval; rerunning an interrupted stage resumes from the last checkpoint."""
    seed: int | None = Field(None, ge=0)
    """Seed of the stage; null derives it from the global seed and the stage's name."""
    launch: LaunchParams = LaunchParams()
    """Processes and engine of the training job (one process by default)."""


class RewardModelParams(_LearnedReward):
    """A Bradley-Terry reward model (TRL's RewardTrainer: a sequence-classification model with one label, loss
    -log sigmoid(r(chosen) - r(rejected))). Its checkpoints are standard transformers sequence-classification
    directories (docs/reward_models.md)."""

    pairs: PairSource = VerifierPairs()
    """Where the preference pairs come from: `{type: verifier}` (the init model's graded samples) or
    `{type: file, path: ...}`."""
    ensemble: int = Field(1, ge=1)
    """Reward models trained on the same pairs with different seeds (Coste et al. 2023, "Reward Model Ensembles
    Help Mitigate Overoptimization"); the held-out metrics score their mean."""
    center_rewards_coefficient: float | None = Field(None, ge=0)
    """TRL's auxiliary loss coef * mean((r_chosen + r_rejected)^2) that centres the scores (Eisenstein et al.
    2023 use 0.01); null: off."""


class ProcessRewardModelParams(_LearnedReward):
    """A process reward model: a per-step scorer trained on Monte-Carlo step labels (Math-Shepherd, Wang et al.
    2024; "Rewarding Progress", Setlur et al. 2024). Each sampled solution is split into steps; from each step's
    prefix `rollouts` continuations are sampled and graded by the verifier; a step's label is the share that
    reach the right answer (soft) or whether any does (hard)."""

    splitter: str = Field("\n", min_length=1)
    """The text that ends a step (a regular expression): by default one line is one step."""
    solutions_per_prompt: int = Field(2, gt=0)
    """Solutions sampled per prompt and split into steps."""
    rollouts: int = Field(4, gt=0)
    """Continuations sampled from each step's prefix (Math-Shepherd's N)."""
    labels: Literal["soft", "hard"] = "soft"
    """soft: the share of continuations that reach the verified answer; hard: 1 if any does, else 0."""
    max_steps_per_solution: int = Field(8, gt=0)
    """Steps labelled per solution at most (the first); each costs `rollouts` continuations."""
    max_prompts: int | None = Field(64, gt=0)
    """Prompts sampled at most (the first of the difficulty stage's train set); null: all."""
    sampling: SamplingParams = SamplingParams(temperature=1.0, max_new_tokens=48)
    """How solutions and continuations are sampled."""

    @model_validator(mode="after")
    def _splitter(self) -> ProcessRewardModelParams:
        try:
            re.compile(self.splitter)
        except re.error as e:
            raise ValueError(f"splitter: not a regular expression: {e}") from None
        if re.fullmatch(self.splitter, ""):
            raise ValueError("splitter: matches the empty text, so it would split between every character")
        return self
