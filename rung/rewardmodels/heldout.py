"""What a learned-reward stage writes around its training: the train / held-out files of its data directory,
and the held-out metrics of the trained model (each member of a reward model's ensemble, and their mean)."""

from __future__ import annotations

from pathlib import Path
from statistics import mean
from typing import Any

from rung import files
from rung.config import FormatParams
from rung.rewardmodels import metrics, scoring
from rung.rewardmodels.encoding import completion_ids, prompt_ids
from rung.rewardmodels.scoring import ProcessRewardModel

TRAIN = "train.jsonl"  # pairs, or labelled solutions, trained on
HELDOUT = "heldout.jsonl"  # held-out pairs, or labelled solutions
GRADED = "graded.jsonl"  # held-out prompts' verifier-graded completions (verifier pairs only): AUROC


def write(data_dir: Path, train: list[dict], heldout: list[dict], graded: list[dict] | None = None) -> None:
    """The stage's data files, each written whole (files.write_jsonl) so that a kill leaves no half file."""
    files.write_jsonl(data_dir / TRAIN, train)
    files.write_jsonl(data_dir / HELDOUT, heldout)
    if graded is not None:
        files.write_jsonl(data_dir / GRADED, graded)


def reward_model(model_dir: Path, data_dir: Path, fmt: FormatParams, key: str, device: str = "auto") -> dict[str, Any]:
    """Pairwise accuracy on the held-out pairs and, where the verifier graded held-out samples, the AUROC of
    the score against the grade (overall and by difficulty bucket): of the ensemble's mean score, and per member."""
    pairs = files.read_jsonl(data_dir / HELDOUT)
    graded = files.read_jsonl(data_dir / GRADED) if (data_dir / GRADED).is_file() else []
    samples = [(row, c) for row in graded for c in row["completions"]]
    per_member = []
    for path in scoring.members(model_dir, key):
        model, tok = scoring.load(path, device)
        prompt = {r["prompt"]: prompt_ids(tok, r["prompt"], fmt) for r in [*pairs, *graded]}
        seqs = [completion_ids(tok, prompt[p["prompt"]], p[side]) for p in pairs for side in ("chosen", "rejected")]
        seqs += [completion_ids(tok, prompt[row["prompt"]], c["text"]) for row, c in samples]
        per_member.append(scoring.scores(model, tok.pad_token_id, seqs))
    out = _reward_metrics(list(map(mean, zip(*per_member, strict=True))), pairs, samples)
    if len(per_member) > 1:
        out["members"] = {str(i): _reward_metrics(s, pairs, samples) for i, s in enumerate(per_member)}
    return out


def _reward_metrics(scores: list[float], pairs: list[dict], samples: list[tuple[dict, dict]]) -> dict[str, Any]:
    n = 2 * len(pairs)
    out: dict[str, Any] = {"heldout_pairs": len(pairs)}
    if pairs:
        chosen, rejected = scores[0:n:2], scores[1:n:2]
        out["pairwise_accuracy"] = metrics.pairwise_accuracy(chosen, rejected)
        if all("bucket" in p for p in pairs):  # verifier pairs: their prompt's difficulty bucket
            buckets = [p["bucket"] for p in pairs]
            out["pairwise_accuracy_by_bucket"] = metrics.pairwise_accuracy_by_bucket(chosen, rejected, buckets)
    if samples:
        right = [c["right"] for _, c in samples]
        found = metrics.auroc(scores[n:], right)
        if found is not None:
            out["auroc"] = found
        out["auroc_by_bucket"] = metrics.auroc_by_bucket(scores[n:], right, [row["bucket"] for row, _ in samples])
    return out


def process_reward_model(model_dir: Path, data_dir: Path, device: str = "auto") -> dict[str, float]:
    """Step accuracy of the PRM on the held-out solutions' Monte-Carlo labels, beside the majority guess's."""
    prm = ProcessRewardModel(model_dir, device)
    rows = files.read_jsonl(data_dir / HELDOUT)
    scores = [s for row in rows for s in prm.scores_of_steps(row["prompt"], row["steps"])]
    return metrics.step_accuracy(scores, [y for row in rows for y in row["labels"]])
