"""rung on a GPU node in one command: generation against `model.generate`, and one RL step by phase.

Prints the tables of shared/GPU_RUNS.md:
1. tokens/s of rung's generation (its default engine on the device: the compiled static-cache path
   on CUDA; and its eager loop) against batched `model.generate` with the dynamic cache and with a
   static cache and compiled decode step, at three shapes: sampled 128 prompts x 8 x 256 tokens, the
   RL shape 8 x 8 x 128, greedy 512 x 64. Each contender runs twice; the second call is timed and
   the first minus the second is its compile (and warm-up) time. Greedy rows identical to
   dynamic-cache `generate` are counted.
2. RL steps of rung's stage trainer (TRL's GRPOTrainer with rung's rollouts) at the dapo preset, 8
   prompts x 8 generations x 128 tokens, split into generation, rewards, the rest of the rollout
   (old log-probs, advantages), the loss forward (log-probs), backward and optimizer, with peak memory;
   the same with LoRA adapters (r 16, all linear layers) for the memory against full fine-tuning; and,
   with --vllm, with TRL's colocated vLLM rollouts (`use_vllm`, the weights synced to vLLM every step)
   against rung's compiled rollouts, phase by phase.

It needs only torch, transformers, TRL, datasets, pydantic and math-verify (no MLflow, Prefect, DVC
or reasoning-gym) and no weights: SmolLM2-135M's architecture and tokenizer
(tests/fixtures/smollm2-135m) with random weights, on math rows graded by math-verify. Random
weights rarely stop, so the peers get min_new_tokens = max_new_tokens; tokens are counted as
generated, so tokens/s is comparable.

    python bench/gpu.py                        # a CUDA machine: bf16 (dtype auto), the full shapes
    python bench/gpu.py --out gpu.json         # also the numbers as JSON
    python bench/gpu.py --vllm --skip-generation  # RL: rung's rollouts, LoRA, TRL's colocated vLLM
    python bench/gpu.py --smoke                # a tiny model and shapes on the CPU, seconds (run by the tests)
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any, NamedTuple

import torch
from phases import PHASES, run  # bench/phases.py
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    CompileConfig,
    PreTrainedModel,
    TrainerCallback,
)

from rung import files, placement
from rung.answers import formats
from rung.config import DifficultyParams, FormatParams, RLStageParams, SamplingParams
from rung.generate.api import batch_rows, generate_ids
from rung.generate.completion import render
from rung.rl import trainers
from rung.train.jobs import RLJob

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "smollm2-135m"
SHAPES = {"sampled": (128, 8, 256), "rl": (8, 8, 128), "greedy": (512, 1, 64)}  # prompts, samples, new tokens
SMOKE_SHAPES = {"sampled": (4, 2, 8), "rl": (2, 2, 8), "greedy": (6, 1, 8)}
SMOKE_CONFIG = dict(num_hidden_layers=2, hidden_size=72, intermediate_size=144, head_dim=16)  # heads: the fixture's
FMT = FormatParams()


def random_model(device: torch.device, dtype: str, smoke: bool) -> tuple[PreTrainedModel, Any]:
    """SmolLM2-135M's architecture (or a tiny one) with seeded random weights, on the device."""
    config = AutoConfig.from_pretrained(FIXTURE)
    if smoke:
        for key, value in SMOKE_CONFIG.items():
            setattr(config, key, value)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype)).to(device).eval()
    return model, AutoTokenizer.from_pretrained(FIXTURE)


def math_rows(count: int) -> list[dict[str, Any]]:
    return [
        {
            "id": str(i),
            "source": "bench",
            "task": "math",
            "prompt": f"What is {i % 97} + {(7 * i) % 89}?",
            "answer": str(i % 97 + (7 * i) % 89),
            "meta": {},
        }
        for i in range(count)
    ]


def cpu_compile_config() -> CompileConfig:
    """A compile backend that runs on the CPU (no code generation), for --smoke."""
    cc = CompileConfig(backend="aot_eager", fullgraph=True, mode=None)
    cc._compile_all_devices = True
    return cc


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn: Any) -> tuple[Any, float]:
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    return out, time.perf_counter() - t0


class Work(NamedTuple):
    """One shape's generation: `n` samples of each prompt, `rows` sequences a batch."""

    model: PreTrainedModel
    ids: list[list[int]]
    sampling: SamplingParams
    n: int
    rows: int
    eos: int
    compile_config: CompileConfig | None


def peer(work: Work, static: bool) -> list[list[int]]:
    """Batched `model.generate`, left-padded, `rows` sequences a batch, fixed lengths; the tokens of each row."""
    model, ids, sampling, n, rows, eos, compile_config = work
    out: list[list[int]] = []
    per_batch = max(1, rows // n)
    extra: dict[str, Any] = (
        dict(cache_implementation="static", disable_compile=False, compile_config=compile_config) if static else {}
    )
    sample = (
        dict(do_sample=False)
        if sampling.temperature == 0
        else dict(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
    )
    for start in range(0, len(ids), per_batch):
        batch = ids[start : start + per_batch]
        width = max(map(len, batch))
        input_ids = torch.tensor([[eos] * (width - len(x)) + x for x in batch], device=model.device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in batch], device=model.device)
        with torch.inference_mode():
            seqs = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=sampling.max_new_tokens,
                min_new_tokens=sampling.max_new_tokens,
                num_return_sequences=n,
                pad_token_id=eos,
                **sample,
                **extra,
            )
        out += seqs[:, width:].tolist()
    return out


