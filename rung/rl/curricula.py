"""Curricula of the RL stage: which prompts each generation step trains on.

One scheduler per `rl.stages.<name>.curriculum` type (rung.config documents the params):
uniform (TRL's RepeatSampler order), staged (fixed bucket phases), scheduled (a target pass rate
over the steps), adaptive (AdaRFT, Shi et al. 2025), bandit (SEC, Chen et al. 2025; DUMP, Wang
et al. 2025) and pools (prime-rl's online difficulty pools). Each step the trainer calls
`draw` (possibly several times, for dynamic sampling), then `update` with the groups' results;
`metrics` are logged and `state_dict` is checkpointed. All randomness comes from one seeded
numpy Generator whose state is part of `state_dict`, so a resumed run draws exactly the same.
"""

# hand-written: no maintained library implements these RL curricula
from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import mean
from typing import Any, Generic, TypeVar

import numpy as np

from rung.config import (
    AdaptiveCurriculum,
    BanditCurriculum,
    Curriculum,
    PoolsCurriculum,
    ScheduledCurriculum,
    StagedCurriculum,
    UniformCurriculum,
)
from rung.data.difficulty import bucket

UNKNOWN_PASS_RATE = 0.5

# Each scheduler reads the params section of its own curriculum type (build() picks it by `type`).
P = TypeVar("P", bound=Curriculum)


@dataclass(frozen=True)
class GroupResult:
    """One prompt's group of completions at a step."""

    index: int
    """Row index the prompt was drawn as."""
    accuracy: float
    """Mean accuracy reward of the group: the online pass rate."""
    reward_std: float
    abs_advantage: float
    """Mean |advantage| over the group's completions: the trainer's own (group-relative, or RLOO's
    leave-one-out) advantage from the rewards, under every objective, so that it measures the same
    learnability whichever advantage is trained (a signed objective's |A| would be the accuracy
    under PSR and 1 - accuracy under NSR)."""

    def __post_init__(self) -> None:
        # Plain Python numbers (not numpy/torch scalars) keep state_dict JSON-serialisable.
        for name, cast in (("index", int), ("accuracy", float), ("reward_std", float), ("abs_advantage", float)):
            object.__setattr__(self, name, cast(getattr(self, name)))


