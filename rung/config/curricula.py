"""The RL stage's curricula: the order in which prompts are drawn (uniform, staged, scheduled, adaptive,
bandit, difficulty pools), one `Curriculum` chosen by its `type`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, model_validator

from rung.config.base import Section, deprecated


class UniformCurriculum(Section):
    """Shuffled passes over the prompts without replacement: TRL's RepeatSampler order (baseline)."""

    type: Literal["uniform"] = "uniform"
    """Selects the uniform curriculum (the default)."""


class CurriculumPhase(Section):
    buckets: list[str] = Field(min_length=1)
    """Difficulty buckets (difficulty.buckets names) sampled in this phase."""
    until_step: int | None = Field(None, gt=0)
    """Last step of the phase (exclusive); None for the final phase."""


class StagedCurriculum(Section):
    """Fixed easy-to-hard phases over difficulty buckets with step boundaries ("Exploring Data
    Scaling in RLHF": static easy->hard orderings help)."""

    type: Literal["staged"]
    """Selects the staged curriculum."""
    phases: list[CurriculumPhase] = Field(min_length=1)
    """Phases in order; every phase but the last ends at an increasing `until_step`."""

    @model_validator(mode="after")
    def _ordered(self) -> StagedCurriculum:
        bounds = [p.until_step for p in self.phases[:-1]]
        steps = [b for b in bounds if b is not None]
        if len(steps) < len(bounds) or steps != sorted(steps):
            raise ValueError("phases: every phase but the last needs an increasing until_step")
        return self


class ScheduledCurriculum(Section):
    """Target pass rate moving from `start` to `end` over the stage's steps; prompts are drawn with
    Gaussian weights around the target (pass rates from the difficulty stage)."""

    type: Literal["scheduled"]
    """Selects the scheduled curriculum."""
    start: float = Field(0.8, ge=0, le=1)
    """Target pass rate at the first step (0.8: easy prompts first)."""
    end: float = Field(0.3, ge=0, le=1)
    """Target pass rate at the last step."""
    shape: Literal["linear", "cosine"] = "linear"
    """How the target moves from start to end over the steps."""
    width: float = Field(0.15, gt=0)
    """Standard deviation of the sampling weights around the target pass rate."""


class AdaptiveCurriculum(Section):
    """AdaRFT (Shi et al. 2025): target difficulty T <- T + eta * tanh(alpha * (reward - beta)),
    each step's prompts the ones closest to T. Difficulty = 1 - pass rate; the paper's defaults
    on its 0-100 scale are eta 50, alpha 2, beta 0.5."""

    type: Literal["adaptive"]
    """Selects the adaptive (AdaRFT) curriculum."""
    initial_target: float = Field(0.5, ge=0, le=1)
    """Starting target difficulty (1 - pass rate)."""
    eta: float = Field(0.5, gt=0)
    """Step size of the target update (AdaRFT's eta, on the 0-1 scale)."""
    alpha: float = Field(2.0, gt=0)
    """Sensitivity of the update to the reward's distance from beta."""
    beta: float = Field(0.5, ge=0, le=1)
    """Target reward: the accuracy at which the difficulty stays put."""


class BanditCurriculum(Section):
    """A non-stationary bandit over arms (difficulty buckets or tasks). sec: Self-Evolving
    Curriculum (Chen et al. 2025), TD(0) values and Boltzmann sampling; ucb: DUMP (Wang et al.
    2025), mean signal over a window plus an exploration bonus."""

    type: Literal["bandit"]
    """Selects the bandit curriculum."""
    arms: Literal["bucket", "task"] = "bucket"
    """What an arm is: a difficulty bucket or a task (the rows' `task`)."""
    method: Literal["sec", "ucb"] = "sec"
    """sec: TD(0) values with Boltzmann sampling (SEC); ucb: windowed mean plus bonus (DUMP)."""
    signal: Literal["abs_advantage", "learning_progress"] = "abs_advantage"
    """Arm reward: mean |advantage| of its groups (SEC, DUMP), the trainer's own advantage (GRPO's
    group-relative, RLOO's leave-one-out) whatever `objective` trains, so that it means the same
    under psr / nsr; or the absolute change of its accuracy between its last two pulls (learning
    progress)."""
    step_size: float = Field(0.5, gt=0, le=1)
    """sec: TD(0) step size (SEC's learning rate alpha; called learning_rate before, which still
    validates with a warning)."""
    temperature: float = Field(1.0, gt=0)
    """sec: Boltzmann temperature."""
    exploration: float = Field(1.0, ge=0)
    """ucb: weight c of the bonus c * sqrt(2 ln N / n_arm)."""
    window: int = Field(50, gt=0)
    """ucb: recent pulls per arm averaged."""

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any, info: ValidationInfo) -> Any:
        # Renamed: `learning_rate` is the RL stage's optimizer rate. RLParams renames it first, naming the stage.
        return deprecated(data, "learning_rate", "step_size", info, label="curriculum")


class PoolParams(Section):
    max_pass_rate: float = Field(ge=0, le=1)
    """Inclusive upper bound of the pool's pass rate."""
    weight: float = Field(ge=0)
    """Relative chance that a step's prompt is drawn from this pool."""


class PoolsCurriculum(Section):
    """Online difficulty pools (prime-rl's difficulty_pool): each prompt's pass rate starts at the
    difficulty stage's value, is updated from every group it gets, and moves it between pools;
    pools are drawn by weight; prompts solved `retire_after` times in a row leave."""

    type: Literal["pools"]
    """Selects the online difficulty pools curriculum."""
    pools: dict[str, PoolParams] = {
        "hard": PoolParams(max_pass_rate=0.25, weight=0.2),
        "normal": PoolParams(max_pass_rate=0.75, weight=1.0),
        "easy": PoolParams(max_pass_rate=1.0, weight=0.2),
    }
    """Pool name -> upper pass-rate bound and draw weight (prime-rl's defaults); the largest bound must be 1.0."""
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
    UniformCurriculum
    | StagedCurriculum
    | ScheduledCurriculum
    | AdaptiveCurriculum
    | BanditCurriculum
    | PoolsCurriculum,
    Field(discriminator="type"),
]
