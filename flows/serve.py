"""`rung serve`: the team's Prefect and MLflow servers on one host, each behind its own authentication.

Prefect runs with basic auth (`PREFECT_SERVER_API_AUTH_STRING`): without it anyone who reaches the
host can create a deployment run that a worker on a GPU node executes. MLflow runs its basic-auth app
(users and per-experiment permissions): its admin is created on the first start with a generated
password (MLflow ships none), and the GPU nodes log as a user of their own, not the admin.

Secrets are generated on the first start into `<dir>/credentials.env` and the nodes' part into
`<dir>/client.env`, both mode 0600 in a 0700 directory outside any checkout; they reach the servers
through the environment (never argv, which `ps` shows to every user) and are never printed.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from flows.credentials import basic, http_status
from rung.errors import InputError

NODE_USER = "rung"  # the MLflow user every GPU node logs as
ADMIN = "admin"
# Telemetry off: a team host often has no internet, and Prefect then logs "Failed to send telemetry".
QUIET = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}
STARTUP_TIMEOUT_S = 600  # a new Prefect database is migrated on its first start (~30 s on 2 cores)


@dataclass(frozen=True)
class Endpoints:
    host: str  # the address the servers bind
    name: str  # the name GPU nodes reach this host by
    prefect_port: int
    mlflow_port: int

    @property
    def prefect_api(self) -> str:
        return f"http://{self.name}:{self.prefect_port}/api"

    @property
    def mlflow(self) -> str:
        return f"http://{self.name}:{self.mlflow_port}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_env_file(path: Path) -> dict[str, str]:
    """`KEY=value` lines (the format `set -a; . file` exports)."""
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def _write_private(path: Path, values: dict[str, str]) -> None:
    """Write `values` as KEY=value lines to a new file created with mode 0600 (never readable by others,
    not even for the instant before a chmod)."""
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in values.items()))
    tmp.replace(path)


def credentials(state: Path) -> dict[str, str]:
    """The servers' secrets, generated on the first start and read back afterwards. A credentials file
    that others can read is refused: its secrets must be taken as leaked."""
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state / "credentials.env"
    if path.exists():
        if path.stat().st_mode & 0o077:
            raise InputError(f"{path}: readable by other users (mode {path.stat().st_mode & 0o777:o}); chmod 600 it")
        return read_env_file(path)
    token = lambda: secrets.token_urlsafe(24)  # noqa: E731
    values = {
        "PREFECT_AUTH_STRING": f"{NODE_USER}:{token()}",
        "MLFLOW_ADMIN_PASSWORD": token(),
        "MLFLOW_NODE_PASSWORD": token(),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": token(),
    }
    _write_private(path, values)
    return values


def client_env(where: Endpoints, creds: dict[str, str] | None) -> dict[str, str]:
    """What a GPU node exports: the servers' URLs, and with auth the nodes' credentials."""
    env = {"PREFECT_API_URL": where.prefect_api, "MLFLOW_TRACKING_URI": where.mlflow}
    if creds:
        env |= {
            "PREFECT_API_AUTH_STRING": creds["PREFECT_AUTH_STRING"],
            "MLFLOW_TRACKING_USERNAME": NODE_USER,
            "MLFLOW_TRACKING_PASSWORD": creds["MLFLOW_NODE_PASSWORD"],
        }
    return env


def commands(
    where: Endpoints, state: Path, creds: dict[str, str] | None
) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each server's command line and the environment it adds (secrets only there)."""
    prefect_env = {"PREFECT_HOME": str(state / "prefect"), **QUIET}
    mlflow_env = dict(QUIET)
    mlflow = [sys.executable, "-m", "mlflow", "server", "--host", where.host, "--port", str(where.mlflow_port)]
    mlflow += ["--backend-store-uri", f"sqlite:///{state / 'mlflow.db'}", "--serve-artifacts"]
    mlflow += ["--artifacts-destination", str(state / "artifacts"), "--workers", "2"]
    # MLflow refuses Host headers other than localhost and private IPs (DNS rebinding): allow the nodes' name
    mlflow += ["--allowed-hosts", f"{where.name},{where.name}:{where.mlflow_port},localhost:*,127.0.0.1:*"]
    if creds:
        auth_ini = state / "mlflow-auth.ini"
        auth_ini.write_text(
            "[mlflow]\ndefault_permission = READ\n"
            f"database_uri = sqlite:///{state / 'mlflow-auth.db'}\nadmin_username = {ADMIN}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
            # a credential is checked (PBKDF2, ~0.1-0.5 s of CPU) once a minute per worker, not per request
            "auth_cache_ttl_seconds = 60\n"
        )
        prefect_env["PREFECT_SERVER_API_AUTH_STRING"] = creds["PREFECT_AUTH_STRING"]
        mlflow_env |= {
            "MLFLOW_AUTH_CONFIG_PATH": str(auth_ini),
            "MLFLOW_AUTH_ADMIN_PASSWORD": creds["MLFLOW_ADMIN_PASSWORD"],
            "MLFLOW_FLASK_SERVER_SECRET_KEY": creds["MLFLOW_FLASK_SERVER_SECRET_KEY"],
        }
        mlflow += ["--app-name", "basic-auth"]
    prefect = [sys.executable, "-m", "prefect", "server", "start", "--host", where.host]
    prefect += ["--port", str(where.prefect_port)]
    return {"prefect": (prefect, prefect_env), "mlflow": (mlflow, mlflow_env)}


