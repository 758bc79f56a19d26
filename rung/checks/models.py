"""The model a stage starts from: a local directory or GGUF that exists and has a tokenizer, a hub
id cached when offline, a chat template where `format.template: chat` needs one, and the difficulty
reference that an RL stage's pass rates come from."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from rung import files
from rung.config import Params
from rung.errors import InputError
from rung.models import EMBEDDED

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")

log = logging.getLogger(__name__)


def base_model(params: Params) -> None:
    """model.source, and its chat template when the format renders chats (the model stage)."""
    _model(params.model.source, "model.source")
    chat_template(params)


def chat_template(params: Params) -> None:
    """The chat template of model.source, for the stages that render prompts with it."""
    if params.format.template == "chat":
        _chat_template(params.model.source, "model.source")


def trace_models(params: Params) -> None:
    """The models sft.traces distill from or sample with (the traces stage)."""
    for trace in params.sft.traces:
        model = getattr(trace, "model", "base")
        if model != "base":
            _model(model, "sft.traces.model")
            if params.format.template == "chat":
                _chat_template(model, "sft.traces.model")


def difficulty_reference(params: Params) -> None:
    """Warn (one line) when an RL stage that reads offline pass rates (its buckets, a curriculum other
    than uniform, or a narrowed keep window) starts from another checkpoint than `difficulty.reference`
    scored: the rates then describe a different model from the policy its rewards grade. A warning,
    not an error: scoring with the base model (so difficulty need not wait for SFT) is a choice."""
    p = params.difficulty
    window = (p.pass_rate_min, p.pass_rate_max) != (0.0, 1.0)
    stages = [
        f"rl.stages.{name} (init: {stage.init})"
        for name, stage in params.rl.stages.items()
        if stage.init in ("base", "sft")  # a later stage's init is an RL checkpoint, never scored
        and stage.init != p.reference
        and (window or stage.buckets is not None or stage.curriculum.type != "uniform")
    ]
    if stages:
        log.warning(
            f"difficulty.reference: {p.reference}, but {', '.join(stages)} starts from another checkpoint: "
            "its pass rates are not its policy's"
        )


def _model(source: str, key: str) -> None:
    """A local model directory needs a config and a tokenizer; a hub id must be cached when offline."""
    if source == EMBEDDED:
        return
    path = Path(source).expanduser()
    if path.suffix == ".gguf" or files.is_local_path(source):
        if path.suffix == ".gguf":
            if not path.is_file():
                raise InputError(f"{key}: GGUF file not found: {source}")
            return
        if not path.is_dir():
            raise InputError(f"{key}: directory not found: {source}")
        if not (path / "config.json").is_file():
            raise InputError(f"{key}: {source} has no config.json (not a Hugging Face model directory)")
        if not any((path / f).is_file() for f in TOKENIZER_FILES):
            raise InputError(f"{key}: {source} has no tokenizer ({' / '.join(TOKENIZER_FILES)})")
        return
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(source, "config.json"), str):
            raise InputError(f"{key}: {source!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE=1")


def _chat_template(source: str, key: str) -> None:
    """`format.template: chat` needs a tokenizer with a chat template (base models often have none)."""
    found = _has_chat_template(source)
    if found is False:
        raise InputError(
            f"format.template: chat, but {key} {source!r} has no chat template "
            "(use template: plain with a plain_template)"
        )


def _has_chat_template(source: str) -> bool | None:
    """Whether the model's tokenizer has a chat template; None when it cannot be told without a download."""
    if source == EMBEDDED:
        return True  # SmolLM2-135M-Instruct
    path = Path(source).expanduser()
    if path.suffix == ".gguf":
        from gguf import GGUFReader

        return "tokenizer.chat_template" in GGUFReader(path).fields
    if path.is_dir():
        config = path / "tokenizer_config.json"
        return (
            (path / "chat_template.jinja").is_file()
            or (path / "chat_template.json").is_file()
            or (config.is_file() and bool(json.loads(config.read_text()).get("chat_template")))
        )
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(source, "tokenizer_config.json")
    if not isinstance(cached, str):
        return None  # not downloaded yet: the stage that loads it checks (rung.generate.completion.render)
    jinja = try_to_load_from_cache(source, "chat_template.jinja")
    return isinstance(jinja, str) or bool(json.loads(Path(cached).read_text()).get("chat_template"))
