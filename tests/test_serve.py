"""`rung serve`'s credentials and commands, and the clients' check of a Prefect Cloud key, without
starting a server (tests/test_orchestration.py starts both with auth and runs a deployment through them)."""

from __future__ import annotations

import http.server
import threading

import pytest
from prefect.settings import PREFECT_API_KEY, PREFECT_API_URL, temporary_settings

from flows import credentials
from flows import serve as team
from rung import config
from rung.errors import InputError


def test_credentials_are_generated_once_into_a_file_only_its_owner_reads(tmp_path):
    state = tmp_path / "servers"
    first = team.credentials(state)
    assert (state / "credentials.env").stat().st_mode & 0o777 == 0o600 and state.stat().st_mode & 0o777 == 0o700
    assert team.credentials(state) == first  # read back, not regenerated
    assert len({v for v in first.values()}) == 4 and all(len(v) >= 32 for v in first.values())
    (state / "credentials.env").chmod(0o644)
    with pytest.raises(InputError, match=r"credentials.env: readable by other users \(mode 644\); chmod 600 it$"):
        team.credentials(state)


def test_secrets_reach_the_servers_by_environment_never_by_command_line(tmp_path):
    creds = team.credentials(tmp_path)
    where = team.Endpoints("0.0.0.0", "orch.example", 4200, 5000)
    cmds = team.commands(where, tmp_path, creds)
    argv = " ".join(" ".join(cmd) for cmd, _ in cmds.values())
    assert not any(secret in argv for secret in creds.values())
    assert "--app-name basic-auth" in argv and "orch.example" in argv  # MLflow's allowed Host header
    assert cmds["prefect"][1]["PREFECT_SERVER_API_AUTH_STRING"] == creds["PREFECT_AUTH_STRING"]
    assert cmds["mlflow"][1]["MLFLOW_AUTH_ADMIN_PASSWORD"] == creds["MLFLOW_ADMIN_PASSWORD"]
    assert all(env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false" for _, env in cmds.values())
    assert team.client_env(where, creds)["MLFLOW_TRACKING_URI"] == "http://orch.example:5000"
    open_cmds = team.commands(where, tmp_path, None)  # --no-auth
    assert (
        "basic-auth" not in " ".join(open_cmds["mlflow"][0])
        and "PREFECT_SERVER_API_AUTH_STRING" not in (open_cmds["prefect"][1])
    )


@pytest.mark.parametrize(
    "host, loopback", [("127.0.0.1", True), ("localhost", True), ("::1", True), ("0.0.0.0", False)]
)
def test_only_loopback_may_serve_without_auth(host, loopback, tmp_path):
    assert team.is_loopback(host) is loopback
    if not loopback:
        with pytest.raises(InputError, match="add --allow-unauthenticated-network to do so anyway$"):
            team.serve(host, 4200, 5000, tmp_path, None, no_auth=True, open_network=False)


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