class Scheduler(Generic[P]):
    """Draws row indices, learns from their groups, reports metrics and checkpoints its state."""

    _state: tuple[str, ...] = ("step", "last")
    """Attributes (JSON-able) that change while training, besides the rng."""

    def __init__(
        self,
        rows: Sequence[Mapping[str, Any]],
        params: P,
        buckets: dict[str, float],
        max_steps: int,
        seed: int,
    ) -> None:
        if not rows:
            raise ValueError("curriculum: no prompts to draw from")
        self.params = params
        self.max_steps = max_steps
        self.pass_rates = [UNKNOWN_PASS_RATE if r.get("pass_rate") is None else float(r["pass_rate"]) for r in rows]
        self.buckets = [r.get("bucket") or bucket(p, buckets) for r, p in zip(rows, self.pass_rates, strict=True)]
        self.rng = np.random.default_rng(seed)
        self.step = 0
        self.last: list[int] = []
        self.passes: dict[str, dict[str, Any]] = {}

    def draw(self, n: int, step: int) -> list[int]:
        """`n` row indices for `step`, distinct unless there are fewer than `n` candidates."""
        if n <= 0:
            raise ValueError(f"curriculum: draw needs n > 0, got {n}")
        self.step = step
        self.last = self._draw(n, step)
        return list(self.last)

    def _draw(self, n: int, step: int) -> list[int]:
        raise NotImplementedError

    def update(self, results: Sequence[GroupResult], step: int) -> None:
        """Learn from the groups generated at `step` (a no-op for the static curricula)."""

    def metrics(self) -> dict[str, float]:
        """Flat scalars; drawn_pass_rate is the mean offline pass rate of the last draw."""
        drawn = {"drawn_pass_rate": mean(self.pass_rates[i] for i in self.last)} if self.last else {}
        return drawn | self._metrics()

    def _metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        state = {k: copy.deepcopy(getattr(self, k)) for k in self._state}
        return {"type": self.params.type, "rows": len(self.pass_rates), "rng": self.rng.bit_generator.state, **state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if (state.get("type"), state.get("rows")) != (self.params.type, len(self.pass_rates)):
            raise ValueError(
                f"curriculum: state of a {state.get('type')} curriculum over {state.get('rows')} prompts "
                f"cannot resume a {self.params.type} one over {len(self.pass_rates)}"
            )
        self.rng.bit_generator.state = copy.deepcopy(state["rng"])
        for k in self._state:
            setattr(self, k, copy.deepcopy(state[k]))

    def _take(self, key: str, pool: list[int], avoid: set[int]) -> int:
        """Next prompt of shuffled passes over `pool` (kept under `key`); a reshuffle puts the
        prompts in `avoid` (already in this draw) last, so a draw stays distinct when it can."""
        p = self.passes.setdefault(key, {"order": [], "pos": 0})
        if p["pos"] >= len(p["order"]):
            perm = self.rng.permutation(pool).tolist()
            p["order"], p["pos"] = [i for i in perm if i not in avoid] + [i for i in perm if i in avoid], 0
        p["pos"] += 1
        return p["order"][p["pos"] - 1]

    def _take_many(self, key: str, pool: list[int], n: int) -> list[int]:
        out: list[int] = []
        for _ in range(n):
            out.append(self._take(key, pool, set(out)))
        return out


class Uniform(Scheduler[UniformCurriculum]):
    _state = (*Scheduler._state, "passes", "drawn")

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.everything = list(range(len(self.pass_rates)))
        self.drawn = 0

    def _draw(self, n: int, step: int) -> list[int]:
        self.drawn += n
        return self._take_many("all", self.everything, n)

    def _metrics(self) -> dict[str, float]:
        return {"epoch": self.drawn / len(self.everything)}


class Staged(Scheduler[StagedCurriculum]):
    _state = (*Scheduler._state, "passes")

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.phase_rows = [[i for i, b in enumerate(self.buckets) if b in p.buckets] for p in self.params.phases]

    def _phase(self, step: int) -> int:
        phases = self.params.phases
        return next((i for i, p in enumerate(phases) if p.until_step is None or step < p.until_step), len(phases) - 1)

    def _pool(self, phase: int) -> list[int]:
        return self.phase_rows[phase] or list(range(len(self.pass_rates)))

    def _draw(self, n: int, step: int) -> list[int]:
        phase = self._phase(step)
        return self._take_many(f"phase{phase}", self._pool(phase), n)

    def _metrics(self) -> dict[str, float]:
        phase = self._phase(self.step)
        return {
            "phase": float(phase),
            "prompts": float(len(self._pool(phase))),
            "fallback": float(not self.phase_rows[phase]),
        }


class Scheduled(Scheduler[ScheduledCurriculum]):
    def target(self, step: int) -> float:
        p, x = self.params, min(step / self.max_steps, 1.0)
        if p.shape == "cosine":
            return p.end + (p.start - p.end) * (1 + math.cos(math.pi * x)) / 2
        return p.start + (p.end - p.start) * x

    def _draw(self, n: int, step: int) -> list[int]:
        rates = np.array(self.pass_rates)
        log_w = -((rates - self.target(step)) ** 2) / (2 * self.params.width**2)
        out: list[int] = []
        while len(out) < n:  # Gumbel top-k: weighted sampling without replacement, in log space
            keys = log_w + self.rng.gumbel(size=len(rates))
            out += np.argsort(-keys, kind="stable")[: n - len(out)].tolist()
        return out

    def _metrics(self) -> dict[str, float]:
        return {"target": self.target(self.step)}


class Adaptive(Scheduler[AdaptiveCurriculum]):
    _state = (*Scheduler._state, "target", "reward")

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.target = self.params.initial_target
        self.reward: float | None = None

    def _draw(self, n: int, step: int) -> list[int]:
        difficulty = 1 - np.array(self.pass_rates)
        ties = self.rng.random(len(difficulty))
        ranked = np.lexsort((ties, np.abs(difficulty - self.target))).tolist()
        # Skip the previous draw's prompts when enough others remain, so a still target does not
        # re-serve the very same prompts every step.
        recent = set(self.last) if len(ranked) - len(set(self.last)) >= n else set()
        ranked = [i for i in ranked if i not in recent]
        return (ranked * math.ceil(n / len(ranked)))[:n]

    def update(self, results: Sequence[GroupResult], step: int) -> None:
        if not results:
            return
        p = self.params
        self.reward = mean(r.accuracy for r in results)
        self.target = float(np.clip(self.target + p.eta * math.tanh(p.alpha * (self.reward - p.beta)), 0.0, 1.0))

    def _metrics(self) -> dict[str, float]:
        return {"target": self.target} | ({"reward": self.reward} if self.reward is not None else {})


class Bandit(Scheduler[BanditCurriculum]):
    _state = (*Scheduler._state, "passes", "pulls", "value", "window", "accuracy")

    def __init__(self, rows: Sequence[Mapping[str, Any]], *args: Any) -> None:
        super().__init__(rows, *args)
        self.arm_of = self.buckets if self.params.arms == "bucket" else [str(r["task"]) for r in rows]
        self.arms = sorted(set(self.arm_of))
        self.members = {a: [i for i, k in enumerate(self.arm_of) if k == a] for a in self.arms}
        self.pulls = dict.fromkeys(self.arms, 0)
        """Prompts drawn from each arm."""
        self.value = dict.fromkeys(self.arms, 0.0)
        """sec: TD(0) value per arm."""
        self.window: dict[str, list[float]] = {a: [] for a in self.arms}
        """ucb: the arm's last `window` signals."""
        self.accuracy: dict[str, float | None] = dict.fromkeys(self.arms)
        """Accuracy at the arm's last update, for learning progress."""

    def _draw(self, n: int, step: int) -> list[int]:
        out: list[int] = []
        used = dict.fromkeys(self.arms, 0)
        for _ in range(n):
            arms = [a for a in self.arms if used[a] < len(self.members[a])] or self.arms
            arm = self._sec(arms) if self.params.method == "sec" else self._ucb(arms)
            used[arm] += 1
            self.pulls[arm] += 1
            out.append(self._take(arm, self.members[arm], set(out)))
        return out

    def _sec(self, arms: list[str]) -> str:
        q = np.array([self.value[a] for a in arms]) / self.params.temperature
        p = np.exp(q - q.max())
        return arms[self.rng.choice(len(arms), p=p / p.sum())]

    def _score(self, arm: str) -> float:
        if self.pulls[arm] == 0:
            return math.inf
        signals = self.window[arm]
        bonus = self.params.exploration * math.sqrt(2 * math.log(sum(self.pulls.values())) / self.pulls[arm])
        return (mean(signals) if signals else 0.0) + bonus

    def _ucb(self, arms: list[str]) -> str:
        scores = [self._score(a) for a in arms]
        best = [a for a, s in zip(arms, scores, strict=True) if s == max(scores)]
        return best[self.rng.integers(len(best))]

    def update(self, results: Sequence[GroupResult], step: int) -> None:
        groups: dict[str, list[GroupResult]] = {}
        for r in results:
            groups.setdefault(self.arm_of[r.index], []).append(r)
        p = self.params
        for arm, rs in groups.items():
            accuracy, previous = mean(r.accuracy for r in rs), self.accuracy[arm]
            if p.signal == "abs_advantage":
                signal = mean(r.abs_advantage for r in rs)
            else:
                signal = 0.0 if previous is None else abs(accuracy - previous)
            self.accuracy[arm] = accuracy
            if p.method == "sec":
                self.value[arm] = p.step_size * signal + (1 - p.step_size) * self.value[arm]
            else:
                self.window[arm] = [*self.window[arm], signal][-p.window :]

    def _metrics(self) -> dict[str, float]:
        if self.params.method == "sec":
            values = {f"q/{a}": self.value[a] for a in self.arms}
        else:  # unpulled arms have an infinite score: not logged
            values = {f"ucb/{a}": self._score(a) for a in self.arms if self.pulls[a]}
        return values | {f"pulls/{a}": float(self.pulls[a]) for a in self.arms}


class Pools(Scheduler[PoolsCurriculum]):
    _state = (*Scheduler._state, "rate", "streak", "retired")

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.pools = sorted(self.params.pools.items(), key=lambda kv: kv[1].max_pass_rate)
        self.rate = list(self.pass_rates)
        """Online pass rate per prompt."""
        self.streak = [0] * len(self.rate)
        """Consecutive all-correct groups per prompt."""
        self.retired = [False] * len(self.rate)

    def _pool(self, rate: float) -> str:
        return next((name for name, p in self.pools if rate <= p.max_pass_rate), self.pools[-1][0])

    def _draw(self, n: int, step: int) -> list[int]:
        pool_of = [self._pool(r) for r in self.rate]
        everything = range(len(self.rate))
        # Active prompts; once all are taken, retired ones (all of them when every prompt is retired); then repeats.
        tiers = [[i for i in everything if not self.retired[i]], [i for i in everything if self.retired[i]]]
        out: list[int] = []
        while len(out) < n:
            candidates = tiers.pop(0) if tiers else list(everything)
            members = {name: [i for i in candidates if pool_of[i] == name] for name, _ in self.pools}
            while len(out) < n and (names := [name for name, _ in self.pools if members[name]]):
                weights = np.array([self.params.pools[name].weight for name in names])
                weights = weights if weights.sum() > 0 else np.ones(len(names))
                chosen = members[names[self.rng.choice(len(names), p=weights / weights.sum())]]
                out.append(chosen.pop(self.rng.integers(len(chosen))))
        return out

    def update(self, results: Sequence[GroupResult], step: int) -> None:
        p = self.params
        for r in results:
            self.rate[r.index] = p.smoothing * self.rate[r.index] + (1 - p.smoothing) * r.accuracy
            self.streak[r.index] = self.streak[r.index] + 1 if r.accuracy == 1.0 else 0
            if p.retire_after is not None and self.streak[r.index] >= p.retire_after:
                self.retired[r.index] = True

    def _metrics(self) -> dict[str, float]:
        sizes = dict.fromkeys((name for name, _ in self.pools), 0.0)
        for rate, retired in zip(self.rate, self.retired, strict=True):
            sizes[self._pool(rate)] += not retired
        n_retired = float(sum(self.retired))
        exhausted = float(n_retired == len(self.retired))
        return {f"size/{name}": size for name, size in sizes.items()} | {"retired": n_retired, "exhausted": exhausted}


_SCHEDULERS: dict[str, type[Scheduler[Any]]] = {
    "uniform": Uniform,
    "staged": Staged,
    "scheduled": Scheduled,
    "adaptive": Adaptive,
    "bandit": Bandit,
    "pools": Pools,
}


def build(
    rows: Sequence[Mapping[str, Any]], params: Curriculum, *, buckets: dict[str, float], max_steps: int, seed: int
) -> Scheduler[Any]:
    """The scheduler of `params.type` over `rows` (dicts with id, task, source, pass_rate, bucket)."""
    return _SCHEDULERS[params.type](rows, params, buckets, max_steps, seed)
