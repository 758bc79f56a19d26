"""SFT targets ("traces"): worked solutions from the data, or verified samples of a model
(rejection sampling / STaR from the base model; distillation from a teacher).

Every target goes through rung.answers.formats, so SFT teaches exactly the format that the rewards
and the evaluation read. A tool-call trace (`tool_calls`) is an episode: its `messages` (the assistant's call,
the tool's real output, the assistant's answer) and the tools' JSON schemas, which SFT trains on the
assistant's turns only. A retry trace (`retry`) puts a wrong answer and the feedback in its prompt's `history`:
SFT trains the right answer after them.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rung import files, paths
from rung.answers import formats
from rung.answers.grading import Grade, grade
from rung.answers.rows import Row
from rung.answers.verify import is_correct
from rung.config import (
    EnvironmentParams,
    FormatParams,
    SampledTraces,
    SFTParams,
    SolutionTraces,
    ToolTraces,
    TraceSource,
)
from rung.config.data import ModelTraces, RetryTraces
from rung.errors import InputError
from rung.seeding import derive

if TYPE_CHECKING:  # solution traces need no model: torch is imported by whoever loads one
    from rung.generate.completion import Completion, Generator

Trace = dict[str, Any]  # id, prompt, target, origin


def from_solutions(rows: list[Row], src: SolutionTraces, fmt: FormatParams, key: str = "sft.traces") -> list[Trace]:
    """The worked solution (or, with answer_only, the bare answer) of each row, in the style.

    Refused when a target would not follow the style or would state another answer than the row's
    (e.g. solutions that carry their own <answer> tags, or a MATH solution whose last box is not
    its answer column): training on them would teach a format the rewards do not read."""
    used = [r for r in rows if r.get("solution") or src.answer_only]
    targets = [formats.target(r["answer"], r.get("solution"), fmt) for r in used]
    bad = [r["id"] for r, t in zip(used, targets, strict=True) if not _stated(grade(t, r, fmt))]
    if bad:
        raise InputError(
            f"{key}: {len(bad)} of {len(used)} solution targets do not state the row's answer in format.style "
            f"{fmt.style} (first: id {bad[0]}); fix the solutions or use another style"
        )
    return [
        {"id": r["id"], "prompt": r["prompt"], "target": t, "origin": "solutions"}
        for r, t in zip(used, targets, strict=True)
    ]


def _stated(target: Grade) -> bool:
    """Whether a target states the row's answer in the format (raises GraderFailed where the grader failed)."""
    return target.follows and target.verdict()


def from_tool_calls(rows: list[Row], src: ToolTraces, fmt: FormatParams) -> list[Trace]:
    """An episode per row with an arithmetic expression: `python(code="print(<expression>)")` run in the
    sandbox by the python environment's own tool (the text the model will read in RL and evaluation), then
    the answer in the style; kept only when the tool printed the row's answer and the target is graded right."""
    import json

    from transformers.utils import get_json_schema

    from rung.envs import Python

    env = Python(fmt, max_turns=2)
    schema = json.dumps([get_json_schema(env.python)])
    traces = []
    for row in rows[: src.max_prompts]:
        expression = (row.get("meta") or {}).get("expression")
        if not expression:
            continue
        env.reset(**row)
        code = f"print({expression})"
        output = env.python(code)
        target = formats.target(row["answer"], None, fmt)
        episode = env.episode
        assert episode is not None  # env.reset above
        if episode.unscored is not None:
            raise InputError(f"sft.traces: the python tool's sandbox failed on row {row['id']}: {episode.unscored}")
        # the tool's output is a bare answer (nothing to extract): the verifier alone
        if not is_correct(output.strip(), row) or not grade(target, row, fmt).verdict():
            continue
        call = {"type": "function", "function": {"name": "python", "arguments": {"code": code}}}
        messages = [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "python", "content": output},
            {"role": "assistant", "content": target},
        ]
        traces.append(
            {
                "id": row["id"],
                "prompt": row["prompt"],
                "target": target,
                "messages": messages,
                "tools": schema,
                "origin": "tool_calls",
            }
        )
    return traces


