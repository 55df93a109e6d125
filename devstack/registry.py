"""Start and stop a local OCI registry (Debian ``docker-registry``, distribution 2.8) on loopback.

    with Registry(work_dir).start() as registry:
        ref = push_image(client, registry.host, "gridmarket/busybox:test")  # devstack.images

The registry listens on ``127.0.0.1:<a free port>`` (``host`` is ``127.0.0.1:<port>``, what image
references start with), keeps its blobs under ``<work_dir>/storage`` (reused by later starts), its
config in ``<work_dir>/config.yml`` and its log in ``<work_dir>/registry.log``. Plain HTTP: dockerd
pulls from and pushes to registries on 127.0.0.0/8 without TLS and without ``insecure-registries``.

With ``users={"name": "password"}`` it wants HTTP basic credentials (an htpasswd file of bcrypt
hashes, made with the standard library's ``crypt``: libxcrypt's ``$2b$``, which the registry's
Go bcrypt accepts). The package's own system service (on :5000) is not used.

``bind="10.231.5.1"`` listens there instead of on loopback (a registry other machines use, e.g.
across :mod:`devstack.netns`'s bridge). ``tls=True`` serves HTTPS with a self-signed certificate
for that address, made with ``openssl`` (``ca_file``: what clients trust): clients of
:mod:`gridmarket.images` speak HTTPS to every registry not on loopback. dockerd accepts it only
as an ``insecure-registries`` entry (then it does not verify the certificate) or with the
certificate under ``/etc/docker/certs.d/<host>/ca.crt``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Self

from devstack._process import ManagedProcess, Service, ServiceError, clear_stale_pidfile

__all__ = ["REGISTRY_BINARY", "Registry", "ServiceError", "htpasswd_line", "self_signed_cert"]

REGISTRY_BINARY = "/usr/bin/docker-registry"


def htpasswd_line(user: str, password: str, rounds: int = 1024) -> str:
    """``user:$2b$10$...``: one htpasswd entry with a bcrypt hash (``rounds`` = 2**cost)."""
    if not user or ":" in user or "\n" in user or "\n" in password:
        raise ValueError(f"bad htpasswd user {user!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # crypt: removed in Python 3.13
        import crypt
    if crypt.METHOD_BLOWFISH not in crypt.methods:
        raise ServiceError("this libc's crypt() has no bcrypt: htpasswd auth is unavailable")
    salt = crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=rounds)  # noqa: S324 (bcrypt, not weak)
    hashed = crypt.crypt(password, salt)
    if not hashed or not hashed.startswith("$2"):
        raise ServiceError("crypt() did not produce a bcrypt hash")
    return f"{user}:{hashed}"


def self_signed_cert(directory: Path, ip: str, days: int = 7) -> tuple[Path, Path]:
    """A self-signed certificate for the IP address ``ip`` (its subjectAltName) and its key,
    ``directory/registry.crt`` and ``registry.key`` (EC P-256, ``openssl req -x509``)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ServiceError("openssl not found (apt-get install openssl): no TLS registry")
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "registry.crt", directory / "registry.key"
    argv = [
        openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", str(key), "-out", str(cert), "-days", str(days),
        "-subj", "/CN=gridmarket devnet registry", "-addext", f"subjectAltName=IP:{ip}",
    ]  # fmt: skip
    result = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if result.returncode != 0:
        raise ServiceError(f"openssl could not make a certificate for {ip}: {result.stderr}")
    key.chmod(0o600)
    return cert, key


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class Registry(Service):
    """A docker-registry owned by this process; a context manager (``stop`` on exit)."""

    def __init__(
        self,
        work_dir: str | os.PathLike[str],
        *,
        port: int = 0,
        users: Mapping[str, str] | None = None,
        binary: str = REGISTRY_BINARY,
        start_timeout: float = 30.0,
        bind: str = "127.0.0.1",
        tls: bool = False,
    ) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.storage = self.work_dir / "storage"
        self.config_path = self.work_dir / "config.yml"
        self.htpasswd_path = self.work_dir / "htpasswd"
        self.log_path = self.work_dir / "registry.log"
        self.binary = binary
        self.port = port
        self.users = dict(users or {})
        self.start_timeout = start_timeout
        self._pidfile = self.work_dir / "registry.pid"
        self.bind = bind
        self.tls = tls
        self.ca_file: Path | None = None
        """With ``tls=True``: the registry's self-signed certificate, what clients trust."""
        self._key_file: Path | None = None

    @property
    def host(self) -> str:
        """``<bind>:<port>`` (``127.0.0.1:<port>`` by default): the registry part of image
        references."""
        return f"{self.bind}:{self.port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        if self._proc is not None:
            return self
        binary = shutil.which(self.binary)
        if binary is None:
            raise ServiceError(
                f"{self.binary} not found: run scripts/setup_services.sh "
                "(apt-get install docker-registry)"
            )
        self.storage.mkdir(parents=True, exist_ok=True)
        clear_stale_pidfile(self._pidfile, "a docker-registry")
        if not self.port:
            self.port = free_port(self.bind)
        if self.tls and self.ca_file is None:
            self.ca_file, self._key_file = self_signed_cert(self.work_dir / "tls", self.bind)
        self._write_config()
        proc = ManagedProcess(
            "docker-registry", [binary, "serve", str(self.config_path)], self.log_path
        )
        self._launch(
            proc, self._ready, self.start_timeout, lambda pid: self._pidfile.write_text(str(pid))
        )
        return self

    def stop(self) -> None:
        super().stop()
        self._pidfile.unlink(missing_ok=True)

    # ------------------------------------------------------------------ steps

    def _write_config(self) -> None:
        auth = ""
        if self.users:
            lines = [htpasswd_line(user, pw) for user, pw in sorted(self.users.items())]
            self.htpasswd_path.write_text("\n".join(lines) + "\n")
            self.htpasswd_path.chmod(0o600)
            auth = (
                "auth:\n"
                "  htpasswd:\n"
                "    realm: gridmarket-registry\n"
                f"    path: {_yaml_str(self.htpasswd_path)}\n"
            )
        tls = ""
        if self.ca_file is not None and self._key_file is not None:
            tls = (
                "  tls:\n"
                f"    certificate: {_yaml_str(self.ca_file)}\n"
                f"    key: {_yaml_str(self._key_file)}\n"
            )
        config = (
            "version: 0.1\n"
            "log:\n"
            "  level: info\n"
            "  formatter: text\n"
            "storage:\n"
            "  filesystem:\n"
            f"    rootdirectory: {_yaml_str(self.storage)}\n"
            "  delete:\n"
            "    enabled: true\n"
            "  maintenance:\n"
            "    uploadpurging:\n"
            "      enabled: false\n"
            "http:\n"
            f"  addr: {self.host}\n"
            f"  secret: {secrets.token_hex(16)}\n"
            f"{tls}"
            "  headers:\n"
            "    X-Content-Type-Options: [nosniff]\n"
            "health:\n"
            "  storagedriver:\n"
            "    enabled: false\n"
            f"{auth}"
        )
        self.config_path.write_text(config)
        self.config_path.chmod(0o600)

    def _ready(self) -> bool:
        request = urllib.request.Request(f"{self.url}/v2/")  # noqa: S310 (our own registry)
        context = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None
        try:
            with urllib.request.urlopen(request, timeout=2, context=context) as response:  # noqa: S310
                return bool(response.status == 200)
        except urllib.error.HTTPError as exc:
            with contextlib.closing(exc):
                return exc.code == 401 and bool(self.users)  # up, and wants credentials
        except (urllib.error.URLError, OSError):
            return False


def _yaml_str(value: object) -> str:
    text = str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
