"""The prompts' shared prefix (chat template and system prompt) run once per training batch instead of once
per row: its keys and values computed for one row and broadcast to every row, gradients flowing back
through the broadcast. RL's log-probs (rung.rl.logprobs) and SFT's loss (`SharedPrefixSFT`) use it."""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin
from trl import SFTTrainer

from rung.generate.decode import shared_prefix
from rung.train.trl_private import FUSED_LM_HEAD, aux_loss_enabled

MIN_SHARED_PREFIX = 8
"""Below this many shared tokens, encoding them once saves less than the extra forward costs."""


def broadcast(kv: DynamicCache | None, index: torch.Tensor, config: Any) -> DynamicCache | None:
    """A cache whose row i is row index[i] of `kv` (a view where every row is the same one)."""
    if kv is None:
        return None
    cache = DynamicCache(config=config)
    for i, layer in enumerate(kv.layers):
        # the forward filled each attention layer's keys and values (a linear-attention layer keeps neither)
        assert isinstance(layer, CacheLayerMixin) and layer.keys is not None and layer.values is not None
        if len(layer.keys) == 1:
            keys, values = (t.expand(len(index), -1, -1, -1) for t in (layer.keys, layer.values))
        else:
            keys, values = layer.keys.index_select(0, index), layer.values.index_select(0, index)
        cache.update(keys, values, i)
    return cache


def prefix_cache(model: Any, prefix: list[int], rows: int, device: torch.device, config: Any) -> DynamicCache:
    """The keys and values of `prefix`, computed once, as a cache of `rows` rows."""
    out = model(input_ids=torch.tensor([prefix], device=device), use_cache=True, logits_to_keep=1)
    cache = broadcast(out.past_key_values, torch.zeros(rows, dtype=torch.long, device=device), config)
    assert cache is not None  # use_cache=True: the forward returns its cache
    return cache


class _PrefixOnce:
    """The model as SFTTrainer.compute_loss calls it, whose fused forward (`fused_lm_head=True`) runs the
    batch's first `p` tokens (the same in every row, none of them trained) once, then each row from its token
    p - 1 on. TRL's loss and metrics are sums over the trained positions, which this forward scores alike."""

    def __init__(self, model: Any, p: int) -> None:
        self.model, self.p = model, p

    def __call__(self, **inputs: Any) -> Any:
        if not inputs.get(FUSED_LM_HEAD):
            return self.model(**inputs)
        ids, mask, labels = inputs.pop("input_ids"), inputs.pop("attention_mask"), inputs.pop("labels")
        positions = inputs.pop("position_ids", None)
        if positions is None:
            positions = (mask.cumsum(1) - 1).clamp(min=0)
        start = self.p - 1  # the last shared token stays in each row: its logits score the row's next token
        cache = prefix_cache(self.model, ids[0, :start].tolist(), len(ids), ids.device, self.model.config)
        return self.model(
            input_ids=ids[:, start:],
            attention_mask=mask,
            position_ids=positions[:, start:],
            labels=labels[:, start:],
            past_key_values=cache,
            **inputs,
        )


class SharedPrefixSFT(SFTTrainer):
    """TRL's SFTTrainer whose training loss runs the rows' shared prefix once per batch (one process, right-padded
    rows whose shared prefix is untrained; packing, padding-free batches, PEFT and MoE use TRL's own forward)."""

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        p = self._shared(model, inputs)
        return super().compute_loss(_PrefixOnce(model, p) if p else model, inputs, return_outputs, num_items_in_batch)

    def _shared(self, model: Any, inputs: dict[str, Any]) -> int:
        """How many leading tokens every row shares untrained; 0 where the batch takes TRL's path."""
        if (
            set(inputs) - {"input_ids", "attention_mask", "labels", "position_ids"}
            or "attention_mask" not in inputs
            or "labels" not in inputs
            or self.accelerator.num_processes > 1
            or getattr(model, "peft_config", None)
            or aux_loss_enabled(self)
            or len(inputs["input_ids"]) < 2
        ):
            return 0
        ids, mask, labels = (inputs[k].tolist() for k in ("input_ids", "attention_mask", "labels"))
        rows = [[t for t, m in zip(r, ms, strict=True) if m] for r, ms in zip(ids, mask, strict=True)]
        if any(r != ids[i][: len(r)] for i, r in enumerate(rows)):  # left padding: positions differ per row
            return 0
        p = len(shared_prefix(rows))
        trained = [next((j for j, t in enumerate(row) if t != -100), len(row)) for row in labels]
        p = min(p, *trained)  # a trained token is scored from the token before it, so all of [0, p) untrained
        return p if p - 1 >= MIN_SHARED_PREFIX else 0
