"""Device-correct by construction, checked on the CPU: every generation and log-prob path runs with
the default device set to `meta`, so a tensor created without an explicit device lands on meta and
fails against the model's CPU tensors, as it would against CUDA ones on a GPU node.
`model.generate` passes this check and is the control."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from trl import GRPOTrainer

from rung import models
from rung.answers import formats
from rung.config import SamplingParams
from rung.errors import InputError
from rung.generate.api import generate, generate_ids
from rung.generate.completion import render
from rung.rl import trainers
from tests.conftest import ROOT
from tests.test_rl import FMT, ROWS, _job, _rollout_batch, _stage


@pytest.fixture(scope="module")
def loaded(tiny_model):
    return models.load(tiny_model)


def _prompts(tok, k: int = 4) -> list[str]:
    return render(tok, [formats.prompt(r["prompt"] + " Explain." * (i % 3), FMT) for i, r in enumerate(ROWS[:k])])


def test_model_generate_passes_on_meta_the_control(loaded):
    model, tok = loaded
    enc = tok(_prompts(tok), return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    with torch.inference_mode(), torch.device("meta"):
        out = model.generate(**enc, do_sample=False, max_new_tokens=4, pad_token_id=tok.pad_token_id)
    assert out.device.type == "cpu"


@pytest.mark.parametrize(
    "sampling, n",
    [
        (SamplingParams(temperature=0, max_new_tokens=5, batch_size=3), 1),  # eval: greedy
        (SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=5, batch_size=3), 2),  # difficulty, traces: sampled
    ],
    ids=["greedy", "sampled"],
)
def test_generation_creates_every_tensor_on_the_models_device(loaded, sampling, n):
    model, tok = loaded
    prompts = _prompts(tok)
    want = generate(model, tok, prompts, sampling, n=n, seed=3)
    with torch.device("meta"):
        got = generate(model, tok, prompts, sampling, n=n, seed=3)
    assert got == want


def test_rollouts_and_shared_prefix_log_probs_on_the_models_device(tiny_model, tmp_path):
    trainer = trainers.trainer_for(_job(tiny_model, tmp_path / "w", _stage(num_generations=2)))
    tok, model = trainer.processing_class, trainer.model
    ids = [
        tok(p, add_special_tokens=False)["input_ids"] for p in _prompts(tok, 2) for _ in range(2)
    ]  # TRL repeats each prompt per group
    want, _ = trainer._generate_single_turn(ids, None, None)
    trainer.rollouts.calls = (-1, 0)  # the same call of the same step again: the same seed
    with torch.device("meta"):
        got, _ = trainer._generate_single_turn(ids, None, None)
    assert got == want and len(got) == 4
    input_ids, mask, keep = _rollout_batch(tok, _prompts(tok), [5, 3, 5, 2])
    theirs = GRPOTrainer._get_per_token_logps_and_entropies(trainer, model, input_ids, mask, keep, compute_entropy=True)
    with torch.device("meta"):
        ours = trainer._get_per_token_logps_and_entropies(
            model, input_ids, mask, keep, batch_size=3, compute_entropy=True
        )
    comp = mask[:, -keep:].bool()
    torch.testing.assert_close(ours[0][comp], theirs[0][comp], atol=1e-5, rtol=1e-4)


def test_generate_ids_leaves_host_lists_on_the_host(loaded):
    """Token ids come back as Python lists whatever the device (one transfer per step, not per row)."""
    model, tok = loaded
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in _prompts(tok, 2)]
    out = generate_ids(model, ids, SamplingParams(temperature=0, max_new_tokens=3), [tok.eos_token_id], desc=None)
    assert all(isinstance(t, int) for row in out for tokens, _ in row for t in tokens)


# What a GPU node lacks (reasoning-gym: cellpylib has no wheel there; the bench needs no tracking
# or orchestration): the module is made absent, as if not installed.
ABSENT = "import sys\nfor m in ('reasoning_gym', 'mlflow', 'prefect', 'dvc'):\n    sys.modules[m] = None\n"


def _run_without_absent(code: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", ABSENT + code], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_generation_rollouts_verifier_and_trainers_import_without_reasoning_gym():
    done = _run_without_absent(
        "from rung.generate import api\nfrom rung.rl import rollouts, trainers\n"
        "from rung.train import sft\nfrom rung.answers import verify\n"
        "row = {'task': 'math', 'answer': '7', 'prompt': 'What is 3 + 4?', 'meta': {}}\n"
        "assert verify.is_correct('\\\\boxed{7}', row) and not verify.is_correct('8', row)\n"
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_gpu_bench_smoke_runs_on_the_cpu_with_only_its_dependencies():
    """bench/gpu.py --smoke: every contender, the RL step by phase, without MLflow, Prefect, DVC or reasoning-gym."""
    done = _run_without_absent(
        "import runpy\nsys.path.insert(0, 'bench')\nsys.argv = ['bench/gpu.py', '--smoke']\n"
        "runpy.run_path('bench/gpu.py', run_name='__main__')\n"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for line in (
        "rung (compiled static cache)",
        "generate, static cache compiled",
        "| greedy 6x1x8 |",
        "| generation |",
        "| backward |",
        "| LoRA r=16, all-linear |",
    ):
        assert line in done.stdout
    greedy = [r for r in done.stdout.splitlines() if r.startswith("| greedy")]
    assert all(r.rstrip(" |").endswith("6/6") for r in greedy), greedy


@pytest.mark.parametrize(
    "visible, local_rank, index",
    [(8, "3", 3), (1, "3", 0), (2, None, 1), (2, "5", None)],
    ids=["rank-of-all", "pinned-rank", "no-launcher", "rank-beyond"],
)
def test_auto_device_under_launchers(monkeypatch, visible, local_rank, index):
    """`model.device: auto` takes LOCAL_RANK's GPU where a rank sees the node's GPUs, the one GPU a
    launcher pinned it to (index 0), the current device without a launcher; else one line."""
    from rung import placement

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0 if visible == 1 else 1)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    if index is None:
        with pytest.raises(InputError, match=r"^model.device: auto, but local rank 5 sees 2 CUDA devices"):
            placement.device("auto")
    else:
        assert placement.device("auto") == torch.device("cuda", index)


def test_gpu_learning_bench_smoke_runs_on_the_cpu_with_only_its_dependencies():
    """bench/gpu_learn.py --smoke: SFT, RL and the paired table against a reference run, without
    MLflow, Prefect or DVC (a GPU machine lacks them)."""
    done = _run_without_absent(
        "import runpy\nsys.path.insert(0, 'bench')\nsys.argv = ['bench/gpu_learn.py', '--smoke']\n"
        "runpy.run_path('bench/gpu_learn.py', run_name='__main__')\n"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| sft | " in done.stdout and "| 100.0% |" in done.stdout  # SFT moved every weight
    # the random model's RL rewards have no variance: no gradient, and the bench says so
    assert "warning: rl-main: no weight changed since init" in done.stdout
    rows = [r for r in done.stdout.splitlines() if r.startswith(("| base |", "| sft |", "| rl/main |"))]
    assert len(rows) == 5 and all("| 0 | 0 | 1 |" in r for r in rows[2:])  # the same run twice: no flips
