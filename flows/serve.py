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

import datetime
import ipaddress
import json
import os
import secrets
import shlex
import signal
import socket
import ssl
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from flows.credentials import basic, http_status
from rung.errors import InputError

NODE_USER = "rung"  # the MLflow user every GPU node logs as
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


@dataclass(frozen=True)
class Endpoints:
    host: str  # the address the servers bind
    name: str  # the name GPU nodes reach this host by
    prefect_port: int
    mlflow_port: int
    https: bool = False

    @property
    def prefect_api(self) -> str:
        return f"{'https' if self.https else 'http'}://{self.name}:{self.prefect_port}/api"

    @property
    def mlflow(self) -> str:
        return f"{'https' if self.https else 'http'}://{self.name}:{self.mlflow_port}"

    @property
    def local(self) -> Endpoints:
        """The same servers as this host reaches them (health checks, the admin's calls)."""
        return replace(self, host="127.0.0.1", name="127.0.0.1")


@dataclass(frozen=True)
class Tls:
    cert: Path  # the servers' certificate (its chain may follow it in the file)
    key: Path
    ca: Path | None  # what clients must trust: the generated CA; None for a given certificate

    def pinned(self) -> ssl.SSLContext:
        """A context that trusts exactly `cert`, whatever name it carries: this host's own calls to its
        servers over loopback (a given certificate need not name 127.0.0.1, nor chain to a CA this host
        trusts), which still refuse anything else answering on the port."""
        context = ssl.create_default_context(cafile=str(self.cert))
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # a leaf as a trust anchor
        context.check_hostname = False
        return context


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


def _write_private(path: Path, values: dict[str, str] | bytes | str) -> None:
    """Write `values` (as KEY=value lines) or text to a new file created with mode 0600 (never readable by
    others, not even for the instant before a chmod)."""
    if isinstance(values, dict):
        values = "".join(f"{k}={v}\n" for k, v in values.items())
    data = values.encode() if isinstance(values, str) else values
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)


def make_private(state: Path) -> int:
    """`state` 0700 and everything under it owner-only (directories 0700, files 0600), on every start: an
    existing directory keeps whatever mode it had, and servers of an earlier start (or another umask)
    left files others could read. Symbolic links are left alone (chmod would change their targets).
    Refuses a directory, or anything in it, that another user owns: its owner could swap the CA, the
    credentials or a database whatever the modes (a planted ca.pem and tls/ca-key.pem would let them pose
    as both servers to the nodes). Returns how many paths were readable or writable by others."""
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    paths = [state, *state.rglob("*")]
    if foreign := next((p for p in paths if p.lstat().st_uid != os.geteuid()), None):
        raise InputError(
            f"rung serve: {foreign} is owned by uid {foreign.lstat().st_uid}, not by this user ({os.geteuid()}):"
            " use a --dir of your own"
        )
    fixed = 0
    for path in paths:
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode) or not mode & 0o077:
            continue
        path.chmod(0o700 if stat.S_ISDIR(mode) else stat.S_IMODE(mode) & 0o700)
        fixed += 1
    return fixed


def credentials(state: Path) -> dict[str, str]:
    """The servers' secrets, generated on the first start and read back afterwards. A credentials file
    that others can read is refused: its secrets must be taken as leaked."""
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state / "credentials.env"
    values = {}
    if path.exists():
        if path.stat().st_mode & 0o077:
            raise InputError(f"{path}: readable by other users (mode {path.stat().st_mode & 0o777:o}); chmod 600 it")
        values = read_env_file(path)
    token = lambda: secrets.token_urlsafe(24)  # noqa: E731
    wanted = {
        "PREFECT_AUTH_STRING": lambda: f"{NODE_USER}:{token()}",
        "MLFLOW_ADMIN_PASSWORD": token,
        "MLFLOW_NODE_PASSWORD": token,
        "MLFLOW_FLASK_SERVER_SECRET_KEY": token,
        # MLflow encrypts the AI gateway's stored secrets (provider API keys) with a key derived from this;
        # unset, from a passphrase public in its source. rung turns the gateway off: this covers an admin
        # who turns it back on.
        "MLFLOW_CRYPTO_KEK_PASSPHRASE": token,
    }
    if missing := [k for k in wanted if k not in values]:  # the first start, or a file from an older rung
        values |= {k: wanted[k]() for k in missing}
        _write_private(path, values)
    return values


def self_signed(state: Path, where: Endpoints) -> Tls:
    """A CA generated once into `<state>/ca.pem` (its key in `<state>/tls/`, 0600) and a certificate it
    signs for the servers, made anew on every start for the names the nodes use (`where.name`, the bound
    address, localhost): the nodes trust the CA, so the name can change without touching them."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    private = state / "tls"
    private.mkdir(mode=0o700, exist_ok=True)
    ca_path, ca_key_path = state / "ca.pem", private / "ca-key.pem"
    now = datetime.datetime.now(datetime.UTC)
    pem = serialization.Encoding.PEM

    def signed(
        subject: x509.Name,
        key: ec.EllipticCurvePrivateKey,
        issuer: x509.Certificate | None,
        signer: ec.EllipticCurvePrivateKey,
        days: int,
    ) -> x509.CertificateBuilder:
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer.subject if issuer else subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(ski, critical=False)
            # Python 3.13's default context is strict (VERIFY_X509_STRICT): it wants both key identifiers
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False)
        )
        return builder

    if ca_path.exists() and ca_key_path.exists():
        ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):  # rung writes a P-256 key; someone replaced it
            raise InputError(
                f"{ca_key_path}: not an elliptic-curve private key (delete it and the CA to make new ones)"
            )
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"rung serve CA ({socket.gethostname()})")])
        ca = (
            signed(name, ca_key, None, ca_key, 3650)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )  # keyCertSign, cRLSign
            .sign(ca_key, hashes.SHA256())
        )
        no_password = serialization.NoEncryption()
        _write_private(ca_key_path, ca_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, no_password))
        _write_private(ca_path, ca.public_bytes(pem))

    names: list[x509.GeneralName] = []
    for host in dict.fromkeys([where.name, where.host, "localhost", "127.0.0.1", "::1"]):
        if host in ("0.0.0.0", "::"):
            continue
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, where.name)])
    cert = (
        signed(subject, key, ca, ca_key, 397)  # 397 days: the longest validity browsers accept
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_bytes = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    _write_private(private / "server-key.pem", key_bytes)
    _write_private(private / "server.pem", cert.public_bytes(pem) + ca.public_bytes(pem))
    return Tls(private / "server.pem", private / "server-key.pem", ca_path)


def given(cert: Path, key: Path) -> Tls:
    """A certificate and key the user gives (signed by a CA the nodes already trust)."""
    for path in (cert, key):
        if not path.is_file():
            raise InputError(f"rung serve: {path}: no such file")
    if key.stat().st_mode & 0o007:
        raise InputError(f"{key}: readable by other users (mode {key.stat().st_mode & 0o777:o}); chmod 600 it")
    return Tls(cert.resolve(), key.resolve(), None)


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
        _write_private(
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
        _write_private(state / "client.env", team.env)
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
