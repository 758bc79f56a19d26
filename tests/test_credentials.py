"""The clients' check of an MLflow tracking URI with credentials in it (MLFLOW_TRACKING_URI=https://u:p@host,
which MLflow's client accepts): asked as MLflow's own client asks, and never shown (flows/credentials.py)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import mlflow
import pytest

from flows import credentials
from rung import config
from rung.errors import InputError, Unavailable
from tests.conftest import free_port


class _MlflowStandIn(http.server.BaseHTTPRequestHandler):
    """MLflow's experiments API behind basic auth for user 'rung', password 'pl/an:ted@0': 401 unless
    that is the Authorization; each request's Authorization is kept in `seen`."""

    seen: list[str | None] = []

    def _answer(self) -> None:
        auth = self.headers.get("Authorization")
        self.seen.append(auth)
        ok = auth == credentials.basic("rung:pl/an:ted@0")
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"experiments": []}' if ok else b"{}")

    do_GET = do_POST = _answer  # noqa: N815 - http.server's names

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server(monkeypatch) -> Iterator[str]:
    """The stand-in's host:port; no MLflow credentials in the environment, Prefect not asked."""
    for var in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "PREFECT_API_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _MlflowStandIn)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _check(uri: str, default_params: dict, monkeypatch) -> Exception | None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    try:
        credentials.check(config.Params.model_validate(default_params))
    except (InputError, Unavailable) as e:
        return e
    return None


@pytest.mark.parametrize(
    "userinfo, refused",
    [
        ("rung:pl%2Fan%3Ated%400", None),  # percent-encoded '/', ':' and '@': MLflow's client decodes them
        ("rung:wr%3Aong", "refused the credentials: set the user and password in MLFLOW_TRACKING_URI"),
        ("ghp_t0ken", "needs credentials: set MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD"),  # not sent
    ],
)
def test_a_tracking_uri_with_userinfo_is_asked_as_mlflow_s_client_asks(
    server, default_params, monkeypatch, userinfo, refused
):
    """The check sends the Authorization MLflow's client sends for the same URI (the user and password in
    it as basic auth, percent-decoded; a user name alone, nothing), and says what the server answered in
    one line showing the URI redacted: never 'does not answer' for a server that answers."""
    uri = f"http://{userinfo}@{server}"
    _MlflowStandIn.seen = []
    error = _check(uri, default_params, monkeypatch)
    try:
        mlflow.MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except mlflow.exceptions.MlflowException:
        pass
    assert len(_MlflowStandIn.seen) == 2 and _MlflowStandIn.seen[0] == _MlflowStandIn.seen[1]
    if refused is None:
        assert error is None
    else:
        shown = "rung:***" if ":" in userinfo else "***"
        assert isinstance(error, InputError) and str(error) == f"MLflow at http://{shown}@{server} {refused}"


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("http://rung:pl/an@{server}", "MLflow tracking URI http://***@{server}: its host or port does not parse"),
        ("http://rung:pl#an@{server}", "MLflow tracking URI http://***@{server}: its host or port does not parse"),
        ("http://ghp_t0ken@127.0.0.1:{port}", "MLflow at http://***@127.0.0.1:{port} does not answer"),
        ("http://rung:pl%3Aan@127.0.0.1:{port}", "MLflow at http://rung:***@127.0.0.1:{port} does not answer"),
    ],
)
def test_a_tracking_uri_that_cannot_be_asked_is_told_in_one_line_without_its_credentials(
    server, default_params, monkeypatch, uri, expected
):
    """A raw '/' or '#' in a password ends the URI's authority early (MLflow's client would ask host 'rung'):
    an input error, not a crash; a server that does not answer: exit 75. Neither line shows a credential."""
    port = free_port()
    error = _check(uri.format(server=server, port=port), default_params, monkeypatch)
    assert error is not None and str(error).startswith(expected.format(server=server, port=port)), error
    assert "pl" not in str(error) and "t0ken" not in str(error) and "\n" not in str(error)
    assert isinstance(error, Unavailable) == ("does not answer" in expected)
