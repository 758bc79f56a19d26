"""Typed results: an eval stage's metrics, the paired tests, the report's comparisons and a seed
study's result. Computed by rung.eval (evaluate, paired, comparisons) and rung.report.study,
rendered by rung.report (tables, pipeline, studypage), written as JSON by `dump`.

One rule keeps the files the same: a key is written exactly when it was given (`dump` excludes
unset fields), and a number keeps the type it was computed with (`Number`: an int stays an int),
so reading a file into its model and dumping it again gives the same JSON, byte for byte.
"""

from __future__ import annotations

from typing import Any, Generic, NotRequired, TypedDict, TypeVar

from pydantic import BaseModel, ConfigDict, model_serializer, model_validator

Number = int | float  # as computed: statistics.mean of ints is an int, of floats a float


class Result(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def dump(self) -> dict[str, Any]:
        """The JSON-ready dict of this result: the keys that were given, nothing added."""
        return self.model_dump(exclude_unset=True)


# ---- eval: what rung.eval.evaluate writes per checkpoint (data/metrics/eval-<ckpt>.json) ----


class Graded(TypedDict, total=False):
    """One graded completion of an eval record."""

    completion: str
    extracted: str | None
    correct: bool
    correct_lenient: bool
    tokens: int
    truncated: bool
    scores: dict[str, float]
    """With eval.samples.rerank (the samples file): each reranker's score of this sample ('reward_model',
    'process_reward_model'; rung.eval.rerank)."""
    episode: dict[str, Any]
    """With an environment: the whole episode (rung.envs.trajectory.Trajectory.dump(); model_validate parses it
    back); the completion is its last turn."""


class EvalRecord(TypedDict, total=False):
    """One prompt's line of data/eval/<ckpt>/<set>.jsonl: the row and its graded completions
    (the first is the greedy one in <set>.jsonl; <set>.samples.jsonl holds the n samples)."""

    id: str
    source: str
    task: str
    difficulty: str
    prompt: str
    answer: Any
    samples: list[Graded]


class Reranked(Result):
    """The n samples of an eval set reranked by one learned reward (rung.eval.rerank), at the spectrum's k:
    best-of-k and weighted maj@k, and best-of-n against maj@n on the same samples, per prompt."""

    best_of_k: dict[str, Number]
    """Share of prompts whose highest-scored sample among the first k is right."""
    weighted_maj_at_k: dict[str, Number]
    """maj@k with each sample's vote weighted by the sigmoid of its score."""
    versus_maj: GreedyTest
    """Best-of-n (new) against maj@n (old) on the same prompts: paired difference, Bonett-Price interval, exact
    McNemar (rung.eval.paired.outcome_test)."""


class SetMetrics(Result):
    """Metrics of one checkpoint on one eval set. Greedy (the headline), then with eval.samples:
    avg@<n> (a key named for n, kept as an extra field), pass@k for k = 1..n and maj@k at the spectrum's k."""

    model_config = ConfigDict(extra="allow")

    n: int
    accuracy: Number
    accuracy_ci: list[Number] | None = None
    accuracy_lenient: Number | None = None
    format_rate: Number | None = None
    mean_tokens: Number | None = None
    median_tokens: Number | None = None
    truncation_rate: Number | None = None
    accuracy_by_source: dict[str, Number] = {}
    accuracy_by_task: dict[str, Number] = {}
    accuracy_by_difficulty: dict[str, Number] = {}
    pass_at_k: dict[str, Number] = {}
    pass_at_k_band: dict[str, list[Number]] = {}
    """Interval over prompts of pass@k at every power of two up to n (and n), metrics.share_interval: [low, high]."""
    coverage: Number | None = None
    """Share of prompts solved at least once in the n samples (= pass@n)."""
    maj_at_k: dict[str, Number] = {}
    sampled_mean_tokens: Number | None = None
    rerank: dict[str, Reranked] = {}
    """With eval.samples.rerank: per reranker ('reward_model', 'process_reward_model') its best-of-k, weighted
    maj@k and the paired test of best-of-n against maj@n."""
    episodes: dict[str, Any] | None = None
    """With an environment: the greedy episodes' metrics (rung.eval.episodes.EpisodeMetrics: success within t
    turns, first-answer accuracy, mean turns, tool calls, tool error rate, cut at max_turns)."""

    @model_validator(mode="after")
    def _only_avg_extra(self) -> SetMetrics:
        unknown = [k for k in self.model_extra or {} if not k.startswith("avg@")]
        if unknown:
            raise ValueError(f"unknown eval metrics {unknown}")
        return self

    def avg_at_n(self) -> dict[str, Number]:
        """{'avg@<n>': value}, empty without samples."""
        return dict(self.model_extra or {})

    def flat(self) -> dict[str, Any]:
        """The metrics with one name per number (no lists, no k-keyed dicts): `accuracy_ci_low` /
        `_high`, `pass_at_<k>`, `maj_at_<k>`, `episodes.success_within_<t>`, `rerank.<reranker>.best_of_<k>` /
        `.weighted_maj_at_<k>` / `.versus_maj.<field>`; avg@<n> and the by-source/task/difficulty dicts as they are."""
        out = self.model_dump(exclude={"accuracy_ci", "pass_at_k", "maj_at_k", "episodes", "rerank"}, exclude_none=True)
        if self.rerank:
            out["rerank"] = {
                name: {f"best_of_{k}": v for k, v in r.best_of_k.items()}
                | {f"weighted_maj_at_{k}": v for k, v in r.weighted_maj_at_k.items()}
                | {"versus_maj": r.versus_maj.dump()}
                for name, r in self.rerank.items()
            }
        if self.episodes:
            within = self.episodes.get("success_within", {})
            rest = {k: v for k, v in self.episodes.items() if k != "success_within"}
            out["episodes"] = rest | {f"success_within_{t}": v for t, v in within.items()}
        if self.accuracy_ci:
            out["accuracy_ci_low"], out["accuracy_ci_high"] = self.accuracy_ci
        out |= {f"pass_at_{k}": v for k, v in self.pass_at_k.items()}
        return out | {f"maj_at_{k}": v for k, v in self.maj_at_k.items()}


class EvalResult(Result):
    """An eval stage's metrics file: every set's metrics and the settings they depend on."""

    checkpoint: str | None = None
    seed: int | None = None
    model_md5: str | None = None
    data_md5: dict[str, str] = {}
    format: dict[str, str] | None = None  # absent in files written before format.style existed
    sampling: dict[str, Any] = {}
    samples: dict[str, Any] | None = None
    bootstrap: dict[str, Number] | None = None
    sets: dict[str, SetMetrics]
    warnings: list[str] = []  # rung.report.health's findings, added by flows.stage.finish


# ---- paired tests (rung.eval.paired) and the report's comparisons (rung.eval.comparisons) ----


class MetricTest(Result):
    """One sampled metric of new against old: per-prompt mean difference, its interval (the band over
    the family of SampledTest), the family-wise p of the sign-flip test and the verdict it gives."""

    old: Number
    new: Number
    difference: Number
    ci_low: Number
    ci_high: Number
    p: Number
    significant: bool
    verdict: str


class Boundary(Result):
    """Coverage (prompts solved at least once in n samples) of old and new, and the prompts on which
    it differs: those only old solves, those only new solves (ids), and the exact McNemar p of
    those two counts."""

    coverage_old: Number
    coverage_new: Number
    solved_only_old: list[str]
    solved_only_new: list[str]
    mcnemar_p: Number


class SampledTest(Result):
    """avg@n and pass@k (k = 1..n) of new against old, and their coverage boundary. On disk each
    metric sits next to n, samples and boundary (`"avg@4": {...}, "pass@1": {...}`); here they are
    under `metrics`."""

    n: int
    samples: int
    family: list[str]
    """The metrics tested together (max-T over them: their verdicts hold family-wise)."""
    test: str
    """The test that gave the verdicts (rung.eval.paired.flip_name)."""
    boundary: Boundary | None = None
    metrics: dict[str, MetricTest]

    @model_validator(mode="before")
    @classmethod
    def _nest(cls, data: Any) -> Any:
        if isinstance(data, dict) and "metrics" not in data:
            data = {
                "n": data.get("n"),
                **{k: data[k] for k in ("samples", "family", "test", "boundary") if k in data},
                "metrics": {k: v for k, v in data.items() if k not in ("n", "samples", "family", "test", "boundary")},
            }
        return data

    @model_serializer(mode="wrap")
    def _flat(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        return {**{k: v for k, v in out.items() if k != "metrics"}, **out.get("metrics", {})}


class GreedyTest(Result):
    """Greedy accuracy of new against old on one eval set: difference with its paired
    interval (Bonett-Price), the flips, the exact McNemar test; prompts_needed only when not significant (None
    when the flips balance); sampled when both checkpoints have samples."""

    n: int
    accuracy_old: Number
    accuracy_new: Number
    difference: Number
    ci_low: Number
    ci_high: Number
    right_to_wrong: int
    wrong_to_right: int
    both_right: int
    both_wrong: int
    mcnemar_p: Number
    test: str
    """The test that gave the verdict (exact McNemar)."""
    p_adjusted: Number | None = None
    """With episodes: mcnemar_p Holm-adjusted over `family` (the final- and first-answer tests of one set);
    significant and verdict read it."""
    family: str | None = None
    significant: bool
    verdict: str
    prompts_needed: int | None = None
    """Post-hoc: prompts at which these flip rates would reach 80% power."""
    sampled: SampledTest | None = None
    first_answer: GreedyTest | None = None
    """With episodes: the same test on the first answers (rung.eval.paired.first_answer_test)."""


class SeedTest(Result):
    """The procedure's test of a comparison of arms (rung.eval.arms.seed_test): the seed is the unit, so
    that run-to-run variation of whole checkpoints counts; p Holm-adjusted over `family` when the study
    corrects for one (None: fewer than 2 seeds, or differences that never vary: no test)."""

    test: str
    seeds: int
    p: Number | None
    family: str | None = None
    significant: bool
    verdict: str
    seeds_needed: int | None = None
    """Post-hoc (from the observed per-seed differences): seeds for 80% power at the family's strictest level."""
    null: Number | None = None
    """The difference tested against when not 0: -margin (or +margin) for a non-inferiority claim."""


class ArmsTest(Result):
    """Arm new against arm old on one eval set, over seeds (rung.eval.arms.arms_test). `procedure` is
    the verdict about the training procedure (a test over seeds). The rest is about these checkpoints
    (the seeds run, held fixed): a unit is a prompt cluster (its rows in every seed that answered it);
    p the sign-flip test's, Holm-adjusted over `family` when the study corrects for one; significant
    and verdict read that p."""

    seeds: list[int]
    unit: str
    units: int
    rows: int
    """(seed, prompt) rows in the clusters."""
    accuracy_old: Number
    accuracy_new: Number
    difference: Number
    ci_low: Number
    ci_high: Number
    units_better: int
    units_worse: int
    p: Number
    test: str
    family: str | None = None
    """The family the p is corrected over (e.g. 'Holm over 6: comparisons x eval sets')."""
    per_seed_difference: dict[str, Number]
    procedure: SeedTest
    significant: bool
    verdict: str
    prompts_needed: int | None = None
    """Post-hoc (from the observed flips): clusters for 80% power at the family's strictest level."""


T = TypeVar("T", GreedyTest, ArmsTest)


class Comparison(Result, Generic[T]):
    """new against old, per eval set (the held-out split first)."""

    new: str
    old: str
    sets: dict[str, T]


class Comparisons(Result):
    """The report's paired comparisons of checkpoints (data/reports/comparisons.json), keyed by
    rung.eval.paired.key(new, old)."""

    level: Number
    confidence: Number
    resamples: int
    seed: int
    compare_k: list[int] = []
    """k at which the tables show pass@k (eval.samples.compare_k), besides avg@n and pass@n."""
    comparisons: dict[str, Comparison[GreedyTest]]


# ---- seed studies (rung.report.study) ----

Band = tuple[Number, Number, Number, Number]  # (step, mean, min, max) over seeds


class Spread(Result):
    """A metric over seeds: mean, sample sd (None for one seed) and the per-seed values."""

    mean: Number
    sd: Number | None
    values: list[Number]


class ArmResult(Result):
    seeds: list[int]
    metrics: dict[str, Spread]
    """'<set>/<metric>' and 'rl/<metric>' -> its spread over seeds."""


class ClaimTest(Result):
    """One k of a claim: the paired test of new against old (pass@k per prompt cluster), its interval
    the band over the claim's k, its p the max-T over those k Holm-adjusted over the claim family, and
    its significant / verdict those the page prints; the verdict against the expected direction; and
    what a clear answer to the study's reference effect would need at the family's level (a planning
    figure, not post-hoc power): prompts, and seeds."""

    k: int
    test: ArmsTest
    verdict: str
    """The claim's verdict at this k: the procedure's test over seeds (test.procedure), Holm-adjusted."""
    checkpoints: str | None = None
    """The same reading of the prompt-level test (test.p): about these checkpoints, not the procedure."""
    prompts_needed_reference: int | None
    seeds_needed_reference: int | None


class ClaimResult(Result):
    """A published claim checked at this scale (rung.report.spectrum.check_claim)."""

    claim: str
    new: str
    old: str
    eval_set: str
    expect: str
    verdict: str
    tests: list[ClaimTest]


class StudyResult(Result):
    """A study's result (data/studies/<name>/study.json, with the page's settings added)."""

    name: str
    seed_key: str
    seeds: list[int]
    definition: dict[str, Any]
    level: Number
    confidence: Number
    resamples: int
    seed: int
    arms: dict[str, ArmResult]
    comparisons: dict[str, Comparison[ArmsTest]]
    curves: dict[str, dict[str, list[Band]]]
    """Per arm: reward, train_accuracy and held_out_accuracy as (step, mean, min, max)."""
    spectrum: dict[str, dict[str, list[Band]]] = {}
    """Per sampled eval set, per arm (and the init checkpoint): (k, pass@k mean over seeds, low, high),
    the band the interval over prompt clusters of the seed-averaged per-prompt pass@k (metrics.share_interval)."""
    coverage: dict[str, dict[str, Spread]] = {}
    """Per sampled eval set, per arm (and the init checkpoint): coverage (solved at least once in n) over seeds."""
    claims: list[ClaimResult] = []


class StudyRun(TypedDict):
    """What the aggregation reads from one experiment of a study (flows.study.collect)."""

    arm: str
    seed: int
    eval: EvalResult
    rl: dict[str, Any]
    init_eval: EvalResult | None
    records: dict[str, list[EvalRecord]]
    curve: list[dict[str, float]]
    samples: NotRequired[dict[str, list[EvalRecord]]]
    """Sampled records per eval set (<set>.samples.jsonl), when the eval stage sampled this checkpoint."""
    init_samples: NotRequired[dict[str, list[EvalRecord]]]
    """The same of the checkpoint the RL stage started from."""
