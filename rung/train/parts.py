"""The parts a TRL trainer of rung's is given (rung.train.trl_seam's `Seam`) and the values its hooks hand
them: a generated batch, the generation and joining of batches, the advantage function, the batch source, and the
generation parts (the rollout engine and the log-probs, with the batch TRL asks log-probs of)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch


@dataclass(frozen=True)
class Generated:
    """A generation batch as TRL made it, with the rewards and advantages of every process's rows."""

    batch: dict[str, Any]
    """This process's rows, as `_generate_and_score_completions` returns them (rung.train.trl_seam's docstring)."""
    rewards: torch.Tensor
    """(rows of all processes, reward functions), as the `scored` hook returned them to TRL."""
    advantages: torch.Tensor
    """(rows of all processes,) TRL's advantages of them."""


Generate = Callable[[list[dict[str, Any]]], Generated]
"""A generation and scoring of rows as the dataset holds them (`Seam.objective_generation_batch`)."""
Concat = Callable[[list[tuple[dict[str, Any], int]]], dict[str, Any]]
"""Groups of generated batches joined into one training batch (`Seam.concat_groups`)."""
AdvantageFn = Callable[[torch.Tensor, Sequence[str], torch.Tensor, int], torch.Tensor]
"""(rows,) advantages of every process's rows from their (rows, reward functions) rewards, the reward functions'
names, TRL's advantages and the group size (rung.rl.advantages.Advantages)."""


class Batches(Protocol):
    """The batch-source part of a trainer (rung.rl.sampling.BatchSource): which rows each generation step
    trains on, called with values by the seam's hooks."""

    def batch(self, size: int, step: int, generate: Generate, concat: Concat) -> dict[str, Any]:
        """This process's `size` rows of the training batch of `step`, made by `generate` (and `concat`)."""
        ...

    def scored(self, rewards: torch.Tensor, rows: int) -> torch.Tensor:
        """The rewards TRL's advantages are computed from, given TRL's (rows of all processes, reward
        functions), this process's being `rows`."""
        ...

    def save(self, checkpoint: Path, main: bool) -> None:
        """Write the part's state into `checkpoint` (`main`: the process that writes shared files)."""
        ...

    def load(self, checkpoint: Path) -> None:
        """Restore the part's state from `checkpoint`."""
        ...


@dataclass(frozen=True)
class LogpsBatch:
    """What TRL asks log-probs of (`_get_per_token_logps_and_entropies`'s arguments, rung.train.trl_seam)."""

    model: Any
    input_ids: torch.Tensor
    """(rows, prompt + completion tokens): prompts left-padded, completions right-padded."""
    attention_mask: torch.Tensor
    logits_to_keep: int
    """The completion tokens: the last `logits_to_keep` of each row."""
    batch_size: int | None
    compute_entropy: bool
    compute_aux_loss: bool
    multimodal: dict[str, Any]


TokenLogps = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]
"""(log-probs, entropies, aux loss) of the completion tokens, (rows, logits_to_keep) each."""


class Rollouts(Protocol):
    """The rollout-engine part of a trainer (rung.rl.engine.RolloutEngine)."""

    def single_turn(self, prompt_ids: list[list[int]], images: Any, multimodal_fields: Any) -> list[list[int]] | None:
        """Completion ids for `prompt_ids` (TRL repeats each prompt for its group), or None for TRL's own
        generation."""
        ...


@dataclass(frozen=True)
class Generation:
    """The generation parts of a trainer, built from it once TRL has (`Seam`'s `generation` factory): they read
    the settings TRL derived from its config and tokenizer."""

    rollouts: Rollouts
    logprobs: Callable[[LogpsBatch], TokenLogps | None]
    """rung's log-probs of a batch, or None for TRL's own computation."""
    probe: Callable[[LogpsBatch, torch.Tensor], None] | None = None
    """Called with each batch the loss takes log-probs of and the policy's log-probs of it (rung.rl.kl_probe)."""
