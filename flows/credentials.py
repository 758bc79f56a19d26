"""The team servers' credentials as a client holds them: from the environment only
(PREFECT_API_AUTH_STRING, MLFLOW_TRACKING_USERNAME / _PASSWORD), checked against the servers before
any compute, and never written to a record (params, tags, logs, outputs)."""

from __future__ import annotations

import os
import ssl
import urllib.error
import urllib.request
from base64 import b64encode
from urllib.parse import unquote, urlsplit

import certifi
from prefect.settings import get_current_settings

from rung import tracking
from rung.config import Params
from rung.errors import InputError, Unavailable
from rung.redaction import redact


def basic(user_and_password: str) -> str:
    """An HTTP basic Authorization header from 'user:password' (a Prefect auth string's form)."""
    return "Basic " + b64encode(user_and_password.encode()).decode()


def http_status(
    url: str,
    auth: str | None = None,
    body: bytes | None = None,
    timeout: float = 10,
    context: ssl.SSLContext | None = None,
) -> int:
    """The HTTP status of a GET (or of a JSON POST of `body`); OSError when nothing answers (or, over
    HTTPS, when the server's certificate is not trusted: `context`, else the system's CAs)."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    if auth:
        req.add_header("Authorization", auth)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def tls_context(ca: str | None, insecure: bool) -> ssl.SSLContext:
    """What a client trusts, as MLflow's and Prefect's clients take it: a CA file (else certifi's CAs, as
    requests and Prefect's client default to), or no check at all."""
    context = ssl.create_default_context(cafile=ca or certifi.where())
    if insecure:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return context


def check(params: Params) -> None:
    """Raise InputError (one line) when the MLflow or Prefect server a run reports to refuses its
    credentials or presents a certificate its client does not trust, Unavailable when it does not answer:
    before any compute, not as a stack trace after training. Over HTTPS each is asked with the trust its
    own client uses (MLFLOW_TRACKING_SERVER_CERT_PATH, PREFECT_API_SSL_CERT_FILE)."""
    uri = tracking.tracking_uri(params)
    if uri.lower().startswith(("http://", "https://")):
        host, auth, variables = _mlflow_auth(uri)
        insecure = os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() in ("true", "1")
        _answer(
            "MLflow",
            uri,
            f"{host.rstrip('/')}/api/2.0/mlflow/experiments/search?max_results=1",
            auth,
            variables,
            tls=(
                tls_context(os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH"), insecure),
                "MLFLOW_TRACKING_SERVER_CERT_PATH",
            ),
        )
    api = get_current_settings().api
    trust = (tls_context(api.ssl_cert_file, api.tls_insecure_skip_verify), "PREFECT_API_SSL_CERT_FILE")
    if api.url and api.key:  # Prefect Cloud: a bearer key; its API has no /admin route
        key = f"Bearer {api.key.get_secret_value()}"
        _answer("Prefect", api.url, f"{api.url.rstrip('/')}/flows/filter", key, "PREFECT_API_KEY", b"{}", trust)
    elif api.url:  # a self-hosted server, with basic auth (rung serve) or without
        auth = basic(api.auth_string.get_secret_value()) if api.auth_string else None
        _answer(
            "Prefect", api.url, f"{api.url.rstrip('/')}/admin/version", auth, "PREFECT_API_AUTH_STRING", None, trust
        )


def _mlflow_auth(uri: str) -> tuple[str, str | None, str]:
    """The tracking URI without its userinfo, the Authorization MLflow's client sends to it, and where that
    is set. The client hands the URI to requests, which sends a user and password in it (percent-decoded;
    a user name alone is not sent) as basic auth, over MLFLOW_TRACKING_USERNAME / _PASSWORD."""
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018 - raises ValueError on a port that is no number
    except ValueError:  # a raw '/', '?', '#' or '@' in a password ends the authority early: no host to ask
        raise InputError(
            f"MLflow tracking URI {redact(uri)}: its host or port does not parse; percent-encode '/', '?', '#' "
            "and '@' in its user name and password (%2F, %3F, %23, %40)"
        ) from None
    host = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
    if parts.username is not None and parts.password is not None and (parts.username or parts.password):
        return (
            host,
            basic(f"{unquote(parts.username)}:{unquote(parts.password)}"),
            "the user and password in MLFLOW_TRACKING_URI",
        )
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    return (
        host,
        basic(f"{user}:{password or ''}") if user else None,
        "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD",
    )


def _answer(
    server: str,
    base: str,
    url: str,
    auth: str | None,
    variables: str,
    body: bytes | None = None,
    tls: tuple[ssl.SSLContext, str] | None = None,
) -> None:
    context, ca_variable = tls or (None, "")
    try:
        status = http_status(url, auth, body, context=context)
    except OSError as e:
        if isinstance(reason := getattr(e, "reason", e), ssl.SSLCertVerificationError):
            # not transient: the client's trust is set up wrong (credentials were not sent)
            raise InputError(
                f"{server} at {redact(base)}: certificate not trusted ({reason.verify_message}): set {ca_variable} "
                "to the CA that signed it (rung serve --tls-self-signed: ca.pem in its directory)"
            ) from None
        # not the user's input: a server restarting answers again soon, so this one is retried (exit 75)
        raise Unavailable(f"{server} at {redact(base)} does not answer ({getattr(e, 'reason', e)})") from None
    if status in (401, 403):
        what = "refused the credentials" if auth else "needs credentials"
        raise InputError(f"{server} at {redact(base)} {what}: set {variables}")
