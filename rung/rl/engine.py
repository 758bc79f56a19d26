"""The rollout engine of an RL stage: the one owner of what its rollouts (single-turn, on vLLM, or episodes) share.

- Which generator samples them (`generator`), decided once at stage start by one check (`lacks`, `check`):
  rung's decode loop (rung.generate.api), unless the stage chose another. The choices kept, all single-turn:
  `use_vllm` (TRL's vLLM, seeded per row by rung.rl.vllm_rollouts.SeededRows), TRL's continuous batching or
  tool loop (`trl.use_transformers_continuous_batching`, `tools`), and a sampling setting rung's loop lacks
  (`trl.top_k`, `min_p`, `repetition_penalty`, `generation_kwargs`), which TRL's `model.generate` samples.
  Episodes have no such choice (rung's loop is the only one that runs them): `check` refuses each in one line.
  Temperature 0 is refused everywhere: a group of identical greedy completions has no advantage to learn from.
- Seeds: each generation call's stream is seeded by (seed, namespace, step, call of the step, rank), so a resumed
  run reproduces an unkilled one's rollouts; vLLM's tensor-parallel ranks share a rank, as they must sample alike.
- The model rollouts decode with (`GenerationModel`): unwrapped as TRL unwraps it, and under bf16 / fp16 a
  low-precision copy of the trained weights; a peft model's a plain copy with its adapters merged (rung.rl.lora).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from rung.config import SamplingParams
from rung.errors import InputError
from rung.generate.api import generate_ids
from rung.rl import lora
from rung.seeding import derive
from rung.train.trl_private import RolloutSettings, generation_context, global_step, rollout_settings

Generator = Literal["rung", "trl", "vllm"]


def lacks(settings: RolloutSettings) -> list[str]:
    """The stage's sampling settings (GRPOConfig's names) that rung's decode loop does not implement."""
    asked = {
        "top_k": bool(settings.top_k),
        "min_p": settings.min_p is not None,
        "repetition_penalty": settings.repetition_penalty != 1.0,
        "generation_kwargs": bool(settings.generation_kwargs),
        "use_transformers_continuous_batching": settings.continuous_batching,
        "tools": settings.tools,
        "use_vllm": settings.use_vllm,
    }
    return [name for name, on in asked.items() if on]


def check(settings: RolloutSettings, key: str, episodes: bool) -> Generator:
    """The generator of a stage's rollouts (module docstring), or InputError naming `key`'s setting where the
    stage asks what no generator of its rollouts does."""
    if settings.temperature == 0:
        raise InputError(f"{key}.temperature: 0 samples a group's completions alike, which gives no advantage")
    missing = lacks(settings)
    if episodes and missing:
        raise InputError(f"{key}: episodes are sampled by rung's decode loop, which lacks {missing}")
    if settings.use_vllm:
        return "vllm"
    return "trl" if missing else "rung"


class GenerationModel:
    """The model rung's rollouts and held-out curve decode with: the trained weights themselves (float32
    compute), or a copy of them, refreshed in place at each call: in the compute dtype under bf16 / fp16, and a
    peft model's as a plain model with its adapters merged (rung.rl.lora). The fp32 master weights stay what the
    optimizer updates, and the copy keeps its addresses, so the compiled path's CUDA graphs stay valid."""

    def __init__(self, dtype: torch.dtype | None) -> None:
        self.dtype = dtype
        self.copy: PreTrainedModel | None = None
        """The copy, made at the first call that needs it."""

    def __call__(self, model: PreTrainedModel) -> PreTrainedModel:
        peft = lora.is_peft(model)  # decoded as a plain model with the adapters merged (rung.rl.lora)
        if not peft and (self.dtype is None or self.dtype == model.dtype):
            return model
        if self.copy is None:
            with torch.device(model.device):
                self.copy = AutoModelForCausalLM.from_config(model.config, dtype=self.dtype or model.dtype)
            self.copy.eval().requires_grad_(False)
            self.copy.generation_config = model.generation_config
        weights = lora.merged_weights(model) if lora.is_peft(model) else model.state_dict()
        with torch.no_grad():
            for name, t in self.copy.state_dict().items():
                t.copy_(weights[name])
        return self.copy


