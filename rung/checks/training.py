"""What the SFT stage needs before it starts: the tested TRL / transformers versions, a launch that can
run here and LoRA target modules that the model has."""

from __future__ import annotations

from rung import compat
from rung.checks.models import lora_targets
from rung.config import Params
from rung.train import launch


def sft_launch(params: Params) -> None:
    """The tested trainer versions, an SFT launch that can run here and its LoRA targets (the sft stage)."""
    compat.check()
    launch.check(params.sft.launch, "sft.launch")
    lora_targets(params.sft.lora, params.model, "sft.lora")
