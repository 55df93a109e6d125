"""A listener that records who connects: a plain TCP socket server, for the tests that a job's
registry (loopback, a LAN address, a metadata service) gets no request from the agent, dockerd,
the scheduler or the front end unless it is allowed."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from typing import Self


class Probe:
    """Listens on ``host`` (any address of this machine; 127.0.0.2 is loopback too), a free
    port; ``connections`` holds the first bytes each connection sent (up to 4 KiB), answered
    with an HTTP 404 so that an allowed client ends cleanly."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        self.connections: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="probe", daemon=True)
        self._thread.start()

    @property
    def registry(self) -> str:
        """``host:port`` as an image reference names it (``[v6]:port`` for IPv6)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def image(self, name: str = "gridmarket/probe") -> str:
        return f"{self.registry}/{name}@sha256:" + "e" * 64

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    data = conn.recv(4096)
                except OSError:
                    data = b""
                self.connections.append(data)
                body = b'{"errors":[{"code":"NAME_UNKNOWN"}]}'
                head = f"HTTP/1.1 404 Not Found\r\nContent-Length: {len(body)}\r\n"
                with contextlib.suppress(OSError):
                    conn.sendall(head.encode() + b"Content-Type: application/json\r\n\r\n" + body)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
