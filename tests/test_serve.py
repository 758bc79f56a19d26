"""`rung serve`'s credentials and commands, and the clients' check of a Prefect Cloud key, without
starting a server (tests/test_orchestration.py starts both with auth and runs a deployment through them)."""

from __future__ import annotations

import http.server
import os
import socket
import ssl
import threading

import mlflow.server as mlflow_server
import pytest
from prefect.settings import PREFECT_API_KEY, PREFECT_API_URL, temporary_settings

from flows import credentials, mlflow_app, serve_state
from flows import serve as team
from rung import config
from rung.errors import InputError


def test_credentials_are_generated_once_into_a_file_only_its_owner_reads(tmp_path):
    state = tmp_path / "servers"
    first = team.credentials(state)
    assert (state / "credentials.env").stat().st_mode & 0o777 == 0o600 and state.stat().st_mode & 0o777 == 0o700
    assert team.credentials(state) == first  # read back, not regenerated
    assert len({v for v in first.values()}) == 5 and all(len(v) >= 32 for v in first.values())
    # a file from before MLflow's gateway passphrase: the passphrase is added, the rest kept
    older = {k: v for k, v in first.items() if k != "MLFLOW_CRYPTO_KEK_PASSPHRASE"}
    serve_state.write_private(state / "credentials.env", older)
    again = team.credentials(state)
    assert again.items() >= older.items() and len(again["MLFLOW_CRYPTO_KEK_PASSPHRASE"]) >= 32
    assert serve_state.read_env_file(state / "credentials.env") == again
    (state / "credentials.env").chmod(0o644)
    with pytest.raises(InputError, match=r"credentials.env: readable by other users \(mode 644\); chmod 600 it$"):
        team.credentials(state)


