"""Where rung's RL steps do less work than TRL's on the same rollouts, as a mixin in front of
rung.train.trl_seam's GRPOSeam / RLOOSeam (its hooks `rollout` and `token_logps`; no TRL internals here). The
work is done by typed parts the trainer holds, built once from its settings:

- `rollouts` (rung.rl.engine.RolloutEngine): rollouts through rung.generate.api instead of batched
  `model.generate`, or the stage's chosen generator (vLLM, seeded per row by rung.rl.vllm_rollouts.SeededRows;
  TRL's for a sampling setting rung's loop lacks), each call's seed its own; the same engine runs a stage's
  episodes (rung.rl.episodes);
- `logprobs` (rung.rl.logprobs.LogProbs): log-probabilities that encode the prompts' shared prefix once per
  batch and each prompt once per group, completions in chunks of like lengths;
- `generation_model` (rung.rl.engine.GenerationModel): the model the rollouts and the held-out curve decode with.
"""

from __future__ import annotations

from typing import Any

import torch

from rung.errors import InputError
from rung.generate.api import generate_ids
from rung.rl.engine import GenerationModel, RolloutEngine
from rung.rl.logprobs import LogProbs
from rung.rl.vllm_rollouts import SeededRows
from rung.train.trl_seam import rollout_settings


class Rollouts:
    rollouts: RolloutEngine
    logprobs: LogProbs
    generation_model: GenerationModel

    def __init__(self, *args: Any, key: str = "rl.stages.main", **kwargs: Any) -> None:
        """TRL's trainer arguments, plus the stage's params `key` that a refused setting is named under."""
        super().__init__(*args, **kwargs)
        episodes = getattr(self, "rollout_func", None) is not None  # rung.rl.episodes: rung's loop as TRL's
        self.generation_model = GenerationModel(rollout_settings(self).compute_dtype)
        self.rollouts = RolloutEngine.of(
            self, "episodes" if episodes else "rollouts", key, episodes, self.generation_model
        )
        self.logprobs = LogProbs(
            self.model.config,  # type: ignore[attr-defined]
            self.accelerator.num_processes,  # type: ignore[attr-defined]
            self.accelerator.autocast,  # type: ignore[attr-defined]
        )
        if self.rollouts.generator == "vllm" and self.args.vllm_mode == "colocate":  # type: ignore[attr-defined]
            # TRL hands colocated vLLM one seed per batch: rung seeds each row from this call's seed
            engine = self.rollouts
            self.wrap_vllm_generate(lambda generate: SeededRows(generate, lambda: engine.last_seed))  # type: ignore[attr-defined]

    def rollout(self, prompt_ids: list[list[int]], images: Any, multimodal_fields: Any) -> list[list[int]] | None:
        """Rollouts through rung's decode loop (rung.generate.api: finished rows leave the batch, the
        group's prompt is encoded once for its samples, oneDNN-prepacked weights) where TRL would call
        batched `model.generate`, unless the stage chose another generator (rung.rl.engine). Each completion
        draws from its own stream seeded by (seed, step, call of the step, process, prompt, sample), so a
        resumed run generates what an unkilled one would."""
        engine = self.rollouts
        seed = engine.seed()
        if engine.generator != "rung":
            return None  # TRL's own generation; vLLM's per-row seeds come from `seed`
        if images or multimodal_fields:
            raise InputError("rung's rollouts sample text prompts: a row with images needs TRL's generation")
        # TRL repeats each prompt for its group: generate the group's samples from one prompt encoding
        g = engine.settings.num_generations
        n = (
            g
            if len(prompt_ids) % g == 0 and all(prompt_ids[i] == prompt_ids[i - i % g] for i in range(len(prompt_ids)))
            else 1
        )
        # every rollout of the step in one batch where memory allows (rung.generate.api sizes it on CUDA)
        sampling = engine.sampling(engine.settings.max_completion_length, len(prompt_ids))
        with engine.decoding() as model:
            out = generate_ids(
                model, prompt_ids[::n], sampling, engine.settings.eos_token_ids, n=n, seed=seed, desc=None
            )
        return [tokens for samples in out for tokens, _ in samples]

    def token_logps(self, *batch: Any) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None:
        """rung's shared-prefix log-probs (rung.rl.logprobs.LogProbs, the hook's arguments as they are), None
        (TRL's) for a batch they do not cover."""
        return self.logprobs(*batch)
