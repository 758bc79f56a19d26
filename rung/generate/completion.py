"""What every generation backend returns and is used through: a Completion per sample, and a
Generator that renders prompts with the model's chat template and samples from them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from transformers import GenerationConfig, PreTrainedTokenizerBase

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
    return [
        p if isinstance(p, str) else tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]


@dataclass(frozen=True)
class Generator:
    """A loaded model that samples: `generate(prompts, sampling, n, seed, desc)` -> n completions
    per rendered prompt, in input order; `device` and `dtype` say where it runs."""

    tok: PreTrainedTokenizerBase
    generate: Callable[..., list[list[Completion]]]
    device: str = "cpu"
    dtype: str = "float32"
    close: Callable[[], None] | None = None
    """Ends what the backend started (the vLLM worker); None: nothing to end (the process's exit does)."""

    def render(self, prompts: list[Prompt]) -> list[str]:
        return render(self.tok, prompts)


def stop_ids(config: GenerationConfig | None, tok: PreTrainedTokenizerBase) -> list[int]:
    """The token ids that end a completion, sorted: the model's generation config's EOS id(s), else the
    tokenizer's EOS."""
    eos = config.eos_token_id if config else None
    return sorted(set(([eos] if isinstance(eos, int) else eos) or [tok.eos_token_id]))