def test_secrets_reach_the_servers_by_environment_never_by_command_line(tmp_path):
    creds = team.credentials(tmp_path)
    where = team.Endpoints("0.0.0.0", "orch.example", 4200, 5000)
    cmds = team.commands(where, tmp_path, creds)
    argv = " ".join(" ".join(cmd) for cmd, _ in cmds.values())
    assert not any(secret in argv for secret in creds.values())
    assert "--app-name rung-basic-auth" in argv and "orch.example" in argv  # MLflow's allowed Host header
    assert cmds["prefect"][1]["PREFECT_SERVER_API_AUTH_STRING"] == creds["PREFECT_AUTH_STRING"]
    assert cmds["mlflow"][1]["MLFLOW_AUTH_ADMIN_PASSWORD"] == creds["MLFLOW_ADMIN_PASSWORD"]
    # MLflow's AI gateway is off, and its secrets' key is not the public default should an admin turn it on
    mlflow_env = cmds["mlflow"][1]
    assert all(mlflow_env[name] == "false" for name in team.SERVER_TOOLS)
    assert mlflow_env["MLFLOW_CRYPTO_KEK_PASSPHRASE"] == creds["MLFLOW_CRYPTO_KEK_PASSPHRASE"]
    assert all(env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false" for _, env in cmds.values())
    nodes = team.client_env(where, creds)
    assert nodes["MLFLOW_TRACKING_URI"] == "http://orch.example:5000"
    # the nodes get their own credentials only: no server-side secret
    server_side = {k: v for k, v in creds.items() if k not in ("PREFECT_AUTH_STRING", "MLFLOW_NODE_PASSWORD")}
    assert not any(secret in nodes.values() for secret in server_side.values())
    open_cmds = team.commands(where, tmp_path, None)  # --no-auth
    assert (
        "basic-auth" not in " ".join(open_cmds["mlflow"][0])
        and "PREFECT_SERVER_API_AUTH_STRING" not in (open_cmds["prefect"][1])
    )
    # both are rung's MLflow apps (flows/mlflow_app.py: no assistant, jobs or gateway), found by MLflow's CLI
    # through the installed entry points
    assert "--app-name rung" in " ".join(open_cmds["mlflow"][0])
    assert [mlflow_server._find_app(name) for name in ("rung", "rung-basic-auth")] == [
        "flows.mlflow_app:create_app",
        "flows.mlflow_app:create_auth_app",
    ]


@pytest.mark.parametrize(
    "path, refused",
    [
        ("/ajax-api/3.0/mlflow/assistant/config", True),
        ("/mlflow-prefix/ajax-api/3.0/mlflow/assistant", True),
        ("//ajax-api/3.0/mlflow//assistant/config", True),
        ("/ajax-api/3.0/mlflow/%61ssistant/config", True),
        ("/ajax-api/3.0/mlflow/assistant%252Fconfig", True),
        ("/ajax-api/3.0/mlflow/runs/../assistant/sessions", True),
        ("/AJAX-API/3.0/MLFLOW/ASSISTANT/config", True),
        ("/ajax-api/3.0/jobs/search", True),
        ("/ajax-api/3.0/mlflow/genai/evaluate/invoke", True),
        ("/api/3.0/mlflow/mcp-servers", True),
        ("/gateway/ep/mlflow/invocations", True),
        ("/api/2.0/mlflow/runs/log-batch", False),
        ("/ajax-api/2.0/mlflow/experiments/search", False),
        ("/static-files/index.html", False),
    ],
)
def test_mlflow_app_refuses_routes_that_run_code_however_spelled(path, refused):
    assert mlflow_app.refused(path) is refused


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_state_directory_another_user_owns_is_refused(tmp_path):
    """Its owner could plant a CA and its key (or swap credentials.env) whatever its mode after chmod."""
    state = tmp_path / "servers"
    (state / "tls").mkdir(parents=True)
    (state / "tls" / "ca-key.pem").write_text("planted")
    os.chown(state / "tls" / "ca-key.pem", 65534, 65534)
    with pytest.raises(InputError, match=r"ca-key.pem is owned by uid 65534, not by this user \(0\): use a --dir"):
        team.make_private(state)
    assert (state / "tls" / "ca-key.pem").read_text() == "planted"  # nothing changed


def test_tls_goes_to_both_servers_and_the_nodes_trust_the_generated_ca(tmp_path):
    where = team.Endpoints("0.0.0.0", "orch.example", 4200, 5000, https=True)
    tls = team.self_signed(tmp_path, where)
    cmds = team.commands(where, tmp_path, None, tls)
    ssl_opts = f"--ssl-certfile {tls.cert} --ssl-keyfile {tls.key}"
    mlflow = cmds["mlflow"][0]
    assert ssl_opts in " ".join(cmds["prefect"][0]) and mlflow[mlflow.index("--uvicorn-opts") + 1] == ssl_opts
    assert cmds["prefect"][1]["PREFECT_UI_API_URL"] == "https://orch.example:4200/api"  # what the UI calls
    nodes = team.client_env(where, None, tls)
    assert nodes["PREFECT_API_URL"] == "https://orch.example:4200/api" and nodes["MLFLOW_TRACKING_URI"].startswith(
        "https"
    )
    assert nodes["PREFECT_API_SSL_CERT_FILE"] == nodes["MLFLOW_TRACKING_SERVER_CERT_PATH"] == str(tmp_path / "ca.pem")
    assert "SSL_CERT_FILE" not in nodes and "REQUESTS_CA_BUNDLE" not in nodes  # the system's CAs stay trusted
    # the certificate chains to the CA for the nodes' name; the CA is kept across starts, the certificate renewed
    ca, cert = (tmp_path / "ca.pem").read_bytes(), tls.cert.read_bytes()
    again = team.self_signed(tmp_path, replace_name(where, "orch2.example"))
    assert (tmp_path / "ca.pem").read_bytes() == ca and again.cert.read_bytes() != cert
    _handshake(again, "orch2.example")
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        _handshake(again, "orch.example")
    assert {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "tls").iterdir()} == dict.fromkeys(
        ["ca-key.pem", "server.pem", "server-key.pem"], 0o600
    )
    # a given certificate: used as is, and the clients keep the system's CAs
    given = team.given(again.cert, again.key)
    assert "PREFECT_API_SSL_CERT_FILE" not in team.client_env(where, None, given)
    again.key.chmod(0o644)
    with pytest.raises(InputError, match=r"server-key.pem: readable by other users \(mode 644\); chmod 600 it$"):
        team.given(again.cert, again.key)


def replace_name(where: team.Endpoints, name: str) -> team.Endpoints:
    return team.Endpoints(where.host, name, where.prefect_port, where.mlflow_port, where.https)


