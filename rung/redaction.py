"""What counts as a credential in a params key or a URL, and a URL as a message may show it.

Params are logged to MLflow and kept in dvc.lock, so rung.config refuses a credential anywhere in them
(`no_credentials`); what a message shows of a URL from the environment goes through `redact`."""

from __future__ import annotations

import re
from typing import Any, NamedTuple
from urllib.parse import unquote_plus, urlsplit

# Words that, ending a key's name, make its value a credential (hub_token, client_secret, aws_secret_key,
# headers.Authorization); a name only beginning with one (token_file, auth_mode) or a plural count
# (max_tokens, special_tokens) is none, nor are the tokenizer's special tokens (pad_token).
_WORDS = (
    "token|password|passwd|pwd|passphrase|secret|secret_?key|private_?key|api_?key|access_?key|"
    "credentials?|auth|authorization|bearer|cookies?"
)
_SECRET_KEY = re.compile(rf"(^|_)({_WORDS})$", re.IGNORECASE)
_SPECIAL_TOKEN = re.compile(r"^(pad|eos|bos|unk|sep|cls|mask)_token$", re.IGNORECASE)
# In a URL's query or fragment, also what signs or keys the request: S3's X-Amz-Signature, Azure's sig,
# Google's key; OAuth puts an access_token in the fragment.
_SECRET_PARAMETER = re.compile(rf"(^|_)({_WORDS}|key|sig|signature)$", re.IGNORECASE)
_URL = re.compile(r"[a-z][a-z0-9+.-]*://\S*", re.IGNORECASE)
# Schemes whose user name is a login, the secret being a key file elsewhere (git+ssh://git@github.com/...).
_LOGIN_SCHEMES = re.compile(r"(^|\+)(ssh|sftp)$", re.IGNORECASE)
MASK = "***"


def _snake(name: str) -> str:
    """`name` with camelCase and '-' as '_' (accessToken, X-Api-Key -> access_Token, X_Api_Key)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).replace("-", "_")


def is_secret_key(key: str) -> bool:
    """Whether a params key names a credential (token, *_token, api_key, password, auth, ...), any case."""
    key = _snake(key)
    return bool(_SECRET_KEY.search(key)) and not _SPECIAL_TOKEN.match(key)


class _Url(NamedTuple):
    scheme: str  # 'https://'
    userinfo: str | None
    rest: str  # host, port, path, query, fragment
    broken: bool  # an authority that does not parse


def _split(url: str) -> _Url:
    """`url` in parts. A password holding a raw '/', '?', '#' or '@' ends the authority early (urlsplit
    reads 'u:p' of https://u:p/w@host as a host and a port that is no number): an authority that does not
    parse, with a '@' after it, is taken as userinfo up to the last '@'."""
    scheme, _, rest = url.partition("://")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is no number
    except ValueError:
        user, at, host = rest.rpartition("@")
        return _Url(f"{scheme}://", user if at else None, host, True)
    user, at, _ = parts.netloc.rpartition("@")
    return _Url(f"{scheme}://", user if at else None, rest[len(user) + 1 :] if at else rest, False)


def _secret_parameters(part: str) -> list[str]:
    """The names of the parameters of a query or fragment ('a=1&sig=x') that carry a credential."""
    names = (unquote_plus(p.partition("=")[0]) for p in re.split(r"[&;]", part))
    return [n for n in names if _SECRET_PARAMETER.search(_snake(n)) and not _SPECIAL_TOKEN.match(_snake(n))]


def url_credential(url: str) -> str | None:
    """What credential a URL carries ('a password', "a query parameter 'sig'", ...), or None."""
    parts = _split(url)
    user = parts.userinfo
    if user and ":" in user:
        return "a password"
    if user and not _LOGIN_SCHEMES.search(parts.scheme[:-3]):
        return "a user name (which can be a token)"
    before, _, fragment = parts.rest.partition("#")  # RFC 3986: the first '?' and '#' end path and query
    for what, part in (("query", before.partition("?")[2]), ("fragment", fragment)):
        if found := _secret_parameters(part):
            return f"a {what} parameter {found[0]!r}"
    return None


def _redact_url(url: str) -> str:
    parts = _split(url)
    if parts.userinfo is not None:
        name, colon, _ = parts.userinfo.partition(":")
        # a user name alone may be a token; of a broken authority, nothing is known to be the name
        shown = f"{name}:{MASK}" if colon and not parts.broken else MASK
        url = f"{parts.scheme}{shown}@{parts.rest}"
    return re.sub(
        r"([?#&;])([^=&;#]*)=([^&;#]*)",
        lambda m: f"{m[1]}{m[2]}={MASK}" if _secret_parameters(m[2]) else m[0],
        url,
    )


def redact(text: str) -> str:
    """`text` with every URL in it shown without its credentials (https://user:***@host, https://***@host
    for a user name alone, ?sig=***); never raises."""
    return _URL.sub(lambda m: _redact_url(m[0]), text)


def no_credentials(data: Any, key: str = "") -> None:
    """Raise ValueError('<dotted key>: ...') at the first credential in a raw params value: a key that names
    one (with a value other than null or a boolean, as HF's `token: true`), or a URL anywhere in a string
    with userinfo or a credential in its query or fragment. The message never shows the value."""
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
    elif isinstance(data, str):
        for url in _URL.findall(data):
            if what := url_credential(url):
                hint = _URL_HINTS.get(key.rpartition(".")[2], "give credentials through the environment")
                raise ValueError(
                    f"{key}: has {what} in it, and params are logged to MLflow and kept in dvc.lock; {hint}"
                )


# Where the credential that does not belong in a URL goes instead, by the URL's key.
_URL_HINTS = {
    "uri": "set MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD instead",
    "vllm_server_base_url": "the server takes no credentials from rung; put an authenticating proxy in front",
}
