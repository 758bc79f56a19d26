"""A tiny model taught one episode by heart, so that its rollouts run a given environment's turns (tool calls,
retry's second answer) deterministically enough to test the episode loop on the CPU or a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

RETRY = [
    {"role": "user", "content": "What is 17 * 23?"},
    {"role": "assistant", "content": "Answer: 390"},
    {"role": "user", "content": "Let's try again."},
    {"role": "assistant", "content": "Answer: 391"},
]
"""A wrong answer, retry's feedback, the right one."""


def memorize(
    model_dir: Path, tok: Any, out: Path, episode: list[dict], tools: list | None = None, lr: float = 1e-2
) -> Path:
    """`model_dir` trained to say `episode`'s assistant turns after its prompt (with `tools` in the template, if
    any); the loss is on the assistant tokens only (the template's generation markers), computing logits only
    there: ~4 s for the 1.6M-parameter tiny model."""
    enc = tok.apply_chat_template(
        episode, tools=tools, return_dict=True, return_assistant_tokens_mask=True, tokenize=True
    )
    ids = torch.tensor(enc["input_ids"])
    targets = torch.tensor([i for i, m in enumerate(enc["assistant_masks"]) if m])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(100):
        hidden = model.model(input_ids=ids[None]).last_hidden_state[0, targets - 1]
        loss = torch.nn.functional.cross_entropy(model.lm_head(hidden), ids[targets])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert loss.item() < 0.1
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
