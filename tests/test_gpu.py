"""On a CUDA device (marked `gpu`, skipped without one): generation and evaluation on the device,
an SFT and an RL step in bf16 compute with resume that move the fp32 weights, batch sizing and the
out-of-memory back-off. docs/gpu.md ("One GPU")
gives the command that runs them with carried wheels; they need no reasoning-gym, MLflow, Prefect or
DVC, and no weights (SmolLM2's tokenizer and a small random model).

RUNG_TEST_DEVICE=cpu runs the same tests on the CPU (a dry run of the test code itself).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, TrainerCallback

from rung import files, models
from rung.answers import formats
from rung.config import DifficultyParams, FormatParams, RLStageParams, SamplingParams, SFTParams
from rung.envs import template
from rung.generate import api
from rung.generate.completion import render
from rung.rl import trainers
from rung.train import movement, sft
from rung.train.checkpoints import FINAL
from rung.train.jobs import RLJob, SFTJob
from tests.memorize import RETRY, memorize
from tests.tiny_model import build

DEVICE = os.environ.get("RUNG_TEST_DEVICE", "cuda")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device"),
]
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "smollm2-135m"
FMT = FormatParams()
ROWS = [
    {
        "id": str(i),
        "source": "gpu",
        "task": "math",
        "prompt": f"What is {i} + {i % 5}?",
        "answer": str(i + i % 5),
        "meta": {},
        "solution": f"{i} + {i % 5} = {i + i % 5}.",
    }
    for i in range(16)
]


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> Path:
    """A 4-layer random Llama with SmolLM2's tokenizer, saved in fp32."""
    shape = dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2
    )
    return build(tmp_path_factory.mktemp("gpu") / "model", tokenizer=FIXTURE, **shape)


def _prompts(tok) -> list[str]:
    return render(tok, [formats.prompt(r["prompt"], FMT) for r in ROWS])


def test_fp32_greedy_on_the_device_equals_the_cpu(small_model):
    """The device's default engine (compiled static cache on CUDA) gives the CPU loop's greedy tokens."""
    cpu, tok = models.load(small_model, "float32", "cpu")
    dev, _ = models.load(small_model, "float32", DEVICE)
    sampling = SamplingParams(temperature=0, max_new_tokens=16)
    assert api.generate(dev, tok, _prompts(tok), sampling) == api.generate(cpu, tok, _prompts(tok), sampling)


def test_bf16_compiled_agrees_with_dynamic_cache_generate(small_model):
    """bf16 on the device: the compiled path against dynamic-cache `model.generate`, greedy; rows can
    part where two logits tie in bf16, so the agreement rate is stated and must stay high."""
    model, tok = models.load(small_model, "bfloat16", DEVICE)
    prompts = _prompts(tok)
    ours = api.generate(model, tok, prompts, SamplingParams(temperature=0, max_new_tokens=16))
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False).to(
        model.device
    )
    with torch.inference_mode():
        seqs = model.generate(**enc, do_sample=False, max_new_tokens=16, pad_token_id=tok.pad_token_id)
    eos = tok.eos_token_id
    theirs = [ids[: ids.index(eos)] if eos in ids else ids for ids in seqs[:, enc["input_ids"].shape[1] :].tolist()]
    agree = sum(c[0].text == tok.decode(t, skip_special_tokens=True) for c, t in zip(ours, theirs, strict=True)) / len(
        prompts
    )
    print(f"bf16 greedy agreement, compiled vs dynamic-cache generate: {agree:.0%}")
    assert agree >= 0.75


def test_sampling_on_the_device_is_seeded_per_row(small_model):
    # bf16 on the CPU: a prompt padded in a batch and alone gets different logits, so the dry run uses fp32
    model, tok = models.load(small_model, "bfloat16" if DEVICE == "cuda" else "float32", DEVICE)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12)
    a = api.generate(model, tok, _prompts(tok), sampling, n=4, seed=3)
    assert a == api.generate(model, tok, _prompts(tok), sampling, n=4, seed=3)
    assert a[0] == api.generate(model, tok, _prompts(tok)[:1], sampling, n=4, seed=3)[0]


