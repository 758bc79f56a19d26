"""rung.onednn's training linear and the training heap: the same numbers as PyTorch's default path (up to
fp32 summation order), on the layers and in a training run."""

from __future__ import annotations

import resource
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, TrainerCallback

from rung import files, onednn
from rung.config import FormatParams, SFTParams, SolutionTraces
from rung.data import traces
from rung.generate import prepacked
from rung.train import sft
from rung.train.harness import keep_freed_memory, trainable
from rung.train.jobs import SFTJob
from tests.rows import sums
from tests.tiny_model import job

FMT = FormatParams()
pytestmark = pytest.mark.skipif(not onednn.available(), reason="PyTorch built without oneDNN")


@pytest.mark.parametrize("bias", [True, False])
def test_linear_forward_and_gradients_match_nn_linear(bias):
    torch.manual_seed(0)
    ref = torch.nn.Linear(96, 320, bias=bias)
    layer = torch.nn.Linear(96, 320, bias=bias)
    layer.load_state_dict(ref.state_dict())
    assert onednn.train_on_onednn(layer) == 1 and type(layer) is onednn.OneDNNLinear
    x = torch.randn(3, 70, 96)
    xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = ref(xr), layer(xo)
    assert type(got.grad_fn).__name__ == "_LinearFnBackward"  # oneDNN's path, not nn.Linear's
    grad = torch.randn_like(want)
    want.backward(grad)
    got.backward(grad)
    close = {"rtol": 1e-4, "atol": 1e-4}  # fp32 sums in another order
    torch.testing.assert_close(got, want, **close)
    torch.testing.assert_close(xo.grad, xr.grad, **close)
    for name, p in layer.named_parameters():
        torch.testing.assert_close(p.grad, dict(ref.named_parameters())[name].grad, **close)


def test_linear_takes_nn_linears_path_off_its_shapes():
    """Under bf16 autocast, in bf16, and for an empty batch (which oneDNN refuses) it is nn.Linear."""
    layer = torch.nn.Linear(8, 4)
    onednn.train_on_onednn(layer)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(torch.randn(2, 8)).dtype == torch.bfloat16
    empty = torch.zeros(0, 8, requires_grad=True)
    layer(empty).sum().backward()
    assert empty.grad.shape == (0, 8)
    bf16 = layer.to(torch.bfloat16)(torch.randn(2, 8, dtype=torch.bfloat16))
    assert type(bf16.grad_fn).__name__ != "_LinearFnBackward"


def _adam_steps(model: torch.nn.Module, batch: torch.Tensor, steps: int) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_training_on_onednn_follows_the_default_run(tiny_model):
    """With model.cpu_matmul: onednn the training stages' model (every linear on oneDNN, the tied LM head
    still tied) trains as the default model does: the same losses and weights after AdamW steps, both far
    from the start."""
    assert not any(type(m) is onednn.OneDNNLinear for m in trainable(tiny_model).modules())  # the default
    model = trainable(tiny_model, "onednn")
    default = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert layers and all(type(m) is onednn.OneDNNLinear for m in layers)
    if model.config.tie_word_embeddings:
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    start = {k: v.clone() for k, v in default.state_dict().items()}
    batch = torch.randint(0, model.config.vocab_size, (4, 48), generator=torch.Generator().manual_seed(0))
    got, want = _adam_steps(model, batch, 6), _adam_steps(default, batch, 6)
    assert want[-1] < want[0] - 2  # it learned (from ln(vocab) = 10.8)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # weights after 6 AdamW steps: on an Intel Xeon MKL and oneDNN sum in orders that leave 4 of 2,048 weights
    # 1.7e-5 apart (AdamW's normalised steps amplify last-bit differences of near-zero gradients); still far
    # below one step's size (lr 1e-2)
    for k, v in default.state_dict().items():
        torch.testing.assert_close(model.state_dict()[k], v, rtol=1e-4, atol=5e-5)
        assert not torch.equal(v, start[k])  # moved


def test_generation_packs_the_training_linears(tiny_model):
    """RL's rollouts run on the training model: its OneDNNLinear layers decode on packed weights too."""
    model = trainable(tiny_model, "onednn")
    layers = [m for m in model.modules() if type(m) is onednn.OneDNNLinear]
    with torch.no_grad(), prepacked.prepacked(model, 4):
        assert all("forward" in vars(m) for m in layers)
    assert all("forward" not in vars(m) for m in layers)


SEEN: list[str] = []


class LayerTypes(TrainerCallback):
    """Notes the classes of the linear layers the trainer trains (a LoRA adapter wraps the base layer)."""

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        SEEN.extend(type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_an_sft_job_with_lora_trains_on_onednn(tiny_model, tmp_path):
    """The job's cpu_matmul (params model.cpu_matmul, passed by flows.sft) reaches the trainer's model,
    LoRA's base layers included, and the job trains."""
    data = tmp_path / "traces.jsonl"
    files.write_jsonl(data, traces.from_solutions(sums(8, lambda i: 2, solutions=True), SolutionTraces(), FMT))
    params = SFTParams(max_steps=2, per_device_train_batch_size=4, lora={"r": 4, "alpha": 8})
    SEEN.clear()
    sft_job = job(
        SFTJob,
        tiny_model,
        data,
        tmp_path / "work",
        key="sft",
        params=params,
        seed=3,
        cpu_matmul="onednn",
        callbacks=["tests.test_onednn:LayerTypes"],
    )
    assert sft.train(sft_job).metrics["steps"] == 2
    layers = sum(isinstance(m, torch.nn.Linear) for m in trainable(tiny_model).modules())
    assert SEEN.count("OneDNNLinear") == layers  # every base layer; LoRA's own A and B are plain nn.Linear


def test_freed_memory_is_reused_without_faulting_pages_again():
    """Once keep_freed_memory has run, a 256 MB buffer allocated, touched and freed again and again is
    served from pages the process holds: glibc's default maps it afresh each time and faults in all 65,536
    of its pages again (the heap settles after two rounds). Counts are the whole process's, so a round in which
    another thread of a busy test worker faults pages too can read high: a settled round must exist among the last
    three, where glibc's default faults in every one of them (a CI worker read [1, 0, 0, 17583] once)."""
    if not keep_freed_memory():
        pytest.skip("not glibc")
    faults = []
    for _ in range(5):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.ones(64 << 20)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    assert min(faults[2:]) < 4096, faults
