"""Throughput of rung's batched generation against a plain loop of model.generate.

Same model, prompts, sampling settings and number of samples; generated tokens per second of
each, and their ratio, measured in one run (this machine is noisy: compare ratios, not seconds).

    python bench/generation.py                       # base model at data/models/base
    python bench/generation.py --model PATH --prompts 32 --n 4 --max-new-tokens 32
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from rung import answer_format, models
from rung.config import CurateParams, FormatParams, SamplingParams
from rung.data import curate
from rung.generation import generate, render


def plain_loop(model, tok, prompts: list[str], sampling: SamplingParams, n: int) -> int:
    """The baseline: one model.generate call per prompt and sample, no batching."""
    tokens = 0
    for i, prompt in enumerate(prompts):
        enc = tok(prompt, return_tensors="pt", add_special_tokens=False)
        for j in range(n):
            torch.manual_seed(i * n + j)
            out = model.generate(**enc, do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0,
                                 max_new_tokens=sampling.max_new_tokens, pad_token_id=tok.pad_token_id)
            tokens += out.shape[1] - enc["input_ids"].shape[1]
    return tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="data/models/base", help="HF model directory; 'embedded' converts the default model")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()

    model_dir = Path(args.model)
    if not model_dir.is_dir():
        model_dir = Path(tempfile.mkdtemp()) / "base"
        models.materialize("embedded", model_dir)
    model, tok = models.load(model_dir)
    fmt = FormatParams()
    rows, _, _ = curate(CurateParams(sources=[dict(name="a", task="basic_arithmetic", size=4 * args.prompts)]), {}, seed=0)
    prompts = render(tok, [answer_format.messages(r["prompt"], fmt) for r in rows[: args.prompts]])
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)

    t0 = time.perf_counter()
    batched = generate(model, tok, prompts, sampling, n=args.n, seed=0, desc="rung")
    t_rung = time.perf_counter() - t0
    # rung counts tokens up to EOS; the loop's count stops at EOS too (generate stops each sequence there)
    tok_rung = sum(c.tokens + (not c.truncated) for cs in batched for c in cs)
    t0 = time.perf_counter()
    tok_loop = plain_loop(model, tok, prompts, sampling, args.n)
    t_loop = time.perf_counter() - t0

    rate_rung, rate_loop = tok_rung / t_rung, tok_loop / t_loop
    print(f"{len(prompts)} prompts x {args.n} samples, max {args.max_new_tokens} new tokens, batch {args.batch_size}, {torch.get_num_threads()} threads")
    print(f"{'':16}{'tokens':>8}{'seconds':>10}{'tokens/s':>10}")
    print(f"{'rung batched':16}{tok_rung:>8}{t_rung:>10.1f}{rate_rung:>10.1f}")
    print(f"{'plain loop':16}{tok_loop:>8}{t_loop:>10.1f}{rate_loop:>10.1f}")
    print(f"speed-up: {rate_rung / rate_loop:.2f}x")


if __name__ == "__main__":
    main()
