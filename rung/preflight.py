"""Everything about an experiment that can be checked without training, checked before any compute:
by `rung validate`, `make demo` / `make pipeline`, the start of every stage, and before a sweep is
queued. Each failure is one InputError naming the params key (with the stage's real name) or file."""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

from rung import compat, files
from rung.config import FileSource, HFSource, Params, ReasoningGymSource, Source
from rung.errors import InputError
from rung.models import EMBEDDED
from rung.train import launch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def check(params: Params) -> None:
    """Raise InputError at the first thing that would make a stage fail on its input."""
    # rung.data.curate, rung.rl.rewards and rung.generate.api are imported only when a check needs them: every
    # stage starts with this check, and they pull reasoning-gym, datasets and torch.
    compat.check()
    _model(params.model.source, "model.source")
    if params.format.template == "chat":
        _chat_template(params.model.source, "model.source")
    for src in params.curate.sources:
        _source(src, f"curate.sources.{src.name}", params.seed, eval_set=False)
    for src in params.eval.sets:
        _source(src, f"eval.sets.{src.name}", params.seed, eval_set=True)
    for trace in params.sft.traces:
        model = getattr(trace, "model", "base")
        if model != "base":
            _model(model, "sft.traces.model")
            if params.format.template == "chat":
                _chat_template(model, "sft.traces.model")
    if params.generation.backend == "vllm":
        _require_vllm("generation.backend")
    launch.check(params.sft.launch, "sft.launch")
    for name, stage in params.rl.stages.items():
        key = f"rl.stages.{name}"
        launch.check(stage.launch, f"{key}.launch")
        if stage.use_vllm:
            _require_vllm(f"{key}.use_vllm")
        for reward, spec in stage.rewards.items():
            if spec.import_path is not None:
                _reward(spec.import_path, bool(spec.args), f"{key}.rewards.{reward}")


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


def _require_vllm(key: str) -> None:
    """rung.generate.vllm.require_vllm, imported only when a vLLM setting asks for it (it imports torch)."""
    from rung.generate.vllm import require_vllm

    require_vllm(key)


def _load(src: Source, seed: int, eval_set: bool) -> None:
    """Load a source as its stage would: an eval set's errors name eval.sets, not curate.sources."""
    from rung.data import curate

    (curate.load_eval_source if eval_set else curate.load_source)(src, seed)


def _source(src: Source, key: str, seed: int, eval_set: bool) -> None:
    """A reasoning-gym task must exist and accept its config; a file source or a local dataset
    directory must exist, parse, have the mapped columns and, with answer_from / answer_pattern,
    yield an answer in one of its first rows (read whole: the loader's own checks and messages)."""
    if isinstance(src, ReasoningGymSource):
        _load(src.model_copy(update={"size": 1}), seed, eval_set)
    elif isinstance(src, FileSource):
        path = Path(src.path)
        if not path.is_file():
            raise InputError(f"{key}.path: {src.path} not found")
        if path.stat().st_size == 0:
            raise InputError(f"{key}.path: {src.path} is empty")
        _load(src, seed, eval_set)
    elif isinstance(src, HFSource) and files.is_local_path(src.dataset):
        _load(
            src, seed, eval_set
        )  # a local directory (the loader's rule); hub datasets are checked when the stage loads them


def _reward(path: str, factory: bool, key: str) -> None:
    """A custom reward resolves to a callable that takes the completions (or, with args, a factory)."""
    from rung.rl import rewards

    func = rewards.load_custom(path, key)
    if factory:
        return
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return  # builtins and C callables: nothing to inspect
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
    names = {p.name for p in params}
    if not takes_kwargs and not names & {"completions", "completion_ids", "prompts"}:
        raise InputError(
            f"{key}.import: {path!r} must accept completions "
            "(TRL calls reward(prompts=, completions=, completion_ids=, **columns))"
        )
