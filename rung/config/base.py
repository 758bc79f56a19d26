"""What every params section shares: unknown keys are errors, values are frozen, no credential
anywhere in it; the error type; and how a deprecated key is still read, with a one-line warning."""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator

from rung.errors import InputError

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


# Keys whose value is a credential: token, password, secret, api_key, access_key, alone or as the
# end of a name (hub_token, client_secret, aws_secret_access_key); not the tokenizer's special tokens.
_SECRET_KEY = re.compile(r"(^|_)(token|password|passwd|secret|api_?key|access_key)$", re.IGNORECASE)
_SPECIAL_TOKEN = re.compile(r"^(pad|eos|bos|unk|sep|cls|mask)_token$", re.IGNORECASE)
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)
# Where the credential that does not belong in a URL goes instead, by the URL's key.
_URL_HINTS = {
    "uri": "set MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD instead",
    "vllm_server_base_url": "the server takes no credentials from rung; put an authenticating proxy in front",
}


def is_secret_key(key: str) -> bool:
    """Whether a params key names a credential (token, *_token, api_key, password, secret, ...), any case."""
    key = key.replace("-", "_")
    return bool(_SECRET_KEY.search(key)) and not _SPECIAL_TOKEN.match(key)


def url_credential(value: str) -> str | None:
    """What credential a URL-like value carries ('a password', "a query parameter 'token'"), or None."""
    if not _URL.match(value):
        return None
    if re.match(r"^[^:]+://[^/?#@]*:[^/?#@]*@", value):  # scheme://user:password@host
        return "a password"
    try:
        query = urlsplit(value).query
    except ValueError:  # not a URL after all (e.g. an unbalanced IPv6 bracket)
        return None
    secret = next((k for k, _ in parse_qsl(query) if is_secret_key(k)), None)
    return f"a query parameter {secret!r}" if secret else None


def no_credentials(data: Any, key: str = "") -> None:
    """Raise ValueError('<dotted key>: ...') at the first credential in a raw params value: a key that names
    one (with a value other than null or a boolean, as HF's `token: true`), or a URL-like string anywhere
    with a password or a token in its query."""
    if isinstance(data, dict):
        for name, value in data.items():
            sub = f"{key}.{name}" if key else str(name)
            if isinstance(name, str) and is_secret_key(name) and value is not None and not isinstance(value, bool):
                raise ValueError(
                    f"{sub}: a credential, and params are logged to MLflow and kept in dvc.lock; "
                    "remove it and give it through the environment (e.g. HF_TOKEN)"
                )
            no_credentials(value, sub)
    elif isinstance(data, list | tuple):
        for i, value in enumerate(data):
            no_credentials(value, f"{key}.{i}")
    elif isinstance(data, str) and (what := url_credential(data)):
        hint = _URL_HINTS.get(key.rpartition(".")[2], "give credentials through the environment")
        raise ValueError(f"{key}: has {what} in it, and params are logged to MLflow and kept in dvc.lock; {hint}")
