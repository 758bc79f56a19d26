"""`rung serve`: the team's Prefect and MLflow servers on one host, each behind its own authentication.

Prefect runs with basic auth (`PREFECT_SERVER_API_AUTH_STRING`): without it anyone who reaches the
host can create a deployment run that a worker on a GPU node executes. MLflow runs its basic-auth app
(users and per-experiment permissions): its admin is created on the first start with a generated
password (MLflow ships none), and the GPU nodes log as a user of their own, not the admin.

Secrets are generated on the first start into `<dir>/credentials.env` and the nodes' part into
`<dir>/client.env`; they reach the servers through the environment (never argv, which `ps` shows to
every user) and are never printed. Every start makes `<dir>` 0700 and everything in it owner-only, and
the servers run with umask 077: their databases (mlflow-auth.db holds password hashes), logs and
artifacts are 0600.

Off loopback both servers speak HTTPS (`--tls-cert`/`--tls-key`, or a CA generated into `<dir>` whose
certificate client.env tells the nodes' Prefect and MLflow clients to trust): basic auth sends the
credentials with every request. Plain HTTP off loopback takes `--allow-plain-http`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from flows.credentials import basic, http_status
from flows.serve_state import NODE_USER, Endpoints, Tls, credentials, given, make_private, self_signed, write_private
from rung.errors import InputError

ADMIN = "admin"
# Telemetry off: a team host often has no internet, and Prefect then logs "Failed to send telemetry".
QUIET = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}
# What the nodes' clients read to trust the generated CA: scoped to each server, unlike SSL_CERT_FILE or
# REQUESTS_CA_BUNDLE, which would replace the system's CAs for every HTTPS call (the Hugging Face Hub too).
CA_VARIABLES = ("PREFECT_API_SSL_CERT_FILE", "MLFLOW_TRACKING_SERVER_CERT_PATH")
SERVER_TOOLS = (
    "MLFLOW_ENABLE_AI_GATEWAY",
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION",
    "MLFLOW_SERVER_ENABLE_CUSTOM_SCORERS",
    "MLFLOW_ENABLE_REMOTE_ASSISTANT",
)
STARTUP_TIMEOUT_S = 600  # a new Prefect database is migrated on its first start (~30 s on 2 cores)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def client_env(where: Endpoints, creds: dict[str, str] | None, tls: Tls | None = None) -> dict[str, str]:
    """What a GPU node exports: the servers' URLs, the CA to trust for a generated one, and with auth
    the nodes' credentials (never the admin's, nor the server-side secrets)."""
    env = {"PREFECT_API_URL": where.prefect_api, "MLFLOW_TRACKING_URI": where.mlflow}
    if tls and tls.ca:
        env |= dict.fromkeys(CA_VARIABLES, str(tls.ca))
    if creds:
        env |= {
            "PREFECT_API_AUTH_STRING": creds["PREFECT_AUTH_STRING"],
            "MLFLOW_TRACKING_USERNAME": NODE_USER,
            "MLFLOW_TRACKING_PASSWORD": creds["MLFLOW_NODE_PASSWORD"],
        }
    return env


def commands(
    where: Endpoints, state: Path, creds: dict[str, str] | None, tls: Tls | None = None
) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each server's command line and the environment it adds (secrets only there)."""
    # `prefect server start` has no TLS options: run its app under uvicorn as that command does
    # (create_app(final=True), services in the same process), with or without TLS alike.
    prefect_env = {"PREFECT_HOME": str(state / "prefect"), "PREFECT__SERVER_FINAL": "1", **QUIET}
    # The UI asks /ui-settings for the API's URL; unset, it names http:// and port 4200
    prefect_env["PREFECT_UI_API_URL"] = where.prefect_api
    # Off whatever the admin's shell says, as flows/mlflow_app.py refuses their routes: MLflow's AI gateway
    # (any logged-in user could store provider keys in the server and make it call URLs), its job runner
    # (scorers, judges, prompt optimisers), server-side custom scorer code, and the remote assistant
    mlflow_env = {**QUIET, **dict.fromkeys(SERVER_TOOLS, "false")}
    mlflow = [sys.executable, "-m", "mlflow", "server", "--host", where.host, "--port", str(where.mlflow_port)]
    mlflow += ["--app-name", "rung-basic-auth" if creds else "rung"]
    mlflow += ["--backend-store-uri", f"sqlite:///{state / 'mlflow.db'}", "--serve-artifacts"]
    mlflow += ["--artifacts-destination", str(state / "artifacts"), "--workers", "2"]
    # MLflow refuses Host headers other than localhost and private IPs (DNS rebinding): allow the nodes' name
    mlflow += ["--allowed-hosts", f"{where.name},{where.name}:{where.mlflow_port},localhost:*,127.0.0.1:*"]
    prefect = [sys.executable, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app"]
    prefect += ["--host", where.host, "--port", str(where.prefect_port)]
    if tls:  # paths, no secret: the key is in a 0600 file
        ssl_opts = ["--ssl-certfile", str(tls.cert), "--ssl-keyfile", str(tls.key)]
        prefect += ssl_opts
        mlflow += ["--uvicorn-opts", shlex.join(ssl_opts)]
    if creds:
        auth_ini = state / "mlflow-auth.ini"
        write_private(
            auth_ini,
            "[mlflow]\ndefault_permission = READ\n"
            f"database_uri = sqlite:///{state / 'mlflow-auth.db'}\nadmin_username = {ADMIN}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
            # a credential is checked (PBKDF2, ~0.1-0.5 s of CPU) once a minute per worker, not per request
            "auth_cache_ttl_seconds = 60\n",
        )
        prefect_env["PREFECT_SERVER_API_AUTH_STRING"] = creds["PREFECT_AUTH_STRING"]
        mlflow_env |= {
            "MLFLOW_AUTH_CONFIG_PATH": str(auth_ini),
            "MLFLOW_AUTH_ADMIN_PASSWORD": creds["MLFLOW_ADMIN_PASSWORD"],
            "MLFLOW_FLASK_SERVER_SECRET_KEY": creds["MLFLOW_FLASK_SERVER_SECRET_KEY"],
        }
        if "MLFLOW_CRYPTO_KEK_PASSPHRASE" in creds:
            mlflow_env["MLFLOW_CRYPTO_KEK_PASSPHRASE"] = creds["MLFLOW_CRYPTO_KEK_PASSPHRASE"]
    return {"prefect": (prefect, prefect_env), "mlflow": (mlflow, mlflow_env)}


def add_node_user(mlflow_url: str, creds: dict[str, str], context: ssl.SSLContext | None = None) -> None:
    """Create the nodes' MLflow user (once; later starts find it) with the admin's credentials."""
    body = json.dumps({"username": NODE_USER, "password": creds["MLFLOW_NODE_PASSWORD"]}).encode()
    admin = basic(f"{ADMIN}:{creds['MLFLOW_ADMIN_PASSWORD']}")
    status = http_status(f"{mlflow_url}/api/2.0/mlflow/users/create", admin, body, context=context)
    if status not in (200, 400):  # 400: RESOURCE_ALREADY_EXISTS
        raise RuntimeError(f"MLflow refused to create user {NODE_USER!r}: HTTP {status}")


def wait_up(proc: subprocess.Popen, url: str, log: Path, context: ssl.SSLContext | None = None) -> None:
    """Until `url` answers (any answer, 401 included: the server is up); RuntimeError with the end of
    `log` when the server exits first or does not start in STARTUP_TIMEOUT_S."""
    deadline = time.time() + STARTUP_TIMEOUT_S
    while True:
        try:
            http_status(url, timeout=2, context=context)
            return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the server did not start; the end of {log}:\n{log.read_text()[-2000:]}") from None
            time.sleep(0.5)


@dataclass
class Team:
    """The two servers of one host: each can be (re)started and stopped on its own."""

    where: Endpoints
    state: Path
    creds: dict[str, str] | None
    tls: Tls | None = None
    fixed: int = 0  # paths make_private found open to others at this start
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """What a GPU node exports."""
        return client_env(self.where, self.creds, self.tls)

    @property
    def context(self) -> ssl.SSLContext | None:
        """For this host's own calls to its servers."""
        return self.tls.pinned() if self.tls else None

    def start(self, name: str) -> None:
        """Start server `name` ('prefect' or 'mlflow') and wait until it answers on loopback."""
        self.launch(name)
        self.wait(name)

    def launch(self, name: str) -> None:
        cmd, extra = commands(self.where, self.state, self.creds, self.tls)[name]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "MLFLOW_TRACKING"))}
        log = os.open(self.state / f"{name}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:  # umask 077: what the server creates (databases, logs, artifacts) only its owner reads
            self.procs[name] = subprocess.Popen(
                cmd, env={**env, **extra}, stdout=log, stderr=subprocess.STDOUT, umask=0o077
            )
        finally:
            os.close(log)
        self.started[name] = time.time()

    def wait(self, name: str) -> None:
        local = self.where.local
        health = {"prefect": f"{local.prefect_api}/health", "mlflow": f"{local.mlflow}/health"}[name]
        try:
            wait_up(self.procs[name], health, self.state / f"{name}.log", self.context)
        except RuntimeError as e:
            raise RuntimeError(f"{name}: {e}") from None

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()

    def down(self) -> list[str]:
        return [name for name, proc in self.procs.items() if proc.poll() is not None]


@contextmanager
def running(where: Endpoints, state: Path, auth: bool = True, tls: tuple[Path, Path] | bool = False) -> Iterator[Team]:
    """Both servers up (auth on unless `auth` is False; HTTPS with `tls`: a given (certificate, key), or
    True for a CA generated into `state`), stopped on exit."""
    fixed = make_private(state)
    creds = credentials(state) if auth else None
    where = replace(where, https=tls is not False)
    certs = None if tls is False else self_signed(state, where) if tls is True else given(*tls)
    team = Team(where, state, creds, certs, fixed)
    try:
        for name in ("prefect", "mlflow"):
            team.launch(name)  # both start at once: a new Prefect database takes ~30 s to migrate
        for name in ("prefect", "mlflow"):
            team.wait(name)
        if creds:
            add_node_user(where.local.mlflow, creds, team.context)
        write_private(state / "client.env", team.env)
        yield team
    finally:
        for name in list(team.procs):
            team.stop(name)


STEADY_S = 60  # a server that exits after running this long is restarted; sooner, it is failing to run


def serve(
    host: str,
    prefect_port: int,
    mlflow_port: int,
    state: Path,
    name: str | None,
    no_auth: bool,
    open_network: bool,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    tls_self_signed: bool = False,
    plain_http: bool = False,
) -> None:
    """Run both servers until interrupted (Ctrl-C or SIGTERM), printing what each GPU node exports, and
    restart a server that exits (a crash, the OOM killer) once it had been running STEADY_S seconds."""
    if no_auth and not is_loopback(host) and not open_network:
        raise InputError(
            f"rung serve: --no-auth on {host} lets anyone who reaches this host read every run and run code "
            "on the GPU nodes; add --allow-unauthenticated-network to do so anyway"
        )
    if (tls_cert is None) != (tls_key is None):
        raise InputError("rung serve: --tls-cert and --tls-key go together")
    if tls_cert and tls_self_signed:
        raise InputError("rung serve: --tls-self-signed or --tls-cert/--tls-key, not both")
    tls: tuple[Path, Path] | bool = (tls_cert, tls_key) if tls_cert and tls_key else tls_self_signed
    if tls_cert and tls_key:
        given(tls_cert, tls_key)  # refused before anything is written
    if tls is False and not is_loopback(host) and not plain_http:
        raise InputError(
            f"rung serve: on {host} without TLS the Prefect auth string and the MLflow passwords cross the network "
            f"in clear with every request; add --tls-self-signed (a CA generated into {state}, which client.env "
            "tells the nodes to trust) or --tls-cert/--tls-key, or --allow-plain-http to do so anyway"
        )
    where = Endpoints(
        host, name or (host if host not in ("0.0.0.0", "::") else socket.getfqdn()), prefect_port, mlflow_port
    )
    where = replace(where, https=tls is not False)
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"starting Prefect ({where.prefect_api}) and MLflow ({where.mlflow}); logs in {state}", flush=True)
    with running(where, state, auth=not no_auth, tls=tls) as team:
        if team.fixed:
            print(f"{team.fixed} paths in {state} were open to other users: now owner-only", flush=True)
        files = "client.env" + (" and ca.pem" if team.tls and team.tls.ca else "")
        print(
            f"up{'' if no_auth else ', with authentication'}{', over HTTPS' if team.tls else ''}. On each GPU node "
            f"(copy {files} from {state} there, mode 0600"
            + (f"; client.env names the CA as {team.tls.ca}: put it at that path" if team.tls and team.tls.ca else "")
            + "):\n  set -a; . ./client.env; set +a\n"
            f"Prefect UI: {where.prefect_api.removesuffix('/api')}  MLflow UI: {where.mlflow}"
            + (
                ""
                if no_auth
                else f"  (MLflow admin: {ADMIN}, password MLFLOW_ADMIN_PASSWORD in {state / 'credentials.env'})"
            ),
            flush=True,
        )
        try:
            while True:
                for server in team.down():
                    code = team.procs[server].returncode
                    if time.time() - team.started[server] < STEADY_S:
                        raise RuntimeError(f"the {server} server exited (code {code}); its log is in {state}")
                    print(f"the {server} server exited (code {code}); restarting it", flush=True)
                    team.start(server)
                time.sleep(1)
        except KeyboardInterrupt:
            print("stopping", flush=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