def bench_generation(
    model: PreTrainedModel, tok: Any, shapes: dict[str, tuple[int, int, int]], smoke: bool
) -> list[dict[str, Any]]:
    eos = tok.eos_token_id
    compile_config = cpu_compile_config() if smoke else None
    results = []
    for shape, (count, n, new) in shapes.items():
        prompts = render(tok, [formats.prompt(r["prompt"], FMT) for r in math_rows(count)])
        ids = tok(prompts, add_special_tokens=False)["input_ids"]
        sampling = SamplingParams(temperature=0.0 if n == 1 else 1.0, max_new_tokens=new)
        rows = batch_rows(model, sampling, max(map(len, ids)))
        contenders = _contenders(Work(model, ids, sampling, n, rows, eos, compile_config), smoke)
        seen: dict[str, list[list[int]]] = {}
        for name, fn in contenders.items():
            _, first = _timed(fn)
            tokens, steady = _timed(fn)
            seen[name] = tokens
            generated = sum(len(t) for t in tokens)
            results.append(
                {
                    "shape": shape,
                    "prompts": count,
                    "samples": n,
                    "new_tokens": new,
                    "rows_per_batch": rows,
                    "contender": name,
                    "tokens": generated,
                    "seconds": steady,
                    "tokens_per_s": generated / steady,
                    "compile_s": max(0.0, first - steady),
                }
            )
        if n == 1:  # greedy: rows identical to dynamic-cache generate (cut at the first end token)
            ref = [_cut(t, eos) for t in seen["generate, dynamic cache"]]
            for r in results[-len(contenders) :]:
                r["greedy_identical"] = sum(_cut(a, eos) == b for a, b in zip(seen[r["contender"]], ref, strict=True))
    return results


def _contenders(work: Work, smoke: bool) -> dict[str, Callable[[], list[list[int]]]]:
    """The generators timed on one shape, by name (each returns the generated token ids per sample)."""
    model, ids, sampling, n, _, eos, compile_config = work
    return {
        "rung (compiled static cache)" if model.device.type == "cuda" or smoke else "rung": lambda: [
            t
            for r in generate_ids(
                model,
                ids,
                sampling,
                [eos],
                n,
                seed=0,
                desc=None,
                engine="compiled" if smoke else "auto",
                compile_config=compile_config,
            )
            for t, _ in r
        ],
        "rung loop": lambda: [
            t for r in generate_ids(model, ids, sampling, [eos], n, seed=0, desc=None, engine="loop") for t, _ in r
        ],
        "generate, dynamic cache": lambda: peer(work._replace(compile_config=None), static=False),
        "generate, static cache compiled": lambda: peer(work, static=True),
    }


