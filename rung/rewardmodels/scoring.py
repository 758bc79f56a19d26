"""Loading a trained reward model (the members of its ensemble) and scoring completions with it: what the
held-out metrics use, and what a reward, best-of-N or over-optimization log loads later. A reward model's
directory holds one standard transformers sequence-classification checkpoint (one label) per member, in
`member-<i>/` (docs/reward_models.md)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, PreTrainedModel, PreTrainedTokenizerBase

from rung import models, placement
from rung.errors import InputError

MEMBER = "member-{}"


def member_dir(out_dir: Path, i: int) -> Path:
    return out_dir / MEMBER.format(i)


def members(model_dir: Path | str, key: str) -> list[Path]:
    """The checkpoints of a reward model directory (its ensemble's members, or itself when it is one), each a
    sequence-classification checkpoint with one label; else InputError naming `key`."""
    model_dir = Path(model_dir)
    found = sorted(model_dir.glob(MEMBER.format("*")), key=lambda p: int(p.name.rsplit("-", 1)[1]))
    for path in found or [model_dir]:
        check(path, key)
    return found or [model_dir]


def check(path: Path, key: str) -> None:
    """InputError naming `key` unless `path` is a transformers sequence-classification checkpoint with one label."""
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError):
        raise InputError(f"{key}: {path} is no model checkpoint (no config.json)") from None
    classifier = any(a.endswith("ForSequenceClassification") for a in config.architectures or [])
    if not classifier or config.num_labels != 1:
        raise InputError(
            f"{key}: {path} is not a reward model (a sequence-classification checkpoint with one label; its "
            f"architectures: {config.architectures}, num_labels {config.num_labels})"
        )


def load(path: Path, device: str = "auto") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """One member, in float32 on `device` (params `model.device`), for scoring."""
    tok = models.load_tokenizer(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).to(placement.device(device))
    model.eval()
    return model, tok


@torch.inference_mode()
def scores(model: PreTrainedModel, pad_id: int, sequences: list[list[int]], batch: int = 16) -> list[float]:
    """The model's output at the last token of each sequence (right-padded batches, so the last real token is
    the one sequence-classification heads read)."""
    out: list[float] = []
    for i in range(0, len(sequences), batch):
        chunk = sequences[i : i + batch]
        width = max(len(s) for s in chunk)
        ids = torch.tensor([s + [pad_id] * (width - len(s)) for s in chunk], device=model.device)
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in chunk], device=model.device)
        logits = model(input_ids=ids, attention_mask=mask).logits  # (batch, width, 1) or (batch, 1)
        if logits.dim() == 3:  # a token classifier (a PRM): the last real token's
            logits = logits[torch.arange(len(chunk)), mask.sum(1) - 1]
        out += logits[:, 0].float().tolist()
    return out
