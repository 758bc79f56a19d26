"""The model a stage starts from: a local directory or GGUF that exists and has a tokenizer, a hub
id cached when offline, a chat template where `format.template: chat` needs one, LoRA target modules
that the model has, and the difficulty reference that an RL stage's pass rates come from."""

from __future__ import annotations

import json
import logging
import os
from functools import cache
from pathlib import Path

from rung import files
from rung.config import LoraParams, ModelParams, Params
from rung.errors import InputError
from rung.models import EMBEDDED, embedded_gguf_path

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


def lora_targets(lora: LoraParams | None, model: ModelParams, key: str) -> None:
    """`<key>.target_modules` (a list of names, or one regular expression) must each match modules of
    `model.source` that LoRA can adapt, as peft matches them (else peft fails when training starts); checked
    on the model built from its config on the meta device. The stages' checkpoints share the source's modules."""
    if lora is None or lora.target_modules == "all-linear":
        return
    modules = _adaptable_modules(model.source, model.revision)
    if modules is None:
        return  # a hub model not downloaded yet: peft says it when the stage starts
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists

    targets = lora.target_modules
    for target in [targets] if isinstance(targets, str) else targets:
        matcher = LoraConfig(target_modules=target if isinstance(targets, str) else [target])
        matched = [name for name in modules if check_target_module_exists(matcher, name)]
        if matched and all(modules[name] for name in matched):
            continue
        valid = sorted({name.rpartition(".")[2] for name, ok in modules.items() if ok})
        if matched:
            what = f"matches {next(n for n in matched if not modules[n])}, which LoRA cannot adapt"
        elif isinstance(targets, str):  # peft's rule: one string is a regular expression over full names
            example = next(name for name, ok in modules.items() if ok and name.endswith(valid[0]))
            what = f"matches no full module name of {model.source} (one string is a regular expression, e.g. {example})"
        else:
            what = f"names no module of {model.source}"
        more = ", ..." if len(valid) > 10 else ""
        raise InputError(
            f"{key}.target_modules: {target!r} {what}; modules LoRA can adapt: {', '.join(valid[:10])}{more}"
        )


@cache
def _adaptable_modules(source: str, revision: str | None) -> dict[str, bool] | None:
    """Every module of the model (dotted name -> whether peft's LoRA can adapt its type), built from the
    config alone on the meta device (no weights read); None when the config is not on this machine."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.pytorch_utils import Conv1D

    path = Path(source).expanduser()
    try:
        if source == EMBEDDED or path.suffix == ".gguf":
            gguf = embedded_gguf_path() if source == EMBEDDED else path
            config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        else:
            config = AutoConfig.from_pretrained(source, revision=revision, local_files_only=not path.is_dir())
    except (OSError, InputError):  # not downloaded, or the embedded model's wheel is missing here
        return None
    if hasattr(config, "quantization_config"):  # a GGUF's: the meta model needs none
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    # the layer types peft's LoRA implements (peft.tuners.lora.model.LoraModel._create_new_module)
    adaptable = (
        torch.nn.Linear,
        torch.nn.Embedding,
        torch.nn.Conv1d,
        torch.nn.Conv2d,
        torch.nn.Conv3d,
        torch.nn.MultiheadAttention,
        Conv1D,
    )
    return {name: isinstance(module, adaptable) for name, module in model.named_modules() if name}
