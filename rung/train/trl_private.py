"""The accessors of rung's seam to TRL (rung.train.trl_seam, the other half, holds `Seam`, the trainer class
that overrides TRL's private methods): every read, write or call rung makes of the private state of TRL's
trainers (GRPOTrainer, RLOOTrainer, SFTTrainer, the DPO family, and transformers' Trainer under them), other
than `Seam`'s on itself, is a function here. This docstring lists the private state both halves touch;
tests/test_trl_seam.py checks each item against the installed TRL on the tiny model, and that no module but
these two touches one. rung's logic (rung.rl.sampling, rung.rl.reward_logs, rung.rl.engine,
rung.rl.kl_probe, rung.train.harness, rung.train.movement, rung.train.prefix, bench/) uses these accessors.

Private state and methods read or written (PRIVATE_STATE):
- `_metrics["train"]`: a `defaultdict(list)` of the step's metrics, averaged at each log (GRPO, RLOO, SFT,
  and DPO, KTO and online DPO: rung.rl.preference, tests/test_preference.py): `train_metrics`.
- `_logs["advantages"]`: the completions table's advantages, the gathered batch's appended last by
  `_generate_and_score_completions`: `Seam.relog_advantages`.
- `_step`, `_buffered_inputs`: TRL's generation cycle (one batch per `steps_per_generation *
  num_iterations` steps; `_buffered_inputs` None until the first); saved in a checkpoint taken in the
  middle of a cycle and restored, since that batch cannot be regenerated.
- `_get_output_dir(trial=)`: where `Seam._save_checkpoint` writes `checkpoint-<step>`.
- `_load_from_checkpoint(path)` (transformers' Trainer): the weights of a checkpoint: `load_checkpoint`.
- `vllm_generation.llm.generate`: the colocated vLLM engine's generate, wrapped by `Seam.wrap_vllm_generate`.
- `model(..., labels=, fused_lm_head=True)` returning `.log_probs` and `.entropy`: the fused LM head TRL
  adds to the trained model: `Seam.fused_logps`; SFTTrainer's `compute_loss` calls the model so (`FUSED_LM_HEAD`,
  the keyword rung.train.prefix's stand-in model answers); `reference_model` adds it to a copy of the init
  with TRL's `add_fused_lm_head`, as TRL adds it to its own reference model.
- `aux_loss_enabled` (SFTTrainer: a mixture-of-experts router loss added to the loss): `aux_loss_enabled`.
- `_prepare_dataset(dataset, processing_class, args, dataset_name)` (DPOTrainer, KTOTrainer; `PREPARE_DATASET`):
  TRL tokenizes the pairs' text there, special-token strings as special tokens, and offers no public way to skip
  it; `PretokenizedDPO` / `PretokenizedKTO` take rung's ids (rung.rl.preference.example_ids) instead and keep the
  rest: dropping examples whose prompt fills `max_length`, and KTO's mismatched completions for its KL estimate.
- The methods that run each phase of a step (`PHASES`), wrapped on an instance by `wrap_phases` (bench/'s
  timers), and `_generate_and_score_completions` called by `generation_and_scoring` (bench/episodes.py).

Public but undocumented trainer attributes rung reads: `num_generations`, `reward_funcs`,
`reward_func_names`; the rollouts' (`ROLLOUT_ATTRIBUTES`, read once into `RolloutSettings` by
`rollout_settings`, and `args`' `seed`, `generation_kwargs`, `vllm_mode`, `vllm_tensor_parallel_size`, `bf16`,
`fp16`, `ds3_gather_for_generation`, `gradient_checkpointing_kwargs`); and
`trl.models.unwrap_model_for_generation` (`generation_context`). TRL's `nanstd` is rung's from here (`pad`
is `Seam`'s). rung's batch source is given the reward functions' names and weights as rung hands them to TRL, which
are TRL's `reward_func_names` (a callable's `__name__`) and `reward_weights`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from datasets import Dataset
from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer
from trl.models import unwrap_model_for_generation
from trl.trainer.utils import add_fused_lm_head
from trl.trainer.utils import nanstd as nanstd  # for rung's modules (module docstring)

PRIVATE_STATE = ("_metrics", "_logs", "_step", "_buffered_inputs", "_get_output_dir", "_load_from_checkpoint")
"""TRL's (and transformers') private attributes and methods the seam (this module and rung.train.trl_seam) reads,
writes or calls."""

PHASES: dict[str, str] = {
    "generation": "_generate_single_turn",  # one turn of rollouts
    "episodes": "_generate",  # a batch's rollouts, TRL's tool loop included
    "rewards": "_calculate_rewards",
    "rollout": "_generate_and_score_completions",  # the above, log-probs of the old policy and advantages
    "loss forward": "compute_loss",
    "step": "training_step",  # the rollout (once per generation cycle), loss forward and backward
    "checkpoint save": "_save_checkpoint",
}
"""The trainer method that runs each phase of a training step (bench/phases.py times them)."""

ROLLOUT_ATTRIBUTES = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "max_completion_length",
    "eos_token_ids",
    "num_generations",
    "use_vllm",
    "model_wrapped",
)
"""The trainer attributes a rollout reads (both trainers; GRPO's `use_transformers_continuous_batching` and
`tools` too, where set)."""

FUSED_LM_HEAD = "fused_lm_head"
"""The keyword with which TRL's trainers call the model for log-probs through their fused LM head."""


