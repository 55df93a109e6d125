"""gridmarket/conn_guard.py on a real uvicorn server (loopback, short timeouts): the connection
past a client's cap is refused with 429 while other clients are served, slow headers and slow
bodies are cut with 408, oversized headers with 431, and a closed connection frees its slot."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from devstack.anvil import free_port
from gridmarket.conn_guard import ConnLimits, guarded_protocol

CAP = 4
HEADER_S = 1.0
BODY_S = 1.0


async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    answer = b"ok:" + body
    headers = [(b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[int, Any]]:
    limits = ConnLimits(
        per_client=CAP,
        exempt=frozenset({"127.0.0.6"}),
        header_timeout_s=HEADER_S,
        max_header_bytes=8192,
        body_timeout_s=BODY_S,
        body_min_bytes_per_s=1000,
    )
    protocol = guarded_protocol(limits)
    port = free_port()
    config = uvicorn.Config(
        echo, host="127.0.0.1", port=port, http=protocol, log_level="warning", lifespan="off"
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.started
    yield port, protocol
    srv.should_exit = True
    thread.join(timeout=10)


def connect(port: int, source: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((source, 0))
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    return s


def answer(s: socket.socket) -> bytes:
    """What the server sent until it closed the connection or went quiet for 10 s."""
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data


def get(port: int, source: str = "127.0.0.1") -> bytes:
    with connect(port, source) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return answer(s)


def wait_released(protocol: Any, source: str) -> None:
    deadline = time.monotonic() + 5
    while protocol.open_by_client.get(source) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert source not in protocol.open_by_client, protocol.open_by_client


def test_the_connection_past_the_cap_is_refused_others_are_served(
    server: tuple[int, Any],
) -> None:
    port, protocol = server
    held = [connect(port, "127.0.0.2") for _ in range(CAP)]
    try:
        with connect(port, "127.0.0.2") as extra:
            refused = answer(extra)
        assert refused.startswith(b"HTTP/1.1 429 "), refused
        assert b"at most 4 per client" in refused and b"retry-after: 2" in refused
        assert protocol.open_by_client["127.0.0.2"] == CAP
        assert get(port).endswith(b"ok:")  # another client is served meanwhile
        # the held connections still work: a request on one is answered
        held[0].sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert held[0].recv(1024).startswith(b"HTTP/1.1 200 ")
    finally:
        for s in held:
            s.close()
    wait_released(protocol, "127.0.0.2")
    assert get(port, "127.0.0.2").endswith(b"ok:")  # the slots are free again


def test_slow_headers_are_cut_with_408(server: tuple[int, Any]) -> None:
    port, protocol = server
    with connect(port, "127.0.0.3") as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        cut = False
        for byte in b"X-Slow: " + b"a" * 20:  # a byte every 0.2 s: never done in time
            try:
                s.sendall(bytes([byte]))
            except OSError:
                cut = True
                break
            time.sleep(0.2)
        data = answer(s)
        took = time.monotonic() - t0
    assert data.startswith(b"HTTP/1.1 408 ") and b"request headers not received" in data, data
    assert cut or took >= HEADER_S, took  # cut by the timer, not at the first byte
    with connect(port, "127.0.0.3") as idle:  # nothing sent at all: cut as well
        assert answer(idle).startswith(b"HTTP/1.1 408 ")
    wait_released(protocol, "127.0.0.3")


def test_slow_bodies_are_cut_and_honest_ones_pass(server: tuple[int, Any]) -> None:
    port, _ = server
    with connect(port, "127.0.0.4") as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nab")
        data = answer(s)
    assert data.startswith(b"HTTP/1.1 408 ") and b"request body too slow" in data, data
    with connect(port, "127.0.0.4") as s:  # a body that arrives at once is served
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        assert s.recv(1024).endswith(b"ok:hello")
        # the connection is kept alive, and its next request gets a fresh header timer
        time.sleep(HEADER_S * 0.6)
        s.sendall(b"GET / HTTP/1.1\r\n")
        time.sleep(HEADER_S * 0.6)
        s.sendall(b"Host: x\r\n\r\n")
        assert s.recv(1024).startswith(b"HTTP/1.1 200 ")


def test_oversized_headers_are_431(server: tuple[int, Any]) -> None:
    port, _ = server
    with connect(port, "127.0.0.5") as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 10000 + b"\r\n\r\n")
        data = answer(s)
    assert data.startswith(b"HTTP/1.1 431 "), data


def test_a_body_sent_with_its_headers_is_not_counted_as_headers(
    server: tuple[int, Any],
) -> None:
    """Headers and a body over the header cap in one write: the read holds both, and only the
    bytes up to the blank line are headers (a big JSON body got 431 instead of 413 once)."""
    port, _ = server
    body = b"x" * 30_000  # over the test server's 8,192-byte header cap
    head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    with connect(port, "127.0.0.6") as s:
        s.sendall(head + body)
        data = answer(s)
    assert data.startswith(b"HTTP/1.1 200 "), data[:200]
    assert data.endswith(b"ok:" + body)


def test_an_exempt_peer_is_not_counted(server: tuple[int, Any]) -> None:
    """A reverse proxy on this host: all its clients come from one address."""
    port, protocol = server
    held = [connect(port, "127.0.0.6") for _ in range(CAP + 2)]
    try:
        for s in held:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(1024).startswith(b"HTTP/1.1 200 ")
        assert "127.0.0.6" not in protocol.open_by_client
    finally:
        for s in held:
            s.close()
