"""The schema of params.yaml, validated before any compute: `Params` and how a file becomes one.

Top-level keys are the stage names of dvc.yaml (model, curate, difficulty, sft, rl, eval) plus the
cross-cutting `seed`, `format`, `generation` and `tracking`. Each stage's sections live in their own
module, and every field is documented once, there:

- `base`: `Section` (unknown keys are errors) and `ConfigError`;
- `common`: model, format, sampling, generation backend, launch, tracking;
- `data`: sources, filters, mix and curate; difficulty; the SFT traces;
- `sft`: LoRA and the SFT stage;
- `rl`: rewards, dynamic sampling, presets, an RL stage and the chain of stages;
- `curricula`: the RL stage's curricula;
- `eval`: decoding, bootstrap and the eval sets;
- `envs`: the environment of multi-turn episodes;
- `rewardmodels`: the learned-reward stages (a reward model, a process reward model).

This module holds `Params`, `parse` / `load` (one-line errors naming the file and the dotted key),
`read_yaml` and `with_overrides`, and re-exports every section, so `from rung.config import X` works.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from rung import paths
from rung.config.base import ConfigError, Section
from rung.config.common import (
    FormatParams,
    GenerationParams,
    LaunchParams,
    LoraParams,
    ModelParams,
    SamplingParams,
    TrackingParams,
    VllmParams,
)
from rung.config.curricula import (
    AdaptiveCurriculum,
    BanditCurriculum,
    Curriculum,
    CurriculumPhase,
    PoolParams,
    PoolsCurriculum,
    ScheduledCurriculum,
    StagedCurriculum,
    UniformCurriculum,
)
from rung.config.data import (
    BenchmarkSource,
    CodeSource,
    ColumnMap,
    CurateParams,
    DifficultyParams,
    FileSource,
    FilterParams,
    HFSource,
    MixParams,
    ReasoningGymSource,
    SampledTraces,
    SolutionTraces,
    Source,
    ToolTraces,
    TraceSource,
    _TabularSource,
)
from rung.config.envs import BUILTIN_ENVIRONMENTS, EnvironmentParams
from rung.config.eval import BootstrapParams, EvalParams, SampledEvalParams
from rung.config.preference import PREFERENCE_ALGORITHMS, PreferenceParams
from rung.config.rewardmodels import (
    STAGE_NAME,
    PreferenceFile,
    ProcessRewardModelParams,
    RewardModelParams,
    VerifierPairs,
)
from rung.config.rl import (
    BUILTIN_REWARDS,
    PRESETS,
    REWARD_TASKS,
    DynamicSamplingParams,
    RewardParams,
    RLParams,
    RLStageParams,
)
from rung.config.sft import SFTParams

__all__ = [
    "BUILTIN_ENVIRONMENTS",
    "BUILTIN_REWARDS",
    "PREFERENCE_ALGORITHMS",
    "PRESETS",
    "PreferenceParams",
    "REWARD_TASKS",
    "AdaptiveCurriculum",
    "BanditCurriculum",
    "BenchmarkSource",
    "CodeSource",
    "BootstrapParams",
    "ColumnMap",
    "ConfigError",
    "CurateParams",
    "Curriculum",
    "CurriculumPhase",
    "DifficultyParams",
    "DynamicSamplingParams",
    "EnvironmentParams",
    "EvalParams",
    "FileSource",
    "FilterParams",
    "FormatParams",
    "GenerationParams",
    "HFSource",
    "LaunchParams",
    "LoraParams",
    "MixParams",
    "ModelParams",
    "Params",
    "PoolParams",
    "PoolsCurriculum",
    "PreferenceFile",
    "ProcessRewardModelParams",
    "ReasoningGymSource",
    "RewardModelParams",
    "RewardParams",
    "RLParams",
    "RLStageParams",
    "SampledEvalParams",
    "SampledTraces",
    "SamplingParams",
    "ScheduledCurriculum",
    "Section",
    "SFTParams",
    "SolutionTraces",
    "Source",
    "StagedCurriculum",
    "ToolTraces",
    "TraceSource",
    "TrackingParams",
    "VerifierPairs",
    "VllmParams",
    "UniformCurriculum",
    "_TabularSource",
    "load",
    "parse",
    "read_yaml",
    "with_overrides",
]


_TRL_SAMPLING = ("top_k", "min_p", "repetition_penalty", "generation_kwargs", "use_transformers_continuous_batching")
"""GRPOConfig's sampling settings beyond temperature and top_p, which an episode's sampler lacks."""


class Params(Section):
    seed: int = Field(42, ge=0)
    """One seed; each stage derives its own from it (rung.seeding)."""
    model: ModelParams = ModelParams()
    """The model every stage starts from and where stages run it (the `model` stage)."""
    format: FormatParams = FormatParams()
    """The response format every stage speaks: prompts, SFT targets, rewards, grading."""
    generation: GenerationParams = GenerationParams()
    """The rollout engine of the difficulty, traces and eval stages."""
    curate: CurateParams
    """The `curate` stage: sources, filters, mix and the held-out split."""
    difficulty: DifficultyParams = DifficultyParams()
    """The `difficulty` stage: pass rates, buckets and the pass-rate window of the RL train set."""
    sft: SFTParams = SFTParams()
    """The `traces` and `sft` stages: where SFT targets come from and how the warm-start trains."""
    rl: RLParams
    """The RL stages (`rl@<name>`), run in order, each from its `init` checkpoint."""
    environment: EnvironmentParams | None = None
    """null: single-turn (prompt -> completion -> reward). A mapping (or a name alone: `python` is `{name: python}`)
    makes every stage that generates run episodes in this environment: difficulty scoring, SFT traces, the RL
    stages (unless one sets its own) and every evaluation, so that the held-out number measures what was trained
    (rung.envs; docs/environments.md)."""
    reward_models: dict[str, RewardModelParams] = {}
    """Reward models by name, each its own stage (`reward_models@<name>`): Bradley-Terry on preference pairs
    (docs/reward_models.md). None by default: no stage."""
    process_reward_models: dict[str, ProcessRewardModelParams] = {}
    """Process reward models by name, each its own stage (`process_reward_models@<name>`): per-step scores
    trained on Monte-Carlo step labels (docs/reward_models.md). None by default: no stage."""
    eval: EvalParams = EvalParams()
    """The eval stages (`eval_base`, `eval_sft`, `eval_rl@<name>`): decoding, bootstrap and eval sets."""
    tracking: TrackingParams = TrackingParams()
    """Where MLflow records the runs."""

    @model_validator(mode="after")
    def _known_buckets(self) -> Params:
        known = set(self.difficulty.buckets)
        for name, stage in self.rl.stages.items():
            used = {*(stage.buckets or [])}
            if isinstance(stage.curriculum, StagedCurriculum):
                used |= {b for p in stage.curriculum.phases for b in p.buckets}
            if used - known:
                raise ValueError(
                    f"rl.stages.{name}: unknown difficulty buckets {sorted(used - known)} "
                    f"(difficulty.buckets has {sorted(known)})"
                )
        sampled = self.eval.samples.checkpoints if self.eval.samples else None
        if sampled and set(sampled) - set(self.checkpoints):
            raise ValueError(
                f"eval.samples.checkpoints: {sorted(set(sampled) - set(self.checkpoints))} are not checkpoints "
                f"of this pipeline {self.checkpoints}"
            )
        return self

    @model_validator(mode="after")
    def _learned_reward_names(self) -> Params:
        for section in ("reward_models", "process_reward_models"):
            for name in getattr(self, section):
                if not re.fullmatch(STAGE_NAME, name):
                    raise ValueError(f"{section}.{name}: names may use letters, digits, '_' and '-' only")
        return self

    @model_validator(mode="after")
    def _rewards_have_their_rows(self) -> Params:
        """A reward for one task (tests_passed: code) needs rows of it in the RL stages' data (curate.sources);
        majority needs answers that compare, which code's are not."""
        mix = self.curate.mix
        tasks = {s.task for s in self.curate.sources if mix is None or mix.weights.get(s.name, 1) > 0}
        for name, stage in self.rl.stages.items():
            for reward, spec in stage.rewards.items():
                task = REWARD_TASKS.get(reward) if spec.import_path is None else None
                if task and task not in tasks:
                    raise ValueError(
                        f"rl.stages.{name}.rewards.{reward}: grades {task} rows, and curate.sources has none "
                        f"(tasks: {', '.join(sorted(tasks))}); use accuracy"
                    )
                if reward == "majority" and spec.import_path is None and "code" in tasks:  # verify.answer_class
                    raise ValueError(
                        f"rl.stages.{name}.rewards.majority: code answers cannot be compared (programs are graded "
                        "by their tests, never one answer)"
                    )
        return self

    @model_validator(mode="after")
    def _tool_traces_have_their_tool(self) -> Params:
        """Tool-call traces call the python environment's tool: the experiment must run it."""
        for i, trace in enumerate(self.sft.traces):
            if isinstance(trace, ToolTraces) and (self.environment is None or self.environment.name != "python"):
                raise ValueError(
                    f"sft.traces.{i}: tool_calls traces call the python tool; set environment: {{name: python}}"
                )
        return self

    @model_validator(mode="after")
    def _episodes_train_with_grpo(self) -> Params:
        """Episodes reach the trainer through GRPOTrainer's rollout_func, which TRL's RLOOTrainer lacks, and are
        sampled by rung's decode loop (rung.envs.loop), which has neither vLLM nor TRL's other samplers."""
        for name, stage in self.rl.stages.items():
            if not self.environment_of(name):
                continue
            if stage.algorithm != "grpo":
                raise ValueError(
                    f"rl.stages.{name}.algorithm: {stage.algorithm} cannot train episodes (an environment); use grpo, "
                    "or set the stage's environment: false"
                )
            if stage.use_vllm:
                raise ValueError(f"rl.stages.{name}.use_vllm: episodes are sampled by rung's decode loop, not vLLM")
            sampler = sorted(k for k in _TRL_SAMPLING if stage.trl.get(k) not in (None, False, 1.0, {}))
            if sampler:
                raise ValueError(f"rl.stages.{name}.trl: {sampler} are not sampled by rung's decode loop (episodes)")
        return self

    @property
    def checkpoints(self) -> list[str]:
        """Every checkpoint the pipeline produces, in order: base, sft, rl/<stage>..."""
        return ["base", "sft", *(f"rl/{name}" for name in self.rl.stages)]

    def environment_of(self, stage: str | None = None) -> EnvironmentParams | None:
        """The environment RL stage `stage` trains in (its own, else the experiment's; None for a stage that sets
        `environment: false`, which trains single-turn); with no stage, the experiment's, which difficulty,
        traces and evaluation run."""
        own = self.rl.stages[stage].environment if stage is not None else None
        if own is False:
            return None
        return own or self.environment

    def init_of(self, checkpoint: str) -> str:
        """What `checkpoint` started from: the base model's source, 'base' for sft, an RL stage's init."""
        if checkpoint == "base":
            return self.model.source
        if checkpoint == "sft":
            return "base"
        return self.rl.stages[checkpoint.removeprefix("rl/")].init


