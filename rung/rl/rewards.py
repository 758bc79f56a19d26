"""Reward functions with TRL's signature: (completions, **dataset_columns) -> list[float | None].

`rung.answers.verify` decides correctness; this module turns it into scores. Each reward is a picklable
callable whose __name__ is its params.yaml name and its metric key (rewards/<name>/mean).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any

from rung.answers import formats, verify
from rung.answers.grading import grade
from rung.answers.rows import Problem, problem
from rung.config import FormatParams, RewardParams, RLStageParams
from rung.errors import InputError
from rung.rl import judge, learned_rewards, majority
from rung.rl.completions import groups
from rung.rl.completions import text as _text

RewardFunc = Callable[..., list[float | None]]


def _graded(
    completions: list[Any],
    answer: list[str],
    task: list[str],
    prompt_text: list[str],
    meta: list[str],
) -> Iterator[tuple[str, Problem]]:
    """Each completion's text, with the row it answers (from TRL's columns, rung.answers.rows.dataset_row's)."""
    for c, a, t, p, m in zip(completions, answer, task, prompt_text, meta, strict=True):
        yield _text(c), problem(dict(answer=a, task=t, prompt_text=p, meta=m))


class Accuracy:
    """1.0 when the formatted final answer passes the task's verifier, else 0.0."""

    __name__ = "accuracy"

    def __init__(self, fmt: FormatParams, stage: RLStageParams):
        self.fmt = fmt

    def __call__(
        self,
        completions: list[Any],
        answer: list[str],
        task: list[str],
        prompt_text: list[str],
        meta: list[str],
        **_: Any,
    ) -> list[float | None]:
        return [self.score(text, row) for text, row in _graded(completions, answer, task, prompt_text, meta)]

    def score(self, text: str, row: Problem) -> float:
        return float(grade(text, row, self.fmt).verdict())


class TestsPassed(Accuracy):
    """Code rows (task code): the share of the problem's tests the completion's code passes, a denser
    signal than accuracy's all-or-nothing (one sandbox per assert, rung.answers.verify); other rows: accuracy."""

    __name__ = "tests_passed"

    def score(self, text: str, row: Problem) -> float:
        code = formats.extract(text, self.fmt) if row["task"] == verify.CODE else None
        if code is None:
            return super().score(text, row)
        meta = row["meta"]
        return verify.tests_passed_share(code, meta["test"], meta["entry_point"], meta.get("context", ""))


class Format:
    """1.0 when the completion passes the style's strict format check (rung.answers.formats), else 0.0."""

    __name__ = "format"

    def __init__(self, fmt: FormatParams, stage: RLStageParams):
        self.style = formats.style(fmt)

    def __call__(self, completions: list[Any], **_: Any) -> list[float | None]:
        return [float(self.style.follows(_text(c))) for c in completions]


class FormatPartial(Format):
    """The style's partial credit in [0, 1]: for tags 0.25 per tag present once (open-r1's
    tag_count_reward), so a policy is pulled towards the structure before it gets it all right."""

    __name__ = "format_partial"

    def __call__(self, completions: list[Any], **_: Any) -> list[float | None]:
        return [self.style.partial_credit(_text(c)) for c in completions]


