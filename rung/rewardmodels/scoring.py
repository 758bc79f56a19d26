"""Loading a trained reward model (the members of its ensemble) or process reward model and scoring completions
with it: what the held-out metrics, the RL rewards and best-of-N use, without the training code. A reward model's
directory holds one standard transformers sequence-classification checkpoint (one label) per member, in
`member-<i>/` (docs/reward_models.md)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from rung import files, models, placement
from rung.config import FormatParams
from rung.errors import InputError
from rung.paths import PRM_SETTINGS as SETTINGS
from rung.rewardmodels.encoding import prompt_ids, step_ids
from rung.rewardmodels.steps import split

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


class ProcessRewardModel:
    """A trained PRM, loaded for scoring: `step_scores(prompt, solution)` splits a solution as training did
    and returns each step's score (a logit; sigmoid gives the estimated chance that the step's prefix still
    reaches the right answer)."""

    def __init__(self, model_dir: Path | str, device: str = "auto") -> None:
        settings = Path(model_dir) / SETTINGS
        if not settings.is_file():
            raise InputError(f"{model_dir}: not a process reward model (no {SETTINGS})")
        saved = files.read_json(settings)
        self.splitter: str = saved["splitter"]
        self.format = FormatParams(**saved["format"])
        self.tok = models.load_tokenizer(model_dir)
        self.model: PreTrainedModel = AutoModelForTokenClassification.from_pretrained(model_dir, dtype=torch.float32)
        self.model.to(placement.device(device)).eval()

    @torch.inference_mode()
    def scores_of_steps(self, prompt: str, steps: list[str]) -> list[float]:
        """Each step's score, the steps given."""
        ids, ends = step_ids(self.tok, prompt_ids(self.tok, prompt, self.format), steps)
        logits = self.model(input_ids=torch.tensor([ids], device=self.model.device)).logits[0, :, 0]
        return logits[ends].float().tolist()

    def step_scores(self, prompt: str, solution: str) -> list[float]:
        return self.scores_of_steps(prompt, split(solution, self.splitter))
