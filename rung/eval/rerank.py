"""Best-of-N in evaluation: the n samples of each prompt reranked by a learned reward (a reward model or a
process reward model, eval.samples.rerank), reported beside maj@k and pass@k on the same samples.

best-of-k picks the highest-scored of a prompt's first k samples (ties: the earlier sample), whatever its
answer, so a sample without one counts wrong as it does for pass@k. Weighted maj@k votes as maj@k does (by the
answers' classes under the grader, no vote for a sample without an answer, ties to the class that occurred
first), each vote weighted by the sigmoid of its sample's score: the reward model's or PRM's estimate, in
(0, 1), that the sample is right, as Math-Shepherd and "Solving math word problems with process- and
outcome-based feedback" (Uesato et al. 2022) weight votes by a verifier's probability. Best-of-n is tested
against maj@n per prompt (exact McNemar, Bonett-Price interval: rung.eval.paired.outcome_test), the test rung
prints for every paired right/wrong comparison."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from statistics import mean

from rung import paths
from rung.answers.rows import Row
from rung.answers.verify import answer_class
from rung.config import EvalParams, FormatParams, Params
from rung.config.eval import RerankParams
from rung.eval import metrics
from rung.eval.paired import outcome_test
from rung.eval.results import EvalRecord, Reranked, SetMetrics

Scorer = Callable[[Sequence[EvalRecord]], list[list[float]]]
"""Each record's samples' scores (higher: better), in sampling order."""

SECTIONS = {"reward_model": "reward_models", "process_reward_model": "process_reward_models"}
"""rerank's key of each kind of reranker -> the params section (and data/models/ directory) of its stages."""

AGGREGATES: dict[str, Callable[[list[float]], float]] = {"min": min, "last": lambda s: s[-1], "mean": mean}
"""A PRM's step scores -> the sample's score (eval.samples.rerank.aggregate)."""


def best_of(scores: Sequence[float], correct: Sequence[bool], ks: Sequence[int]) -> list[bool]:
    """For each k of ks: whether the highest-scored of the first k samples is right (ties: the earlier one)."""
    return [correct[max(range(k), key=lambda i: (scores[i], -i))] for k in ks]


def sigmoid(score: float) -> float:
    return 0.5 * (1 + math.tanh(score / 2))  # = 1 / (1 + e^-score), without overflow at either end


def summarize(
    records: Sequence[EvalRecord],
    scores: Sequence[Sequence[float]],
    ks: Sequence[int],
    classes: Sequence[metrics.Classify] | None,
    confidence: float,
) -> Reranked:
    """Best-of-k and weighted maj@k at each k of ks (the largest is n) over `records`' samples scored by
    `scores`, and best-of-n against maj@n on the same prompts."""
    ks = sorted(set(ks))
    best, weighted, majority = [], [], []
    for i, (record, s) in enumerate(zip(records, scores, strict=True)):
        votes = [(x["extracted"], x["correct"]) for x in record["samples"][: ks[-1]]]
        classify = classes[i] if classes is not None else None
        best.append(best_of(s, [ok for _, ok in votes], ks))
        weighted.append(metrics.votes_right(votes, ks, classify, [sigmoid(x) for x in s]))
        majority.append(metrics.votes_right(votes, ks[-1:], classify)[0])

    def share(right: list[list[bool]]) -> dict[str, float]:
        return {str(k): mean(float(r[j]) for r in right) for j, k in enumerate(ks)}

    return Reranked(
        best_of_k=share(best),
        weighted_maj_at_k=share(weighted),
        versus_maj=outcome_test(majority, [b[-1] for b in best], confidence),
    )


def directory(params: Params, kind: str, value: str) -> Path:
    """The model directory a reranker names: its stage's output (a name of the section's stages), else a path."""
    section = SECTIONS[kind]
    return paths.learned_reward(section, value) if value in getattr(params, section) else Path(value)


