"""An RL stage's LoRA model on rung's fast paths (rung.rl.lora): rollouts decode a merged plain copy, log-probs run
rung's shared-prefix path on the peft model's inner model, and neither touches the frozen base."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
from trl.trainer.utils import add_fused_lm_head

from rung.config import SamplingParams
from rung.generate.api import generate_ids
from rung.rl.engine import GenerationModel
from rung.rl.logprobs import LogProbs
from rung.train.parts import LogpsBatch


@pytest.fixture
def peft_model(tiny_model):
    """The tiny model with dropout-free adapters whose updates are not zero (peft starts B at 0), and TRL's fused
    LM head on its inner model as the trainers add it."""
    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model),
        LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    add_fused_lm_head(model.get_base_model(), outputs=("log_probs", "entropy"))
    return model


def test_rollouts_decode_a_merged_copy_equal_to_the_peft_model_and_leave_its_base_alone(peft_model):
    base = {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_" not in n}
    generation = GenerationModel(None)
    copy = generation(peft_model)
    assert type(copy) is type(peft_model.get_base_model()) and not any("lora" in k for k in copy.state_dict())
    ids = torch.randint(0, peft_model.config.vocab_size, (3, 12))
    with torch.no_grad():
        want = peft_model(input_ids=ids).logits
        torch.testing.assert_close(copy(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)
        plain = peft_model.get_base_model()
        with peft_model.disable_adapter():
            assert (plain(input_ids=ids).logits - want).abs().max() > 1e-3  # the adapters change the outputs
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    prompts = ids.tolist()
    merged, unmerged = (generate_ids(m, prompts, greedy, [-1], desc=None) for m in (copy, peft_model))
    assert merged == unmerged
    for n, p in peft_model.named_parameters():
        if n in base:
            assert torch.equal(p, base[n])  # bit for bit: the trained model is never merged

    with torch.no_grad():  # a refresh follows the adapters' update, in place
        next(p for n, p in peft_model.named_parameters() if "lora_B" in n).add_(0.5)
    assert generation(peft_model) is copy
    torch.testing.assert_close(copy(input_ids=ids).logits, peft_model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_shared_prefix_logprobs_of_a_peft_model_match_its_forward_and_train_only_the_adapters(peft_model):
    torch.manual_seed(1)
    prefix = torch.randint(0, 100, (10,))
    prompts = [torch.cat([prefix, torch.randint(0, 100, (3,))]) for _ in range(2)]
    completions = torch.randint(0, 100, (4, 5))
    input_ids = torch.stack([torch.cat([prompts[i // 2], completions[i]]) for i in range(4)])  # groups of 2
    mask = torch.ones_like(input_ids)
    mask[1, -2:] = 0  # a shorter completion
    batch = LogpsBatch(peft_model, input_ids, mask, 5, None, False, False, {})
    logps, _, _ = LogProbs(peft_model.config, 1, nullcontext)(batch) or pytest.fail("rung's path declined a peft model")
    logits = peft_model(input_ids=input_ids, attention_mask=mask).logits[:, -6:-1]
    want = logits.log_softmax(-1).gather(-1, input_ids[:, -5:, None])[..., 0]
    torch.testing.assert_close(logps * mask[:, -5:], want * mask[:, -5:], rtol=1e-4, atol=1e-4)
    logps.sum().backward()
    grads = {n: p.grad for n, p in peft_model.named_parameters()}
    assert all(g is not None and g.abs().sum() > 0 for n, g in grads.items() if "lora_B" in n)
    assert all(g is None for n, g in grads.items() if "lora_" not in n)  # the base is frozen
