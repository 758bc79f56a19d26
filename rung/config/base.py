"""What every params section shares: unknown keys are errors, values are frozen, no credential
anywhere in it; the error type; and how a deprecated key is still read, with a one-line warning."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator

from rung.errors import InputError
from rung.redaction import no_credentials

# The core library's logger: the CLI prints its warnings on stderr (Python's last-resort handler, one
# line) and the flows pass it to Prefect's run logs (flows/__init__.py).
log = logging.getLogger("rung.config")


class ConfigError(InputError):
    """A params file that cannot be used; its message is one line naming the file and the key."""


class Section(BaseModel):
    # Unknown keys are errors: a typo must not silently fall back to a default.
    # Field docstrings become field descriptions: the params reference (docs/reference/params.md) is made from them.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _no_credentials(cls, data: Any) -> Any:
        # Params are logged to MLflow and the RL stages' are kept in dvc.lock: a credential must never be
        # one, pass-through mappings (trl, model_init_kwargs, reward args) included. The outermost section
        # checks first, so the error names the whole dotted key.
        no_credentials(data)
        return data


def deprecated(
    data: Any, old: str, new: str | None, info: ValidationInfo, path: str = "", label: str | None = None
) -> Any:
    """A section's raw mapping with its deprecated key `old` read as `new`, or dropped when `new` is
    None (a setting that has no effect), and one warning line naming the key (`<label or path>.<old>`)
    and the file when `parse` gave it. `path`: the section's dotted key below the model whose validator
    calls this, for the error when both `old` and `new` are set (a ValueError)."""
    if not isinstance(data, dict) or old not in data:
        return data
    data = dict(data)
    value = data.pop(old)
    source = (info.context or {}).get("source")
    prefix = label or path
    where = f"{source}: " if source else ""
    where += f"{prefix}.{old}" if prefix else old
    if new is None:
        log.warning(f"{where}: deprecated and has no effect; ignored (remove it)")
        return data
    if new in data:
        raise ValueError(f"{path + '.' if path else ''}{old}: renamed {new}; set {new} only, not both")
    log.warning(f"{where}: deprecated, renamed {new}; read as {new} (rename it)")
    return {**data, new: value}


IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
"""'package.module:attr', as a custom environment or objective is named."""


def known_or_import_path(value: str, known: Iterable[str], kind: str, form: str) -> str:
    """`value` where it is one of `known` or an import path (`form`: what it names); ValueError naming both else."""
    known = list(known)
    if value not in known and not IMPORT_PATH.match(value):
        raise ValueError(f"{value!r} is neither {kind} ({', '.join(known)}) nor an import path {form}")
    return value