_SOURCE_TAGS = {"reasoning_gym", "file", "hf", "benchmark"}
_PAIR_TAGS = {"verifier", "file"}


def _is_tag(part: Any, before: Any) -> bool:
    """Whether a location part is the tag pydantic inserts for a tagged union: a source's, a reward model's pairs'."""
    return (part in _SOURCE_TAGS and isinstance(before, int)) or (part in _PAIR_TAGS and before == "pairs")


def _one_line(err: ValidationError) -> str:
    first = err.errors()[0]
    # Drop the tag pydantic inserts for tagged unions (curate.sources.0.file.path -> ...0.path).
    loc = first["loc"]
    key = ".".join(str(p) for i, p in enumerate(loc) if not (i and _is_tag(p, loc[i - 1]))) or "<root>"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    # Cross-field validators name the sub-key at the start of their message.
    sub = re.match(r"^([\w.-]+): (.*)$", msg)
    if sub and first["type"] == "value_error":
        key, msg = f"{key}.{sub.group(1)}" if key != "<root>" else sub.group(1), sub.group(2)
    more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{key}: {msg}{more}"


def parse(data: Any, source: str = str(paths.PARAMS)) -> Params:
    """Validate a params mapping; raise ConfigError with one line naming the dotted key. A deprecated
    key is read with a warning line naming `source` and the key (logger rung.config)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    try:
        return Params.model_validate(data, context={"source": source})
    except ValidationError as e:
        raise ConfigError(f"{source}: {_one_line(e)}") from None


def with_overrides(data: dict[str, Any], sets: dict[str, Any]) -> dict[str, Any]:
    """A copy of a params mapping with each dotted key set to its value, as `dvc exp run -S
    ++key=value` sets it: missing mappings are created, a number indexes a list
    (`curate.sources.0.size`)."""
    data = copy.deepcopy(data)
    for key, value in sets.items():
        *parents, leaf = key.split(".")
        node: Any = data
        for i, p in enumerate([*parents, leaf]):
            last = i == len(parents)
            if isinstance(node, list) and p.isdigit() and int(p) < len(node):
                if last:
                    node[int(p)] = value
                else:
                    node = node[int(p)]
            elif isinstance(node, dict):
                if last:
                    node[p] = value
                else:
                    node = node.setdefault(p, {})
            else:
                raise ConfigError(
                    f"{key}: no key {p!r} here "
                    f"({'list index out of range' if isinstance(node, list) else 'not a mapping'})"
                )
    return data


class _UniqueKeys(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; DVC (ruamel) refuses the file. Refusing here too means a params
    file `rung validate` passes is one `dvc repro` can read."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (line {key_node.start_mark.line + 1})", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path | str) -> Any:
    """A YAML file's content; ConfigError with one line naming the file when it is missing, not YAML or has a
    key twice in one mapping."""
    path = Path(path)
    try:
        return yaml.load(path.read_text(), Loader=_UniqueKeys)
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None


def load(path: Path | str = paths.PARAMS) -> Params:
    """Read and validate a params file."""
    return parse(read_yaml(path), str(path))
