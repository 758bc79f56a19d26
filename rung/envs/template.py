"""A chat template that can render tool calls, and the one parser of tool calls that TRL and rung share.

SmolLM2-135M-Instruct's own template is plain ChatML: it drops `tool_calls` and the tools, so TRL 1.16's
`supports_tool_calling` refuses it and `GRPOTrainer(tools=... / environment_factory=...)` raises. rung ships
`chatml_tools.jinja` (this package): SmolLM2's ChatML, byte-identical for conversations without tools, plus
the Hermes / Qwen2.5 tool format — the tools' JSON schemas in the system message, a call as
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` in the assistant turn, results as
`<tool_response>` blocks in one user turn. It uses SmolLM2's existing vocabulary (no new tokens, no embedding
resize), is prefix-preserving (TRL's loop appends tool results by token concatenation) and carries
`{% generation %}` markers, so SFT's assistant-only loss masks tool results and TRL never swaps it for a
"training" template.

Parsing is transformers' own (`tokenizer.parse_response`, driven by `tokenizer.response_template`, which
`save_pretrained` writes to tokenizer_config.json and `from_pretrained` reads back), called through TRL's
wrapper `trl.chat_template_utils.parse_response` (malformed calls fall back to plain text). TRL's
GRPOTrainer calls `add_response_schema` only when the tokenizer has no `response_template`, so `apply()`
setting RESPONSE_TEMPLATE makes TRL parse with exactly the template rung parses with (`parse()`).

Real model families whose own templates work unchanged with TRL 1.16's tool loop (checked against the
templates TRL stores byte-identically in trl/chat_templates/, by `supports_tool_calling`,
`add_response_schema` and prefix preservation, the three things GRPOTrainer's `__init__` needs):

- Qwen2.5 (instruct, not -VL), Qwen3 (incl. Instruct-2507; TRL swaps in its prefix-preserving training
  template), Qwen3-VL, Qwen3.5 / 3.6 / 3.8;
- Llama 3.1 and 3.2 (one tool call per turn, `parameters` key; no training template for SFT's
  assistant-only loss);
- GLM-4-MoE, GPT-OSS, Gemma 4 (no training template for SFT's assistant-only loss), LFM2 (its second
  revision) and LFM2.5, NVIDIA Nemotron 3 (Nano / Super / Ultra / 3.5 Lightning);
- Muse Glimmer only with its checkpoint's own `response_template`.

Not without a template like this one: SmolLM2-Instruct's ChatML, Llama 3 (3.0), Gemma 1-3, Phi-3 / 3.5,
Cohere, Qwen2.5-VL, DeepSeek-R1-Distill (no tool calls) and DeepSeek-V3 / DiffusionGemma (they render calls,
but TRL has no parser for them). `tool_calling_problem()` says which check a tokenizer fails.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase
from trl.chat_template_utils import (
    add_response_schema,
    get_training_chat_template,
    is_chat_template_prefix_preserving,
    parse_response,
    supports_tool_calling,
)

from rung.errors import InputError

TEMPLATE_FILE = "chatml_tools.jinja"
TEMPLATE: str = (resources.files(__package__) / TEMPLATE_FILE).read_text(encoding="utf-8")
"""rung's tool-capable ChatML (rung/envs/chatml_tools.jinja)."""

RESPONSE_TEMPLATE: dict[str, Any] = {
    # transformers' response_template format (transformers/utils/chat_parsing): TRL's `qwen3_template` for
    # the same tool-call blocks, without its <think> field: rung's `tags` answer style writes <think> into the
    # answer, and its format reward must see it in `content`.
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}
"""How an assistant turn in TEMPLATE's format parses into a message: content and tool_calls."""

FIX = (
    "use rung's tool template (rung.envs.template.apply: SmolLM2's ChatML with Qwen2.5 tool calls, "
    "rung/envs/chatml_tools.jinja) or a model whose own template renders tool calls (Qwen2.5/3, Llama 3.1+)"
)
"""The one-line fix appended to every refusal of a chat template."""


