"""Rewards a trained model gives (docs/reward_models.md, Rewards for RL): `reward_model`, a reward model's score of
each completion (an ensemble's members aggregated), and `process`, a process reward model's step scores
aggregated over the steps. Both score the batch on the stage's device, and, as every `Learned` reward, grade each
completion with the task's verifier too, never to train on: the gold grade logged beside the proxy (`log_gold`,
rung.rl.gold)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import mean
from typing import Any, Literal

import torch

from rung.answers.grading import grade
from rung.answers.rows import Problem, problem
from rung.config import FormatParams, RLStageParams
from rung.rewardmodels import scoring
from rung.rewardmodels.encoding import completion_ids, prompt_ids
from rung.rewardmodels.scoring import ProcessRewardModel
from rung.rl import gold
from rung.rl.completions import text
from rung.rl.reward_models_used import known_aggregate, model_dir


def aggregate(members: torch.Tensor, how: str, lam: float) -> torch.Tensor:
    """One score per completion from the (members, completions) scores of an ensemble: their mean, their
    minimum, or mean - lam * std (Coste et al. 2023's uncertainty-weighted optimisation; std 0 for one member)."""
    if how == "min":
        return members.min(dim=0).values
    average = members.mean(dim=0)
    if how == "mean_minus_std":
        return average - lam * members.std(dim=0, unbiased=False)
    return average


def normalised(scores: list[float | None]) -> list[float | None]:
    """Scores standardised over the batch's scored completions: a reward model's scale is arbitrary (Bradley–Terry
    fixes differences only), so its raw values would weigh unpredictably against the other rewards."""
    scored = torch.tensor([s for s in scores if s is not None])
    if not len(scored):
        return scores
    centre, std = scored.mean().item(), scored.std(unbiased=False).item()
    return [None if s is None else (s - centre) / (std if std > 0 else 1.0) for s in scores]


def log_gold(
    name: str,
    proxy: Sequence[float | None],
    completions: list[Any],
    fmt: FormatParams,
    log_metric: Callable[[str, float], None] | None = None,
    **columns: Any,
) -> list[float | None] | None:
    """Log the batch's mean proxy score and its verifier accuracy through TRL's `log_metric` (rung.rl.gold); a
    completion the grader fails on counts in neither side of the accuracy (unscored, as the accuracy reward leaves
    it). The gold grade of each completion (1.0, 0.0, None), or None outside a trainer (no `log_metric`)."""
    if log_metric is None:  # called outside a trainer (best-of-N, tests)
        return None
    keys = ("answer", "task", "prompt_text", "meta")
    rows = [problem(dict(zip(keys, values, strict=True))) for values in zip(*(columns[k] for k in keys), strict=True)]
    graded = [gold_grade(c, row, fmt) for c, row in zip(completions, rows, strict=True)]
    scored = [g for g in graded if g is not None]
    if scored:
        log_metric(gold.GOLD, mean(scored))
    proxied = [p for p in proxy if p is not None]
    if proxied:
        log_metric(f"{gold.PROXY}{name}", mean(proxied))
    return graded


def gold_grade(completion: Any, row: Problem, fmt: FormatParams) -> float | None:
    """The verifier's grade of one completion (1.0, 0.0), None where it cannot grade it."""
    try:
        correct = grade(text(completion), row, fmt).correct
    except Exception:  # noqa: BLE001 - a grade only logged must not stop training: the completion is ungraded
        return None
    return None if correct is None else float(correct)


class Learned:
    """A reward given by a model (or, `majority`, by the group), whose batch is graded by the verifier too (gold).
    `score` gives the raw scores; `finish` logs gold and proxy and standardises (`normalize`) once per batch.
    rung.rl.rewards.Guarded calls the two apart, so that after a crash, which it rescores group by group, the gold
    and the normalisation still cover the whole batch; a plain call runs both."""

    __name__: str
    fmt: FormatParams
    normalize = False
    gold: list[float | None] | None = None
    """The verifier's grade of each completion of the last batch `finish` saw (None: not logged, outside a
    trainer): rung.rl.sampling's accuracy by bucket reads it."""

    def score(self, completions: list[Any], prompt_text: list[str], **columns: Any) -> list[float | None]:
        raise NotImplementedError

    def finish(self, scores: list[float | None], completions: list[Any], **columns: Any) -> list[float | None]:
        self.gold = log_gold(self.__name__, scores, completions, self.fmt, **columns)
        return normalised(scores) if self.normalize else scores

    def __call__(self, completions: list[Any], **columns: Any) -> list[float | None]:
        return self.finish(self.score(completions, **columns), completions, **columns)


class RewardModel(Learned):
    """The reward model's score of (prompt, completion), read as in its held-out metrics (rung.rewardmodels)."""

    __name__ = "reward_model"

    def __init__(
        self,
        fmt: FormatParams,
        stage: RLStageParams,
        model: str,
        aggregate: Literal["mean", "min", "mean_minus_std"] = "mean",
        lam: float = 1.0,
        normalize: bool = False,
        batch_size: int = 16,
        device: str = "auto",
    ) -> None:
        known_aggregate(self.__name__, aggregate, "rewards.reward_model.args.aggregate")
        self.fmt, self.how, self.lam, self.normalize, self.batch = fmt, aggregate, lam, normalize, batch_size
        loaded = [scoring.load(m, device) for m in scoring.members(model_dir(model, "reward_model"), "model")]
        self.models = [m for m, _ in loaded]
        self.tok = loaded[0][1]

    def raw(self, completions: list[Any], prompt_text: list[str]) -> torch.Tensor:
        """The aggregated scores, before any normalisation."""
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id
        seqs = [
            completion_ids(self.tok, prompt_ids(self.tok, p, self.fmt), text(c))
            for c, p in zip(completions, prompt_text, strict=True)
        ]
        members = torch.tensor([scoring.scores(m, pad, seqs, self.batch) for m in self.models])
        return aggregate(members, self.how, self.lam)

    def score(self, completions: list[Any], prompt_text: list[str], **_: Any) -> list[float | None]:
        return list(self.raw(completions, prompt_text).tolist())


class Process(Learned):
    """A process reward model's scores of a completion's steps (split by the PRM's own splitter), aggregated:
    min (the weakest step: Cheng et al. 2025, "Stop Summation"), last, or mean; each step's score a
    probability (sigmoid of the PRM's logit)."""

    __name__ = "process"

    def __init__(
        self,
        fmt: FormatParams,
        stage: RLStageParams,
        model: str,
        aggregate: Literal["min", "last", "mean"] = "min",
        device: str = "auto",
    ) -> None:
        known_aggregate(self.__name__, aggregate, "rewards.process.args.aggregate")
        self.fmt, self.how = fmt, aggregate
        self.prm = ProcessRewardModel(model_dir(model, "process"), device)

    def one(self, prompt: str, completion: str) -> float:
        steps = torch.tensor(self.prm.step_scores(prompt, completion)).sigmoid()
        if not len(steps):
            raise ValueError("a completion without steps has no process score")  # unscored (Guarded)
        return float({"min": steps.min(), "last": steps[-1], "mean": steps.mean()}[self.how])

    def score(self, completions: list[Any], prompt_text: list[str], **_: Any) -> list[float | None]:
        return [self.one(p, text(c)) for c, p in zip(completions, prompt_text, strict=True)]
