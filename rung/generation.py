"""Batched rollouts, shared by difficulty scoring, rejection sampling and evaluation.

Two backends behind one `Generator`: transformers (CPU or GPU; prompts sorted by length for less
padding, left-padded, each prompt encoded once for its n samples via num_return_sequences) and
vLLM (GPU; optional, selected by params `generation.backend`).
"""
from __future__ import annotations

import importlib.util

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rung import models
from rung.config import SamplingParams
from rung.errors import InputError


@dataclass(frozen=True)
class Completion:
    text: str
    tokens: int
    truncated: bool
    """True when generation stopped at max_new_tokens instead of an end-of-sequence token."""


def render(tok: PreTrainedTokenizerBase, conversations: list[list[dict[str, str]]]) -> list[str]:
    """Chat-template each conversation with the assistant turn opened."""
    return [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations]


@dataclass(frozen=True)
class Generator:
    """A loaded model that samples: `generate(prompts, sampling, n, seed, desc)` -> n completions
    per rendered prompt, in input order."""

    tok: PreTrainedTokenizerBase
    generate: Callable[..., list[list[Completion]]]

    def render(self, conversations: list[list[dict[str, str]]]) -> list[str]:
        return render(self.tok, conversations)


def load(model_dir: Path, dtype: str, backend: str = "transformers") -> Generator:
    """A Generator for the model directory on the given backend ('transformers' or 'vllm')."""
    if backend == "vllm":
        return _load_vllm(model_dir, dtype)
    model, tok = models.load(model_dir, dtype)
    return Generator(tok, partial(generate, model, tok))


def require_vllm(key: str) -> None:
    """Stop before any work when vLLM is asked for where it cannot run."""
    if importlib.util.find_spec("vllm") is None:
        raise InputError(f"{key}: vllm is not installed (pip install 'rung[vllm]', on a CUDA machine)")
    if not torch.cuda.is_available():
        raise InputError(f"{key}: vllm needs a CUDA GPU and none is visible")


def _load_vllm(model_dir: Path, dtype: str) -> Generator:
    require_vllm("generation.backend")
    import vllm

    llm = vllm.LLM(model=str(model_dir), dtype=dtype, seed=0)
    tok = models.load_tokenizer(model_dir)

    def sample(prompts: list[str], sampling: SamplingParams, n: int = 1, seed: int = 0, desc: str = "generate") -> list[list[Completion]]:
        params = vllm.SamplingParams(n=n, temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_new_tokens, seed=seed)
        outputs = llm.generate(prompts, params, use_tqdm=True)
        return [[Completion(o.text, len(o.token_ids), o.finish_reason == "length") for o in out.outputs] for out in outputs]

    return Generator(tok, sample)


@torch.inference_mode()
def generate(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    prompts: list[str],
    sampling: SamplingParams,
    n: int = 1,
    seed: int = 0,
    desc: str = "generate",
) -> list[list[Completion]]:
    """`n` completions for each rendered prompt, in input order. Deterministic given `seed`."""
    greedy = sampling.temperature == 0
    if greedy and n > 1:
        raise ValueError("sampling.temperature: 0 (greedy) gives identical samples; use n=1 or temperature > 0")
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    per_batch = max(1, sampling.batch_size // n)
    eos_ids = set(_as_list(model.generation_config.eos_token_id) or [tok.eos_token_id])
    out: list[list[Completion]] = [[] for _ in prompts]
    with tqdm(total=len(prompts) * n, desc=desc, unit="seq") as bar:
        for b, start in enumerate(range(0, len(order), per_batch)):
            idx = order[start : start + per_batch]
            enc = tok([prompts[i] for i in idx], return_tensors="pt", padding=True, add_special_tokens=False)
            torch.manual_seed(seed + b)  # per-batch seed: results do not depend on earlier batches' lengths
            kwargs = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
            seqs = model.generate(
                **enc, max_new_tokens=sampling.max_new_tokens, num_return_sequences=n,
                pad_token_id=tok.pad_token_id, **kwargs,
            )
            new = seqs[:, enc["input_ids"].shape[1] :]  # (len(idx) * n, <= max_new_tokens)
            for row, ids in enumerate(new.tolist()):
                ended = next((j for j, t in enumerate(ids) if t in eos_ids), None)
                kept = ids if ended is None else ids[:ended]
                out[idx[row // n]].append(
                    Completion(tok.decode(kept, skip_special_tokens=True), len(kept), ended is None)
                )
            bar.update(len(idx) * n)
    return out


def _as_list(x: int | list[int] | None) -> list[int] | None:
    return [x] if isinstance(x, int) else x
