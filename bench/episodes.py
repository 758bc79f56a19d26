"""Episodes per generated token: rung's episode loop (rung.envs.loop) against TRL 1.16's own tool loop
(GRPOTrainer with `environment_factory`: `_generate`, i.e. batched `model.generate` and `_tool_call_loop`) on the
same model, prompts, environment (`python`, the real sandbox), sampling and completion budget.

Both run inside one GRPOTrainer on the same weights; TRL's side is timed around its `_generate` only (no reward or
log-prob work), rung's around `run`. Tokens are the model's own (env_mask / tool_mask 1), tool output excluded.
Samples differ between the two (each its own seeding), so the episodes are the same in kind, not in text: compare
the per-token ratio. This machine is noisy (shared cores): compare the ratios of one run, not seconds across runs.

    python bench/episodes.py                                # base model at data/models/base (else the embedded)
    python bench/episodes.py --model data/models/sft --prompts 16 --generations 4 --max-completion 128
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from rung import models
from rung.config import CurateParams, FormatParams, SamplingParams
from rung.data.curate import curate
from rung.envs import FinalAnswer, check, template
from rung.envs.loop import run, sampler
from rung.rl.trainers import prompts
from rung.train import trl_private


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="data/models/base", help="HF model directory; else the embedded model")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--max-completion", type=int, default=96, help="completion budget (TRL's max_completion_length)")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3, help="rounds of TRL then rung; the median ratio is printed")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model_dir = Path(args.model)
    if not model_dir.is_dir():
        model_dir = Path(tempfile.mkdtemp()) / "base"
        models.materialize("embedded", model_dir)
    tok = template.apply(AutoTokenizer.from_pretrained(model_dir))  # rung's tool template: TRL accepts it
    fmt = FormatParams()
    env = check({"name": "python", "max_turns": args.max_turns}, tok)
    rows = curate(CurateParams(sources=[dict(name="a", task="basic_arithmetic", size=4 * args.prompts)]), {}, seed=0)[
        0
    ][: args.prompts]
    dataset = prompts(rows, fmt)
    batch = [row for row in dataset for _ in range(args.generations)]  # TRL's sampler repeats each prompt
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=[FinalAnswer()],
        args=GRPOConfig(
            output_dir=tempfile.mkdtemp(),
            per_device_train_batch_size=len(batch),
            num_generations=args.generations,
            max_completion_length=args.max_completion,
            max_tool_calling_iterations=env.max_tool_calling_iterations,
            temperature=1.0,
            use_cpu=True,
            bf16=False,
            report_to=[],
        ),
        train_dataset=dataset,
        processing_class=tok,
        environment_factory=env.factory(fmt),
    )
    timed: dict[str, float] = {}

    def timing(_: str, generate: Callable[[list], tuple]) -> Callable[[list], tuple]:
        def timed_generate(prompts_: list) -> tuple:
            t0 = time.perf_counter()
            out = generate(prompts_)
            timed["trl"] = time.perf_counter() - t0
            timed["trl_tokens"] = sum(map(sum, out[2])) if out[2] is not None else sum(map(len, out[1]))
            return out

        return timed_generate

    # TRL's generation and tool loop only, not its rewards and log-probs
    trl_private.wrap_phases(trainer, timing, ["episodes"])
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_completion, batch_size=len(batch))
    print(f"{len(batch)} episodes ({args.prompts} prompts x {args.generations}), {torch.get_num_threads()} threads")
    print(f"{'round':6}{'contender':11}{'tokens':>8}{'seconds':>9}{'tokens/s':>10}{'turns':>7}{'calls':>7}")
    ratios = []
    for r in range(args.repeats):  # alternating, so that the machine's load falls on both alike
        torch.manual_seed(r)
        trl_private.generation_and_scoring(trainer, batch)
        t0 = time.perf_counter()
        episodes = run(
            sampler(trainer.model, trainer.eos_token_ids),
            tok,
            [env.factory(fmt)() for _ in batch],
            batch,
            sampling=sampling,
            max_turns=args.max_turns,
            seed=r,
            keys=[(i // args.generations, i % args.generations) for i in range(len(batch))],
            max_completion_tokens=args.max_completion,
        )
        timed["rung"] = time.perf_counter() - t0
        timed["rung_tokens"] = sum(sum(e.env_mask) for e in episodes)
        turns = sum(len(e.turns) for e in episodes) / len(episodes)
        calls = sum(len(t["tool_calls"]) for e in episodes for t in e.turns) / len(episodes)
        for name in ("trl", "rung"):
            rate = timed[name + "_tokens"] / timed[name]
            shape = f"{turns:>7.2f}{calls:>7.2f}" if name == "rung" else ""
            print(f"{r:<6}{name:11}{timed[name + '_tokens']:>8}{timed[name]:>9.1f}{rate:>10.1f}{shape}")
        ratios.append((timed["rung_tokens"] / timed["rung"]) / (timed["trl_tokens"] / timed["trl"]))
    spread = ", ".join(f"{x:.2f}" for x in ratios)
    print(f"per generated token: rung {statistics.median(ratios):.2f}x TRL's loop (median of {spread})")


if __name__ == "__main__":
    main()
