"""Start and stop a private Docker Engine (Debian ``docker.io``'s dockerd) on its own socket.

    with Dockerd(work_dir).start() as engine:
        client = docker.DockerClient(base_url=engine.host)

Everything lives under ``work_dir``: the images and containers (``data``), the log
(``dockerd.log``), and, when the path is short enough for a unix socket, the socket, exec-root
and pidfile (``run``; otherwise in ``/tmp/gmd-<hash of work_dir>``, removed on stop). The
engine has no bridge, no iptables rules and no port proxy: containers get ``network_mode=none``
anyway, and the host's network set-up is left untouched. Needs root (dockerd does).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from devstack._process import ManagedProcess, Service, ServiceError, clear_stale_pidfile

__all__ = ["Dockerd", "ServiceError", "ping"]

# sockaddr_un holds 108 bytes; containerd puts "<exec-root>/containerd/containerd.sock.ttrpc" there.
_MAX_RUN_DIR = 60


def ping(socket_path: str | os.PathLike[str], timeout: float = 2.0) -> bool:
    """True when a Docker Engine answers ``GET /_ping`` on the unix socket at ``socket_path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(os.fspath(socket_path))
        conn.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
        reply = b""
        while chunk := conn.recv(4096):
            reply += chunk
    status = reply.split(b"\r\n", 1)[0].split()  # [b"HTTP/1.0", b"200", b"OK"]
    return len(status) > 1 and status[1] == b"200"


class Dockerd(Service):
    """A dockerd owned by this process; a context manager (``stop`` on exit)."""

    stop_timeout = 30.0  # dockerd stops its containers and containerd on SIGTERM (10 s each)

    def __init__(
        self,
        work_dir: str | os.PathLike[str],
        *,
        dockerd: str = "dockerd",
        start_timeout: float = 60.0,
        insecure_registries: Sequence[str] = (),
    ) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.data_root = self.work_dir / "data"
        self.log_path = self.work_dir / "dockerd.log"
        self.dockerd = dockerd
        self.start_timeout = start_timeout
        self.insecure_registries = list(insecure_registries)
        """``--insecure-registry`` values (``host:port`` or a CIDR): plain HTTP, or TLS without
        verifying the certificate, for registries off loopback (127.0.0.0/8 is always so)."""
        run_dir = self.work_dir / "run"
        self._short_run_dir = len(str(run_dir)) > _MAX_RUN_DIR
        if self._short_run_dir:  # one short name per work dir, created by start()
            digest = hashlib.sha256(str(self.work_dir).encode()).hexdigest()[:16]
            run_dir = Path(tempfile.gettempdir()) / f"gmd-{digest}"
        self.run_dir = run_dir
        self._owns_run_dir = False
        self.socket_path = run_dir / "docker.sock"
        self.pidfile = run_dir / "docker.pid"

    @property
    def host(self) -> str:
        """The value for ``DOCKER_HOST`` / ``docker.DockerClient(base_url=...)``."""
        return f"unix://{self.socket_path}"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        if self._proc is not None:
            return self
        binary = shutil.which(self.dockerd)
        if binary is None:
            raise ServiceError(
                f"{self.dockerd!r} not found: run scripts/setup_services.sh "
                "(apt-get install docker.io)"
            )
        if os.geteuid() != 0:
            raise ServiceError("dockerd must run as root: run this as root (or with sudo)")
        for d in (self.work_dir, self.data_root, self.run_dir):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._clear_stale_state()  # raises while another dockerd owns run_dir: leave it be
        self._owns_run_dir = True
        argv = [
            binary,
            "-H", self.host,
            "--data-root", str(self.data_root),
            "--exec-root", str(self.run_dir / "exec"),
            "--pidfile", str(self.pidfile),
            "--iptables=false",
            "--ip6tables=false",
            "--ip-forward=false",
            "--ip-masq=false",
            "--bridge=none",
            "--userland-proxy=false",
            "--storage-driver=overlay2",
            "--log-level=warn",
            *(f"--insecure-registry={r}" for r in self.insecure_registries),
        ]  # fmt: skip
        proc = ManagedProcess("dockerd", argv, self.log_path, cwd=self.work_dir)
        self._launch(proc, lambda: ping(self.socket_path), self.start_timeout)
        return self

    def stop(self) -> None:
        super().stop()
        if self._short_run_dir and self._owns_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self._owns_run_dir = False

    # ------------------------------------------------------------------ steps

    def _clear_stale_state(self) -> None:
        clear_stale_pidfile(self.pidfile, "a dockerd")
        self.socket_path.unlink(missing_ok=True)
