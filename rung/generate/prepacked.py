"""oneDNN-prepacked weights for a model's linear layers while it decodes on CPU.

At decode shapes (a few dozen rows against a 576 x 49152 LM head) PyTorch's default fp32 GEMM
runs far below this machine's matmul peak; oneDNN's matmul on weights reordered once into its
blocked layout runs 2-4x faster per layer. It is what torch.compile's CPU `freezing` pass does,
without compiling: PyTorch has no public call for it, so this uses the same operators inductor
emits (rung.onednn). Results differ from the default GEMM in the last bits of fp32 summation order
only; greedy completions are tested equal.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch
from torch import nn

from rung.onednn import LINEARS, available, linear


@contextmanager
def prepacked(model: nn.Module, rows: int) -> Iterator[None]:
    """Within the block, every `nn.Linear` of a CPU model in fp32 or bf16 runs on weights packed
    for about `rows` input rows (any row count works). A no-op on GPU, for other dtypes, where
    oneDNN is unavailable, or when gradients are on (the packed path has no backward). Weights are
    packed on entry, so a model trained between two blocks decodes with its new weights."""
    linears = [
        m
        for m in model.modules()
        # the exact classes, not subclasses (whose forward may differ); isinstance types m as an nn.Linear
        if isinstance(m, nn.Linear)
        and type(m) in LINEARS
        and m.weight.device.type == "cpu"
        and m.weight.dtype in (torch.float32, torch.bfloat16)
        and available(m.weight.dtype)
    ]
    if not linears or torch.is_grad_enabled():
        yield
        return
    for m in linears:
        packed = torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), rows)
        # an instance attribute over the class's forward, for the block only (mypy forbids it on a method)
        m.forward = partial(linear, packed, m.bias)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for m in linears:
            del m.forward  # the class's forward again
