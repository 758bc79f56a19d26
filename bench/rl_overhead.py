"""rung's RL stage against a plain TRL GRPOTrainer script: wall time per generated token.

Both contenders train the same model (default: the pipeline's SFT checkpoint) on the same prompts
(the difficulty-filtered train set), chat template and system prompt, reward functions and weights,
group size, prompts per step, steps and TRL config: the one rung builds from params.yaml's RL stage
(rung.rl.trainers.trl_config), with uniform prompt sampling and no dynamic sampling so that both do the same
work. The plain script is what a TRL user writes, `GRPOTrainer(model, reward_funcs, args,
train_dataset, processing_class).train()`; rung is the stage's trainer (rung.rl.trainers.trainer_for): its
curriculum hooks and its rollouts through rung.generate.api. bf16 is off in both (fp32 on CPU).

Timers around the trainers' own methods split each one's training time into generation, reward
scoring, the rest of the rollout phase (reference/old log-probs, advantages, rung's curriculum and
dynamic-sampling bookkeeping), the loss forward, backward, and optimizer + logging (the remainder).
The ratio is of milliseconds per generated completion token, plain / rung: above 1, rung is faster.
Contenders run one after the other in this process (plain first); this machine is noisy, so
compare the ratio of one run, not seconds across runs.

    python bench/rl_overhead.py                     # after `make demo`: data/models/sft, params.yaml
    python bench/rl_overhead.py --steps 10 --out bench/results/rl_overhead.json
    # rung alone, the stage as params.yaml has it (curriculum, dynamic sampling):
    python bench/rl_overhead.py --as-configured
    # a third contender: rung with model.cpu_matmul: onednn (the training linears on oneDNN)
    python bench/rl_overhead.py --onednn
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from phases import PHASES, run  # bench/phases.py: the same timers as bench/gpu.py
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOTrainer

from rung import config, files, paths
from rung.rl import rewards, trainers
from rung.train.jobs import RLJob


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(paths.PARAMS))
    ap.add_argument("--stage", default="main")
    ap.add_argument("--model", default=str(paths.checkpoint("sft")), help="HF model directory the stage starts from")
    ap.add_argument("--data", default=str(paths.FILTERED), help="the train prompts (jsonl rows)")
    ap.add_argument("--steps", type=int, default=None, help="default: the stage's max_steps")
    ap.add_argument("--out", default=None, help="also write the results here (JSON)")
    ap.add_argument(
        "--as-configured", action="store_true", help="profile rung alone on the stage as configured (no plain script)"
    )
    ap.add_argument("--onednn", action="store_true", help="also rung with model.cpu_matmul: onednn (after the others)")
    args = ap.parse_args()

    params = config.load(args.params)
    same_work = {} if args.as_configured else {"curriculum": config.UniformCurriculum(), "dynamic_sampling": None}
    stage = params.rl.stages[args.stage].model_copy(
        update={**same_work, "eval_every": None, **({"max_steps": args.steps} if args.steps else {})}
    )
    key = f"rl.stages.{args.stage}"
    work = Path(tempfile.mkdtemp(prefix="rl-overhead-"))
    job = RLJob(
        key=key,
        params=stage,
        init=Path(args.model),
        data=Path(args.data),
        work_dir=work / "rung",
        curves=work / "curves.json",
        format=params.format,
        seed=params.seed,
        dtype="float32",
        cpu_matmul=params.model.cpu_matmul,
        buckets=params.difficulty.buckets,
    )

    # The plain script: TRL's trainer on the same rows, prompts, rewards and config.
    rows = trainers.select(files.read_jsonl(job.data), stage, key)
    funcs, weights = rewards.build(stage, params.format, f"{key}.rewards")
    plain = (
        None
        if args.as_configured
        else GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32),
            reward_funcs=funcs,
            args=trainers.trl_config(stage, weights, params.seed, work / "plain", "float32", key),
            train_dataset=trainers.prompts(rows, params.format),
            processing_class=AutoTokenizer.from_pretrained(args.model),
        )
    )
    results = ([] if args.as_configured else [run("plain TRL script", plain)]) + [
        run(f"rung ({job.cpu_matmul})", trainers.trainer_for(job))
    ]
    if args.onednn:
        results.append(run("rung (onednn)", trainers.trainer_for(job.model_copy(update={"cpu_matmul": "onednn"}))))

    print(
        f"{len(rows)} prompts, {stage.max_steps} steps x {stage.prompts_per_step} prompts x "
        f"{stage.num_generations} samples, "
        f"{stage.max_completion_length} new tokens at most, {torch.get_num_threads()} threads, fp32"
    )
    print(
        f"{'contender':18}{'seconds':>9}{'tokens':>8}{'ms/token':>10}{'reward':>8}  "
        + "  ".join(f"{p:>16}" for p in PHASES)
    )
    for r in results:
        shares = "  ".join(f"{r['phases'][p]:>8.1f}s {r['phases'][p] / r['seconds']:>5.0%}" for p in PHASES)
        print(
            f"{r['contender']:18}{r['seconds']:>9.1f}{r['tokens']:>8}{r['ms_per_token']:>10.1f}"
            f"{r['mean_reward']:>8.3f}  {shares}"
        )
    if args.as_configured:
        print(
            f"(the stage as configured: {stage.curriculum.type} curriculum, dynamic sampling {stage.dynamic_sampling})"
        )
        if args.out:
            files.write_json(Path(args.out), {"results": results})
        return
    plain_ms, ratios = results[0]["ms_per_token"], {}
    for r in results[1:]:
        ratios[r["contender"]] = plain_ms / r["ms_per_token"]
        print(
            f"{r['contender']} is {ratios[r['contender']]:.2f}x the plain script's speed per generated token "
            f"(generation alone: {results[0]['phases']['generation'] / results[0]['tokens'] * 1000:.1f} vs "
            f"{r['phases']['generation'] / r['tokens'] * 1000:.1f} ms per token)"
        )
    if args.out:
        files.write_json(Path(args.out), {"ratios": ratios, "results": results})


if __name__ == "__main__":
    main()
