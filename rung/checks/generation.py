"""The generation backend of the stages that sample (difficulty, traces, eval)."""

from __future__ import annotations

from rung.config import Params


def backend(params: Params) -> None:
    """vllm: the worker's python exists and its vllm is in the supported range (package metadata, no torch)."""
    if params.generation.backend == "vllm":
        from rung.generate import vllm

        vllm.check(params.generation.vllm, "generation.vllm")
