"""What the SFT stage needs before it starts: the tested TRL / transformers versions and a launch
that can run here."""

from __future__ import annotations

from rung import compat
from rung.config import Params
from rung.train import launch


def sft_launch(params: Params) -> None:
    """The tested trainer versions and an SFT launch that can run here (the sft stage)."""
    compat.check()
    launch.check(params.sft.launch, "sft.launch")