def train_metrics(trainer: Any) -> dict[str, list[float]]:
    """The training metrics of the current step of any TRL trainer: a list per key, which TRL averages
    into the next log taken while the model is in training mode (under the key's name), then clears."""
    return trainer._metrics["train"]


def has_train_metrics(trainer: Any) -> bool:
    """Whether the trainer keeps TRL's per-step metrics (`train_metrics`): TRL's trainers do, transformers'
    plain Trainer (the process reward model's) does not."""
    return isinstance(getattr(trainer, "_metrics", None), dict)


def load_checkpoint(trainer: Any, checkpoint: str) -> None:
    """Load the weights of `checkpoint` into the trainer's model (transformers' own loader: sharded,
    FSDP, DeepSpeed and peft checkpoints alike), without training state."""
    trainer._load_from_checkpoint(checkpoint)


def aux_loss_enabled(trainer: Any) -> bool:
    """Whether TRL's SFTTrainer adds a mixture-of-experts router loss to its loss."""
    return bool(trainer.aux_loss_enabled)


def wrap_phases(
    trainer: Any, wrap: Callable[[str, Callable[..., Any]], Callable[..., Any]], phases: Iterable[str] = tuple(PHASES)
) -> None:
    """Shadow the method of each of `phases` the trainer has (`PHASES`) by `wrap(phase, method)` on the instance:
    calls through `self.` reach the wrapper, the class's method stays TRL's."""
    for phase in phases:
        if hasattr(trainer, PHASES[phase]):
            setattr(trainer, PHASES[phase], wrap(phase, getattr(trainer, PHASES[phase])))


