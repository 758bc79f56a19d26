"""The vLLM backend (params `generation.backend: vllm`): a Generator over `vllm.LLM`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from rung import models
from rung.config import SamplingParams
from rung.errors import InputError
from rung.generate.completion import Completion, Generator


def require_vllm(key: str) -> None:
    """Stop before any work when vLLM is asked for where it cannot run."""
    if importlib.util.find_spec("vllm") is None:
        raise InputError(f"{key}: vllm is not installed (pip install 'rung[vllm]', on a CUDA machine)")
    if not torch.cuda.is_available():
        raise InputError(f"{key}: vllm needs a CUDA GPU and none is visible")


def load(model_dir: Path, dtype: str) -> Generator:
    require_vllm("generation.backend")
    import vllm

    llm = vllm.LLM(model=str(model_dir), dtype=dtype, seed=0)
    tok = models.load_tokenizer(model_dir)

    def sample(
        prompts: list[str], sampling: SamplingParams, n: int = 1, seed: int = 0, desc: str = "generate"
    ) -> list[list[Completion]]:
        params = vllm.SamplingParams(
            n=n, temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_new_tokens, seed=seed
        )
        outputs = llm.generate(prompts, params, use_tqdm=True)
        return [
            [Completion(o.text, len(o.token_ids), o.finish_reason == "length") for o in out.outputs] for out in outputs
        ]

    return Generator(tok, sample, "cuda", dtype)
