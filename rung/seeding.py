"""One seed in params.yaml; each stage derives its own so that stages stay independent."""
from __future__ import annotations

import hashlib
import random

import numpy as np
import torch


def derive(seed: int, *scope: str) -> int:
    """A stable 31-bit seed for `scope` (e.g. derive(42, "rl", "main")) from the global seed."""
    h = hashlib.sha256(":".join([str(seed), *scope]).encode()).digest()
    return int.from_bytes(h[:4], "big") & 0x7FFFFFFF


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA) and ask torch for deterministic kernels."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
