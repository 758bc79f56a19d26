"""rung's one seam to TRL's trainers: every access rung makes to a private method or private state of
TRL's GRPOTrainer, RLOOTrainer or SFTTrainer (and transformers' Trainer under them) is in this module.
A TRL upgrade is a review of this file plus a run of tests/test_trl_seam.py, which checks each item
listed here against the installed TRL on the tiny model; rung.compat refuses untested versions.

rung's logic (rung.rl.sampling, rung.rl.reward_logs, rung.rl.rollouts, rung.rl.engine, rung.train.harness,
rung.train.movement) uses the public hooks and accessors below. Each override here is thin: it calls one
hook, whose default is TRL's own behaviour or that of a part the trainer is given (`Seam.__init__`: a
batch source, an advantage function, a metrics sink, and the rollout engine and log-probs, which read the
trainer's settings once when built; called with values, they read nothing else of the trainer), so rung
changes what it changes and nothing else. It lives in rung.train (not rung.rl) because
the SFT stage's harness shares two of the accesses.

Private methods overridden (OVERRIDDEN: the leading parameters relied on; the rest pass through):
- `_generate_and_score_completions(inputs) -> dict`: hook `generation_batch`; TRL's is
  `trl_generation_batch`. Only in training (`model.training`) does rung change it.
- `_calculate_rewards(inputs, prompts, completions, completion_ids_list) -> Tensor`: hook `scored`.
- `_generate_single_turn(prompt_ids, images, multimodal_fields, ...)`: hook `rollout`. GRPO's returns
  `(completion_ids, logprobs | None)` and takes `num_generations, has_tool_images` after these (its tool
  loop calls it once per turn with `num_generations=1`); RLOO's returns `completion_ids` alone
  (`ROLLOUT_LOGPROBS`).
- `_get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, batch_size,
  compute_entropy, compute_aux_loss, **multimodal) -> (logps, entropies | None, aux_loss | None)`:
  hook `token_logps` (TRL's own: `per_token_logps`); the loss's call (the one with grad enabled) is handed to the
  `probe` part too, with the policy's log-probs (rung.rl.kl_probe).
- `_save_checkpoint(model, trial)` / `_load_optimizer_and_scheduler(checkpoint)`: hooks `save_rung_state` /
  `load_rung_state`, plus TRL's generation cycle (below) per process.

Private state and methods read or written (PRIVATE_STATE):
- `_metrics["train"]`: a `defaultdict(list)` of the step's metrics, averaged at each log (GRPO, RLOO, SFT,
  and DPO, KTO and online DPO: rung.rl.preference, tests/test_preference.py): `train_metrics`.
- `_logs["advantages"]`: the completions table's advantages, the gathered batch's appended last by
  `_generate_and_score_completions`: `relog_advantages`.
- `_step`, `_buffered_inputs`: TRL's generation cycle (one batch per `steps_per_generation *
  num_iterations` steps; `_buffered_inputs` None until the first); saved in a checkpoint taken in the
  middle of a cycle and restored, since that batch cannot be regenerated.
- `_get_output_dir(trial=)`: where `_save_checkpoint` writes `checkpoint-<step>`.
- `_load_from_checkpoint(path)` (transformers' Trainer): the weights of a checkpoint: `load_checkpoint`.
- `vllm_generation.llm.generate`: the colocated vLLM engine's generate, wrapped by `wrap_vllm_generate`.
- `model(..., labels=, fused_lm_head=True)` returning `.log_probs` and `.entropy`: the fused LM head TRL
  adds to the trained model: `fused_logps`; SFTTrainer's `compute_loss` calls the model so (`FUSED_LM_HEAD`,
  the keyword rung.train.prefix's stand-in model answers); `reference_model` adds it to a copy of the init
  with TRL's `add_fused_lm_head`, as TRL adds it to its own reference model.
- `aux_loss_enabled` (SFTTrainer: a mixture-of-experts router loss added to the loss): `aux_loss_enabled`.
- The methods that run each phase of a step (`PHASES`), wrapped on an instance by `wrap_phases` (bench/'s
  timers), and `_generate_and_score_completions` called by `generation_and_scoring` (bench/episodes.py).

Return shapes relied on (tests/test_trl_seam.py checks each, on both trainers):
- `_generate_and_score_completions`: a dict of this process's rows. `prompt_ids` / `prompt_mask`
  left-padded, `completion_ids` / `completion_mask` (and GRPO's `tool_mask`) right-padded,
  `advantages` (rows,) = this process's slice (at `process_index * rows`) of the gathered batch; GRPO
  adds `num_items_in_batch` (loss tokens over all processes), RLOO `old_logps`; every tensor but
  `num_items_in_batch` has the rows first (`concat_groups` relies on that).
- `_calculate_rewards`: (rows of all processes, reward functions), NaN where a function declined.
- `_get_train_sampler`: each prompt index `num_generations` times in a row, so a generation batch holds
  whole groups; rung's `generation_batch` keeps the batch's size and draws its prompts anew.
- `_compute_loss(model, inputs)`: a scalar from such a dict, the same from `concat_groups` of its groups.

Public but undocumented trainer attributes rung reads: `num_generations`, `reward_funcs`,
`reward_func_names`; the rollouts' (`ROLLOUT_ATTRIBUTES`, read once into `RolloutSettings` by
`rollout_settings`, and `args`' `seed`, `generation_kwargs`, `vllm_mode`, `vllm_tensor_parallel_size`, `bf16`,
`fp16`, `ds3_gather_for_generation`, `gradient_checkpointing_kwargs`); and
`trl.models.unwrap_model_for_generation` (`generation_context`). TRL's utils rung uses come from here: `nanstd`,
`pad`. rung's batch source is given the reward functions' names and weights as rung hands them to TRL, which
are TRL's `reward_func_names` (a callable's `__name__`) and `reward_weights`.

Multi-turn episodes (EPISODE_HOOKS; nothing of them is overridden: rung's RL stages train episodes through
GRPOTrainer's public `rollout_func`, rung.rl.episodes, whose `env_mask` TRL takes as its `tool_mask`).
In TRL 1.16's GRPOTrainer (grpo_trainer.py) `_generate_and_score_completions` draws one environment per rollout from
`environment_factory` and calls its `reset` (`environments`, `_batch_environments`,
`_sync_tool_dicts`), then `_generate(prompts)` generates the first turn through `_generate_single_turn`
and, where `tools` is set, runs `_tool_call_loop`: tool calls parsed from each completion are executed,
their results appended (`_get_tool_suffix_ids`), the next turn generated by `_generate_single_turn(...,
num_generations=1)`, up to `max_tool_calling_iterations`; it returns a `tool_mask` (0 on tool / environment
tokens) that `_compute_loss` multiplies into the completion mask. rung does not override this loop: its
episode loop (rung.envs.loop) is GRPOTrainer's public `rollout_func`, which replaces `_generate` whole and
returns prompt_ids, completion_ids and `env_mask` (TRL's `tool_mask`); the methods are listed to be watched
on a TRL upgrade, since `rollout_func`'s contract with them (tool_mask into the loss) is what episodes rely on.
rung.envs.loop copies their behaviour (tool calls run and failures reported as `_tool_call_loop` does, env turns
rendered as `_get_tool_suffix_ids` renders them); tests/test_tool_loop_contract.py runs both on the same scripted
turns.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from trl import GRPOTrainer, RLOOTrainer
from trl.models import unwrap_model_for_generation
from trl.trainer.utils import add_fused_lm_head, pad
from trl.trainer.utils import nanstd as nanstd  # for rung's modules (module docstring)

from rung.train.checkpoints import generation_state
from rung.train.parts import AdvantageFn, Batches, Generated, Generation, LogpsBatch, TokenLogps

OVERRIDDEN: dict[str, list[str]] = {
    "_generate_and_score_completions": ["self", "inputs"],
    "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
    "_generate_single_turn": ["self", "prompt_ids", "images", "multimodal_fields"],
    "_get_per_token_logps_and_entropies": [
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
        "compute_aux_loss",
    ],
    "_save_checkpoint": ["self", "model", "trial"],
    "_load_optimizer_and_scheduler": ["self", "checkpoint"],
}
"""TRL's private methods `Seam` overrides, with the leading parameters it relies on (the rest pass through)."""