def graded(text: str, row: Row, fmt: FormatParams) -> tuple[str, bool] | None:
    """The completion as a target and whether the task's verifier accepts its answer: unchanged when it
    follows the format, else with its answer (read leniently) added in the format; None when it states
    no answer, or the added answer line would not follow the format (e.g. stray tags of its own)."""
    text = text.strip()
    got = grade(text, row, fmt, lenient=True)  # lenient: the strict answer where the text follows the format
    if got.follows:
        return text, got.verdict()
    if got.answer is None:
        return None
    fixed = formats.style(fmt).appended(text, got.answer)
    return (fixed, got.verdict()) if formats.follows_format(fixed, fmt) else None


def in_format(text: str, row: Row, fmt: FormatParams) -> str | None:
    """The completion as a target if its answer is correct (see `graded`); None when it is wrong or states none."""
    got = graded(text, row, fmt)
    return got[0] if got is not None and got[1] else None


def samples(gen: Generator, rows: list[Row], src: ModelTraces, fmt: FormatParams, seed: int) -> list[list[Completion]]:
    """`src.num_samples` completions of each row's prompt, in row order: the one sampling path of every source
    sampled from a model (rejection, distill, retry)."""
    prompts = gen.render([formats.prompt(r["prompt"], fmt) for r in rows])
    return gen.generate(prompts, src.sampling, n=src.num_samples, seed=seed, desc=f"{src.type} traces")


def sampled(
    gen: Generator, rows: list[Row], src: SampledTraces, fmt: FormatParams, seed: int
) -> tuple[list[Trace], dict[str, Any]]:
    """Verified-correct samples, at most `max_per_prompt` distinct ones per prompt; with counts."""
    rows = rows[: src.max_prompts]
    traces: list[Trace] = []
    kept_per_prompt: Counter[int] = Counter()  # prompts by how many distinct traces they kept
    correct = 0
    for row, completions in zip(rows, samples(gen, rows, src, fmt, seed), strict=True):
        seen: set[str] = set()
        for c in completions:
            target = in_format(c.text, row, fmt)
            if target is None:
                continue
            correct += 1
            key = " ".join(target.split())  # duplicates up to whitespace
            if key in seen or len(seen) >= src.max_per_prompt:
                continue
            seen.add(key)
            traces.append(
                {"id": row["id"], "prompt": row["prompt"], "target": target, "origin": f"{src.type}:{src.model}"}
            )
        kept_per_prompt[len(seen)] += 1
    stats = {
        "prompts": len(rows),
        "samples": len(rows) * src.num_samples,
        "correct_samples": correct,
        "kept": len(traces),
        "prompts_with_trace": len(rows) - kept_per_prompt[0],
    }
    return traces, stats


def retry_feedback(environment: EnvironmentParams | None) -> str:
    """The user's reply to a wrong answer in the experiment's retry environment (its `settings.feedback`, else
    the retry environment's default)."""
    from rung.envs.retry import RetrySettings  # transformers: only for an experiment with retry traces

    settings = environment.settings if environment is not None and environment.name == "retry" else {}
    return RetrySettings.model_validate(settings).feedback


