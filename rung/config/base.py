"""What every params section shares: unknown keys are errors, values are frozen; and the error type."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from rung.errors import InputError


class ConfigError(InputError):
    """A params file that cannot be used; its message is one line naming the file and the key."""


class Section(BaseModel):
    # Unknown keys are errors: a typo must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True)