def apply(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Give `tokenizer` rung's tool template and its response template (in place; returned for chaining).
    Both travel with `save_pretrained`."""
    tokenizer.chat_template = TEMPLATE
    tokenizer.response_template = copy.deepcopy(RESPONSE_TEMPLATE)
    return tokenizer


def parse(
    tokenizer: PreTrainedTokenizerBase,
    completion_ids: list[int],
    prefix_ids: list[int],
    tools: list[Callable[..., Any] | dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], str | None]:
    """One generated assistant turn as a message ({"role", "content", "tool_calls"?}), parsed exactly as
    TRL's GRPOTrainer parses it: `prefix_ids` is the prompt it was generated after, `tools` types the
    arguments by each tool's JSON schema. With it, why the turn's tool-call blocks are malformed (TRL then
    gives the turn as plain content, a final answer), None where they are not or there are none."""
    if getattr(tokenizer, "response_template", None) is None:
        add_response_schema(tokenizer)  # what TRL does for a known model template; raises for an unknown one
    message = parse_response(tokenizer, completion_ids, prefix=prefix_ids, tools=tools)
    if "tool_calls" in message:
        return message, None
    try:  # TRL's fallback to plain text hides why: the parser again, without it
        raw = tokenizer.parse_response(completion_ids, prefix=prefix_ids, tools=tools)
    except (ValueError, TypeError) as e:
        return message, _why(str(e))
    if raw and raw.get("tool_calls"):  # parsed, but TRL's validation refused a call
        return message, 'each call needs a string "name" and an "arguments" object'
    return message, None


def _why(error: str) -> str:
    # transformers' JSON error is "...could not parse region as JSON.\nContent: <the block>\nError: <json's>"
    return f"not valid JSON ({error.rsplit('Error: ', 1)[-1]})" if "as JSON" in error else error.split("\n")[0]


_SLOT = re.compile("\ue000(\\d+)\ue001")  # private-use code points: where a message's text goes


def _pieces(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[Callable[..., Any] | dict[str, Any]] | None,
    add_generation_prompt: bool,
) -> list[str]:
    """The rendered chat cut into the template's markup (even places) and the messages' texts (odd places).
    An empty text stays in the markup: templates test it (`if message['content']`) to decide what they write."""
    slotted = [
        {**m, "content": f"\ue000{i}\ue001"} if isinstance(m.get("content"), str) and m["content"] else m
        for i, m in enumerate(messages)
    ]

    def render(chat: list[dict[str, Any]]) -> str:
        text = tokenizer.apply_chat_template(
            chat, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        assert isinstance(text, str)  # tokenize=False
        return text

    parts = _SLOT.split(render(slotted))
    texts = [messages[int(p)]["content"] if i % 2 else p for i, p in enumerate(parts)]
    if "".join(texts) != render(messages):
        raise InputError(f"the chat template rewrites message text: rung cannot keep it plain; fix: {FIX}")
    return texts


def _encode(tokenizer: PreTrainedTokenizerBase, pieces: list[str], **kwargs: Any) -> list[Any]:
    """Each piece's encoding: the markup with its special tokens, a text as plain text."""
    return [
        tokenizer(p, add_special_tokens=False, split_special_tokens=bool(i % 2), **kwargs) for i, p in enumerate(pieces)
    ]


def render_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[Callable[..., Any] | dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
) -> list[int]:
    """`messages` through the chat template as `apply_chat_template(tokenize=True)` gives them, but the text of
    every message (a tool's output, the environment's reply and observation, the prompt, an assistant turn the
    model or a dataset wrote) tokenized as plain text (`split_special_tokens`): text that spells a special token
    (`<|im_end|>`) gets the ids of its characters, never the token, so that it cannot close its turn and forge
    the next one. Each text is rendered as a slot and tokenized alone; raises InputError for a template that
    rewrites message text."""
    pieces = _pieces(tokenizer, messages, tools, add_generation_prompt)
    return [t for encoding in _encode(tokenizer, pieces) for t in encoding.input_ids]


def render_masked(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[Callable[..., Any] | dict[str, Any]] | None = None,
) -> tuple[list[int], list[int]]:
    """`render_ids` of a whole conversation, and its assistant mask: 1 on each token that overlaps what the
    template's `{% generation %}` blocks wrote (the assistant's turns), as `apply_chat_template(
    return_assistant_tokens_mask=True)` marks its own tokens. The blocks are located in the rendered text, not
    in tokens, so a text that spells a special token moves no boundary."""
    pieces = _pieces(tokenizer, messages, tools, False)
    marked = tokenizer.apply_chat_template(
        messages,
        tools=tools,
        return_dict=True,
        return_assistant_tokens_mask=True,
        tokenizer_kwargs={"return_offsets_mapping": True},
    )
    assert isinstance(marked, Mapping)  # return_dict=True: a BatchEncoding
    generated = [False] * sum(map(len, pieces))  # per character of the rendered chat
    for (a, b), m in zip(marked["offset_mapping"], marked["assistant_masks"], strict=True):
        if m:
            generated[a:b] = [True] * (b - a)
    ids: list[int] = []
    mask: list[int] = []
    start = 0
    for piece, encoding in zip(pieces, _encode(tokenizer, pieces, return_offsets_mapping=True), strict=True):
        ids += encoding.input_ids
        mask += [int(any(generated[start + a : start + b])) for a, b in encoding.offset_mapping]
        start += len(piece)
    return ids, mask


def tool_calling_problem(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """Why TRL's GRPOTrainer would refuse `tokenizer` for tools (None: it accepts it), in a few words; each
    reason is one of the checks GRPOTrainer.__init__ makes (trl/trainer/grpo_trainer.py, 1.16)."""
    if tokenizer.chat_template is None:
        return "the model has no chat template"
    if not supports_tool_calling(tokenizer):
        return "its chat template cannot render a tool call and its result (TRL's supports_tool_calling)"
    if getattr(tokenizer, "response_template", None) is None:
        try:
            add_response_schema(copy.deepcopy(tokenizer))
        except ValueError:
            return "TRL has no parser for its tool calls (no response_template, add_response_schema refuses it)"
    try:
        preserving = is_chat_template_prefix_preserving(tokenizer)
    except (TemplateError, TypeError, ValueError) as e:
        return f"its chat template fails on a tool conversation ({type(e).__name__}: {e})"
    if not preserving:
        try:
            get_training_chat_template(tokenizer)
        except ValueError:
            return "its chat template is not prefix-preserving and TRL has no training template for it"
    return None