def generation_and_scoring(trainer: Any, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """The trainer's rollout phase on `inputs` (a generation batch as the dataset holds its rows)."""
    return trainer._generate_and_score_completions(inputs)


@dataclass(frozen=True)
class RolloutSettings:
    """What a TRL trainer's rollouts are asked to do, read once from it (`rollout_settings`)."""

    seed: int
    temperature: float
    top_p: float
    top_k: int | None
    min_p: float | None
    repetition_penalty: float
    generation_kwargs: dict[str, Any]
    max_completion_length: int
    eos_token_ids: list[int]
    num_generations: int
    use_vllm: bool
    vllm_mode: str
    vllm_tensor_parallel_size: int
    continuous_batching: bool
    """TRL's transformers continuous batching (GRPO's `use_transformers_continuous_batching`)."""
    tools: bool
    """TRL's own tool loop (GRPO's `tools`)."""
    compute_dtype: torch.dtype | None
    """bf16 / fp16 mixed precision's dtype; None under float32 compute."""


def rollout_settings(trainer: Any) -> RolloutSettings:
    """The rollout settings of a GRPO-family trainer (`ROLLOUT_ATTRIBUTES` and its args)."""
    args = trainer.args
    return RolloutSettings(
        seed=args.seed,
        temperature=trainer.temperature,
        top_p=trainer.top_p,
        top_k=trainer.top_k,
        min_p=trainer.min_p,
        repetition_penalty=trainer.repetition_penalty,
        generation_kwargs=dict(args.generation_kwargs or {}),
        max_completion_length=trainer.max_completion_length,
        eos_token_ids=list(trainer.eos_token_ids),
        num_generations=trainer.num_generations,
        use_vllm=bool(trainer.use_vllm),
        vllm_mode=args.vllm_mode,
        vllm_tensor_parallel_size=args.vllm_tensor_parallel_size,
        continuous_batching=bool(getattr(trainer, "use_transformers_continuous_batching", False)),
        tools=bool(getattr(trainer, "tools", None)),
        compute_dtype=torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None,
    )


def generation_context(trainer: Any) -> AbstractContextManager[Any]:
    """The trainer's model unwrapped for generation (DeepSpeed ZeRO-3 gathered, gradient checkpointing off), as
    TRL's own generation unwraps it."""
    return unwrap_model_for_generation(
        trainer.model_wrapped,
        trainer.accelerator,
        gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
        gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
    )


def reference_model(trainer: Any, model: Any) -> Any:
    """`model` (a frozen copy of the init, not yet TRL's) given the fused LM head TRL gives its own reference model
    (`FUSED_LM_HEAD`, at the trainer's sampling temperature), in eval mode on the trainer's device."""
    add_fused_lm_head(model, temperature=trainer.temperature)
    return model.to(trainer.accelerator.device).eval().requires_grad_(False)


def global_step(trainer: Any) -> int:
    """The optimizer steps the trainer has taken (transformers' TrainerState)."""
    return int(trainer.state.global_step)


PREPARE_DATASET = ["self", "dataset", "processing_class", "args", "dataset_name"]
"""The parameters of DPOTrainer's and KTOTrainer's `_prepare_dataset`, which the Pretokenized trainers override."""


def _fitting(dataset: Dataset, args: DPOConfig | KTOConfig) -> Dataset:
    # TRL's own drop: a prompt that fills max_length would leave no completion token to learn from
    if args.max_length is None or getattr(args, "truncation_mode", "keep_start") != "keep_start":
        return dataset
    return dataset.filter(lambda example: len(example["prompt_ids"]) < args.max_length)


class PretokenizedDPO(DPOTrainer):
    """TRL's DPOTrainer on a dataset rung tokenized (`prompt_ids`, `chosen_ids`, `rejected_ids`)."""

    def _prepare_dataset(self, dataset: Dataset, processing_class: Any, args: DPOConfig, dataset_name: str) -> Dataset:
        return _fitting(dataset, args)


class PretokenizedKTO(KTOTrainer):
    """TRL's KTOTrainer on a dataset rung tokenized (`prompt_ids`, `completion_ids`, `label`)."""

    def _prepare_dataset(self, dataset: Dataset, processing_class: Any, args: KTOConfig, dataset_name: str) -> Dataset:
        dataset = _fitting(dataset, args)
        if not self.calculate_KL:
            return dataset

        def mismatched(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
            # as TRL estimates KL: each completion paired with the prompt after it, rotated within a batch
            return {"KL_completion_ids": [batch["completion_ids"][-1], *batch["completion_ids"][:-1]]}

        return dataset.map(mismatched, batched=True, batch_size=args.per_device_train_batch_size)