class CrashAfterFirst(TrainerCallback):
    """Stops training right after the checkpoint of step 1 is written, like a killed job."""

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == 1:
            raise KeyboardInterrupt


def _trained_alike(init: Path, a: Path, b: Path) -> None:
    """Both checkpoints moved (nearly) every weight from their init, as fp32 master weights do (bf16
    weights kept ~6% of SmolLM2's moving), and agree with each other (bf16 kernels on a GPU need not be
    bit-exact run to run)."""
    for out in (a, b):
        assert movement.since(init, out)["weights_changed_share"] > 0.99
    x, _ = models.load(a, "float32")
    y, _ = models.load(b, "float32")
    for p, q in zip(x.state_dict().values(), y.state_dict().values(), strict=True):
        torch.testing.assert_close(p, q, atol=2e-2, rtol=2e-2)


def test_sft_step_in_bf16_resumes(small_model, tmp_path):
    data = tmp_path / "traces.jsonl"
    files.write_jsonl(
        data, [{"prompt": r["prompt"], "target": f"{r['solution']}\nAnswer: {r['answer']}"} for r in ROWS]
    )
    params = SFTParams(max_steps=2, save_steps=1, per_device_train_batch_size=4, learning_rate=1e-3)
    job = dict(
        key="sft", params=params, init=small_model, data=data, format=FMT, seed=0, dtype="bfloat16", device=DEVICE
    )
    whole = sft.train(SFTJob(work_dir=tmp_path / "a", **job))
    with pytest.raises(KeyboardInterrupt):
        sft.train(SFTJob(work_dir=tmp_path / "b", callbacks=["tests.test_gpu:CrashAfterFirst"], **job))
    resumed = sft.train(SFTJob(work_dir=tmp_path / "b", resume=str(tmp_path / "b" / "checkpoint-1"), **job))
    assert whole.metrics["steps"] == resumed.metrics["steps"] == 2
    _trained_alike(small_model, tmp_path / "a" / FINAL, tmp_path / "b" / FINAL)


def test_rl_step_in_bf16_with_rungs_rollouts_resumes(small_model, tmp_path):
    data = tmp_path / "rows.jsonl"
    files.write_jsonl(data, ROWS)
    shape = dict(max_steps=2, num_generations=4, prompts_per_step=2, max_completion_length=16, save_steps=1)
    stage = RLStageParams(
        preset="dapo",
        learning_rate=1e-4,
        rewards={"accuracy": 1.0, "even": {"import": "tests.rows:even_tokens"}},
        **shape,
    )
    job = dict(
        key="rl.stages.main",
        params=stage,
        init=small_model,
        data=data,
        format=FMT,
        seed=0,
        dtype="bfloat16",
        device=DEVICE,
        buckets=DifficultyParams().buckets,
    )
    whole = trainers.train(RLJob(work_dir=tmp_path / "a", curves=tmp_path / "a.json", **job))
    with pytest.raises(KeyboardInterrupt):
        trainers.train(
            RLJob(
                work_dir=tmp_path / "b", curves=tmp_path / "b.json", callbacks=["tests.test_gpu:CrashAfterFirst"], **job
            )
        )
    resumed = trainers.train(
        RLJob(work_dir=tmp_path / "b", curves=tmp_path / "b.json", resume=str(tmp_path / "b" / "checkpoint-1"), **job)
    )
    assert whole.metrics["steps"] == resumed.metrics["steps"] == 2
    assert [c["step"] for c in files.read_json(tmp_path / "b.json")] == [1, 2]
    _trained_alike(small_model, tmp_path / "a" / FINAL, tmp_path / "b" / FINAL)


