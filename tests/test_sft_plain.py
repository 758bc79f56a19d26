"""rung tokenizes SFT examples itself, every text as plain text (rung.train.sft.examples; the forged-turn test is
tests/test_episodes.py's): on ordinary text its examples are exactly those TRL's SFTTrainer tokenizes from the
prompt/completion conversations, the same ids and the same trained tokens, for every kind of trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trl
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from rung.answers import formats
from rung.config import FormatParams
from rung.envs import template
from rung.train.sft import examples
from tests.rows import sums

ROWS = sums(4, lambda i: i % 3 + 1, solutions=True)
SCHEMA = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code and return what it prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}


def single(fmt: FormatParams) -> list[dict]:
    """Solution traces (the demo's) and retry traces (a wrong answer and the feedback in the prompt)."""
    solved = [{"prompt": r["prompt"], "target": formats.target(r["answer"], r["solution"], fmt)} for r in ROWS]
    if fmt.template == "plain":
        return solved
    wrong = [{"role": "assistant", "content": "Answer: 99"}, {"role": "user", "content": "Let's try again."}]
    return solved + [{**t, "history": wrong} for t in solved[:2]]


def tool_calls(fmt: FormatParams) -> list[dict]:
    """Episodes as rung.data.traces.from_tool_calls writes them, among single-turn traces."""
    episodes = []
    for r in ROWS[:2]:
        call = {"type": "function", "function": {"name": "python", "arguments": {"code": f"print({r['answer']})"}}}
        messages = [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "python", "content": f"{r['answer']}\n"},
            {"role": "assistant", "content": f"Answer: {r['answer']}"},
        ]
        target = messages[-1]["content"]
        episodes.append({"prompt": r["prompt"], "target": target, "messages": messages, "tools": json.dumps([SCHEMA])})
    return episodes + single(fmt)


def trls(traces: list[dict], fmt: FormatParams) -> Dataset:
    """The traces as TRL tokenizes them itself: prompt/completion conversations (or texts), tools' schemas."""
    rows = []
    for t in traces:
        prompt = formats.prompt(t["prompt"], fmt)
        if isinstance(prompt, str):
            rows.append({"prompt": prompt, "completion": t["target"]})
            continue
        completion = t.get("messages") or [{"role": "assistant", "content": t["target"]}]
        rows.append({"prompt": [*prompt, *t.get("history", [])], "completion": completion, "tools": t.get("tools")})
    return Dataset.from_list(rows)


QWEN2_5 = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
"""A template without generation markers for which TRL has a training template that has them."""


@pytest.mark.parametrize(
    "fmt, kind, chat_template",
    [
        (FormatParams(), single, None),  # SmolLM2's own template, the demo's
        (FormatParams(), tool_calls, template.TEMPLATE),
        (FormatParams(), tool_calls, QWEN2_5),
        (FormatParams(template="plain"), single, None),
    ],
    ids=["chat", "episodes", "episodes-trl-training-template", "plain"],
)
def test_examples_are_trls_on_ordinary_text(tiny_model, tmp_path, fmt, kind, chat_template):
    episodes = kind is tool_calls
    tok = AutoTokenizer.from_pretrained(tiny_model)
    tok.chat_template = chat_template or tok.chat_template
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    traces = kind(fmt)

    def prepared(data: Dataset, assistant_only: bool) -> list[tuple[list[int], list[int]]]:
        args = SFTConfig(
            str(tmp_path), completion_only_loss=True, assistant_only_loss=assistant_only, use_cpu=True, report_to=[]
        )
        trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
        return [(r["input_ids"], r["labels"]) for r in trainer.train_dataset]

    ours, theirs = prepared(examples(traces, fmt, tok), False), prepared(trls(traces, fmt), episodes)
    assert ours == theirs
    trained = [tok.decode([i for i, label in zip(*row, strict=True) if label != -100]) for row in ours]
    assert len(ours) == len(traces) and all("Answer: " in t for t in trained)  # every example trains its answer
    if episodes:  # the assistant's call is trained, the tool's output only read
        assert "<tool_call>" in trained[0] and "<tool_response>" not in trained[0]
        assert "<tool_response>" in tok.decode(ours[0][0])