@dataclass
class RolloutEngine:
    """One rollout path of a trainer (module docstring): its settings, generator, seeds and model."""

    settings: RolloutSettings
    generator: Generator
    namespace: str
    """The seeds' scope: "rollouts" (single-turn) or "episodes"."""
    rank: int
    """The process's sampling rank (vLLM's tensor-parallel ranks share one)."""
    step: Callable[[], int]
    unwrap: Callable[[], AbstractContextManager[PreTrainedModel]]
    model: GenerationModel
    calls: tuple[int, int] = (-1, 0)
    """(step, generation calls in it so far)."""
    last_seed: int = field(default=0)
    """The seed of the latest call (where SeededRows draws vLLM's per-row seeds from)."""

    @classmethod
    def of(
        cls, trainer: Any, namespace: str, key: str, episodes: bool, model: GenerationModel | None = None
    ) -> RolloutEngine:
        """The engine of a TRL GRPO-family trainer, checked (`check`, naming the stage's `key`); `model` shared
        with the trainer's other decoding (its held-out curve), else its own."""
        settings = rollout_settings(trainer)
        ranks = settings.vllm_tensor_parallel_size if settings.use_vllm else 1
        return cls(
            settings,
            check(settings, key, episodes),
            namespace,
            trainer.accelerator.process_index // ranks,
            lambda: global_step(trainer),
            lambda: generation_context(trainer),
            model or GenerationModel(settings.compute_dtype),
        )

    def seed(self) -> int:
        """The seed of a new generation call: (seed, namespace, step, call of the step, rank)."""
        step = self.step()
        calls = self.calls[1] if self.calls[0] == step else 0
        self.calls = (step, calls + 1)
        self.last_seed = derive(self.settings.seed, self.namespace, str(step), str(calls), str(self.rank))
        return self.last_seed

    def sampling(self, max_new_tokens: int, batch_size: int) -> SamplingParams:
        """rung's sampling settings for a call of `batch_size` rows."""
        return SamplingParams(
            temperature=self.settings.temperature,
            top_p=self.settings.top_p,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
        )

    @contextmanager
    def decoding(self) -> Iterator[PreTrainedModel]:
        """The model to decode with, unwrapped for the duration (`GenerationModel`)."""
        with self.unwrap() as unwrapped:
            yield self.model(unwrapped)

    def single_turn(self, prompt_ids: list[list[int]], images: Any, multimodal_fields: Any) -> list[list[int]] | None:
        """Rollouts through rung's decode loop (rung.generate.api: finished rows leave the batch, the group's
        prompt is encoded once for its samples, oneDNN-prepacked weights) where TRL would call batched
        `model.generate`, or None where the stage chose another generator. Each completion draws from its own
        stream seeded by (seed, step, call of the step, process, prompt, sample), so a resumed run generates what
        an unkilled one would."""
        seed = self.seed()
        if self.generator != "rung":
            return None  # TRL's own generation; vLLM's per-row seeds come from `seed`
        if images or multimodal_fields:
            raise InputError("rung's rollouts sample text prompts: a row with images needs TRL's generation")
        # TRL repeats each prompt for its group: generate the group's samples from one prompt encoding
        g = self.settings.num_generations
        n = (
            g
            if len(prompt_ids) % g == 0 and all(prompt_ids[i] == prompt_ids[i - i % g] for i in range(len(prompt_ids)))
            else 1
        )
        # every rollout of the step in one batch where memory allows (rung.generate.api sizes it on CUDA)
        sampling = self.sampling(self.settings.max_completion_length, len(prompt_ids))
        with self.decoding() as model:
            out = generate_ids(model, prompt_ids[::n], sampling, self.settings.eos_token_ids, n=n, seed=seed, desc=None)
        return [tokens for samples in out for tokens, _ in samples]
