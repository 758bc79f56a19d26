"""Where rung's RL steps do less work than TRL's on the same rollouts, as a mixin in front of
rung.train.trl_seam's GRPOSeam / RLOOSeam (its hooks `rollout` and `token_logps`; no TRL internals here):

- rollouts through rung.generate.api instead of batched `model.generate`;
- colocated vLLM seeded per row (rung.rl.vllm_rollouts.SeededRows) from the same per-call seed;
- log-probabilities that encode the prompts' shared prefix (chat template and system prompt) once
  per batch instead of once per completion, in the forward and the backward pass.

Anything these paths do not cover (vLLM, TRL's continuous batching, tools, images, several
processes, sampling settings rung's sampler lacks) goes to TRL's own methods.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel
from trl.models import unwrap_model_for_generation

from rung.config import SamplingParams
from rung.generate.api import generate_ids
from rung.generate.decode import shared_prefix
from rung.rl.vllm_rollouts import SeededRows
from rung.seeding import derive

# Below this many shared tokens, encoding them once saves less than the extra forward costs.
MIN_SHARED_PREFIX = 8


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
        """TRL's per-token log-probs (and entropies) of the completions, with the prompts' shared
        prefix run once and its keys and values broadcast to every row (gradients flow back through
        the broadcast). Rows are laid out as in generation: [prefix][left padding][rest of the prompt]
        [completion], positions counted over real tokens (TRL's forward counts left pads as
        positions; rung.generate.api, like `model.generate`, does not)."""
        prompt_len = input_ids.shape[1] - logits_to_keep
        # one copy to the host, not a device sync per row
        host_ids, host_mask = input_ids[:, :prompt_len].tolist(), attention_mask[:, :prompt_len].tolist()
        rows = [[t for t, m in zip(ids, mask, strict=True) if m] for ids, mask in zip(host_ids, host_mask, strict=True)]
        prefix = shared_prefix(rows) if len(rows) > 1 else []
        if (
            len(prefix) < MIN_SHARED_PREFIX
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
        p = len(prefix)
        width = max(len(r) for r in rows) - p
        # built on the host, moved once; pads (0) are masked
        rest = torch.tensor([[0] * (width - len(r) + p) + r[p:] for r in rows], dtype=input_ids.dtype, device="cpu").to(
            input_ids.device
        )
        rest_mask = torch.tensor(
            [[0] * (width - len(r) + p) + [1] * (len(r) - p) for r in rows], dtype=attention_mask.dtype, device="cpu"
        ).to(attention_mask.device)
        block = torch.cat([rest, input_ids[:, prompt_len:]], 1)
        mask = torch.cat([attention_mask.new_ones(len(rows), p), rest_mask, attention_mask[:, prompt_len:]], 1)
        positions = (mask.cumsum(1) - 1).clamp(min=0)[:, p:]
        labels = block.masked_fill(mask[:, p:] == 0, -100)
        labels[:, :-logits_to_keep] = -100
        batch_size = batch_size or len(rows)
        logps, entropies = [], []
        with self.accelerator.autocast():
            kv = model(
                input_ids=torch.tensor([prefix], device=input_ids.device), use_cache=True, logits_to_keep=1
            ).past_key_values
            for start in range(0, len(rows), batch_size):
                end = min(start + batch_size, len(rows))
                cache = DynamicCache(config=self.model.config)
                for i, layer in enumerate(kv.layers):
                    cache.update(
                        layer.keys.expand(end - start, -1, -1, -1), layer.values.expand(end - start, -1, -1, -1), i
                    )
                lp, entropy = self.fused_logps(  # type: ignore[attr-defined]
                    model,
                    input_ids=block[start:end],
                    attention_mask=mask[start:end],
                    position_ids=positions[start:end],
                    past_key_values=cache,
                    labels=labels[start:end],
                )
                logps.append(lp[:, -logits_to_keep:])
                if compute_entropy:
                    entropies.append(entropy[:, -logits_to_keep:])
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None
