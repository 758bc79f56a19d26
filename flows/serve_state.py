"""Where `rung serve`'s servers listen (`Endpoints`) and its state directory (`--dir`): owner-only files, the
servers' generated secrets (`credentials.env`) and their TLS certificates (a CA generated into it, or the user's
own). flows.serve starts the servers from it."""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import socket
import ssl
import stat
from dataclasses import dataclass, replace
from pathlib import Path

from rung.errors import InputError

NODE_USER = "rung"  # the MLflow user every GPU node logs as


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


def read_env_file(path: Path) -> dict[str, str]:
    """`KEY=value` lines (the format `set -a; . file` exports)."""
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def write_private(path: Path, values: dict[str, str] | bytes | str) -> None:
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
        write_private(path, values)
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
        write_private(ca_key_path, ca_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, no_password))
        write_private(ca_path, ca.public_bytes(pem))

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
    write_private(private / "server-key.pem", key_bytes)
    write_private(private / "server.pem", cert.public_bytes(pem) + ca.public_bytes(pem))
    return Tls(private / "server.pem", private / "server-key.pem", ca_path)


def given(cert: Path, key: Path) -> Tls:
    """A certificate and key the user gives (signed by a CA the nodes already trust)."""
    for path in (cert, key):
        if not path.is_file():
            raise InputError(f"rung serve: {path}: no such file")
    if key.stat().st_mode & 0o007:
        raise InputError(f"{key}: readable by other users (mode {key.stat().st_mode & 0o777:o}); chmod 600 it")
    return Tls(cert.resolve(), key.resolve(), None)
