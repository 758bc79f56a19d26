"""Where rung's RL steps do less work than TRL's on the same rollouts, as a mixin in front of
rung.train.trl_seam's GRPOSeam / RLOOSeam (its hooks `rollout` and `token_logps`; no TRL internals here):

- rollouts through rung.generate.api instead of batched `model.generate`;
- colocated vLLM seeded per row (rung.rl.vllm_rollouts.SeededRows) from the same per-call seed;
- log-probabilities that encode the prompts' shared prefix (chat template and system prompt) once
  per batch and each prompt once per group instead of once per completion, and run completions in
  chunks of like lengths instead of all padded to the longest, in the forward and the backward pass.

Anything these paths do not cover (vLLM, TRL's continuous batching, tools, images, several
processes, sampling settings rung's sampler lacks) goes to TRL's own methods.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel
from trl.models import unwrap_model_for_generation

from rung.config import SamplingParams
from rung.generate.api import generate_ids
from rung.generate.decode import shared_prefix
from rung.rl.vllm_rollouts import SeededRows
from rung.seeding import derive
from rung.train.prefix import MIN_SHARED_PREFIX, broadcast, prefix_cache

# What one more forward and backward costs beyond its tokens, in row-tokens (reading and updating every weight
# once more): a chunk of rows is split off where it saves more padding than this.
CHUNK_COST = 48


class Rollouts:
    _rollout_calls: tuple[int, int] = (-1, 0)
    """(step, generation calls in it): with the seed, where each rollout's sampling stream starts."""
    _low_precision: PreTrainedModel | None = None
    _rollout_seed: int = 0
    """The seed of the current generation call where TRL's own path generates it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.use_vllm and self.args.vllm_mode == "colocate":
            # TRL hands colocated vLLM one seed per batch: rung seeds each row from this call's seed
            self.wrap_vllm_generate(lambda generate: SeededRows(generate, lambda: self._rollout_seed))

    def generation_model(self, model: PreTrainedModel) -> PreTrainedModel:
        """The model rung's rollouts and held-out curve decode with: the trained weights themselves
        (float32 compute, or a peft model), or under bf16 / fp16 compute a copy of them in that dtype,
        refreshed in place at each call: the fp32 master weights stay what the optimizer updates, and
        the copy keeps its addresses, so the compiled path's CUDA graphs stay valid."""
        dtype = torch.bfloat16 if self.args.bf16 else torch.float16 if self.args.fp16 else model.dtype
        if dtype == model.dtype or getattr(model, "peft_config", None):
            return model
        if self._low_precision is None:
            with torch.device(model.device):
                self._low_precision = AutoModelForCausalLM.from_config(model.config, dtype=dtype)
            self._low_precision.eval().requires_grad_(False)
            self._low_precision.generation_config = model.generation_config
        weights = model.state_dict()
        with torch.no_grad():
            for name, t in self._low_precision.state_dict().items():
                t.copy_(weights[name])
        return self._low_precision

    def rollout(self, prompt_ids: list[list[int]], images: Any, multimodal_fields: Any) -> list[list[int]] | None:
        """Rollouts through rung's decode loop (rung.generate.api: finished rows leave the batch, the
        group's prompt is encoded once for its samples, oneDNN-prepacked weights) where TRL would call
        batched `model.generate`: text prompts, no tools, sampling rung implements (temperature, top_p).
        Each completion draws from its own stream seeded by (seed, step, call of the step, process,
        prompt, sample), so a resumed run generates what an unkilled one would."""
        step, calls = (
            self._rollout_calls if self._rollout_calls[0] == self.state.global_step else (self.state.global_step, 0)
        )
        self._rollout_calls = (step, calls + 1)
        # vLLM's tensor-parallel ranks must sample alike: they share a seed
        rank = self.accelerator.process_index // (self.args.vllm_tensor_parallel_size if self.use_vllm else 1)
        seed = derive(self.args.seed, "rollouts", str(step), str(calls), str(rank))
        if not self._rung_generates(images, multimodal_fields):
            self._rollout_seed = seed  # where vLLM draws per-row seeds from (rung.rl.vllm_rollouts.SeededRows)
            return super().rollout(prompt_ids, images, multimodal_fields)  # type: ignore[misc]
        # TRL repeats each prompt for its group: generate the group's samples from one prompt encoding
        g = self.num_generations
        n = (
            g
            if len(prompt_ids) % g == 0 and all(prompt_ids[i] == prompt_ids[i - i % g] for i in range(len(prompt_ids)))
            else 1
        )
        # every rollout of the step in one batch where memory allows (rung.generate.api sizes it on CUDA)
        sampling = SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            max_new_tokens=self.max_completion_length,
            batch_size=len(prompt_ids),
        )
        with unwrap_model_for_generation(
            self.model_wrapped,
            self.accelerator,
            gather_deepspeed3_params=self.args.ds3_gather_for_generation,
            gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
        ) as unwrapped:
            out = generate_ids(
                self.generation_model(unwrapped),
                prompt_ids[::n],
                sampling,
                self.eos_token_ids,
                n=n,
                seed=seed,
                desc=None,
            )
        return [tokens for samples in out for tokens, _ in samples]

    def _rung_generates(self, images: Any, multimodal_fields: Any) -> bool:
        return not (
            self.use_vllm
            or getattr(self, "use_transformers_continuous_batching", False)
            or images
            or multimodal_fields
            or getattr(self, "tools", None)
            or self.args.generation_kwargs
            or self.top_k
            or self.min_p is not None
            or self.repetition_penalty != 1.0
            or self.temperature == 0
        )

    def token_logps(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None,
        compute_entropy: bool,
        compute_aux_loss: bool,
        multimodal: dict[str, Any],
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None:
        """TRL's per-token log-probs (and entropies) of the completions, with each prompt run once: the
        prompts' shared prefix (chat template and system prompt) once per batch, the rest of each distinct
        prompt once for its group, their keys and values broadcast to every row of the group (gradients flow
        back through the broadcast), and each row's forward only its completion (after the prompt's last
        token, whose logits score the first completion token). Prompts are laid out as in generation:
        [prefix][left padding][rest of the prompt], positions counted over real tokens (TRL's forward counts
        left pads as positions; rung.generate.api, like `model.generate`, does not)."""
        prompt_len = input_ids.shape[1] - logits_to_keep
        # one copy to the host, not a device sync per row
        host_ids, host_mask = input_ids[:, :prompt_len].tolist(), attention_mask[:, :prompt_len].tolist()
        rows = [[t for t, m in zip(ids, mask, strict=True) if m] for ids, mask in zip(host_ids, host_mask, strict=True)]
        distinct: dict[tuple[int, ...], int] = {}
        group = [distinct.setdefault(tuple(r), len(distinct)) for r in rows]
        prefix = shared_prefix(rows) if len(rows) > 1 else []
        if (
            (len(prefix) < MIN_SHARED_PREFIX and len(distinct) == len(rows))
            or compute_aux_loss
            or any(v is not None for v in multimodal.values())
            or self.accelerator.num_processes > 1
            or getattr(model, "peft_config", None)
        ):
            return super().token_logps(  # type: ignore[misc]
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size,
                compute_entropy,
                compute_aux_loss,
                multimodal,
            )
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
        logps, entropies, order = [], [], []
        with self.accelerator.autocast():
            kv = None
            if p:
                kv = prefix_cache(model, prefix, len(prompts), device, self.model.config)
            if width > 1:  # the prompts' rest but their last token
                kv = model(
                    input_ids=rest[:, :-1],
                    attention_mask=prompt_mask[:, :-1],
                    position_ids=(prompt_mask.cumsum(1) - 1).clamp(min=0)[:, p:-1],
                    past_key_values=kv,
                    use_cache=True,
                    logits_to_keep=1,
                ).past_key_values
            for chunk in length_chunks(lengths, batch_size or len(rows)):
                order += chunk
                at, keep = torch.tensor(chunk, device=device), max(lengths[i] for i in chunk)
                cut = mask.shape[1] - logits_to_keep + keep
                lp, entropy = self.fused_logps(  # type: ignore[attr-defined]
                    model,
                    input_ids=block[at, : keep + 1],
                    attention_mask=mask[at, :cut],
                    position_ids=positions[at, : keep + 1],
                    past_key_values=broadcast(kv, index[at], self.model.config),
                    labels=labels[at, : keep + 1],
                )
                logps.append(torch.nn.functional.pad(lp[:, -keep:], (0, logits_to_keep - keep)))
                if compute_entropy:
                    entropies.append(torch.nn.functional.pad(entropy[:, -keep:], (0, logits_to_keep - keep)))
        back = torch.tensor(order, device=device).argsort()  # the rows in TRL's order again
        if compute_entropy:
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
