"""Evaluation of one checkpoint on one eval set: greedy accuracy with its Clopper-Pearson interval,
format compliance, lengths, breakdowns by source and difficulty, and (with n samples per
prompt) avg@n and unbiased pass@k for every k <= n, maj@k at the k of the spectrum."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import mean, median
from typing import TYPE_CHECKING, Any, Literal

from rung import files, paths
from rung.answers import formats, grading
from rung.answers.rows import Row
from rung.answers.verify import GraderFailed, answer_class
from rung.config import EvalParams, FormatParams, SamplingParams
from rung.data.rows import difficulty_label
from rung.eval import metrics
from rung.eval.results import EvalRecord, EvalResult, Graded, SetMetrics

if TYPE_CHECKING:  # types only: torch is imported by whoever loads the model (tasks.generation), after the preflight
    from rung.envs.spec import Environment
    from rung.envs.trajectory import Trajectory
    from rung.generate.completion import Completion, Generator

Record = EvalRecord


def grade(rows: list[Row], samples: list[list[Completion]], fmt: FormatParams) -> list[Record]:
    """One record per row: its completions with the extracted answers and their grades."""
    records = []
    for row, completions in zip(rows, samples, strict=True):
        graded = []
        for c in completions:
            strict = grading.grade(c.text, row, fmt)
            graded.append(
                Graded(
                    completion=c.text,
                    extracted=strict.answer,
                    correct=strict.verdict(),
                    correct_lenient=grading.grade(c.text, row, fmt, lenient=True).verdict(),
                    tokens=c.tokens,
                    truncated=c.truncated,
                )
            )
        records.append(
            EvalRecord(
                id=row["id"],
                source=row["source"],
                task=row["task"],
                difficulty=difficulty_label(row),
                prompt=row["prompt"],
                answer=row["answer"],
                samples=graded,
            )
        )
    return records


def _by(records: list[Record], key: Literal["source", "task", "difficulty"]) -> dict[str, float]:
    groups: dict[str, list[float]] = defaultdict(list)
    for r in records:
        groups[r[key]].append(float(r["samples"][0]["correct"]))
    return {k: mean(v) for k, v in sorted(groups.items())}


def summarize_greedy(records: list[Record], params: EvalParams) -> SetMetrics:
    """Headline metrics of one completion per prompt (the first), accuracy with its Clopper-Pearson interval
    (metrics.share_interval)."""
    first = [r["samples"][0] for r in records]
    correct = [float(s["correct"]) for s in first]
    low, high = metrics.share_interval(correct, params.bootstrap.confidence)
    return SetMetrics(
        n=len(records),
        accuracy=mean(correct),
        accuracy_ci=[float(low), float(high)],
        accuracy_lenient=mean(float(s["correct_lenient"]) for s in first),
        format_rate=mean(float(s["extracted"] is not None) for s in first),
        mean_tokens=mean(s["tokens"] for s in first),
        median_tokens=median(s["tokens"] for s in first),
        truncation_rate=mean(float(s["truncated"]) for s in first),
        accuracy_by_source=_by(records, "source"),
        accuracy_by_task=_by(records, "task"),
        accuracy_by_difficulty=_by(records, "difficulty"),
    )


def summarize_sampled(
    records: list[Record],
    confidence: float | None = None,
    compare_k: Sequence[int] = (),
    classes: Sequence[metrics.Classify] | None = None,
) -> dict[str, Any]:
    """avg@n, pass@k (k = 1..n) and coverage over n sampled completions per prompt (the smallest
    count, with a warning when some prompt has more), and maj@k at the k of the spectrum and
    `compare_k` (metrics.spectrum_ks), voting on the answers' `classes` (one function per record,
    verify.answer_class of its row), else on strings: the fields of SetMetrics that need samples, avg@n under a key
    named for n; with `confidence`, the band of pass@k over prompts at every k of the spectrum (the interval of
    the mean of the prompts' pass@k, metrics.share_interval)."""
    n = metrics.common_n(records, "sampled evaluation")
    per_prompt = [[s["correct"] for s in r["samples"][:n]] for r in records]
    counts = [sum(c) for c in per_prompt]
    votes = [[(s["extracted"], s["correct"]) for s in r["samples"][:n]] for r in records]
    maj = metrics.maj_at_ks(votes, metrics.spectrum_ks(n, compare_k), classes)
    ks = metrics.spectrum_ks(n)
    band = {}
    if confidence is not None:
        low, high = metrics.share_interval([[metrics.pass_at_k(n, c, k) for c in counts] for k in ks], confidence)
        band = {str(k): [float(lo), float(hi)] for k, lo, hi in zip(ks, low, high, strict=True)}
    return {
        f"avg@{n}": metrics.avg_at_n(per_prompt),
        "pass_at_k": {str(k): metrics.mean_pass_at_k(counts, n, k) for k in range(1, n + 1)},
        **({"pass_at_k_band": band} if band else {}),
        "coverage": metrics.coverage(counts),
        "maj_at_k": {str(k): v for k, v in maj.items()},
        "sampled_mean_tokens": mean(s["tokens"] for r in records for s in r["samples"][:n]),
    }


def grade_episodes(rows: list[Row], samples: list[list[Trajectory]], fmt: FormatParams) -> list[Record]:
    """One record per row from its episodes: each graded as a completion (its last assistant turn, the final
    answer, graded by the task's verifier as single-turn completions are) with the whole episode in `episode`.
    A grader that failed inside an episode (the sandbox of a python tool) stops evaluation in one line, as it
    does for single-turn code (rung.answers.verify.GraderFailed): an unscored episode is never counted wrong."""
    records = grade(rows, [[_final(t) for t in trajectories] for trajectories in samples], fmt)
    for row, record, trajectories in zip(rows, records, samples, strict=True):
        for graded, trajectory in zip(record["samples"], trajectories, strict=True):
            if trajectory.unscored is not None:
                raise GraderFailed(f"eval row {row['id']}: the environment's grader failed: {trajectory.unscored}")
            graded["episode"] = trajectory.dump()
    return records


def _final(trajectory: Trajectory) -> Completion:
    """An episode as the completion it ends with: the last assistant turn, its tokens all the model generated."""
    from rung.generate.completion import Completion

    last = trajectory.turns[-1]["text"] if trajectory.turns else ""
    return Completion(last, trajectory.tokens, trajectory.truncated)


def evaluate(
    gen: Generator,
    rows: list[Row],
    fmt: FormatParams,
    params: EvalParams,
    seed: int,
    progress: Callable[[str], None] = lambda _: None,
    environment: Environment | None = None,
) -> tuple[list[Record], list[Record], SetMetrics]:
    """Greedy (headline) and, when `params.samples` is set, sampled evaluation of `rows`: single-turn
    completions, or with `environment` its episodes (rung.eval.episodes.run), graded by their final answers and
    summarized by their episode metrics too.

    Returns (greedy records, sampled records, metrics).
    """
    prompts = [] if environment else gen.render([formats.prompt(r["prompt"], fmt) for r in rows])

    def answer(subset: list[Row], sampling: SamplingParams, n: int, seed: int, desc: str) -> list[Record]:
        if environment is None:
            return grade(subset, gen.generate(prompts[: len(subset)], sampling, n=n, seed=seed, desc=desc), fmt)
        from rung.eval import episodes

        return grade_episodes(subset, episodes.run(gen, environment, subset, fmt, sampling, n, seed), fmt)

    greedy = answer(rows, params.sampling, 1, seed, "eval greedy")
    result = summarize_greedy(greedy, params)
    progress(f"greedy accuracy {result.accuracy:.3f} on {len(rows)} prompts")
    if environment is not None:
        from rung.envs.trajectory import Trajectory
        from rung.eval import episodes

        greedy_episodes = [Trajectory.model_validate(r["samples"][0]["episode"]) for r in greedy]
        found = episodes.metrics(greedy_episodes, environment.spec.max_turns)
        result = SetMetrics(**result.dump(), episodes=found.model_dump())
        progress(f"episodes: success within {found.success_within}, first answer {found.first_answer_accuracy}")
    sampled: list[Record] = []
    if params.samples is not None:
        s = params.samples
        subset = rows[: s.max_prompts]
        sampled = answer(subset, s, s.n, seed + 1, f"eval x{s.n}")
        summary = summarize_sampled(
            sampled, params.bootstrap.confidence, s.compare_k, [answer_class(r) for r in subset]
        )
        result = SetMetrics(**result.dump(), **summary)
    return greedy, sampled, result


def _band(band: list[float] | None) -> dict[str, float]:
    return {"pass_at_k_low": band[0], "pass_at_k_high": band[1]} if band else {}


def run(
    checkpoint: str,
    results: dict[str, tuple[list[Record], list[Record], SetMetrics]],
    set_paths: dict[str, Path],
    params: EvalParams,
    fmt: FormatParams,
    seed: int,
) -> dict[str, Any]:
    """The eval stage's outputs for one checkpoint: per-sample records of every set (one directory,
    written atomically), the DVC plots of the held-out split (accuracy by difficulty, pass@k and
    maj@k), and the metrics (an EvalResult, returned as the dict the metrics file holds), which record
    format, sampling, seed and the md5 of the model and of every set."""
    slug = paths.checkpoint_slug(checkpoint)
    with files.atomic_path(paths.EVAL / slug) as tmp:
        tmp.mkdir()
        for name, (greedy, sampled, _) in results.items():
            files.write_jsonl(tmp / f"{name}.jsonl", greedy)
            if sampled:
                files.write_jsonl(tmp / f"{name}.samples.jsonl", sampled)
    test = results["test"][2]
    files.write_json(
        paths.plot("accuracy_by_difficulty", slug),
        [{"difficulty": d, "accuracy": a} for d, a in test.accuracy_by_difficulty.items()],
    )
    curve = [
        {
            "k": int(k),
            "pass_at_k": v,
            **({"maj_at_k": test.maj_at_k[k]} if k in test.maj_at_k else {}),  # at the spectrum's k only
            **_band(test.pass_at_k_band.get(k)),
        }
        for k, v in test.pass_at_k.items()
    ]
    files.write_json(paths.plot("pass_at_k", slug), curve)  # empty without eval.samples
    return EvalResult(
        checkpoint=checkpoint,
        seed=seed,
        model_md5=files.md5(paths.checkpoint(checkpoint)),
        data_md5={n: files.md5(p) for n, p in set_paths.items()},
        format={"style": fmt.style, "template": fmt.template},
        sampling=params.sampling.model_dump(),
        samples=params.samples.model_dump() if params.samples else None,
        bootstrap=params.bootstrap.model_dump(),
        sets={name: m for name, (_, _, m) in results.items()},
    ).dump()
