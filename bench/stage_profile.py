"""Where a demo stage's time goes, by phase: the cores of the eval, SFT, difficulty and RL stages on
the demo's model and params.yaml, at small sizes, in a temporary workspace.

The set-up is the demo's own (not profiled): the embedded model materialized (rung.models), the data
curated (rung.data.curate) and the SFT targets built (rung.data.traces). Then, in pipeline order:

- eval (the base model): load, generate, score (grading and metrics, bootstrap included), write
  (records, plots, the metrics file with the model's md5);
- sft: load (model, tokenizer, trainer and its tokenized data), the training steps split by the same
  timers as bench/rl_overhead.py (bench/phases.py: loss forward, backward, optimizer + rest, checkpoint
  save), write (the final model and how far it moved, then publishing it);
- difficulty (the SFT model just trained, the demo's reference): load, generate, score, write;
- rl (from that SFT model, the stage as configured: preset, curriculum, dynamic sampling): load,
  generate and score (TRL's rollout and reward calls), rollout rest, the training step's phases, write.

Each stage runs through its core function as the pipeline's flow calls it; the timers wrap the functions
it calls (unittest.mock), so no phase is a copy of the code it measures. Sizes are the demo's but for
the prompt counts and steps given here: shares transfer to the demo, seconds scale with them.

    python bench/stage_profile.py                               # 32 eval prompts, 4 SFT steps, 2 RL steps
    python bench/stage_profile.py --prompts 96 --sft-steps 30 --rl-steps 20 --out bench/results/stage_profile.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from phases import instrument, split, timed  # bench/phases.py: the trainer timers of bench/rl_overhead.py

import rung.data.difficulty
import rung.models
import rung.rl.trainers
import rung.train.sft
from rung import config, files, models, paths
from rung.data import curate, traces
from rung.eval import evaluate
from rung.generate import api
from rung.seeding import derive
from rung.train import launch
from rung.train.jobs import RLJob, SFTJob

TRAIN_PHASES = {  # bench/phases.py's names -> this table's
    "generation": "generate",
    "rewards": "score",
    "rollout rest": "rollout rest",
    "loss forward": "train: forward",
    "backward": "train: backward",
    "optimizer + rest": "train: optimizer + rest",
    "checkpoint save": "checkpoint save",
}


@contextmanager
def patched(spent: dict[str, float], targets: list[tuple[str, Any, str]]) -> Iterator[None]:
    """Time every call of `owner.attr` as spent[name] inside the block ("train" also instruments the
    trainer it is given, bench/phases.instrument)."""
    with ExitStack() as stack:
        for name, owner, attr in targets:
            fn = getattr(owner, attr)
            if name == "train":
                fn = _instrumented(fn, spent)
            stack.enter_context(mock.patch.object(owner, attr, timed(spent, name, fn)))
        yield


def _instrumented(fit: Callable[..., Any], spent: dict[str, float]) -> Callable[..., Any]:
    def wrapper(trainer: Any, *args: Any, **kwargs: Any) -> Any:
        instrument(trainer, spent)
        return fit(trainer, *args, **kwargs)

    return wrapper


def _seconds(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def generation_stage(load: Callable[[], Any], core: Callable[[Any], Any], write: list[tuple[Any, str]]) -> dict:
    """Phases of a generating stage: load the model, then its core (generate, score, and the `write`
    functions it calls); score is the core's time outside generate and write."""
    spent: dict[str, float] = defaultdict(float)
    gen, spent["load"] = _seconds(load)
    gen = dataclasses.replace(gen, generate=timed(spent, "generate", gen.generate))
    with patched(spent, [("write", owner, attr) for owner, attr in write]):
        _, total = _seconds(lambda: core(gen))
    return {
        "load": spent["load"],
        "generate": spent["generate"],
        "score": total - spent["generate"] - spent["write"],
        "write": spent["write"],
    }


