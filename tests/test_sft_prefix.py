"""SFT's loss with the rows' shared prefix run once per batch (rung.train.prefix.SharedPrefixSFT) equals TRL's
own: the loss, every gradient and the logged entropy and token accuracy, on a batch of the tiny model's traces
(system prompt and chat template shared, prompts and answers of different lengths, right padding)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from rung.config import FormatParams
from rung.train.prefix import SharedPrefixSFT, _PrefixOnce
from rung.train.sft import examples
from tests.rows import sums


@pytest.mark.parametrize("system", [True, False], ids=["system-prompt", "instruction-in-the-user-turn"])
def test_shared_prefix_loss_and_gradients_equal_trls(tiny_model, tmp_path, system):
    fmt = FormatParams(system_message=system)
    traces = [
        {"prompt": r["prompt"] + " Explain." * (i % 3), "target": f"{r['solution']}\nAnswer: {r['answer']}"}
        for i, r in enumerate(sums(6, lambda i: i % 4 + 1, solutions=True))
    ]
    tok = AutoTokenizer.from_pretrained(tiny_model)
    torch.manual_seed(0)
    trainer = SharedPrefixSFT(
        model=AutoModelForCausalLM.from_pretrained(tiny_model),
        args=SFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=6, use_cpu=True, report_to=[]),
        train_dataset=examples(traces, fmt, tok),
        processing_class=tok,
    )
    batch = next(iter(trainer.get_train_dataloader()))
    model = trainer.model
    model.train()
    shared = trainer._shared(model, batch)
    assert shared > 8  # template, system prompt or instruction: the prefix path runs

    def run(compute_loss):
        model.zero_grad()
        trainer._metrics["train"].clear()
        loss = compute_loss(trainer, model, dict(batch))
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        return loss.detach(), grads, {k: v[-1] for k, v in trainer._metrics["train"].items() if k != "num_tokens"}

    ours, theirs = run(SharedPrefixSFT.compute_loss), run(SFTTrainer.compute_loss)
    torch.testing.assert_close(ours[0], theirs[0], atol=1e-6, rtol=1e-5)
    for a, b in zip(ours[1], theirs[1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    assert ours[2].keys() == theirs[2].keys() and ours[2]
    assert ours[2] == pytest.approx(theirs[2], rel=1e-5)
    # every tensor of the prefix path comes from the model's device: made without one, it would land on meta
    with torch.no_grad(), torch.device("meta"):
        once = _PrefixOnce(model, shared)(**batch, fused_lm_head=True)
    with torch.no_grad():
        whole = model(**batch, fused_lm_head=True)
    torch.testing.assert_close(once.log_probs.sum(), whole.log_probs.sum(), atol=1e-5, rtol=1e-5)
