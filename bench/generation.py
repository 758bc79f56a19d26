"""Throughput of rung's generation against batched `model.generate`, the honest peer.

Both get the same model, prompts, sampling, samples per prompt (`num_return_sequences` for the
peer), batch size and left padding; the peer also gets rung's former length sorting. Two shapes,
the default pipeline's: difficulty (4 samples, 40 new tokens, temperature 1) and eval (greedy, 48
new tokens). Tokens are counted alike for both: generated tokens up to and including EOS.

Each contender's fraction of the fp32 roofline = FLOPs per generated token x tokens/s / the
matmul peak of this machine (measured here: a large fp32 matmul, MKL's or oneDNN's, the faster). Prompt encoding is not
counted as useful work, so a fraction is of generated tokens only. This machine is noisy (shared
cores): compare the ratios of one run, not seconds across runs.

    python bench/generation.py                        # base model at data/models/base
    python bench/generation.py --model embedded --prompts 96
    python bench/generation.py --model data/models/rl --shapes eval   # a trained policy: short answers
    # the held-out split:
    python bench/generation.py --model data/models/sft --rows data/curated/test.jsonl --shapes eval
    python bench/generation.py --vllm .venv-vllm/bin/python   # vLLM as a third contender (`make vllm-setup`)

With --vllm, vLLM (its own environment, rung.generate.vllm's worker) runs the same prompts, sampling
and seeds after the other two; its load time (engine start and weights) is printed beside the
transformers load.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rung import files, models, onednn
from rung.answers import formats
from rung.config import CurateParams, FormatParams, SamplingParams, VllmParams
from rung.data.curate import curate
from rung.generate import vllm
from rung.generate.api import generate
from rung.generate.completion import Completion, render, stop_ids

T = TypeVar("T")
SHAPES = {
    "difficulty": (SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=40, batch_size=32), 4),
    "eval": (SamplingParams(temperature=0.0, max_new_tokens=48, batch_size=32), 1),
}


def peer(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    prompts: list[str],
    sampling: SamplingParams,
    n: int,
    seed: int = 0,
) -> list[list[Completion]]:
    """Batched model.generate: prompts sorted by length, left-padded, n samples per prompt."""
    greedy = sampling.temperature == 0
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    per_batch = max(1, sampling.batch_size // n)
    eos_ids = set(stop_ids(model.generation_config, tok))
    out: list[list[Completion]] = [[] for _ in prompts]
    for b, start in enumerate(range(0, len(order), per_batch)):
        idx = order[start : start + per_batch]
        enc = tok(
            [prompts[i] for i in idx], return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
        )
        torch.manual_seed(seed + b)
        kwargs = (
            dict(do_sample=False)
            if greedy
            else dict(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        )
        with torch.inference_mode():
            seqs = model.generate(
                **enc,
                max_new_tokens=sampling.max_new_tokens,
                num_return_sequences=n,
                pad_token_id=tok.pad_token_id,
                **kwargs,
            )
        for row, ids in enumerate(seqs[:, enc["input_ids"].shape[1] :].tolist()):
            ended = next((j for j, t in enumerate(ids) if t in eos_ids), None)
            kept = ids if ended is None else ids[:ended]
            out[idx[row // n]].append(Completion(tok.decode(kept, skip_special_tokens=True), len(kept), ended is None))
    return out


def flops_per_token(model: PreTrainedModel, context: float) -> float:
    """2 x the weights of every matmul (LM head included, embedding lookup not) + attention
    (QK^T and AV: 4 x layers x heads x head_dim x context)."""
    cfg = model.config
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * linear + 4 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim * context


def tokens(outs: list[list[Completion]]) -> int:
    """Generated tokens up to and including EOS."""
    return sum(c.tokens + (not c.truncated) for cs in outs for c in cs)


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", default="data/models/base", help="HF model directory; 'embedded' converts the default model"
    )
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument(
        "--rows",
        default=None,
        help="prompts from this jsonl of rows (e.g. data/curated/test.jsonl, the held-out split), all of them",
    )
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--threads", type=int, default=None, help="torch threads for both contenders (default: torch's)")
    ap.add_argument("--vllm", default=None, help="the vLLM environment's python: vLLM as a third contender")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model_dir = Path(args.model)
    if not model_dir.is_dir():
        model_dir = Path(tempfile.mkdtemp()) / "base"
        models.materialize("embedded", model_dir)
    (model, tok), t_load = timed(lambda: models.load(model_dir))
    engine = None
    if args.vllm:
        engine, t_vllm = timed(lambda: vllm.load(model_dir, "float32", VllmParams(python=args.vllm)))
        print(f"load: transformers {t_load:.1f} s, vLLM {t_vllm:.1f} s (engine start and weights)")
    if args.rows:
        rows = files.read_jsonl(args.rows)
    else:
        rows = curate(
            CurateParams(sources=[dict(name="a", task="basic_arithmetic", size=4 * args.prompts)]), {}, seed=0
        )[0][: args.prompts]
    prompts = render(tok, [formats.prompt(r["prompt"], FormatParams()) for r in rows])
    prompt_tokens = sum(len(x) for x in tok(prompts, add_special_tokens=False)["input_ids"]) / len(prompts)

    peak = onednn.matmul_peak()
    print(
        f"{len(prompts)} prompts ({prompt_tokens:.0f} tokens on average), {torch.get_num_threads()} threads, "
        f"fp32 matmul peak {peak:.0f} GFLOP/s"
    )
    print(f"{'shape':12}{'contender':18}{'tokens':>8}{'seconds':>9}{'tokens/s':>10}{'roofline':>10}")
    for shape in args.shapes:
        sampling, n = SHAPES[shape]
        # peer first, then rung: a slower machine later in the run only penalizes rung
        theirs, t_peer = timed(partial(peer, model, tok, prompts, sampling, n=n))
        ours, t_rung = timed(partial(generate, model, tok, prompts, sampling, n=n, desc=shape))
        runs = [("model.generate", theirs, t_peer), ("rung", ours, t_rung)]
        if engine:
            runs.append(("vllm", *timed(partial(engine.generate, prompts, sampling, n=n, desc=None))))
        mean_len = tokens(ours) / (len(prompts) * n)
        flops = flops_per_token(model, prompt_tokens + mean_len / 2)
        rates = {}
        for name, outs, secs in runs:
            rates[name] = tokens(outs) / secs
            print(
                f"{shape:12}{name:18}{tokens(outs):>8}{secs:>9.1f}{rates[name]:>10.1f}"
                f"{flops * rates[name] / 1e9 / peak:>10.1%}"
            )
        print(
            f"{shape:12}speed-up {rates['rung'] / rates['model.generate']:.2f}x"
            + (f", vllm {rates['vllm'] / rates['model.generate']:.2f}x" if engine else "")
            + "   "
            f"({flops / 1e9:.3f} GFLOP per token; mean completion {mean_len:.1f} tokens, "
            f"peer {tokens(theirs) / (len(prompts) * n):.1f})"
        )
        if sampling.temperature == 0:
            for name, outs, _ in runs[1:]:
                same = sum(a == b for a, b in zip(outs, theirs, strict=True))
                print(f"{shape:12}greedy completions of {name} identical to model.generate: {same}/{len(prompts)}")
    if engine:
        engine.close()


if __name__ == "__main__":
    main()
