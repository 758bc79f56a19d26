"""The generation backend of the stages that sample (difficulty, traces, eval)."""

from __future__ import annotations

from rung.config import Params


def backend(params: Params) -> None:
    if params.generation.backend == "vllm":
        from rung.generate.vllm import require_vllm  # torch: only when vLLM is asked for

        require_vllm("generation.backend")