def retry_episodes(
    gen: Generator, rows: list[Row], src: RetryTraces, fmt: FormatParams, seed: int, feedback: str
) -> tuple[list[Trace], dict[str, Any]]:
    """Wrong-then-right episodes (see RetryTraces): for each prompt with a wrong and a right sample, its first
    wrong one, `feedback` as the user's turn, its first right one (the wrong one and the feedback as the
    trace's `history`, the right one its target); and, for a seeded `first_try` share of the prompts with a
    right sample, that sample alone. With counts."""
    rows = rows[: src.max_prompts]
    answered = [
        [g for c in completions if (g := graded(c.text, row, fmt)) is not None]
        for row, completions in zip(rows, samples(gen, rows, src, fmt, seed), strict=True)
    ]
    solved = [i for i, got in enumerate(answered) if any(ok for _, ok in got)]
    first_try = set(random.Random(derive(seed, "first_try")).sample(solved, round(src.first_try * len(solved))))
    traces: list[Trace] = []
    for i in solved:
        row, got = rows[i], answered[i]
        right = next(text for text, ok in got if ok)
        wrong = next((text for text, ok in got if not ok), None)
        if wrong is not None:
            # the wrong answer and the feedback are the prompt's history: SFT never trains the wrong answer
            history = [{"role": "assistant", "content": wrong}, {"role": "user", "content": feedback}]
            trace = {"id": row["id"], "prompt": row["prompt"], "history": history, "target": right}
            traces.append({**trace, "origin": f"retry:{src.model}"})
        if i in first_try:
            trace = {"id": row["id"], "prompt": row["prompt"], "target": right}
            traces.append({**trace, "origin": f"retry:{src.model}:first_try"})
    episodes = sum("history" in t for t in traces)
    stats = {
        "prompts": len(rows),
        "samples": len(rows) * src.num_samples,
        "correct_samples": sum(ok for got in answered for _, ok in got),
        "wrong_samples": sum(not ok for got in answered for _, ok in got),
        "wrong_then_right": episodes,
        "first_try_right": len(traces) - episodes,
        "kept": len(traces),
        "prompts_with_trace": len({t["id"] for t in traces}),
    }
    return traces, stats


def build(
    rows: list[Row],
    sources: list[TraceSource],
    fmt: FormatParams,
    seed: int,
    load: Callable[[str], Generator],
    environment: EnvironmentParams | None = None,
) -> tuple[list[Trace], dict[str, Any]]:
    """Traces of every source in params order, and per-source counts. `load(model)` returns the
    generator for a sampled source's model ('base' or a teacher); `environment` is the experiment's (a
    retry source's feedback)."""
    # Solution targets first, whatever their place: a refused one stops the stage before any sampling.
    solved = {
        i: from_solutions(rows, src, fmt, f"sft.traces[{i}]")
        for i, src in enumerate(sources)
        if isinstance(src, SolutionTraces)
    }
    traces: list[Trace] = []
    stats: dict[str, Any] = {}
    for i, src in enumerate(sources):
        name = f"{i}_{src.type}"
        if isinstance(src, SolutionTraces):
            got = solved[i]
            stats[name] = {"kept": len(got), "with_solution": sum(bool(r.get("solution")) for r in rows)}
        elif isinstance(src, ToolTraces):
            got = from_tool_calls(rows, src, fmt)
            stats[name] = {
                "kept": len(got),
                "with_expression": sum(bool((r.get("meta") or {}).get("expression")) for r in rows),
            }
        elif isinstance(src, RetryTraces):
            feedback = retry_feedback(environment)
            got, stats[name] = retry_episodes(load(src.model), rows, src, fmt, seed + i, feedback)
        else:
            got, stats[name] = sampled(load(src.model), rows, src, fmt, seed + i)
        traces += got
    stats["total"] = len(traces)
    return traces, stats


def run(
    rows: list[Row],
    sft: SFTParams,
    fmt: FormatParams,
    seed: int,
    load: Callable[[str], Generator],
    environment: EnvironmentParams | None = None,
) -> dict[str, Any]:
    """The traces stage: write the SFT targets of every source in `sft.traces` at their layout
    path; returns the counts. With SFT disabled (zero-RL) nothing is built or sampled and the file
    is empty; with SFT enabled and no target at all, refused (one line) instead of failing inside
    the trainer."""
    if not sft.enabled:
        files.write_jsonl(paths.TRACES, [])
        return {"skipped": 1}
    traces, stats = build(rows, sft.traces, fmt, seed, load, environment)
    if not traces:
        raise InputError(
            f"sft.traces: no SFT target from any source ({stats}); add a `solutions` source, "
            "sample more, or set sft.enabled: false"
        )
    files.write_jsonl(paths.TRACES, traces)
    return stats
