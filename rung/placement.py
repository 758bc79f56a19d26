"""Where a stage's model runs and in which dtype: params `model.device` and `model.dtype` resolved
on the machine the stage runs on (the stage records the resolved pair with its numbers)."""

from __future__ import annotations

import os

import torch

from rung.errors import InputError


def device(spec: str = "auto") -> torch.device:
    """'auto': this process's CUDA device when one is visible, else the CPU; 'cpu', 'cuda' or
    'cuda:N' as named, refused in one line if absent."""
    if spec == "auto":
        return _local_cuda() if torch.cuda.is_available() else torch.device("cpu")
    where = torch.device(spec)
    if where.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"model.device: {spec}, but no CUDA GPU is visible (use auto or cpu)")
        if where.index is not None and where.index >= torch.cuda.device_count():
            raise InputError(f"model.device: {spec}, but only {torch.cuda.device_count()} CUDA device(s) are visible")
        if where.index is None:
            where = torch.device("cuda", torch.cuda.current_device())
    return where


def _local_cuda() -> torch.device:
    """The CUDA device of this process: under a distributed launcher LOCAL_RANK's where each rank sees
    the node's GPUs, or the one GPU a launcher that pins ranks (CUDA_VISIBLE_DEVICES per rank) leaves it."""
    visible = torch.cuda.device_count()
    rank = os.environ.get("LOCAL_RANK")
    if rank is None or visible == 1:
        return torch.device("cuda", torch.cuda.current_device())
    if int(rank) >= visible:
        raise InputError(
            f"model.device: auto, but local rank {rank} sees {visible} CUDA devices: "
            "give each rank one GPU or all of them"
        )
    return torch.device("cuda", int(rank))


def dtype(spec: str, where: torch.device) -> str:
    """'auto': bfloat16 on a CUDA device that supports it, else float32 (bf16 matmuls are slow on
    most CPUs: a TRL step ran ~10x slower with bf16 autocast on an AVX2-only machine). Generating
    stages hold their weights in it; training stages compute in it over fp32 weights (rung.train.harness)."""
    if spec != "auto":
        return spec
    return "bfloat16" if where.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"


def resolve(device_spec: str, dtype_spec: str) -> tuple[torch.device, str]:
    """(device, dtype name) for the params' specs on this machine."""
    where = device(device_spec)
    return where, dtype(dtype_spec, where)
