"""How a (prompt, completion) becomes the token ids a learned reward scores, at training and at every later
use alike: the prompt as the policy saw it (rung.generate.completion.encode), then the completion's text with
its special-token strings kept as text (a model wrote it: `<|im_end|>` inside it must not end the turn), then
EOS. A process reward model's completion is its steps, each encoded alone, so that each step ends on a token
of its own: the token whose score is that step's."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from rung.answers import formats
from rung.config import FormatParams
from rung.generate.completion import encode


def prompt_ids(tok: PreTrainedTokenizerBase, prompt: str, fmt: FormatParams) -> list[int]:
    """The problem's ids as the policy was prompted with them (the response format's template)."""
    return encode(tok, [formats.prompt(prompt, fmt)])[0]


def text_ids(tok: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Model-written text's ids, special-token strings kept as text."""
    return tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def completion_ids(tok: PreTrainedTokenizerBase, prompt: list[int], completion: str) -> list[int]:
    """The sequence a reward model scores: prompt, completion, EOS (its score is read at the last token)."""
    return [*prompt, *text_ids(tok, completion), tok.eos_token_id]


def step_ids(tok: PreTrainedTokenizerBase, prompt: list[int], steps: list[str]) -> tuple[list[int], list[int]]:
    """The sequence a process reward model scores and the index of each step's last token (where its score
    is read). A step that encodes to no token (empty text) ends where the one before it does."""
    ids, ends = list(prompt), []
    for step in steps:
        ids += text_ids(tok, step)
        ends.append(len(ids) - 1)
    return ids, ends
