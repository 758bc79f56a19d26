"""A tiny random Llama with the SmolLM2 tokenizer: seconds per stage, for tests."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from rung.models import embedded_gguf_path


def build(out_dir: Path, **shape: float) -> Path:
    """Save the tiny model (and its tokenizer) in `out_dir`; `shape` overrides LlamaConfig fields."""
    gguf = embedded_gguf_path()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
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
