"""An RL stage's LoRA model (peft) on rung's fast paths, as full fine-tuning runs them.

- Rollouts decode a plain model whose weights are the base's plus each adapter's update (`merged_weights`,
  written into rung.rl.engine.GenerationModel's copy once per generation call): the compiled path and the
  oneDNN prepack see plain linear layers, and a decode step costs what full fine-tuning's does instead of two
  more small matmuls (and their dispatch) per layer. The trained model itself is never merged, so its frozen
  base stays bit for bit what it was (merging in place and back would round it), and the copy samples
  without adapter dropout, which `lora.dropout` applies in training only (TRL's vLLM sync merges alike).
- Log-probs run on the peft model's inner transformers model (`inner`), which holds the adapter layers and
  TRL's fused LM head, so rung's shared-prefix log-probs (rung.rl.logprobs) cover LoRA too.
"""

from __future__ import annotations

from typing import Any, TypeGuard

import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer

ADAPTER_KEY = "lora_"
"""What peft's adapter parameters' names contain (lora_A, lora_B, lora_embedding_A, ...)."""
BASE_LAYER = ".base_layer"
"""What peft inserts into the name of each adapted layer's own parameters."""


def is_peft(model: Any) -> TypeGuard[PeftModel]:
    return isinstance(model, PeftModel)


def inner(model: Any) -> Any:
    """The transformers model inside a peft model (adapter layers included), else the model itself."""
    return model.get_base_model() if is_peft(model) else model


@torch.no_grad()
def merged_weights(model: PeftModel) -> dict[str, torch.Tensor]:
    """The state dict of the plain model the peft `model` computes (its inner model's names, adapters merged):
    each adapted layer's weight plus its active adapters' updates (peft's `get_delta_weight`, which merging
    adds), every other tensor as it is (shared, not copied)."""
    base = model.get_base_model()
    weights = {k.replace(BASE_LAYER, ""): v for k, v in base.state_dict().items() if ADAPTER_KEY not in k}
    for name, layer in base.named_modules():
        if isinstance(layer, LoraLayer) and not layer.merged:
            key = f"{name}.weight"
            # get_delta_weight: defined by each of LoraLayer's layer types (Linear, Embedding, ...), not by it
            deltas = [layer.get_delta_weight(a) for a in layer.active_adapters if a in layer.scaling]  # type: ignore[attr-defined]
            weights[key] = weights[key] + sum(d.to(weights[key].dtype) for d in deltas)
    return weights
