"""Limits on connections, before a request reaches the app: slow clients cannot hold the server.

uvicorn alone lets a client hold a connection forever by sending its request headers a byte at a
time (each byte cancels the keep-alive timer, and there is no header timeout), keep a body
trickling, and open as many connections as it likes. :func:`guarded_protocol` returns uvicorn's
httptools protocol (what ``uvicorn[standard]`` serves with) with, per :class:`ConnLimits`:

* **open connections per client address** (``per_client``): the connection past the cap is
  answered ``429`` with ``Connection: close`` at once, before a byte of it is read (peers in
  ``exempt`` are not counted);
* **a header timeout** (``header_timeout_s``): a request's line and headers must arrive within
  it, counted from the connection's start or the request's first byte (``408`` and closed past
  it), and may not pass ``max_header_bytes`` (``431`` and closed);
* **a body timeout** (``body_timeout_s`` plus one second per ``body_min_bytes_per_s`` bytes of
  body received): a body trickled slower than that is cut (``408`` if no answer was started; the
  app sees the client disconnect).

A response's own time (a live stream, a long download) is not limited here. The counts are the
address of the TCP peer: behind a reverse proxy every client is the proxy, so exempt it (or set
``per_client`` to 0) and cap connections at the proxy.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnLimits:
    """What :func:`guarded_protocol` enforces; 0 turns a limit off."""

    per_client: int = 16
    exempt: frozenset[str] = frozenset()
    """Peers never counted: a reverse proxy on this host (the front end exempts the addresses
    it does not rate-limit, loopback by default)."""
    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024
    body_timeout_s: float = 30.0
    body_min_bytes_per_s: float = 64 * 1024
    settings_hint: str = ""


def refusal(status: int, reason: str, detail: str, retry_after: int | None = None) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection (JSON ``{"detail": ...}``)."""
    body = json.dumps({"detail": detail}).encode()
    head = [
        f"HTTP/1.1 {status} {reason}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
    ]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def guarded_protocol(limits: ConnLimits) -> type[HttpToolsProtocol]:
    """uvicorn's ``http`` protocol class with ``limits`` (see the module's docstring). Each call
    has its own per-client counts (one per server)."""
    open_by_client: dict[str, int] = {}
    hint = f"; see {limits.settings_hint}" if limits.settings_hint else ""

    class GuardedProtocol(HttpToolsProtocol):
        open_by_client: dict[str, int]  # client address -> connections open (all instances)
        _peer: str | None = None
        _timer: asyncio.TimerHandle | None = None
        _in_headers = True  # between a request's first byte (or the connection's start) and
        _header_bytes = 0  # its headers' end
        _body_started = 0.0
        _body_bytes = 0
        _in_body = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            peer = self.client[0] if self.client else None
            if limits.per_client > 0 and peer is not None and peer not in limits.exempt:
                n = open_by_client.get(peer, 0)
                if n >= limits.per_client:
                    detail = (
                        f"{peer} already has {n} connections open; at most "
                        f"{limits.per_client} per client{hint}"
                    )
                    transport.write(refusal(429, "Too Many Requests", detail, retry_after=2))
                    transport.close()
                    return
                open_by_client[peer] = n + 1
                self._peer = peer
            self._arm(limits.header_timeout_s)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._peer is not None:
                n = open_by_client.get(self._peer, 0) - 1
                if n > 0:
                    open_by_client[self._peer] = n
                else:
                    open_by_client.pop(self._peer, None)
                self._peer = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._in_headers:
                # One read may hold the headers' end and the start of the body (a client that
                # sends both at once): only the bytes up to the blank line are headers.
                end = data.find(b"\r\n\r\n")
                self._header_bytes += len(data) if end < 0 else end + 4
                if 0 < limits.max_header_bytes < self._header_bytes:
                    self._refuse(
                        431,
                        "Request Header Fields Too Large",
                        f"request line and headers over {limits.max_header_bytes} bytes{hint}",
                    )
                    return
            super().data_received(data)

        # httptools' callbacks
        def on_message_begin(self) -> None:
            super().on_message_begin()
            if not self._in_headers:  # a new request on a kept-alive connection
                self._in_headers = True
                self._header_bytes = 0
                self._arm(limits.header_timeout_s)

        def on_headers_complete(self) -> None:
            self._in_headers = False
            self._in_body = True
            self._body_started = time.monotonic()
            self._body_bytes = 0
            self._arm(limits.body_timeout_s)
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            self._body_bytes += len(body)
            super().on_body(body)

        def on_message_complete(self) -> None:
            self._in_body = False
            self._disarm()
            super().on_message_complete()

        # timers
        def _arm(self, seconds: float) -> None:
            self._disarm()
            if seconds > 0 and not self.transport.is_closing():
                self._timer = self.loop.call_later(seconds, self._expired)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expired(self) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            if self._in_headers:
                self._refuse(
                    408,
                    "Request Timeout",
                    f"request headers not received within {limits.header_timeout_s:g} s{hint}",
                )
            elif self._in_body:
                allowed = limits.body_timeout_s
                if limits.body_min_bytes_per_s > 0:
                    allowed += self._body_bytes / limits.body_min_bytes_per_s
                left = self._body_started + allowed - time.monotonic()
                if left > 0:
                    self._timer = self.loop.call_later(left, self._expired)
                    return
                self._refuse(
                    408,
                    "Request Timeout",
                    f"request body too slow: {self._body_bytes} bytes in {allowed:.0f} s{hint}",
                )

        def _refuse(self, status: int, reason: str, detail: str) -> None:
            log.info("%s: %s", self._peer or "client", detail)
            cycle = None if self._in_headers else self.cycle
            if cycle is None or not cycle.response_started:
                self.transport.write(refusal(status, reason, detail))
            if cycle is not None:  # the app waiting on the body sees the client leave
                cycle.disconnected = True
                cycle.message_event.set()
            self.transport.close()

    GuardedProtocol.open_by_client = open_by_client
    return GuardedProtocol
