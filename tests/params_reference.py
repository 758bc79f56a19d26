"""docs/reference/params.md, generated from the params schema (rung/config): every key, its type, default
and docstring. `python -m tests.params_reference` rewrites the page; tests/test_docs.py fails when the
committed page differs from what the schema gives, or when a field has no docstring.

Hand-written: mkdocstrings documents Python objects, not the nested keys of a YAML file, and pydantic's
JSON schema loses the order of sections and the discriminated unions' `type` values a reader needs."""

from __future__ import annotations

import json
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from rung.config import Params

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "params.md"

HEADER = """# Params reference

Every key of `params.yaml`, generated from the docstrings of the schema in `rung/config/` by
`python -m tests.params_reference` (the test suite fails when this page differs from the schema, or
when a key has no docstring). A key that is not listed here is refused by `rung validate` with one
line naming it. `<name>` stands for a name you choose (an RL stage, a reward, a pool);
`[]` for an item of a list.

The guides explain how the settings work together: [pipeline](../pipeline.md), [data](../data.md),
[SFT](../sft.md), [RL](../rl.md), [reward models](../reward_models.md), [evaluation](../evaluation.md),
[answer formats](../formats.md), [GPU nodes](../gpu.md).
"""


class UndocumentedKey(ValueError):
    """A params field without a docstring."""


@dataclass
class Table:
    """One table of the page: a schema model and every key path where it sits."""

    model: type[BaseModel]
    paths: list[str] = field(default_factory=list)


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models inside a type (unions, lists, dicts, Annotated), in order."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _child_path(path: str, annotation: Any) -> str:
    """The dotted key of a field's items: `x[]` for a list, `x.<name>` for a mapping."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        if origin is typing.Annotated:
            inner = inner[:1]
        return _child_path(path, inner[0]) if len(inner) == 1 else path
    if origin is list:
        return f"{path}[]"
    if origin is dict:
        return f"{path}.<name>"
    return path


def _sections(root: type[BaseModel]) -> list[Table]:
    """Every model reachable from Params, each after the section that holds it (depth first), with every
    key path it sits at."""
    found: dict[type[BaseModel], Table] = {}

    def visit(model: type[BaseModel], path: str) -> None:
        section = found.setdefault(model, Table(model))
        if path in section.paths:
            return
        section.paths.append(path)
        for name, info in model.model_fields.items():
            child = _child_path(f"{path}.{info.alias or name}".lstrip("."), info.annotation)
            for sub in _models(info.annotation):
                visit(sub, child)

    visit(root, "")
    return list(found.values())


def slug(title: str) -> str:
    # The anchor MkDocs' toc (markdown.extensions.toc.slugify) and GitHub give a heading without hyphens.
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", title).strip().lower())


def _title(section: Table) -> str:
    tag = section.model.model_fields.get("type")
    kind = ""
    if tag is not None and typing.get_origin(tag.annotation) is typing.Literal:
        kind = " with type: " + " or ".join(typing.get_args(tag.annotation))
    return ", ".join(f"`{p}`" for p in section.paths) + kind if section.paths != [""] else "Top level"


def _type(annotation: Any, links: dict[type[BaseModel], str]) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        # A tagged variant is named by its `type`; any other section is a mapping of its own keys.
        tag = annotation.model_fields.get("type")
        name = "/".join(typing.get_args(tag.annotation)) if tag is not None else "section"
        return f"[{name}](#{links[annotation]})"
    if origin is typing.Annotated:
        return _type(args[0], links)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type(a, links) for a in args)
    if origin is list:
        return f"list of {_type(args[0], links)}"
    if origin is dict:
        return f"mapping of {_type(args[0], links)} to {_type(args[1], links)}"
    return getattr(annotation, "__name__", str(annotation))


def _dump(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(by_alias=True)
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_dump(v) for v in value]
    return value


def _code(value: Any) -> str:
    return "`" + json.dumps(value, ensure_ascii=False).replace("|", "\\|") + "`"


def _default(info: Any) -> str:
    """The default; for a section (not one of several kinds), only where it differs from its own defaults."""
    if info.default is PydanticUndefined and info.default_factory is None:
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel) and len(_models(info.annotation)) == 1:
        changed = {k: v for k, v in _dump(value).items() if v != _dump(type(value)().model_dump(by_alias=True)).get(k)}
        return f"the section's defaults, except {_code(changed)}" if changed else "the section's defaults"
    return _code(_dump(value))


def _cell(text: str) -> str:
    """A docstring as one table cell: one line, pipes escaped, `<` outside code spans shown as text."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;").replace("*", "\\*") for p in parts).replace(
        "|", "\\|"
    )


def render(root: type[BaseModel] = Params) -> str:
    """The page's markdown for `root`'s keys; UndocumentedKey names the first field without a docstring."""
    sections = _sections(root)
    links = {s.model: slug(_title(s)) for s in sections}
    out = [HEADER]
    for section in sections:
        model = section.model
        out.append(f"\n## {_title(section)}\n")
        if model.__doc__:
            out.append(" ".join(model.__doc__.split()) + "\n")
        out.append("| key | type | default | meaning |\n|---|---|---|---|")
        for name, info in model.model_fields.items():
            key = info.alias or name
            if not info.description:
                where = ", ".join(f"{p}.{key}".lstrip(".") for p in section.paths)
                raise UndocumentedKey(f"{where} ({model.__module__}.{model.__name__}.{name}): no docstring")
            out.append(f"| `{key}` | {_type(info.annotation, links)} | {_default(info)} | {_cell(info.description)} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    try:
        PAGE.parent.mkdir(parents=True, exist_ok=True)
        PAGE.write_text(render())
    except UndocumentedKey as e:
        sys.exit(f"error: {e}")
    print(f"wrote {PAGE}")
