"""What every generation backend returns and is used through: a Completion per sample, and a
Generator that renders prompts to token ids exactly as TRL's trainers do and samples from them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from rung.answers.formats import Prompt
from rung.errors import InputError


@dataclass(frozen=True)
class Completion:
    text: str
    tokens: int
    truncated: bool
    """True when generation stopped at max_new_tokens instead of an end-of-sequence token."""


def render(tok: PreTrainedTokenizerBase, prompts: list[Prompt]) -> list[str]:
    """Chat-template each conversation with the assistant turn opened; a plain-template prompt
    (already a string) is used as it is."""
    if any(not isinstance(p, str) for p in prompts) and tok.chat_template is None:
        raise InputError("format.template: chat, but the model's tokenizer has no chat template (use template: plain)")
    return [p if isinstance(p, str) else _chat(tok, p) for p in prompts]


def _chat(tok: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> str:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert isinstance(text, str)  # tokenize=False
    return text


def encode(tok: PreTrainedTokenizerBase, prompts: list[Prompt]) -> list[list[int]]:
    """Each prompt's token ids as TRL's SFT and GRPO / RLOO trainers tokenize it, so a checkpoint is
    scored on the context it was trained on: a conversation through the chat template, which writes
    any BOS itself (TRL's `apply_chat_template(tokenize=True)` adds no special tokens); a plain-template
    text with the tokenizer's special tokens (TRL calls `tok(text)`), i.e. with the BOS that Llama 3,
    Mistral or Gemma tokenizers add (SmolLM2's and Qwen's add none)."""
    return [
        tok(text, add_special_tokens=isinstance(p, str))["input_ids"]
        for p, text in zip(prompts, render(tok, prompts), strict=True)
    ]


def token_ids(tok: PreTrainedTokenizerBase, prompts: Sequence[str | list[int]]) -> list[list[int]]:
    """The ids a backend generates from: `encode`'s ids as they are, a rendered text (chat-template
    output, e.g. from `render`) without added special tokens."""
    return [p if isinstance(p, list) else tok(p, add_special_tokens=False)["input_ids"] for p in prompts]


def decode_text(tok: PreTrainedTokenizerBase, ids: list[int]) -> str:
    """The text of one completion's token ids, without special tokens."""
    text = tok.decode(ids, skip_special_tokens=True)
    assert isinstance(text, str)  # one sequence of ids: one string
    return text


@dataclass(frozen=True)
class Generator:
    """A loaded model that samples: `generate(prompts, sampling, n, seed, desc)` -> n completions
    per prompt (token ids from `render`, or rendered texts; see `token_ids`), in input order;
    `device` and `dtype` say where it runs."""

    tok: PreTrainedTokenizerBase
    generate: Callable[..., list[list[Completion]]]
    device: str = "cpu"
    dtype: str = "float32"
    close: Callable[[], None] | None = None
    """Ends what the backend started (the vLLM worker); None: nothing to end (the process's exit does)."""
    model: PreTrainedModel | None = None
    """The transformers backend's model, for callers that work on token ids (rung.envs.loop); None on vLLM."""

    def render(self, prompts: list[Prompt]) -> list[list[int]]:
        """The prompts' token ids, as the trainers tokenize them (`encode`)."""
        return encode(self.tok, prompts)


def stop_ids(config: GenerationConfig | None, tok: PreTrainedTokenizerBase) -> list[int]:
    """The token ids that end a completion, sorted: the model's generation config's EOS id(s), else the
    tokenizer's EOS."""
    eos = config.eos_token_id if config else None
    return sorted(set(([eos] if isinstance(eos, int) else eos) or [tok.eos_token_id]))