class Overlong:
    """DAPO's soft overlong punishment: 0 up to max_len - buffer tokens, then linearly down to
    -penalty at max_len (DAPO: L_max 20480 with a 4096-token buffer, i.e. a fifth)."""

    __name__ = "overlong"

    def __init__(self, fmt: FormatParams, stage: RLStageParams, buffer: int | None = None, penalty: float = 1.0):
        self.max_len = stage.max_completion_length
        self.buffer = buffer if buffer is not None else max(1, self.max_len // 5)
        if not 0 < self.buffer <= self.max_len:
            raise InputError(
                f"rewards.overlong.args.buffer: {self.buffer} must be in [1, max_completion_length={self.max_len}]"
            )
        self.penalty = penalty

    def __call__(self, completions: list[Any], completion_ids: list[list[int]], **_: Any) -> list[float | None]:
        free = self.max_len - self.buffer
        return [-self.penalty * min(1.0, max(0, len(ids) - free) / self.buffer) for ids in completion_ids]


class ConditionalLength:
    """ConciseR's length reward (L-GRPO): 1 - length / max_len, given only when every completion of
    the group is correct, so brevity is never traded for accuracy; 0 otherwise. A group short of
    num_generations completions is one that Guarded scores without its unscored ones: not known to be
    all correct, so 0."""

    __name__ = "conditional_length"

    def __init__(self, fmt: FormatParams, stage: RLStageParams):
        self.fmt = fmt
        self.max_len = stage.max_completion_length
        self.group = stage.num_generations

    def __call__(
        self,
        completions: list[Any],
        completion_ids: list[list[int]],
        answer: list[str],
        task: list[str],
        prompt_text: list[str],
        meta: list[str],
        **_: Any,
    ) -> list[float | None]:
        rows = _graded(completions, answer, task, prompt_text, meta)
        ok = [grade(text, row, self.fmt).verdict() for text, row in rows]
        out: list[float | None] = []
        for group in groups(len(ok), self.group):
            all_ok = len(group) == self.group and all(ok[i] for i in group)
            out += [1.0 - len(completion_ids[i]) / self.max_len if all_ok else 0.0 for i in group]
        return out


# rung.config.BUILTIN_REWARDS lists the same names, so that params validate without importing this
# module (tests/test_rewards.py checks that they match).
REGISTRY: dict[str, Callable[..., RewardFunc]] = {
    "accuracy": Accuracy,
    "tests_passed": TestsPassed,
    "format": Format,
    "format_partial": FormatPartial,
    "overlong": Overlong,
    "conditional_length": ConditionalLength,
    "reward_model": learned_rewards.RewardModel,
    "process": learned_rewards.Process,
    "judge": judge.Judge,
    "majority": majority.Majority,
}


class Guarded:
    """A reward that survives its own exceptions: a completion that raises is unscored (None: NaN in
    TRL), not wrong. A score of 0 would be a wrong answer, which NSR and W-REINFORCE push down: the model
    would learn away from whatever made the grader crash. rung.rl.sampling leaves such a completion out
    of training altogether (advantage 0). When a batch raises, each prompt's group is scored alone; a
    group that raises has its completions tried one at a time to find the ones that crash, then the rest
    are scored together, so a group reward sees its whole group minus the crashed completions, not each
    completion alone (conditional_length pays no bonus to a group that lost one). Failures are counted
    (`errors`, `crashed`) and logged as rewards/<name>/errors. A learned reward (rung.rl.learned_rewards.Learned)
    is scored so and then finished once on the whole batch: its gold grades and per-batch normalisation never
    see only a group."""

    def __init__(self, func: RewardFunc, name: str, group: int):
        self.func, self.__name__ = func, name
        self.learned = func if isinstance(func, learned_rewards.Learned) else None
        self.scorer: RewardFunc = func if self.learned is None else self.learned.score
        self.group = group
        """Completions per prompt (num_generations), laid out contiguously (groups)."""
        self.errors = 0
        self.crashed: list[int] = []
        """Indices of the completions of the last call that raised."""

    @property
    def gold(self) -> list[float | None] | None:
        """The verifier's grade of each completion of the last call, where a learned reward logged it."""
        return None if self.learned is None else self.learned.gold

    def __call__(self, completions: list[Any], **kwargs: Any) -> list[float | None]:
        log_metric = kwargs.get("log_metric")
        self.crashed = []
        try:
            scores: list[float | None] = list(self.scorer(completions=completions, **kwargs))
        except Exception:  # noqa: BLE001 - any failure of user code falls back to scoring group by group
            scores = [None] * len(completions)
            for group in groups(len(completions), self.group):
                self._score_group(list(group), completions, kwargs, scores)
            self.crashed.sort()
        if self.learned is not None:
            scores = self.learned.finish(scores, completions, **kwargs)
        self.errors += len(self.crashed)
        if self.crashed and log_metric is not None:
            log_metric(f"rewards/{self.__name__}/errors", float(len(self.crashed)))
        return scores

    def _score(self, rows: list[int], completions: list[Any], kwargs: dict[str, Any]) -> list[float | None]:
        """The reward of the completions at `rows`, the columns TRL passes (a list per column) cut to them."""
        n = len(completions)
        cut = {k: [v[i] for i in rows] if isinstance(v, list) and len(v) == n else v for k, v in kwargs.items()}
        return list(self.scorer(completions=[completions[i] for i in rows], **cut))

    def _score_group(
        self, rows: list[int], completions: list[Any], kwargs: dict[str, Any], scores: list[float | None]
    ) -> None:
        try:
            values = self._score(rows, completions, kwargs)
        except Exception:  # noqa: BLE001 - find the completions that crash alone, score the others together
            alive = []
            for i in rows:
                try:
                    self._score([i], completions, kwargs)
                    alive.append(i)
                except Exception:  # noqa: BLE001 - a reward's failure must not stop training
                    self.crashed.append(i)
            rows = alive
            try:
                values = self._score(rows, completions, kwargs) if rows else []
            except Exception:  # noqa: BLE001 - no completion crashes alone (a flaky grader): the group is unscored
                self.crashed += rows
                return
        for i, v in zip(rows, values, strict=True):
            scores[i] = v


def error_counts(funcs: list[Guarded]) -> dict[str, float]:
    """A stage's summary metrics of grader crashes: `reward_errors` in all and `reward_errors/<name>`
    per reward (the completions each left unscored)."""
    return {"reward_errors": float(sum(f.errors for f in funcs))} | {
        f"reward_errors/{f.__name__}": float(f.errors) for f in funcs
    }


def load_custom(path: str, key: str) -> Callable[..., Any]:
    """The object at 'package.module:attr'; one-line error naming the params key otherwise."""
    module, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise InputError(f"{key}.import: cannot load {path!r}: {e}") from None
    if not callable(obj):
        raise InputError(f"{key}.import: {path!r} is not callable")
    return obj


def build(
    stage: RLStageParams,
    fmt: FormatParams,
    key: str,
    wrap: Callable[[str, RewardFunc], RewardFunc] | None = None,
) -> tuple[list[Guarded], list[float]]:
    """Reward functions in params order and their weights (for GRPOConfig.reward_weights); `wrap(name, func)`
    replaces each function before it is guarded (episodes: rung.rl.episodes.rewards)."""
    funcs = []
    for name, spec in stage.rewards.items():
        func = _one(name, spec, fmt, stage, f"{key}.{name}")
        funcs.append(Guarded(wrap(name, func) if wrap else func, name, stage.num_generations))
    return funcs, [spec.weight for spec in stage.rewards.values()]


def _one(name: str, spec: RewardParams, fmt: FormatParams, stage: RLStageParams, key: str) -> RewardFunc:
    if spec.import_path is None:
        factory: Callable[..., RewardFunc] = REGISTRY[name]
        try:
            return factory(fmt, stage, **spec.args)
        except TypeError as e:
            raise InputError(f"{key}.args: {e}") from None
    func = load_custom(spec.import_path, key)
    # A custom entry with args is a factory called with them; without, the reward itself.
    return func(**spec.args) if spec.args else func
