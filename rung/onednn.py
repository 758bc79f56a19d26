"""oneDNN's matmul from PyTorch on the CPU: where it runs, and the linear layer rung trains with.

PyTorch's fp32 `mm` calls MKL, whose kernels on AMD CPUs are its AVX2 ones: 170-230 GFLOP/s on the
demo's shapes on an AVX-512 AMD EPYC, where oneDNN's matmul reads 330-500 for a linear's forward and
input gradient and 240-350 for its weight gradient. Generation packs weights for it
(rung.generate.prepacked); training runs `OneDNNLinear`. PyTorch has no public call for either, so both
use the operators torch.compile's CPU backend emits (`mkldnn._reorder_linear_weight`,
`mkldnn._linear_pointwise`). Results differ from MKL's in the last bits of fp32 summation order, as two
BLAS libraries' do: tests/test_onednn.py holds them to nn.Linear's and a training run to the default one.
"""

from __future__ import annotations

import time
from functools import cache
from typing import Any

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
        out = linear(torch.ops.mkldnn._reorder_linear_weight(w, 2), None, torch.ones(2, 8, device="cpu", dtype=dtype))
        return bool(torch.equal(out, torch.full((2, 4), 8.0, device="cpu", dtype=dtype)))
    except (RuntimeError, AttributeError):  # an older or a different build of PyTorch
        return False


def matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b^T (+ bias) for 2-D a; b a weight as nn.Linear holds it, packed or plain (strided operands
    are read in place)."""
    return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")


def linear(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """nn.Linear's forward on oneDNN, for an input of any leading shape."""
    return matmul(x.reshape(-1, x.shape[-1]), weight, bias).reshape(*x.shape[:-1], -1)


class _LinearFn(torch.autograd.Function):
    """y = x W^T + b with the forward, the input gradient and the weight gradient on oneDNN (PyTorch's
    fp32 CPU linear has no switch to it: written by hand)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(flat, weight)
        ctx.shape, ctx.has_bias = x.shape, bias is not None
        return matmul(flat, weight, bias).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        flat, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        gx = matmul(g, weight.t()).view(ctx.shape) if ctx.needs_input_grad[0] else None
        gw = matmul(g.t(), flat.t()) if ctx.needs_input_grad[1] else None
        gb = g.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb


class OneDNNLinear(nn.Linear):
    """An `nn.Linear` (same parameters, state dict and isinstance) whose fp32 CPU forward and backward
    run on oneDNN; anything else (CUDA, bf16, under autocast, no rows) is `nn.Linear`'s own path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        fp32_cpu = w.device.type == "cpu" and w.dtype == x.dtype == torch.float32
        if not fp32_cpu or not x.numel() or torch.is_autocast_enabled("cpu"):  # oneDNN refuses 0 rows
            return super().forward(x)
        return _LinearFn.apply(x, w, self.bias)


LINEARS = (nn.Linear, OneDNNLinear)  # the layer types whose weights rung's oneDNN paths may run


def train_on_onednn(model: nn.Module) -> int:
    """Make every plain `nn.Linear` of `model` a `OneDNNLinear` in place (tied weights stay tied: the
    parameters are the same objects); returns how many. A no-op where oneDNN's fp32 matmul is missing."""
    if not available(torch.float32):
        return 0
    layers = [m for m in model.modules() if type(m) is nn.Linear]
    for m in layers:
        m.__class__ = OneDNNLinear
    return len(layers)


def matmul_peak(size: int = 2048, reps: int = 10) -> float:
    """Best fp32 GFLOP/s of a square matmul over a few timed rounds, by PyTorch's default GEMM (MKL) or
    oneDNN's, whichever is faster here (on an AMD CPU MKL runs its AVX2 kernels: about half oneDNN's)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = 0.0
    for mm in (torch.matmul, matmul):
        mm(a, b)
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(reps):
                mm(a, b)
            best = max(best, reps * 2 * size**3 / (time.perf_counter() - t0) / 1e9)
    return best