def test_retry_episodes_train_in_bf16_and_resume(small_model, tmp_path):
    """rung's episode loop on the device: the model taught to answer 390 and, after retry's feedback, 391 runs
    two-turn episodes in the RL stage, which trains them and resumes to what an unkilled stage trains."""
    tok = template.apply(AutoTokenizer.from_pretrained(small_model))
    model = memorize(small_model, tok, tmp_path / "retrying", RETRY, lr=3e-3)
    question = RETRY[0]["content"]
    rows = [  # right after the feedback for the first; the second's answer is never said
        {"id": "0", "source": "gpu", "task": "math", "prompt": question, "answer": "391", "meta": {}},
        {"id": "1", "source": "gpu", "task": "math", "prompt": question[:-1] + " ?", "answer": "392", "meta": {}},
    ]
    files.write_jsonl(tmp_path / "rows.jsonl", rows)
    stage = RLStageParams(
        preset="dapo",
        learning_rate=1e-4,
        rewards={"accuracy": 1.0, "even": {"import": "tests.rows:even_tokens"}},
        environment={"name": "retry", "max_turns": 3},
        max_steps=2,
        num_generations=4,
        prompts_per_step=2,
        max_completion_length=16,
        save_steps=1,
    )
    job = dict(
        key="rl.stages.main",
        params=stage,
        init=model,
        data=tmp_path / "rows.jsonl",
        format=FormatParams(instruction=""),  # the prompt the model memorized: the bare question
        seed=0,
        dtype="bfloat16",
        device=DEVICE,
        buckets=DifficultyParams().buckets,
        environment=stage.environment,
    )
    trainers.train(RLJob(work_dir=tmp_path / "a", curves=tmp_path / "a.json", **job))
    with pytest.raises(KeyboardInterrupt):
        trainers.train(
            RLJob(
                work_dir=tmp_path / "b", curves=tmp_path / "b.json", callbacks=["tests.test_gpu:CrashAfterFirst"], **job
            )
        )
    trainers.train(
        RLJob(work_dir=tmp_path / "b", curves=tmp_path / "b.json", resume=str(tmp_path / "b" / "checkpoint-1"), **job)
    )
    curves = files.read_json(tmp_path / "b.json")
    assert [c["step"] for c in curves] == [1, 2]
    assert all(c["episodes/mean_turns"] > 1 for c in curves)  # the first answer, 390, gets the feedback
    assert 0 < sum(c["accuracy_generated"] for c in curves) < 2  # 391 after it: right for one row of two
    assert max(c["completion_length"] for c in curves) <= 16 * 3
    _trained_alike(model, tmp_path / "a" / FINAL, tmp_path / "b" / FINAL)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA's allocator limit forces the error")
def test_out_of_memory_backs_off_and_draws_the_same_samples(small_model):
    """With the process held to a small share of the GPU, batch sizing from free memory (device-wide)
    overshoots: the error halves the batch until it fits, and the samples are those of a free run."""
    model, tok = models.load(small_model, "float32", DEVICE)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=64)
    prompts = _prompts(tok) * 8
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    want = api.generate(model, tok, prompts, sampling, n=8, seed=1)
    need = torch.cuda.max_memory_allocated() - base  # what the batch sized from free memory took
    torch.cuda.empty_cache()
    # reserved, not allocated: the compiled path's CUDA-graph pools stay reserved after the run and count
    # against the limit; a third of the first run's need fits a quarter of its rows, not all of them
    _, total = torch.cuda.mem_get_info()
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + need // 3) / total)
    try:
        got = api.generate(model, tok, prompts, sampling, n=8, seed=1)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert model in api._backed_off and got == want


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA's allocator")
def test_batch_sizing_counts_cached_blocks_as_free_and_the_longest_static_cache(small_model):
    """Blocks PyTorch's allocator caches after a step are free to this process: the batch after them
    is as large as before. A compiled call with a long cache makes later, shorter calls size their
    batches at that length (transformers keeps the longest static cache)."""
    model, tok = models.load(small_model, "bfloat16", DEVICE)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=32)
    before = api.memory_rows(model, 512)
    free, _ = torch.cuda.mem_get_info()
    cached = torch.empty(int(free * 0.6), dtype=torch.uint8, device=DEVICE)
    del cached  # reserved by the allocator, allocated to nothing
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() > free * 0.5
    assert api.memory_rows(model, 512) == before
    torch.cuda.empty_cache()
    long_prompt = tok(_prompts(tok)[0] * 12, add_special_tokens=False)["input_ids"]
    api.generate_ids(model, [long_prompt], sampling, [tok.eos_token_id], desc=None)
    longest = api._longest[model]
    assert longest >= len(long_prompt) + 32
    assert api.batch_rows(model, sampling, 8) == min(api.compiled.ROW_BUCKETS[-1], api.memory_rows(model, longest))
