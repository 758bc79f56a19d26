"""Uniform prompt sampling against curricula (with DAPO dynamic sampling) on the default experiment.

Each arm trains the default RL stage (params.yaml rl.stages.<stage>) from the SFT checkpoint with
the same number of steps, changing only what the arm overrides, for several seeds. Held-out greedy
accuracy is measured every --eval-every steps; the table reports the final accuracy, the steps an
arm needs to reach the uniform arm's final accuracy (same seed), and the zero-variance fraction of
the groups generated and of the groups trained on. Needs the outputs of `dvc repro difficulty`.

    python bench/curriculum.py                                  # the arms below, seeds 1 2 3
    python bench/curriculum.py --arms uniform pools_ds --seeds 1 --steps 10
"""
from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from statistics import mean, stdev
from typing import Any

from transformers import TrainerCallback

from rung import answer_format, config, io, layout, models, rl
from rung.config import SamplingParams
from rung.evaluate import grade
from rung.generation import generate, render

DS = {"dynamic_sampling": {"max_rounds": 3}}
ARMS: dict[str, dict[str, Any]] = {
    "uniform": {"curriculum": {"type": "uniform"}, "dynamic_sampling": None},  # TRL's default sampling: the baseline
    "uniform_ds": {"curriculum": {"type": "uniform"}, **DS},
    "pools_ds": {"curriculum": {"type": "pools"}, **DS},
    "adaptive_ds": {"curriculum": {"type": "adaptive"}, **DS},
    "bandit_ds": {"curriculum": {"type": "bandit", "arms": "bucket", "method": "sec"}, **DS},
    "scheduled_ds": {"curriculum": {"type": "scheduled", "start": 0.8, "end": 0.4}, **DS},
}


class HeldOut(TrainerCallback):
    """Greedy held-out accuracy of the policy every `every` steps (step 0, the SFT checkpoint,
    is measured once per benchmark: it is the same for every arm)."""

    def __init__(self, rows: list[dict[str, Any]], fmt: config.FormatParams, tok: Any, every: int, max_new_tokens: int):
        self.rows, self.fmt, self.every, self.tok = rows, fmt, every, tok  # left-padded, for generation
        self.prompts = render(tok, [answer_format.prompt(r["prompt"], fmt) for r in rows])
        self.sampling = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, batch_size=32)
        self.curve: list[tuple[int, float]] = []

    def measure(self, model: Any, step: int) -> None:
        was_training = model.training
        model.eval()
        records = grade(self.rows, generate(model, self.tok, self.prompts, self.sampling, desc=f"held-out @{step}"), self.fmt)
        model.train(was_training)
        self.curve.append((step, mean(r["samples"][0]["correct"] for r in records)))

    def on_step_end(self, args, state, control, model=None, **kw):  # type: ignore[no-untyped-def]
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            self.measure(model, state.global_step)


def run(arm: str, seed: int, params: config.Params, stage_name: str, steps: int, every: int, work: Path) -> dict[str, Any]:
    stage = params.rl.stages[stage_name]
    stage = config.RLStageParams.model_validate({**stage.model_dump(exclude_unset=True, by_alias=True), **ARMS[arm], "max_steps": steps})
    init = layout.checkpoint(stage.init)
    rows = io.read_jsonl(layout.FILTERED)
    test = io.read_jsonl(layout.TEST)
    held = HeldOut(test, params.format, models.load_tokenizer(init), every, params.eval.sampling.max_new_tokens)
    t0 = time.perf_counter()
    summary, _ = rl.train(init, rows, params.format, stage, params.difficulty.buckets, seed, work / f"{arm}-{seed}", params.model.dtype, callbacks=[held])
    shutil.rmtree(work / f"{arm}-{seed}")  # checkpoints: ~1.6 GB per run
    return {"arm": arm, "seed": seed, "curve": held.curve, "summary": summary, "seconds": time.perf_counter() - t0,
            "zero_std_generated": summary.get("frac_reward_zero_std"), "zero_std_trained": summary.get("frac_zero_std_trained")}


def steps_to(curve: list[tuple[int, float]], target: float) -> int | None:
    return next((s for s, acc in curve if acc >= target), None)


def table(results: list[dict[str, Any]]) -> str:
    base = {r["seed"]: r["curve"][-1][1] for r in results if r["arm"] == "uniform"}
    lines = ["| arm | seeds | held-out acc. (mean ± sd) | steps to uniform's final acc. | zero-var. generated | zero-var. trained | min/run |",
             "|---|---|---|---|---|---|---|"]
    for arm in dict.fromkeys(r["arm"] for r in results):
        rs = [r for r in results if r["arm"] == arm]
        finals = [r["curve"][-1][1] for r in rs]
        reach = [steps_to(r["curve"], base[r["seed"]]) for r in rs if r["seed"] in base]
        reach_txt = ", ".join("-" if s is None else str(s) for s in reach) or "n/a"
        sd = f" ± {stdev(finals) * 100:.1f}" if len(finals) > 1 else ""
        lines.append(f"| {arm} | {len(rs)} | {mean(finals) * 100:.1f}{sd} | {reach_txt} | {mean(r['zero_std_generated'] for r in rs):.2f} "
                     f"| {mean(r['zero_std_trained'] for r in rs):.2f} | {mean(r['seconds'] for r in rs) / 60:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", nargs="+", default=["uniform", "pools_ds"], choices=list(ARMS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    ap.add_argument("--stage", default="main")
    ap.add_argument("--steps", type=int, help="RL steps per run (default: the stage's max_steps)")
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--out", default="bench/results/curriculum.json")
    args = ap.parse_args()

    params = config.load(layout.PARAMS)
    steps = args.steps or params.rl.stages[args.stage].max_steps
    out = Path(args.out)
    # Rerunning continues an interrupted benchmark, unless the settings or the data changed.
    settings = {"stage": params.rl.stages[args.stage].model_dump(mode="json"), "steps": steps, "eval_every": args.eval_every,
                "data": io.md5(layout.FILTERED),
                "init": io.md5(layout.checkpoint(params.rl.stages[args.stage].init) / "model.safetensors")}  # weights, not provenance
    saved = io.read_json(out) if out.exists() else {}
    results = saved.get("runs", []) if saved.get("settings") == settings else []
    start = saved.get("start") if results else None
    if start is None:
        init = layout.checkpoint(params.rl.stages[args.stage].init)
        held = HeldOut(io.read_jsonl(layout.TEST), params.format, models.load_tokenizer(init), args.eval_every, params.eval.sampling.max_new_tokens)
        held.measure(models.load(init, params.model.dtype)[0], 0)
        start = held.curve[0][1]
        io.write_json(out, {"settings": settings, "start": start, "runs": results})
    print(f"held-out accuracy at step 0 ({params.rl.stages[args.stage].init}): {start * 100:.1f}%")
    for seed in args.seeds:
        for arm in args.arms:
            if any((r["arm"], r["seed"]) == (arm, seed) for r in results):
                continue
            results.append(run(arm, seed, params, args.stage, steps, args.eval_every, layout.WORK / "bench"))
            io.write_json(out, {"settings": settings, "start": start, "runs": results})
            print(table(results), flush=True)
    print(f"\n{steps} RL steps per run, eval every {args.eval_every}; steps to reach: per seed, '-' = never\n")
    print(table(results))


if __name__ == "__main__":
    main()