def _cut(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


class StepClock(TrainerCallback):
    """Wall time at the end of each optimizer step."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _sync()
        self.ends.append(time.perf_counter())


def bench_rl(
    model: PreTrainedModel,
    tok: Any,
    dtype: str,
    shape: tuple[int, int, int],
    steps: int,
    bf16_weights: bool = False,
    **stage: Any,
) -> dict[str, Any]:
    """RL steps of rung's stage trainer by phase. `bf16_weights`: the trained weights themselves in
    bf16, as rung kept them before issue 36 (whose updates round away), for the cost of fp32 master weights.
    `stage`: params of the RL stage over the dapo preset's (lora, use_vllm, ...)."""
    prompts_per_step, gens, new = shape
    work = Path(tempfile.mkdtemp(prefix="rung-gpu-bench-"))
    model.save_pretrained(work / "init")
    tok.save_pretrained(work / "init")
    files.write_jsonl(work / "rows.jsonl", math_rows(4 * prompts_per_step))
    stage = RLStageParams.model_validate(
        {
            "preset": "dapo",
            "max_steps": steps,
            "num_generations": gens,
            "prompts_per_step": prompts_per_step,
            "max_completion_length": new,
            "learning_rate": 1e-6,
            "save_steps": 10_000,
            "rewards": {"accuracy": 1.0, "format": 0.1},
            **stage,
        }
    )
    job = RLJob(
        key="rl.stages.bench",
        params=stage,
        init=work / "init",
        data=work / "rows.jsonl",
        work_dir=work / "w",
        format=FMT,
        seed=0,
        dtype=dtype,
        device=str(model.device),
        buckets=DifficultyParams().buckets,
        curves=work / "curves.json",
    )
    clock = StepClock()
    trainer = trainers.trainer_for(job, [clock])
    if bf16_weights:
        trainer.model.to(torch.bfloat16)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    result = run("rung", trainer)
    result["step_seconds"] = [b - a for a, b in pairwise([t0, *clock.ends])]
    result["peak_gib"] = (
        torch.cuda.max_memory_allocated()
        if torch.cuda.is_available()
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ) / 2**30
    # what the trainer holds whatever the batch, exact on any device: weights and AdamW state
    held = [*trainer.model.parameters(), *(t for s in trainer.optimizer.state.values() for t in s.values())]
    result["state_gib"] = sum(t.numel() * t.element_size() for t in held if torch.is_tensor(t)) / 2**30
    result["shape"] = {"prompts": prompts_per_step, "generations": gens, "new_tokens": new, "preset": "dapo"}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--smoke", action="store_true", help="a tiny model and shapes on the CPU (the test suite runs this)"
    )
    ap.add_argument("--device", default="auto", help="params model.device: auto | cpu | cuda[:N]")
    ap.add_argument(
        "--dtype", default="auto", help="params model.dtype: auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16"
    )
    ap.add_argument("--rl-steps", type=int, default=4, help="RL steps (the first includes compilation)")
    ap.add_argument("--skip-generation", action="store_true", help="only the RL steps")
    ap.add_argument("--out", default=None, help="also write the results here (JSON)")
    ap.add_argument(
        "--vllm", action="store_true", help="also RL with TRL's colocated vLLM rollouts (vllm installed, CUDA)"
    )
    ap.add_argument("--vllm-share", type=float, default=0.3, help="vllm_gpu_memory_utilization of the vLLM arm")
    args = ap.parse_args()

    device, dtype = placement.resolve("cpu" if args.smoke else args.device, args.dtype)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"{name}, {dtype}, torch {torch.__version__}, "
        f"{'tiny model (smoke)' if args.smoke else 'SmolLM2-135M architecture, random weights'}"
    )
    model, tok = random_model(device, dtype, args.smoke)
    gen = (
        [] if args.skip_generation else bench_generation(model, tok, SMOKE_SHAPES if args.smoke else SHAPES, args.smoke)
    )
    if gen:
        print(
            "\n| shape | rows/batch | contender | tokens/s | compile + warm-up s | greedy identical |"
            "\n|---|---|---|---|---|---|"
        )
    for r in gen:
        same = f"{r['greedy_identical']}/{r['prompts']}" if "greedy_identical" in r else ""
        print(
            f"| {r['shape']} {r['prompts']}x{r['samples']}x{r['new_tokens']} | {r['rows_per_batch']} | "
            f"{r['contender']} | "
            f"{r['tokens_per_s']:,.0f} | {r['compile_s']:.1f} | {same} |"
        )
    shape, steps = (SMOKE_SHAPES["rl"], 2) if args.smoke else (SHAPES["rl"], args.rl_steps)
    # fp32 master weights (rung's training) against bf16 weights (before issue 36), when compute is bf16;
    # LoRA's memory against full fine-tuning; TRL's colocated vLLM rollouts against rung's, where vllm is installed
    arms: dict[str, dict[str, Any]] = {
        "fp32 master weights": {},
        **({"bf16 weights (drops updates)": {"bf16_weights": True}} if dtype == "bfloat16" else {}),
        "LoRA r=16, all-linear": {"lora": {"r": 16, "alpha": 32}},
    }
    if args.vllm:
        arms["vLLM colocate (TRL), fp32 master weights"] = {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": args.vllm_share,
        }
    rl_results = {arm: bench_rl(model, tok, dtype, shape, steps, **kw) for arm, kw in arms.items()}
    print(
        f"\nRL, dapo, {shape[0]} prompts x {shape[1]} generations x {shape[2]} tokens, {steps} steps"
        "\n| arm | first step s | then s a step | tokens generated | weights + AdamW GiB | peak GiB |"
        "\n|---|---|---|---|---|---|"
    )
    for arm, r in rl_results.items():
        t = r["step_seconds"]
        print(
            f"| {arm} | {t[0]:.1f} | {sum(t[1:]) / max(1, len(t) - 1):.2f} | {r['tokens']} | {r['state_gib']:.3f} | "
            f"{r['peak_gib']:.2f} |"
        )
    if device.type != "cuda":
        print("(peak on the CPU: the process's largest resident set so far, not each arm's own)")
    phased = [a for a in arms if a == "fp32 master weights" or a.startswith("vLLM")]
    print(f"\n\n| phase | {' | '.join(f'{a}: s (share)' for a in phased)} |\n|---|{'---|' * len(phased)}")
    for p in PHASES:
        cells = [
            f"{rl_results[a]['phases'][p]:.1f} ({rl_results[a]['phases'][p] / rl_results[a]['seconds']:.0%})"
            for a in phased
        ]
        print(f"| {p} | {' | '.join(cells)} |")
    if args.out:
        Path(args.out).write_text(
            json.dumps({"device": name, "dtype": dtype, "generation": gen, "rl": rl_results}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