def add_node_user(mlflow_url: str, creds: dict[str, str]) -> None:
    """Create the nodes' MLflow user (once; later starts find it) with the admin's credentials."""
    body = json.dumps({"username": NODE_USER, "password": creds["MLFLOW_NODE_PASSWORD"]}).encode()
    admin = basic(f"{ADMIN}:{creds['MLFLOW_ADMIN_PASSWORD']}")
    status = http_status(f"{mlflow_url}/api/2.0/mlflow/users/create", admin, body)
    if status not in (200, 400):  # 400: RESOURCE_ALREADY_EXISTS
        raise RuntimeError(f"MLflow refused to create user {NODE_USER!r}: HTTP {status}")


def wait_up(proc: subprocess.Popen, url: str, log: Path) -> None:
    """Until `url` answers (any answer, 401 included: the server is up); RuntimeError with the end of
    `log` when the server exits first or does not start in STARTUP_TIMEOUT_S."""
    deadline = time.time() + STARTUP_TIMEOUT_S
    while True:
        try:
            http_status(url, timeout=2)
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
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """What a GPU node exports."""
        return client_env(self.where, self.creds)

    def start(self, name: str) -> None:
        """Start server `name` ('prefect' or 'mlflow') and wait until it answers on loopback."""
        self.launch(name)
        self.wait(name)

    def launch(self, name: str) -> None:
        cmd, extra = commands(self.where, self.state, self.creds)[name]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "MLFLOW_TRACKING"))}
        with (self.state / f"{name}.log").open("a") as out:
            self.procs[name] = subprocess.Popen(cmd, env={**env, **extra}, stdout=out, stderr=subprocess.STDOUT)
        self.started[name] = time.time()

    def wait(self, name: str) -> None:
        local = Endpoints("127.0.0.1", "127.0.0.1", self.where.prefect_port, self.where.mlflow_port)
        health = {"prefect": f"{local.prefect_api}/health", "mlflow": f"{local.mlflow}/health"}[name]
        try:
            wait_up(self.procs[name], health, self.state / f"{name}.log")
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
def running(where: Endpoints, state: Path, auth: bool = True) -> Iterator[Team]:
    """Both servers up (auth on unless `auth` is False), stopped on exit."""
    creds = credentials(state) if auth else None
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    team = Team(where, state, creds)
    try:
        for name in ("prefect", "mlflow"):
            team.launch(name)  # both start at once: a new Prefect database takes ~30 s to migrate
        for name in ("prefect", "mlflow"):
            team.wait(name)
        if creds:
            add_node_user(f"http://127.0.0.1:{where.mlflow_port}", creds)
        _write_private(state / "client.env", team.env)
        yield team
    finally:
        for name in list(team.procs):
            team.stop(name)


STEADY_S = 60  # a server that exits after running this long is restarted; sooner, it is failing to run


def serve(
    host: str, prefect_port: int, mlflow_port: int, state: Path, name: str | None, no_auth: bool, open_network: bool
) -> None:
    """Run both servers until interrupted (Ctrl-C or SIGTERM), printing what each GPU node exports, and
    restart a server that exits (a crash, the OOM killer) once it had been running STEADY_S seconds."""
    if no_auth and not is_loopback(host) and not open_network:
        raise InputError(
            f"rung serve: --no-auth on {host} lets anyone who reaches this host read every run and run code "
            "on the GPU nodes; add --allow-unauthenticated-network to do so anyway"
        )
    where = Endpoints(
        host, name or (host if host not in ("0.0.0.0", "::") else socket.getfqdn()), prefect_port, mlflow_port
    )
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"starting Prefect ({where.prefect_api}) and MLflow ({where.mlflow}); logs in {state}", flush=True)
    with running(where, state, auth=not no_auth) as team:
        print(
            f"up{'' if no_auth else ', with authentication'}. On each GPU node (copy {state / 'client.env'} there, "
            "mode 0600):\n  set -a; . ./client.env; set +a\n"
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