def _handshake(tls: team.Tls, name: str) -> None:
    """A TLS handshake with a server holding `tls`, as a client trusting only the CA and asking for `name`."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tls.cert, tls.key)
    client = ssl.create_default_context(cafile=str(tls.ca))
    a, b = socket.socketpair()
    with a, b:
        done = threading.Thread(target=lambda: _quietly(lambda: server.wrap_socket(a, server_side=True)))
        done.start()
        try:
            client.wrap_socket(b, server_hostname=name).close()
        finally:
            b.close()
            done.join()


def _quietly(f) -> None:
    try:
        f()
    except (ssl.SSLError, OSError):
        pass


def test_every_start_makes_the_state_directory_private(tmp_path):
    """An existing --dir keeps its mode otherwise, and files an earlier start (or another umask) wrote stay
    readable: fixed on every start, leaving symbolic links (and what they point to) alone."""
    state, outside = tmp_path / "servers", tmp_path / "shared.txt"
    (state / "artifacts" / "1").mkdir(parents=True)
    outside.write_text("not ours")
    for path, mode in [
        (state, 0o755),
        (state / "artifacts", 0o775),
        (state / "artifacts" / "1", 0o755),
        (outside, 0o644),
    ]:
        path.chmod(mode)
    for name, mode in [("mlflow-auth.db", 0o644), ("prefect.log", 0o640), ("run.sh", 0o755), ("ok", 0o600)]:
        (state / name).write_text("x")
        (state / name).chmod(mode)
    (state / "link").symlink_to(outside)
    assert team.make_private(state) == 6
    modes = {str(p.relative_to(state)): p.lstat().st_mode & 0o777 for p in state.rglob("*") if not p.is_symlink()}
    assert modes == {
        "artifacts": 0o700,
        "artifacts/1": 0o700,
        "mlflow-auth.db": 0o600,
        "prefect.log": 0o600,
        "run.sh": 0o700,
        "ok": 0o600,
    }
    assert state.stat().st_mode & 0o777 == 0o700 and outside.stat().st_mode & 0o777 == 0o644
    assert team.make_private(state) == 0


@pytest.mark.parametrize(
    "host, loopback", [("127.0.0.1", True), ("localhost", True), ("::1", True), ("0.0.0.0", False)]
)
def test_only_loopback_may_serve_without_auth(host, loopback, tmp_path):
    assert team.is_loopback(host) is loopback
    if not loopback:
        with pytest.raises(InputError, match="add --allow-unauthenticated-network to do so anyway$"):
            team.serve(host, 4200, 5000, tmp_path, None, no_auth=True, open_network=False)


def test_off_loopback_the_servers_speak_https_unless_told_otherwise(tmp_path):
    def serve(host: str, **tls: object) -> None:
        team.serve(host, 4200, 5000, tmp_path, None, no_auth=False, open_network=False, **tls)

    with pytest.raises(InputError, match="cross the network in clear .* or --allow-plain-http to do so anyway$"):
        serve("0.0.0.0")
    with pytest.raises(InputError, match="--tls-cert and --tls-key go together"):
        serve("0.0.0.0", tls_cert=tmp_path / "cert.pem")
    with pytest.raises(InputError, match="not both"):
        serve("0.0.0.0", tls_cert=tmp_path / "c.pem", tls_key=tmp_path / "k.pem", tls_self_signed=True)
    with pytest.raises(InputError, match="cert.pem: no such file"):
        serve("0.0.0.0", tls_cert=tmp_path / "cert.pem", tls_key=tmp_path / "key.pem")
    assert not any(tmp_path.iterdir())  # refused before anything was written


class _BearerOnly(http.server.BaseHTTPRequestHandler):
    """Prefect Cloud as the check sees it: 401 unless the bearer key is right, and no /admin route."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        ok = self.path.endswith("/flows/filter") and self.headers.get("Authorization") == "Bearer pnu_right"
        self.send_response(200 if ok else 401)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_prefect_cloud_key_is_checked_as_a_bearer(default_params, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _BearerOnly)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/api/accounts/a/workspaces/w"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params = config.Params.model_validate(default_params)  # MLflow: local sqlite, nothing to ask
    try:
        with temporary_settings({PREFECT_API_URL: url, PREFECT_API_KEY: "pnu_right"}):
            credentials.check(params)
        with (
            temporary_settings({PREFECT_API_URL: url, PREFECT_API_KEY: "pnu_wrong"}),
            pytest.raises(InputError, match=rf"^Prefect at {url} refused the credentials: set PREFECT_API_KEY$"),
        ):
            credentials.check(params)
    finally:
        server.shutdown()
