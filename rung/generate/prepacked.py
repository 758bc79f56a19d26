"""oneDNN-prepacked weights for a model's linear layers while it decodes on CPU.

At decode shapes (a few dozen rows against a 576 x 49152 LM head) PyTorch's default fp32 GEMM
runs far below this machine's matmul peak; oneDNN's matmul on weights reordered once into its
blocked layout runs 2-4x faster per layer. It is what torch.compile's CPU `freezing` pass does,
without compiling: PyTorch has no public call for it, so this uses the same operators inductor
emits (`mkldnn._reorder_linear_weight`, `mkldnn._linear_pointwise`). Results differ from the
default GEMM in the last bits of fp32 summation order only; greedy completions are tested equal.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache, partial

import torch
from torch import nn


@cache
def available(dtype: torch.dtype = torch.float32) -> bool:
    """oneDNN is built in and its prepacked linear runs here in `dtype` (probed once on a tiny layer:
    bf16 needs AVX-512 or AVX-NE-CONVERT, which an AVX2-only CPU lacks)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        w = torch.ones(4, 8, device="cpu", dtype=dtype)
        out = _linear(torch.ops.mkldnn._reorder_linear_weight(w, 2), None, torch.ones(2, 8, device="cpu", dtype=dtype))
        return bool(torch.equal(out, torch.full((2, 4), 8.0, device="cpu", dtype=dtype)))
    except (RuntimeError, AttributeError):  # an older or a different build of PyTorch
        return False


def _linear(packed: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    return torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "").reshape(*x.shape[:-1], -1)


@contextmanager
def prepacked(model: nn.Module, rows: int) -> Iterator[None]:
    """Within the block, every `nn.Linear` of a CPU model in fp32 or bf16 runs on weights packed
    for about `rows` input rows (any row count works). A no-op on GPU, for other dtypes, where
    oneDNN is unavailable, or when gradients are on (the packed path has no backward). Weights are
    packed on entry, so a model trained between two blocks decodes with its new weights."""
    linears = [
        m
        for m in model.modules()
        if type(m) is nn.Linear
        and m.weight.device.type == "cpu"
        and m.weight.dtype in (torch.float32, torch.bfloat16)
        and available(m.weight.dtype)
    ]
    if not linears or torch.is_grad_enabled():
        yield
        return
    for m in linears:
        m.forward = partial(_linear, torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), rows), m.bias)
    try:
        yield
    finally:
        for m in linears:
            del m.forward  # the class's forward again