def directories(params: Params) -> dict[str, Path]:
    """Each reranker of eval.samples.rerank (kind -> its model directory); empty without."""
    rerank = params.eval.samples.rerank if params.eval.samples else None
    if rerank is None:
        return {}
    named = {kind: getattr(rerank, kind) for kind in SECTIONS}
    return {kind: directory(params, kind, value) for kind, value in named.items() if value is not None}


def load(rerank: RerankParams, dirs: Mapping[str, Path], fmt: FormatParams, device: str) -> dict[str, Scorer]:
    """A scorer per reranker of `dirs` (kind -> model directory), its model loaded on `device`."""
    out: dict[str, Scorer] = {}
    if "reward_model" in dirs:
        out["reward_model"] = _reward_model(dirs["reward_model"], fmt, device)
    if "process_reward_model" in dirs:
        out["process_reward_model"] = _process_reward_model(dirs["process_reward_model"], rerank.aggregate, device)
    return out


def _reward_model(model_dir: Path, fmt: FormatParams, device: str) -> Scorer:
    """The ensemble's mean score of each sample, encoded as the reward model was trained (rewardmodels.encoding)."""
    from rung.rewardmodels import scoring
    from rung.rewardmodels.encoding import completion_ids, prompt_ids

    members = [scoring.load(path, device) for path in scoring.members(model_dir, "eval.samples.rerank.reward_model")]

    def score(records: Sequence[EvalRecord]) -> list[list[float]]:
        per_member = []
        for model, tok in members:
            seqs = [
                completion_ids(tok, prompt_ids(tok, r["prompt"], fmt), s["completion"])
                for r in records
                for s in r["samples"]
            ]
            per_member.append(scoring.scores(model, tok.pad_token_id, seqs))
        flat = [mean(x) for x in zip(*per_member, strict=True)]
        return _regroup(flat, records)

    return score


def _process_reward_model(model_dir: Path, aggregate: str, device: str) -> Scorer:
    """Each sample's step scores aggregated (min / last / mean); a sample the splitter finds no step in (an
    empty completion) is scored as one step."""
    from rung.rewardmodels.scoring import ProcessRewardModel

    prm, combine = ProcessRewardModel(model_dir, device), AGGREGATES[aggregate]

    def score(records: Sequence[EvalRecord]) -> list[list[float]]:
        out = []
        for r in records:
            steps = [
                prm.step_scores(r["prompt"], s["completion"]) or prm.scores_of_steps(r["prompt"], [s["completion"]])
                for s in r["samples"]
            ]
            out.append([combine(x) for x in steps])
        return out

    return score


def _regroup(flat: list[float], records: Sequence[EvalRecord]) -> list[list[float]]:
    out, i = [], 0
    for r in records:
        out.append(flat[i : i + len(r["samples"])])
        i += len(r["samples"])
    return out


def rerank(
    records: list[EvalRecord],
    scorers: Mapping[str, Scorer],
    ks: Sequence[int],
    classes: Sequence[metrics.Classify] | None,
    confidence: float,
) -> dict[str, Reranked]:
    """Score `records`' samples with each scorer (kept in each sample's `scores`) and summarize each ranking."""
    out = {}
    for kind, scorer in scorers.items():
        scores = scorer(records)
        for r, s in zip(records, scores, strict=True):
            for sample, x in zip(r["samples"], s, strict=True):
                sample.setdefault("scores", {})[kind] = x
        out[kind] = summarize(records, scores, ks, classes, confidence)
    return out


def reranked(
    result: SetMetrics,
    rows: Sequence[Row],
    sampled: list[EvalRecord],
    scorers: Mapping[str, Scorer],
    params: EvalParams,
) -> SetMetrics:
    """`result` (an eval set's metrics) with its samples (of `rows`, in order) reranked by each of `scorers`, at the
    k where maj@k is reported, voting on the answers' classes under each row's grader as maj@k does."""
    if not scorers or not sampled or params.samples is None:
        return result
    ks = metrics.spectrum_ks(params.samples.n, params.samples.compare_k)
    classes = [answer_class(r) for r in rows[: len(sampled)]]
    found = rerank(sampled, scorers, ks, classes, params.bootstrap.confidence)
    return SetMetrics(**result.dump(), rerank=found)
