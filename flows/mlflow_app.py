"""MLflow's server app as `rung serve` runs it: MLflow's own app (basic auth, or plain on loopback) with every
route that runs code or configures server-side tools refused, for every user and from every address.

MLflow 3.17's server carries an Assistant whose config (`PUT /ajax-api/3.0/mlflow/assistant/config`) any
logged-in user can point at a model endpoint of their own with full tool access; a request that reaches the
server from loopback (a same-host reverse proxy, an `ssh -L` tunnel, a local shell) then has its Bash tool
calls run on the host, which holds credentials.env. MLflow only lets an operator widen that access
(`MLFLOW_ENABLE_REMOTE_ASSISTANT`), never switch it off, so rung registers these factories as MLflow apps
(pyproject.toml, entry points `mlflow.app`) and `mlflow server --app-name rung[-basic-auth]` serves them. rung
logs runs, params, metrics and artifacts; it uses none of the refused routes.
"""

from __future__ import annotations

import posixpath
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Asgi = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

# Path segments, matched anywhere in the normalised path so that `--static-prefix`, doubled slashes, `..` and
# percent-encoding change nothing: the assistant (runs tool calls on the host); the job API and every `invoke`
# route (jobs run scorers, judges and prompt optimisers that call out to model endpoints); MCP server records
# (tools for the assistant); the AI gateway (stores provider keys, calls URLs; also off by MLFLOW_ENABLE_AI_GATEWAY).
REFUSED = ("/mlflow/assistant/", "/jobs/", "/invoke/", "/mcp-servers/", "/gateway/")
MESSAGE = b'{"error_code": "PERMISSION_DENIED", "message": "not served by rung serve: this route runs code or configures server-side tools"}'  # noqa: E501


def refused(path: str) -> bool:
    """Whether a request path reaches one of the REFUSED routes (however it is spelled)."""
    once = unquote(path)
    while (again := unquote(once)) != once:  # %252F and deeper: decode until nothing changes
        once = again
    normal = posixpath.normpath("/" + once.replace("\\", "/").lower()) + "/"
    return any(segment in normal for segment in REFUSED)


class WithoutServerTools:
    """An ASGI app that answers 403 to REFUSED paths (HTTP) or closes the socket (WebSocket) before `app`
    sees them, whoever asks: authentication and MLflow's own localhost check come after it."""

    def __init__(self, app: Asgi) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]], send: Callable) -> None:
        if scope["type"] == "http" and refused(scope["path"]):
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(MESSAGE)).encode())]
            await send({"type": "http.response.start", "status": 403, "headers": headers})
            await send({"type": "http.response.body", "body": MESSAGE})
        elif scope["type"] == "websocket" and refused(scope["path"]):
            await send({"type": "websocket.close", "code": 1008})
        else:
            await self.app(scope, receive, send)


def create_app() -> WithoutServerTools:
    """MLflow's plain server app (`rung serve --no-auth`, loopback only) without the refused routes."""
    from mlflow.server.fastapi_app import app

    return WithoutServerTools(app)


def create_auth_app() -> WithoutServerTools:
    """MLflow's basic-auth app (users, per-experiment permissions) without the refused routes."""
    from mlflow.server.auth import create_app as basic_auth

    return WithoutServerTools(basic_auth())