PRIVATE_STATE = ("_metrics", "_logs", "_step", "_buffered_inputs", "_get_output_dir", "_load_from_checkpoint")
"""TRL's (and transformers') private attributes and methods this module reads, writes or calls."""

EPISODE_HOOKS: dict[str, list[str]] = {
    "_generate": ["self", "prompts"],
    "_tool_call_loop": [
        "self",
        "prompts",
        "prompt_ids",
        "completion_ids",
        "completions",
        "logprobs",
        "images",
        "multimodal_fields",
    ],
    "_get_tool_suffix_ids": ["self", "tool_messages"],
}
"""GRPOTrainer's private methods of TRL's own tool loop (module docstring), with their parameters in TRL 1.16:
watched (tests/test_trl_seam.py), not overridden, since rung's episodes reach TRL through `rollout_func`."""

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


class Seam:
    """The base of rung's trainers on TRL's GRPO family (GRPOSeam, RLOOSeam): the parts it is given (a batch
    source, an advantage function, a metrics sink, a rollout engine and log-probs), hooks whose defaults are TRL's
    behaviour or the parts', TRL's own steps for them to call, and the private overrides that call the hooks."""

    ROLLOUT_LOGPROBS: bool
    """Whether the trainer's `_generate_single_turn` returns (completion ids, logprobs) or the ids alone."""
    pending_rewards: torch.Tensor | None = None
    """The rewards of the generation batch TRL is making, from `_calculate_rewards` to `scored_generation_batch`."""

    # The TRL trainer's own attributes the seam reads (declared for type checkers; TRL sets them)
    model: Any
    state: Any
    args: Any
    accelerator: Any
    processing_class: Any
    vllm_generation: Any
    num_generations: int | None  # TRL's config type; its __post_init__ always fills it in
    num_iterations: int
    reward_func_names: list[str]
    _get_output_dir: Callable[..., str]
    _metrics: dict[str, defaultdict[str, list[float]]]
    _logs: dict[str, Any]

    def __init__(
        self,
        *args: Any,
        batch_source: Batches | None = None,
        advantages: AdvantageFn | None = None,
        metrics: defaultdict[str, list[float]] | None = None,
        generation: Callable[[Seam], Generation] | None = None,
        **kwargs: Any,
    ) -> None:
        """TRL's trainer arguments, plus the parts: `batch_source` (None: TRL's sampler's batches), the
        `advantages` trained with (None: TRL's), `metrics`, the sink the parts log a step's metrics into,
        which becomes TRL's (`train_metrics`), and `generation`, the factory of the rollout engine and
        log-probs (None: TRL's), called once TRL has set the trainer up, since they read its settings."""
        super().__init__(*args, **kwargs)
        self.batch_source, self.advantages = batch_source, advantages
        if metrics is not None:
            self._metrics["train"] = metrics
        parts = None if generation is None else generation(self)
        self.rollouts = None if parts is None else parts.rollouts
        self.logprobs = None if parts is None else parts.logprobs
        self.probe = None if parts is None else parts.probe

    @property
    def group_size(self) -> int:
        """Completions per prompt (TRL's num_generations, set by the time a trainer exists)."""
        assert self.num_generations is not None
        return self.num_generations

    # Hooks: TRL's behaviour, or the parts'.

    def generation_batch(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """The batch a generation step trains on, for TRL's generation batch `inputs` (module
        docstring: `_generate_and_score_completions`): the batch source's in training."""
        if self.batch_source is None or not self.model.training:
            return self.trl_generation_batch(inputs)
        return self.batch_source.batch(
            len(inputs), self.state.global_step, self.objective_generation_batch, self.concat_groups
        )

    def scored(self, rewards: torch.Tensor, prompts: list[Any]) -> torch.Tensor:
        """The rewards TRL's advantages are computed from, given TRL's: (rows of all processes, reward
        functions), for this process's `prompts`."""
        return rewards if self.batch_source is None else self.batch_source.scored(rewards, len(prompts))

    def rollout(self, prompt_ids: list[list[int]], images: Any, multimodal_fields: Any) -> list[list[int]] | None:
        """Completion ids for `prompt_ids` (TRL repeats each prompt for its group): the rollout engine's, or None
        for TRL's own generation."""
        return None if self.rollouts is None else self.rollouts.single_turn(prompt_ids, images, multimodal_fields)

    def token_logps(self, batch: LogpsBatch) -> TokenLogps | None:
        """(log-probs, entropies, aux loss) of the completion tokens: the log-probs part's, or None for TRL's own
        computation."""
        return None if self.logprobs is None else self.logprobs(batch)

    def save_rung_state(self, checkpoint: Path) -> None:
        """Write rung's state into `checkpoint` (every process calls it) before TRL writes its own."""
        if self.batch_source is not None:
            self.batch_source.save(checkpoint, self.args.should_save)

    def load_rung_state(self, checkpoint: Path) -> None:
        """Restore rung's state from `checkpoint` after TRL restored its optimizer and scheduler."""
        if self.batch_source is not None:
            self.batch_source.load(checkpoint)

    # TRL's own steps, for the hooks.

    def per_token_logps(self, batch: LogpsBatch) -> TokenLogps:
        """The trainer's log-probs of `batch`: the `token_logps` hook's, else TRL's own computation."""
        out = self.token_logps(batch)
        if out is not None:
            return out
        return super()._get_per_token_logps_and_entropies(  # type: ignore[misc]
            batch.model,
            batch.input_ids,
            batch.attention_mask,
            batch.logits_to_keep,
            batch.batch_size,
            batch.compute_entropy,
            batch.compute_aux_loss,
            **batch.multimodal,
        )

    def trl_generation_batch(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """TRL's generation and scoring of `inputs` (rows as the dataset holds them)."""
        return super()._generate_and_score_completions(inputs)  # type: ignore[misc]

    def scored_generation_batch(self, inputs: list[dict[str, Any]]) -> Generated:
        """TRL's generation and scoring of `inputs`, with the rewards and advantages of every process."""
        batch = self.trl_generation_batch(inputs)
        # TRL computes the rewards inside that call and keeps them to itself: `_calculate_rewards` left them here
        rewards, self.pending_rewards = self.pending_rewards, None
        if rewards is None:
            raise RuntimeError("TRL generated a batch without scoring it through _calculate_rewards")
        return Generated(batch, rewards, self.accelerator.gather(batch["advantages"]))

    def objective_generation_batch(self, inputs: list[dict[str, Any]]) -> Generated:
        """`scored_generation_batch`, the batch's advantages (and the completions table's) the advantage
        part's; `Generated.advantages` stays TRL's (the curricula's learnability signal, rung.rl.sampling)."""
        generated = self.scored_generation_batch(inputs)
        if self.advantages is None:
            return generated
        out = generated.batch
        advantages = self.advantages(generated.rewards, self.reward_func_names, generated.advantages, self.group_size)
        local = len(out["advantages"])  # TRL's slice of the gathered batch for this process
        start = self.accelerator.process_index * local
        out["advantages"] = advantages[start : start + local].to(out["advantages"].device)
        # TRL logged its own (gathered) advantages for the completions table: log those trained with
        self.relog_advantages(advantages.tolist())
        return generated

    @staticmethod
    def fused_logps(model: Any, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log-probs, entropies) of each next token, (rows, length - 1), of a forward through TRL's fused
        LM head (positions whose label is -100 are not scored)."""
        out = model(**inputs, fused_lm_head=True)
        return out.log_probs, out.entropy

    def relog_advantages(self, advantages: list[float]) -> None:
        """Replace the advantages TRL logged for the last generated (gathered) batch in the completions table."""
        logged = self._logs["advantages"]
        for _ in range(len(advantages)):
            logged.pop()
        logged.extend(advantages)

    def concat_groups(self, groups: list[tuple[dict[str, Any], int]]) -> dict[str, Any]:
        """One training batch of groups taken from several generation batches: (batch, index of the
        group in it) each, re-padded as TRL pads them; `num_items_in_batch` recounted over all processes."""
        g, pad_id = self.group_size, self.processing_class.pad_token_id
        merged: dict[str, Any] = {}
        for key, first in groups[0][0].items():
            if key == "num_items_in_batch" or not isinstance(first, torch.Tensor):
                continue
            rows = [row for out, j in groups for row in out[key][j * g : (j + 1) * g]]
            if first.dim() == 1:
                merged[key] = torch.stack(rows)
                continue
            value = pad_id if key.endswith("_ids") else 0
            merged[key] = pad(rows, padding_value=value, padding_side="left" if key.startswith("prompt") else "right")
        if "num_items_in_batch" in groups[0][0]:
            mask = merged["completion_mask"] * merged.get("tool_mask", 1)
            merged["num_items_in_batch"] = self.accelerator.gather(mask.sum()).sum()
        return merged

    def wrap_vllm_generate(self, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        """Replace the colocated vLLM engine's `generate` by `wrap(generate)`."""
        llm = self.vllm_generation.llm
        llm.generate = wrap(llm.generate)

    # TRL's private methods, each through its hook.

    def _generate_and_score_completions(self, inputs):
        return self.generation_batch(inputs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # type: ignore[misc]
        self.pending_rewards = self.scored(rewards, prompts)
        return self.pending_rewards

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, *args, **kwargs):
        ids = self.rollout(prompt_ids, images, multimodal_fields)
        if ids is None:
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, *args, **kwargs)  # type: ignore[misc]
        return (ids, None) if self.ROLLOUT_LOGPROBS else ids

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **multimodal,
    ):
        batch = LogpsBatch(
            model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, multimodal
        )
        out = self.per_token_logps(batch)
        if self.probe is not None and torch.is_grad_enabled():  # the loss's forward (TRL's others run without grad)
            self.probe(batch, out[0])
        return out

    def _save_checkpoint(self, model, trial):
        # rung's state first: TRL writes trainer_state.json last and then deletes the previous
        # checkpoint, so wherever a kill lands a complete checkpoint (rung.train.checkpoints) is left.
        checkpoint = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
        self.save_rung_state(checkpoint)
        # Every process its own slice of the batch; kept only in the middle of a cycle, where TRL reuses it
        # (the generation batch was made by the weights before this step's update: it cannot be regenerated).
        middle = self._step % (self.args.steps_per_generation * self.num_iterations)
        checkpoint.mkdir(parents=True, exist_ok=True)
        torch.save(
            {"step": self._step, "buffered": self._buffered_inputs if middle else None},
            checkpoint / generation_state(self.accelerator.process_index),
        )
        super()._save_checkpoint(model, trial)  # type: ignore[misc]

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)  # type: ignore[misc]
        if checkpoint is None:
            return
        self.load_rung_state(Path(checkpoint))
        cycle = Path(checkpoint) / generation_state(self.accelerator.process_index)
        if cycle.exists():
            state = torch.load(cycle, map_location=self.accelerator.device, weights_only=True)
            self._step, self._buffered_inputs = state["step"], state["buffered"]


class GRPOSeam(Seam, GRPOTrainer):
    """rung's trainer on TRL's GRPOTrainer (rung.rl.trainers builds it from a stage's params)."""

    ROLLOUT_LOGPROBS = True


class RLOOSeam(Seam, RLOOTrainer):
    """rung's trainer on TRL's RLOOTrainer, as GRPOSeam."""

    ROLLOUT_LOGPROBS = False
