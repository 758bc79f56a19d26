"""Batched rollouts, shared by difficulty scoring, rejection sampling, evaluation and RL.

Two backends behind one `Generator`: transformers and vLLM (optional, selected by params
`generation.backend`). The transformers backend runs rung's decode loop (rung.generate.decode) on the CPU
and a compiled static-cache `generate` (rung.generate.compiled) on CUDA, with the batch sized for the device.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Literal
from weakref import WeakKeyDictionary

import torch
from tqdm.auto import tqdm
from transformers import CompileConfig, PreTrainedModel, PreTrainedTokenizerBase

from rung import models, placement
from rung.config import SamplingParams, VllmParams
from rung.errors import InputError
from rung.generate import compiled, decode, vllm
from rung.generate.completion import Completion, Generator, decode_text, stop_ids, token_ids
from rung.generate.prepacked import prepacked

log = logging.getLogger(__name__)

CPU_ROWS = 32
"""Rows decoded at once on the CPU when params set no batch_size (rung's CPU figures were measured at it)."""
KV_SHARE = 0.5
"""Share of the GPU's free memory the KV cache and logits of one batch may take (the rest: activations)."""
Engine = Literal["auto", "loop", "compiled"]


def load(
    model_dir: Path | str,
    dtype: str = "auto",
    backend: str = "transformers",
    device: str = "auto",
    vllm_params: VllmParams | None = None,
) -> Generator:
    """A Generator for the model directory on the given backend ('transformers' or 'vllm': a worker
    in the vLLM environment, params `generation.vllm`), placed by params `model.device` / `model.dtype`
    (rung.placement; vLLM places itself on its build's platform)."""
    where, dtype = placement.resolve(device, dtype)
    if backend == "vllm":
        return vllm.load(model_dir, dtype, vllm_params)
    model, tok = models.load(model_dir, dtype, where)
    return Generator(tok, partial(generate, model, tok), str(where), dtype, model=model)


def generate(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    prompts: list[str] | list[list[int]],
    sampling: SamplingParams,
    n: int = 1,
    seed: int = 0,
    desc: str = "generate",
) -> list[list[Completion]]:
    """`n` completions for each prompt (token ids, or a rendered text: see completion.token_ids), in
    input order. Deterministic given `seed`.

    Greedy completions are those of batched `model.generate` (same argmax on the same logits, up to
    floating-point summation order). Each sample draws from its own seeded stream, so a prompt's
    samples do not depend on which other prompts share its batch.
    """
    if not prompts:
        return []
    ids = token_ids(tok, prompts)
    out = generate_ids(model, ids, sampling, stop_ids(model.generation_config, tok), n, seed, desc)
    return [
        [Completion(decode_text(tok, t[: len(t) - (not cut)]), len(t) - (not cut), cut) for t, cut in row]
        for row in out
    ]


def positions(model: PreTrainedModel) -> int | None:
    """The model's context length (max_position_embeddings); None where its config gives none."""
    return getattr(model.config.get_text_config(), "max_position_embeddings", None)


@torch.inference_mode()
def generate_ids(
    model: PreTrainedModel,
    ids: list[list[int]],
    sampling: SamplingParams,
    eos_ids: list[int],
    n: int = 1,
    seed: int = 0,
    desc: str | None = "generate",
    engine: Engine = "auto",
    compile_config: CompileConfig | None = None,
    keys: Sequence[tuple[int, ...]] | None = None,
) -> list[list[tuple[list[int], bool]]]:
    """`n` completions for each tokenized prompt, in input order: (token ids with the EOS that ended
    it, if one did; truncated at max_new_tokens or where the sequence reaches the model's positions, which
    a prompt may not reach: a model's output past them is noise). `desc` None: no progress bar. `keys[i]`:
    prompt i's sampling stream, (seed, *keys[i], sample); default its position (seed, i, sample).

    engine 'auto': rung's loop on the CPU, compiled static-cache `generate` on CUDA (`compile_config`,
    transformers' default if None). A CUDA out-of-memory error empties the cache, halves the batch
    for the rest of the process and redoes the unfinished prompts: samples are seeded per row, so
    the retry draws the same samples.
    """
    if sampling.temperature == 0 and n > 1:
        raise ValueError("sampling.temperature: 0 (greedy) gives identical samples; use n=1 or temperature > 0")
    limit = positions(model)
    if limit is not None and (longest := max(map(len, ids), default=0)) >= limit:
        raise InputError(
            f"generation: a prompt of {longest} tokens leaves no room under the model's max_position_embeddings "
            f"{limit}; shorten the prompts (or the episode: environment.max_turns, the tool's max_output)"
        )
    use_compiled = engine == "compiled" or (engine == "auto" and model.device.type == "cuda")
    out: list[list[tuple[list[int], bool] | None]] = [[None] * n for _ in ids]
    pending = list(range(len(ids)))
    with tqdm(total=len(ids) * n, desc=desc, unit="seq", disable=desc is None) as bar:
        while pending:
            width = max(len(ids[i]) for i in pending)
            if use_compiled:  # the static cache keeps the longest length this process has used
                _longest[model] = max(_longest.get(model, 0), compiled.round_up(width + sampling.max_new_tokens))
            rows = batch_rows(model, sampling, width)
            try:
                if use_compiled:
                    done = compiled.decode(
                        model, decode.Request(ids, pending, sampling, n, seed, eos_ids, rows, keys), compile_config
                    )
                else:
                    done = decode.decode(model, decode.Request(ids, pending, sampling, n, seed, eos_ids, rows, keys))
                with nullcontext() if use_compiled else prepacked(model, max(rows, n)):
                    for row in done:
                        room = len(row.tokens) if limit is None else limit - len(ids[row.prompt])
                        cut = len(row.tokens) > room  # the tokens before are those a stop there gives
                        out[row.prompt][row.sample] = (row.tokens[:room], row.truncated or cut)
                        bar.update(1)
                pending = []
            except torch.OutOfMemoryError:
                if rows <= 1:
                    raise
                if not use_compiled and rows <= n:  # the loop decodes a prompt's n samples in one batch
                    raise InputError(
                        f"generation: out of memory with one prompt's {n} samples in a batch ({rows} rows); "
                        "lower the samples or max_new_tokens, or use the compiled engine"
                    ) from None
                _back_off(model, rows)
                pending = [i for i, slots in enumerate(out) if None in slots]
                for i in pending:  # redo every sample of a prompt cut short, so the bar counts each once
                    bar.update(-sum(s is not None for s in out[i]))
                    out[i] = [None] * n
    return out  # type: ignore[return-value]  # every slot is filled


_backed_off: WeakKeyDictionary[PreTrainedModel, int] = WeakKeyDictionary()
"""The row cap an out-of-memory error left each model with: kept for the rest of the process (the stage)."""
_longest: WeakKeyDictionary[PreTrainedModel, int] = WeakKeyDictionary()
"""The longest static cache (tokens a row) each model's compiled generation has allocated: transformers
keeps a call's cache at least as long as the previous call's, so later batches are sized for it."""


def _back_off(model: PreTrainedModel, rows: int) -> None:
    torch.cuda.empty_cache()
    _backed_off[model] = max(1, rows // 2)
    log.warning(
        "CUDA out of memory at %d rows: cache emptied, retrying at %d rows for the rest of this stage",
        rows,
        _backed_off[model],
    )


def batch_rows(model: PreTrainedModel, sampling: SamplingParams, width: int) -> int:
    """Rows decoded at once: on CUDA the largest row bucket whose KV cache (at the longest static
    cache this model has allocated) and logits fit in KV_SHARE of the free memory, on the CPU
    CPU_ROWS; params `batch_size` caps either, and so does
    an earlier out-of-memory error."""
    cap = sampling.batch_size or (CPU_ROWS if model.device.type != "cuda" else compiled.ROW_BUCKETS[-1])
    if model.device.type == "cuda":
        cap = min(cap, memory_rows(model, max(width + sampling.max_new_tokens, _longest.get(model, 0))))
    return min(cap, _backed_off.get(model, cap))


def memory_rows(model: PreTrainedModel, length: int) -> int:
    """The largest row bucket whose KV cache (`length` tokens a row, rounded up as the static
    cache is) and float32 logits, softmax and float64 CDF fit in KV_SHARE of the device's free memory."""
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    per_row = (
        2 * config.num_hidden_layers * kv_heads * head_dim * model.dtype.itemsize * compiled.round_up(length)
        + 24 * config.vocab_size
    )
    free, _ = torch.cuda.mem_get_info(model.device)
    # blocks PyTorch's allocator holds but no tensor uses are free to this process, though not to the driver
    free += torch.cuda.memory_reserved(model.device) - torch.cuda.memory_allocated(model.device)
    fits = int(free * KV_SHARE) // per_row
    return max([b for b in compiled.ROW_BUCKETS if b <= fits], default=1)
