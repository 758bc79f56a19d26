"""Atomic, deterministic file outputs and content hashes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temporary sibling of `path` to write into; replace `path` only if the block succeeds.

    A failing stage therefore leaves its previous output intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _remove(tmp)
    try:
        yield tmp
        _remove(path)
        os.replace(tmp, path)
    finally:
        _remove(tmp)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False)


def write_json(path: Path | str, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def read_json(path: Path | str) -> Any:
    return json.loads(Path(path).read_text())


def write_jsonl(path: Path | str, rows: Iterable[Mapping[str, Any]]) -> None:
    with atomic_path(path) as tmp, tmp.open("w") as f:
        for row in rows:
            f.write(dumps(row) + "\n")


def read_jsonl(path: Path | str) -> list[dict[str, Any]]:
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]


def md5(path: Path | str) -> str:
    """md5 of a file, or of a directory's (relative path, file md5) listing."""
    path = Path(path)
    if path.is_file():
        h = hashlib.md5()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    listing = "".join(f"{p.relative_to(path).as_posix()}\t{md5(p)}\n" for p in sorted(path.rglob("*")) if p.is_file())
    return hashlib.md5(listing.encode()).hexdigest()


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level of dotted keys; an empty dict stays a leaf."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{key}."))
        else:
            out[key] = v
    return out


def is_local_path(text: str) -> bool:
    """Whether a model or dataset reference names a local path rather than a hub id: it starts with
    '.', '/' or '~', or exists."""
    return text.startswith((".", "/", "~")) or Path(text).expanduser().exists()