def training_stage(train: Callable[[], Any], module: Any) -> dict:
    """Phases of a training stage run by rung.train.launch (in this process): its trainer's phases
    while `module.fit` runs, write = finalize + publish, load = the rest (model, tokenizer, trainer)."""
    spent: dict[str, float] = defaultdict(float)
    targets = [("train", module, "fit"), ("write", module, "finalize"), ("write", rung.models, "publish")]
    with patched(spent, targets):
        _, total = _seconds(train)
    phases = {TRAIN_PHASES[k]: v for k, v in split(spent, spent["train"]).items()}
    return {"load": total - spent["train"] - spent["write"], **phases, "write": spent["write"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(paths.PARAMS))
    ap.add_argument("--prompts", type=int, default=32, help="held-out prompts evaluated greedily (demo: 305)")
    ap.add_argument(
        "--difficulty-prompts", type=int, default=16, help="prompts the difficulty stage scores (demo: 128)"
    )
    ap.add_argument("--sft-steps", type=int, default=4, help="SFT steps (demo: 30)")
    ap.add_argument("--rl-steps", type=int, default=2, help="RL steps (demo: 20)")
    ap.add_argument("--out", default=None, help="also write the results here (JSON)")
    args = ap.parse_args()

    params, out = config.load(Path(args.params).resolve()), Path(args.out).resolve() if args.out else None
    fmt, where = params.format, Path(tempfile.mkdtemp(prefix="stage-profile-"))
    os.chdir(where)  # the stages write at rung.paths' layout, relative to the workspace
    _, setup = _seconds(
        lambda: (
            models.materialize(params.model.source, paths.BASE, params.model.dtype, params.model.revision),
            curate.run(params.curate, params.eval, params.seed),
            traces.run(files.read_jsonl(paths.TRAIN), params.sft, fmt, derive(params.seed, "traces"), _no_model),
        )
    )

    def load(model_dir: Path) -> Callable[[], Any]:
        m, g = params.model, params.generation
        return lambda: api.load(model_dir, m.dtype, g.backend, m.device, g.vllm)

    results: dict[str, dict[str, float]] = {}
    # eval: the held-out split; the sampled evaluation on the demo's share of it (50 of 305 prompts)
    rows = files.read_jsonl(paths.TEST)[: args.prompts]
    samples = params.eval.samples and params.eval.samples.model_copy(update={"max_prompts": max(1, args.prompts // 6)})
    eval_params, seed = params.eval.model_copy(update={"samples": samples}), derive(params.seed, "eval")

    def eval_core(gen: Any) -> None:
        results_ = {"test": evaluate.evaluate(gen, rows, fmt, eval_params, seed)}
        metrics = evaluate.run("base", results_, {"test": paths.TEST}, eval_params, fmt, seed)
        files.write_json(paths.metrics("eval-base"), metrics)  # the flow's finish

    # write: evaluate.run (records, plots, the model's md5); the metrics file after it, a few kB, counts as score
    results["eval"] = generation_stage(load(paths.BASE), eval_core, [(evaluate, "run")])

    sft_job = SFTJob(
        key="sft",
        params=params.sft.model_copy(update={"max_steps": args.sft_steps}),
        init=paths.BASE,
        data=paths.TRACES,
        work_dir=paths.WORK / "sft",
        format=fmt,
        seed=derive(params.seed, "sft"),
        dtype=params.model.dtype,
        device=params.model.device,
        cpu_matmul=params.model.cpu_matmul,
    )
    results["sft"] = training_stage(lambda: launch.train(sft_job, params.sft.launch, paths.SFT), rung.train.sft)

    diff = params.difficulty.model_copy(update={"max_prompts": args.difficulty_prompts})
    train_rows = files.read_jsonl(paths.TRAIN)[: diff.max_prompts]
    results["difficulty"] = generation_stage(
        load(paths.checkpoint(params.difficulty.reference)),
        lambda gen: rung.data.difficulty.run(gen, train_rows, fmt, diff, derive(params.seed, "difficulty")),
        [(files, "write_jsonl"), (files, "write_json")],
    )

    name, stage = next(iter(params.rl.stages.items()))
    stage = stage.model_copy(update={"max_steps": args.rl_steps, "eval_every": None})
    rl_job = RLJob.of(params, name, stage)
    results["rl"] = training_stage(
        lambda: launch.train(rl_job, stage.launch, paths.checkpoint(f"rl/{name}")), rung.rl.trainers
    )

    print(
        f"set-up (model, curate, traces: not profiled) {setup:.1f} s; {torch.get_num_threads()} threads; eval "
        f"{len(rows)} prompts (+{samples.max_prompts if samples else 0} x {samples.n if samples else 0} sampled), "
        f"sft {args.sft_steps} steps, difficulty {len(train_rows)} prompts, rl {args.rl_steps} steps "
        f"(rl.stages.{name}: {stage.preset or 'custom'}, {stage.curriculum.type})"
    )
    print(f"{'stage':12}{'phase':26}{'seconds':>9}{'share':>7}")
    for stage_name, phases in results.items():
        total = sum(phases.values())
        for phase, seconds in phases.items():
            if seconds:  # 0 exactly: a phase the stage does not have (SFT generates nothing)
                print(f"{stage_name:12}{phase:26}{seconds:>9.2f}{seconds / total:>7.1%}")
        print(f"{stage_name:12}{'total':26}{total:>9.2f}")
    if out:
        files.write_json(out, {"setup_s": setup, "stages": results})


def _no_model(model: str) -> Any:
    raise SystemExit(f"the profile builds SFT targets from solutions only; sft.traces asks for model {model}")


if __name__ == "__main__":
    main()
