"""Generation on CUDA: `model.generate` with a static KV cache and a compiled decode step.

On a GPU a 135M model's decode step is a few hundred small kernel launches, so rung's eager loop
(rung.generate.decode) runs no faster than dynamic-cache `generate` there; a static cache with a
torch.compile'd step (CUDA graphs) ran 3.5-5.9x faster on an H100 (shared/GPU_RUNS.md). Shapes come
from fixed buckets (rows, cache length) so each bucket compiles once per process, not per batch.
rung's per-row seeded sampling is kept: a logits processor picks each row's token from that row's
own stream (rung.generate.decode.pick), and generate's greedy step then takes exactly that token.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, cast

import torch
from transformers import CompileConfig, GenerationConfig, LogitsProcessor, LogitsProcessorList, PreTrainedModel

from rung.config import SamplingParams
from rung.generate.decode import Request, Row, draws_for, pick

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
WIDTH_STEP = 64
"""Prompts are left-padded to a multiple of this, and the cache length rounded up to one."""


def rows_bucket(rows: int, cap: int) -> int:
    """The smallest row bucket that holds `rows`, at most `cap` (itself a bucket or not)."""
    return min(next(b for b in ROW_BUCKETS + (rows,) if b >= rows), cap)


def round_up(x: int, step: int = WIDTH_STEP) -> int:
    return -(-x // step) * step


class SeededPick(LogitsProcessor):
    """Leaves only the token each row's own seeded draw picks (inverse-CDF over the temperature /
    top-p warped distribution, as rung.generate.decode does), so generate's greedy argmax takes it."""

    def __init__(self, draws: torch.Tensor, width: int, sampling: SamplingParams) -> None:
        self.draws, self.width, self.sampling = draws, width, sampling

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        picked = pick(scores, self.draws[:, input_ids.shape[1] - self.width], self.sampling)
        return torch.full_like(scores, float("-inf")).scatter_(1, picked[:, None], 0.0)


def generation_config(
    sampling: SamplingParams, eos_ids: list[int], cache_len: int, compile_config: CompileConfig
) -> GenerationConfig:
    """Greedy over rung's pick, a static cache of `cache_len`, compilation on; every processor a
    model's own generation_config could add is set off, so only rung's sampling applies."""
    return GenerationConfig(
        max_new_tokens=sampling.max_new_tokens,
        min_new_tokens=0,
        do_sample=False,
        num_beams=1,
        eos_token_id=eos_ids,
        pad_token_id=eos_ids[0],
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        cache_implementation="static",
        max_cache_len=cache_len,
        compile_config=compile_config,
        disable_compile=False,
    )


class _Generates(Protocol):
    """A causal LM's `generate` as decode calls it. transformers types GenerationMixin.generate's `self` as a
    Protocol written for the ty checker, which mypy finds no PreTrainedModel to satisfy; with
    `return_dict_in_generate` off (generation_config) it returns the token ids, prompt included."""

    def generate(
        self,
        *,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        generation_config: GenerationConfig,
        logits_processor: LogitsProcessorList,
    ) -> torch.Tensor: ...


@torch.inference_mode()
def decode(model: PreTrainedModel, req: Request, compile_config: CompileConfig | None = None) -> Iterator[Row]:
    """The contract of rung.generate.decode.decode (each Row as it is known), through compiled
    static-cache `generate` in batches of at most `req.capacity` rows."""
    lm = cast(_Generates, model)  # see _Generates: mypy finds no model that transformers' generate accepts
    ids, order, sampling, n, seed, eos_ids, capacity, keys = req
    compile_config = compile_config or CompileConfig()
    pairs = [(i, j) for i in sorted(order, key=lambda i: (len(ids[i]), i)) for j in range(n)]
    # one cache length for the whole call (and, rounded, for the calls after it): no recompile per batch
    cache_len = round_up(max(len(ids[i]) for i in order) + sampling.max_new_tokens)
    config = generation_config(sampling, eos_ids, cache_len, compile_config)
    eos = set(eos_ids)
    # every chunk in the first one's bucket: a smaller last chunk would compile a bucket of its own
    bucket = rows_bucket(min(len(pairs), capacity), capacity)
    for start in range(0, len(pairs), capacity):
        chunk = pairs[start : start + capacity]
        padded = chunk + [chunk[-1]] * (bucket - len(chunk))  # filler rows, dropped below
        width = round_up(max(len(ids[i]) for i, _ in padded))
        input_ids = torch.tensor([[eos_ids[0]] * (width - len(ids[i])) + ids[i] for i, _ in padded], device="cpu").to(
            model.device
        )
        mask = torch.tensor([[0] * (width - len(ids[i])) + [1] * len(ids[i]) for i, _ in padded], device="cpu").to(
            model.device
        )
        draws = draws_for(seed, padded, sampling, model.device, keys)
        processors = LogitsProcessorList([SeededPick(draws, width, sampling)] if draws is not None else [])
        out = lm.generate(
            input_ids=input_ids, attention_mask=mask, generation_config=config, logits_processor=processors
        )
        # strict=False: out also has the filler rows of `padded`, past the end of `chunk`
        for (i, j), tokens in zip(chunk, out[:, width:].tolist(), strict=False):
            end = next((t for t, x in enumerate(tokens) if x in eos), None)
            kept = tokens if end is None else tokens[: end + 1]
            yield Row(i, j, None, kept[: sampling.max_new_tokens], truncated=end is None)
