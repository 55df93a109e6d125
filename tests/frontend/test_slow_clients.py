"""Slow clients against the real front end (``python -m frontend_api`` with its default limits,
tests/frontend/conftest.py), issue 32: one address's 17th connection is refused with 429, its
9th live stream gets 429, a request whose headers trickle in is cut with 408 after the header
timeout, and honest requests from another address are answered throughout. Attackers bind
other loopback addresses (127.0.0.x) and connect to 127.0.0.1 only."""

from __future__ import annotations

import os
import socket
import time
from contextlib import ExitStack

import httpx

from tests.frontend.conftest import FrontendStack

CONN_CAP = 16  # Settings.conn_per_client
STREAM_CAP = 8  # Settings.streams_per_client
HEADER_TIMEOUT_S = 10.0  # Settings.header_timeout_s


def connect(url: str, source: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((source, 0))
    s.settimeout(HEADER_TIMEOUT_S + 10)
    s.connect((host, int(port)))
    return s


def read_all(s: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data


def honest_ok(stack: FrontendStack) -> None:
    for path in ("/api/info", "/jobs"):
        r = stack.get(path, headers={"accept": "text/html"})
        assert r.status_code == 200, (path, r.status_code, r.text[:200])


def test_slow_loris_is_capped_and_cut_while_honest_requests_go_on(stack: FrontendStack) -> None:
    source = "127.0.0.21"
    with ExitStack() as held:
        loris = []
        for _ in range(CONN_CAP):
            s = held.enter_context(connect(stack.frontend_url, source))
            s.sendall(b"GET /api/info HTTP/1.1\r\nHost: x\r\nX-Slow: a")
            loris.append(s)
        started = time.monotonic()
        with connect(stack.frontend_url, source) as extra:
            refused = read_all(extra)
        assert refused.startswith(b"HTTP/1.1 429 "), refused[:200]
        assert f"at most {CONN_CAP} per client".encode() in refused
        honest_ok(stack)  # another address is served while this one holds its cap
        for s in loris[:3]:  # a byte now and then: it never finishes its headers
            s.sendall(b"a")
        cut = read_all(loris[0])
        took = time.monotonic() - started
        assert cut.startswith(b"HTTP/1.1 408 "), cut[:200]
        assert b"request headers not received within 10 s" in cut
        assert took < HEADER_TIMEOUT_S + 10, took
        honest_ok(stack)


def test_live_streams_past_the_cap_get_429_and_honest_streams_go_on(
    stack: FrontendStack,
) -> None:
    job_id = "0x" + os.urandom(32).hex()  # nobody's: the stream says so and keeps watching
    url = f"/api/jobs/{job_id}/stream"
    transport = httpx.HTTPTransport(local_address="127.0.0.22")
    with ExitStack() as held, httpx.Client(base_url=stack.frontend_url, timeout=30) as honest:
        hoarder = held.enter_context(
            httpx.Client(base_url=stack.frontend_url, transport=transport, timeout=30)
        )
        readers = []  # kept: a line iterator dropped closes its response
        for _ in range(STREAM_CAP):  # opened and never read past their first event
            r = held.enter_context(hoarder.stream("GET", url))
            assert r.status_code == 200
            readers.append(r.iter_lines())
            assert next(line for line in readers[-1] if line.startswith("data: ")).find(job_id) > 0
        with hoarder.stream("GET", url) as over:
            over.read()  # an answer with a body: a stream would not end here
        assert over.status_code == 429, over.text
        assert f"at most {STREAM_CAP} at once" in over.json()["detail"]
        assert over.headers["retry-after"] == "2"
        with honest.stream("GET", url) as mine:  # another address's stream is served
            assert mine.status_code == 200
            data = next(line for line in mine.iter_lines() if line.startswith("data: "))
            assert "is not on escrow" in data
        honest_ok(stack)
    # the hoarder's streams closed: its slots come back
    deadline = time.monotonic() + 10
    while True:
        fresh = httpx.HTTPTransport(local_address="127.0.0.22")
        with (
            httpx.Client(base_url=stack.frontend_url, transport=fresh, timeout=30) as again,
            again.stream("GET", url) as r,
        ):
            if r.status_code == 200 or time.monotonic() > deadline:
                assert r.status_code == 200, r.status_code
                break
        time.sleep(0.3)
