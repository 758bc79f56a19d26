"""The data sources: reasoning-gym tasks that exist and accept their config, files and local datasets
that exist, parse and map their columns (the curate stage, which also writes the eval sets), and for
code problems a sandbox that can isolate the code the model will write."""

from __future__ import annotations

from pathlib import Path

from rung import files, sandbox
from rung.answers.verify import CODE
from rung.config import CodeSource, FileSource, HFSource, Params, ReasoningGymSource, Source
from rung.data import curate
from rung.errors import InputError


def sources(params: Params) -> None:
    """curate.sources and eval.sets, loaded (a reasoning-gym source at size 1) as the stage would."""
    for src in params.curate.sources:
        _source(src, f"curate.sources.{src.name}", params.seed, eval_set=False)
    for src in params.eval.sets:
        _source(src, f"eval.sets.{src.name}", params.seed, eval_set=True)
    code = [
        f"{section}.{s.name}"
        for section, group in (("curate.sources", params.curate.sources), ("eval.sets", params.eval.sets))
        for s in group
        if s.task == CODE
    ]
    if code or params.format.style == "code":
        # model-written code never runs unconfined: refuse here rather than in the middle of a stage
        where = code[0] if code else "format.style"
        try:
            sandbox.check()
        except sandbox.SandboxUnavailable as e:
            raise sandbox.SandboxUnavailable(f"{where}: {e}") from None


def _load(src: Source, seed: int, eval_set: bool) -> None:
    """Load a source as its stage would: an eval set's errors name eval.sets, not curate.sources."""
    (curate.load_eval_source if eval_set else curate.load_source)(src, seed)


def _source(src: Source, key: str, seed: int, eval_set: bool) -> None:
    """A reasoning-gym task must exist and accept its config; a file source or a local dataset
    directory must exist, parse, have the mapped columns and, with answer_from / answer_pattern,
    yield an answer in one of its first rows (read whole: the loader's own checks and messages)."""
    if isinstance(src, ReasoningGymSource | CodeSource):
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
