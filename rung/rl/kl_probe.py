"""The KL of the policy from its init, for a stage trained on a learned reward with `beta: 0` (docs/reward_models.md,
Over-optimization): TRL logs `kl` only when it holds a reference model (beta > 0), and Gao et al. 2023's figure
plots proxy and gold against it. The probe holds a frozen copy of the init and, on each batch the loss takes
log-probs of, computes the init's log-probs through the trainer's own log-prob path (one forward of the init, no
gradient) and logs TRL's k3 estimator exp(ref - pol) - (ref - pol) - 1, masked mean over the completion tokens,
under TRL's key `kl` (on episodes the environment's tokens count too: the loss's tool mask is not in the batch)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rung.config import RLStageParams
from rung.train.parts import LogpsBatch, TokenLogps
from rung.train.trl_private import reference_model, train_metrics
from rung.train.trl_seam import Seam

LEARNED = ("reward_model", "process", "judge", "majority")
"""The built-in reward kinds a model gives (or, majority, the group): what the verifier's gold grade is logged for."""


def needed(stage: RLStageParams) -> bool:
    """Whether a stage logs `kl` through the probe: it trains on a learned reward and TRL logs no KL (beta 0)."""
    learned = any(name in LEARNED and spec.import_path is None for name, spec in stage.rewards.items())
    return learned and stage.beta == 0


def k3(ref: torch.Tensor, policy: torch.Tensor) -> torch.Tensor:
    """TRL's per-token KL estimator of the policy from the reference (Schulman's k3: unbiased, never negative)."""
    delta = ref - policy
    return torch.exp(delta) - delta - 1


@dataclass(frozen=True)
class KLProbe:
    """The probe of one trainer (the seam's `probe` part): called with the loss's batch and the policy's log-probs."""

    init: Any
    """The frozen copy of the init model."""
    logps: Callable[[LogpsBatch], TokenLogps]
    """The trainer's log-prob path (`Seam.per_token_logps`)."""
    reduce: Callable[[torch.Tensor], torch.Tensor]
    """A sum over processes (accelerate's)."""
    metrics: dict[str, list[float]]
    """The step's metrics TRL logs (`train_metrics`)."""

    @classmethod
    def of(cls, trainer: Seam, init: Any) -> KLProbe:
        """The probe of `trainer`, holding `init`, a copy of the model taken before TRL set the trainer up."""
        return cls(
            reference_model(trainer, init),
            trainer.per_token_logps,
            lambda t: trainer.accelerator.reduce(t, reduction="sum"),
            train_metrics(trainer),
        )

    def __call__(self, batch: LogpsBatch, policy: torch.Tensor) -> None:
        with torch.no_grad():
            init = dataclasses.replace(batch, model=self.init, compute_entropy=False, compute_aux_loss=False)
            ref = self.logps(init)[0]
            mask = batch.attention_mask[:, -batch.logits_to_keep :].to(ref.dtype)
            kl = k3(ref, policy.detach()) * mask
            total, tokens = self.reduce(torch.stack([kl.sum(), mask.sum()])).tolist()
        self.metrics["kl"].append(total / max(tokens, 1.0))


def init_copy(model: Any, stage: RLStageParams) -> Any | None:
    """A copy of the init for the probe, taken before the trainer patches the model; None where none is needed."""
    return copy.deepcopy(model) if needed(stage) else None
