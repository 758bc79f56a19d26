"""SFT warm-start on the tiny model: trace sources, LoRA and packing, and a 2-process DDP run
(torchrun over gloo) in which each rank trains on its own shard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rung import files, models, paths
from rung.config import (
    FormatParams,
    LaunchParams,
    SampledTraces,
    SFTParams,
    SolutionTraces,
)
from rung.data import traces
from rung.errors import InputError
from rung.generate.completion import Completion, Generator
from rung.generate.vllm import require_trl_vllm
from rung.train import launch
from rung.train.checkpoints import FINAL, resume_point
from rung.train.jobs import SFTJob
from tests.rows import sums
from tests.tiny_model import job

FMT = FormatParams()
ROWS = [  # every other row without a solution
    {**r, "solution": r["solution"] if i % 2 else None, "meta": {"expression": f"{i} + 2"}}
    for i, r in enumerate(sums(16, lambda i: 2, solutions=True))
]


@pytest.fixture(autouse=True)
def _mlflow_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")


def test_solution_traces_end_in_the_answer_line():
    with_answers = traces.from_solutions(ROWS, SolutionTraces(), FMT)
    only_solutions = traces.from_solutions(ROWS, SolutionTraces(answer_only=False), FMT)
    assert len(with_answers) == 16 and len(only_solutions) == 8
    assert only_solutions[0]["target"] == "1 + 2 = 3\nAnswer: 3"


def test_rejection_sampling_keeps_verified_distinct_traces(tiny_model):
    # A scripted sampler stands in for a model, so the filter's decisions are known.
    scripted = ["1 + 2 = 3\nAnswer: 3", "1 + 2 = 3\n Answer: 3", "so it is 3", "Answer: 4"]
    gen = Generator(
        models.load_tokenizer(tiny_model),
        lambda prompts, sampling, n, seed, desc: [[Completion(t, 4, False) for t in scripted] for _ in prompts],
    )
    out, stats = traces.sampled(gen, ROWS[1:2], SampledTraces(type="rejection", max_per_prompt=3), FMT, seed=0)
    # duplicates up to whitespace collapse; an unformatted correct answer gets the answer line
    assert [t["target"] for t in out] == ["1 + 2 = 3\nAnswer: 3", "so it is 3\nAnswer: 3"]
    assert stats == {"prompts": 1, "samples": 4, "correct_samples": 3, "kept": 2, "prompts_with_trace": 1}
    with pytest.raises(ValueError, match="teacher"):
        SampledTraces(type="distill")


def test_traces_stage_skips_without_sft_and_refuses_to_leave_sft_nothing(tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    wrong = Generator(
        models.load_tokenizer(tiny_model),
        lambda prompts, sampling, n, seed, desc: [[Completion("Answer: 0", 2, False)] * n for _ in prompts],
    )
    teacher = [SampledTraces(type="distill", model="teacher")]
    zero_rl = SFTParams(enabled=False, traces=teacher)
    assert traces.run(ROWS, zero_rl, FMT, 0, lambda m: wrong) == {"skipped": 1}  # zero-RL: nothing sampled
    assert files.read_jsonl(paths.TRACES) == []
    with pytest.raises(InputError, match=r"^sft.traces: no SFT target from any source .*'correct_samples': 0"):
        traces.run(ROWS, SFTParams(traces=teacher), FMT, 0, lambda m: wrong)
    assert files.read_jsonl(paths.TRACES) == []  # the earlier output is left as it was


def _job(tiny_model: Path, tmp_path: Path, params: SFTParams, **kw) -> SFTJob:
    data = tmp_path / "traces.jsonl"
    files.write_jsonl(data, traces.from_solutions(ROWS, SolutionTraces(), FMT))
    return job(SFTJob, tiny_model, data, tmp_path / "work", key="sft", params=params, seed=3, **kw)


def test_lora_and_packing_give_a_plain_model(tiny_model, tmp_path):
    params = SFTParams(max_steps=2, per_device_train_batch_size=4, packing=True, lora={"r": 4, "alpha": 8})
    result = launch.run(_job(tiny_model, tmp_path, params), params.launch)
    assert result.metrics["steps"] == 2
    model, _ = models.load(tmp_path / "work" / FINAL)  # LoRA merged: no adapter files needed
    assert not any("lora" in k for k in model.state_dict())


def test_the_job_file_round_trips_and_publishing_keeps_the_checkpoints(tiny_model, tmp_path):
    """The stage's flow discards them once its records are complete (flows.sft): until then a rerun,
    for want of the MLflow server, resumes from them."""
    params = SFTParams(max_steps=2, per_device_train_batch_size=4, save_steps=1)
    job = _job(tiny_model, tmp_path, params)
    assert SFTJob.model_validate_json(job.model_dump_json(by_alias=True)) == job
    metrics = launch.train(job, params.launch, tmp_path / "sft")
    assert metrics["steps"] == 2 and (job.work_dir / "checkpoint-2" / "trainer_state.json").is_file()
    assert files.read_json(tmp_path / "sft" / "rung.json")["params"]["max_steps"] == 2
    models.load(tmp_path / "sft")


def test_two_process_ddp_trains_each_rank_on_its_own_shard(tiny_model, tmp_path):
    params = SFTParams(max_steps=2, per_device_train_batch_size=2, launch=LaunchParams(num_processes=2))
    assert launch.command(params.launch, tmp_path / "job.json", "rung.train.sft", "sft.launch")[1:3] == [
        "-m",
        "torch.distributed.run",
    ]
    result = launch.run(_job(tiny_model, tmp_path, params, callbacks=["tests.recording:RecordExamples"]), params.launch)
    assert result.metrics["steps"] == 2
    models.load(tmp_path / "work" / FINAL)
    shards = [set((tmp_path / "work" / "shards" / f"rank{r}.txt").read_text().split()) for r in (0, 1)]
    assert all(len(s) >= 4 for s in shards)  # 2 steps x batch 2 per rank (+ the batch the loader prefetches)
    assert not shards[0] & shards[1]  # disjoint: DistributedSampler split the data


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a CPU-only machine rejects")
def test_impossible_launch_is_rejected_before_start():
    with pytest.raises(InputError, match=r"^sft.launch.accelerate_config: .*not found"):
        launch.check(LaunchParams(accelerate_config="nope"), "sft.launch")
    for name in ("fsdp", "zero3"):
        with pytest.raises(
            InputError,
            match=rf"^rl.stages.main.launch.accelerate_config: {name}.yaml \(FSDP / DeepSpeed\) needs CUDA GPUs",
        ):
            launch.check(LaunchParams(num_processes=8, accelerate_config=name), "rl.stages.main.launch")
    with pytest.raises(
        InputError, match=r"^rl.stages.main.use_vllm: (vllm is not installed|TRL's vLLM rollouts need a CUDA GPU)"
    ):
        require_trl_vllm("rl.stages.main.use_vllm")


def test_resume_point_skips_incomplete_checkpoints_and_other_inputs(tmp_path):
    work = tmp_path / "work"
    assert resume_point(work, {"lr": 1}) is None and (work / "fingerprint.json").is_file()
    for step, written in (
        (2, ["model.safetensors", "trainer_state.json"]),
        (4, ["model.safetensors"]),
    ):  # 4: killed mid-write
        (work / f"checkpoint-{step}").mkdir()
        for name in written:
            (work / f"checkpoint-{step}" / name).write_text("{}")
    assert resume_point(work, {"lr": 1}) == str(work / "checkpoint-2")
    assert resume_point(work, {"lr": 1}, complete=("trainer_state.json", "curriculum.json")) is None
    assert resume_point(work, {"lr": 2}) is None and not (work / "checkpoint-2").exists()  # other inputs: discarded


def test_warmup_ratio_is_a_ratio_of_the_steps_in_transformers(tmp_path):
    """rung.train.sft passes `warmup_ratio` as SFTConfig(warmup_steps=...): transformers 5 dropped
    warmup_ratio and reads a float in [0, 1) as a ratio of the total steps (an int >= 1 as steps)."""
    from trl import SFTConfig

    def warmup(value: float, steps: int) -> int:
        return SFTConfig(
            output_dir=str(tmp_path), warmup_steps=value, report_to="none", use_cpu=True, bf16=False
        ).get_warmup_steps(steps)

    assert warmup(SFTParams().warmup_ratio, 40) == 4
    assert warmup(0.99, 40) == 40 and warmup(0.0, 40) == 0
    assert not hasattr(SFTConfig, "warmup_ratio")


def test_episode_traces_cut_to_nothing_are_refused_by_the_key(tiny_model, tmp_path):
    """An episode's prompt carries its tools' schemas (~300 tokens for python): a max_length that cuts every
    assistant token gets one line naming sft.max_length, not TRL's empty-sampler error; the truncated share
    counts the whole episode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rung.answers import formats
    from rung.config import ToolTraces
    from rung.envs import template
    from rung.train import sft

    init = tmp_path / "tools-model"
    AutoModelForCausalLM.from_pretrained(tiny_model).save_pretrained(init)
    tok = template.apply(AutoTokenizer.from_pretrained(tiny_model))
    tok.save_pretrained(init)
    rows = [{**r, "task": "basic_arithmetic", "meta": {"expression": f"{i} + 2"}} for i, r in enumerate(ROWS[:4])]
    episodes = traces.from_tool_calls(rows, ToolTraces(type="tool_calls"), FMT)
    data = tmp_path / "traces.jsonl"
    files.write_jsonl(data, episodes)
    rendered = [  # the format's messages, then the episode's
        tok.apply_chat_template([*formats.prompt(t["prompt"], FMT), *t["messages"]], tools=json.loads(t["tools"]))
        for t in episodes
    ]
    longest = max(len(r["input_ids"]) for r in rendered)
    assert sft.truncated_fraction(episodes, FMT, tok, longest) == 0.0
    assert sft.truncated_fraction(episodes, FMT, tok, longest - 20) > 0.0
    params = SFTParams(max_steps=1, per_device_train_batch_size=4, max_length=64)
    with pytest.raises(InputError, match=r"^sft.max_length: 64 tokens cut all trained tokens of every one of the 4"):
        sft.train(job(SFTJob, init, data, tmp_path / "work", key="sft", params=params, seed=3))
