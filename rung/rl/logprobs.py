"""rung's log-probabilities of an RL stage's completions (the trainer's `token_logps` hook): the prompts' shared
prefix (chat template and system prompt) encoded once per batch and each prompt once per group instead of once per
completion, and completions run in chunks of like lengths instead of all padded to the longest, in the forward and
the backward pass. Batches it does not cover (no shared prefix nor groups, a router loss, images, several
processes) get TRL's own computation (None); a peft model runs on its inner model (rung.rl.lora)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PretrainedConfig

from rung.generate.decode import shared_prefix
from rung.rl import lora
from rung.train.parts import LogpsBatch, TokenLogps
from rung.train.prefix import MIN_SHARED_PREFIX, broadcast, prefix_cache
from rung.train.trl_seam import Seam

# What one more forward and backward costs beyond its tokens, in row-tokens (reading and updating every weight
# once more): a chunk of rows is split off where it saves more padding than this.
CHUNK_COST = 48


@dataclass(frozen=True)
class LogProbs:
    """The shared-prefix log-probs of one trainer's model (module docstring)."""

    config: PretrainedConfig
    """The trained model's config (its layers' key-value layout)."""
    processes: int
    autocast: Callable[[], AbstractContextManager[Any]]
    """The trainer's mixed-precision context (accelerate's)."""

    def __call__(self, batch: LogpsBatch) -> TokenLogps | None:
        """TRL's per-token log-probs (and entropies) of the completions, with each prompt run once: the
        prompts' shared prefix (chat template and system prompt) once per batch, the rest of each distinct
        prompt once for its group, their keys and values broadcast to every row of the group (gradients flow
        back through the broadcast), and each row's forward only its completion (after the prompt's last
        token, whose logits score the first completion token). Prompts are laid out as in generation:
        [prefix][left padding][rest of the prompt], positions counted over real tokens (TRL's forward counts
        left pads as positions; rung.generate.api, like `model.generate`, does not)."""
        model, input_ids, attention_mask, logits_to_keep = (
            batch.model,
            batch.input_ids,
            batch.attention_mask,
            batch.logits_to_keep,
        )
        prompt_len = input_ids.shape[1] - logits_to_keep
        # one copy to the host, not a device sync per row
        host_ids, host_mask = input_ids[:, :prompt_len].tolist(), attention_mask[:, :prompt_len].tolist()
        rows = [[t for t, m in zip(ids, mask, strict=True) if m] for ids, mask in zip(host_ids, host_mask, strict=True)]
        distinct: dict[tuple[int, ...], int] = {}
        group = [distinct.setdefault(tuple(r), len(distinct)) for r in rows]
        prefix = shared_prefix(rows) if len(rows) > 1 else []
        if (
            (len(prefix) < MIN_SHARED_PREFIX and len(distinct) == len(rows))
            or batch.compute_aux_loss
            or any(v is not None for v in batch.multimodal.values())
            or self.processes > 1
        ):
            return None
        model = lora.inner(model)  # a peft model's adapter layers and fused LM head live on it
        p, prompts, device = len(prefix), [list(k) for k in distinct], input_ids.device
        width = max(len(r) for r in prompts) - p  # each prompt keeps at least one token after the prefix
        # built on the host, moved once; pads (0) are masked
        rest = torch.tensor(
            [[0] * (width - len(r) + p) + r[p:] for r in prompts], dtype=input_ids.dtype, device="cpu"
        ).to(device)
        rest_mask = torch.tensor(
            [[0] * (width - len(r) + p) + [1] * (len(r) - p) for r in prompts], dtype=attention_mask.dtype, device="cpu"
        ).to(device)
        index = torch.tensor(group, device=device)
        prompt_mask = torch.cat([attention_mask.new_ones(len(prompts), p), rest_mask], 1)
        # each row: its prompt's last token, then its completion
        block = torch.cat([rest[index, -1:], input_ids[:, prompt_len:]], 1)
        mask = torch.cat([prompt_mask[index], attention_mask[:, prompt_len:]], 1)
        positions = (mask.cumsum(1) - 1).clamp(min=0)[:, p + width - 1 :]
        labels = block.masked_fill(mask[:, p + width - 1 :] == 0, -100)
        labels[:, 0] = -100
        # rows of like completion lengths run together, each chunk only as long as its longest row
        steps = torch.arange(1, logits_to_keep + 1, device=device)
        lengths = (attention_mask[:, prompt_len:] * steps).amax(1).tolist()
        logps: list[torch.Tensor] = []
        entropies: list[torch.Tensor] = []
        order: list[int] = []
        with self.autocast():
            kv = None
            if p:
                kv = prefix_cache(model, prefix, len(prompts), device, self.config)
            if width > 1:  # the prompts' rest but their last token
                kv = model(
                    input_ids=rest[:, :-1],
                    attention_mask=prompt_mask[:, :-1],
                    position_ids=(prompt_mask.cumsum(1) - 1).clamp(min=0)[:, p:-1],
                    past_key_values=kv,
                    use_cache=True,
                    logits_to_keep=1,
                ).past_key_values
            for chunk in length_chunks(lengths, batch.batch_size or len(rows)):
                order += chunk
                at, keep = torch.tensor(chunk, device=device), max(lengths[i] for i in chunk)
                cut = mask.shape[1] - logits_to_keep + keep
                lp, entropy = Seam.fused_logps(
                    model,
                    input_ids=block[at, : keep + 1],
                    attention_mask=mask[at, :cut],
                    position_ids=positions[at, : keep + 1],
                    past_key_values=broadcast(kv, index[at], self.config),
                    labels=labels[at, : keep + 1],
                )
                logps.append(torch.nn.functional.pad(lp[:, -keep:], (0, logits_to_keep - keep)))
                if batch.compute_entropy and entropy is not None:
                    entropies.append(torch.nn.functional.pad(entropy[:, -keep:], (0, logits_to_keep - keep)))
        back = torch.tensor(order, device=device).argsort()  # the rows in TRL's order again
        if batch.compute_entropy:
            return torch.cat(logps)[back], torch.cat(entropies)[back], None
        return torch.cat(logps)[back], None, None


def length_chunks(lengths: list[int], most: int) -> list[list[int]]:
    """Rows (indices into `lengths`) in chunks of at most `most`, longest first, that minimize the row-tokens
    computed (each row padded to its chunk's longest) plus CHUNK_COST per chunk."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    # best[j]: the cheapest cost of the first j rows of `order`; cut[j]: where its last chunk starts
    best, cut = [0.0] + [float("inf")] * len(order), [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        for i in range(max(0, j - most), j):
            cost = best[i] + (j - i) * (lengths[order[i]] + 1) + CHUNK_COST
            if cost < best[j]:
                best[j], cut[j] = cost, i
    chunks, j = [], len(order)
    while j:
        chunks.append(order[cut[j] : j])
        j = cut[j]
    return chunks[::-1]
