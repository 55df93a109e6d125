"""The scheduler's request limits against the real app (uvicorn, anvil, IPFS): bodies over their
cap are refused with 413 before they are read (declared or streamed), NaN, Infinity and lone
surrogates are 400s naming the problem, JSON nested thousands deep and numbers with huge
exponents or thousands of digits (issue 32) are 400s naming the field on every route that takes
a body (and in queries), 422 answers do not echo large inputs, a flood of large or hostile
bodies does not stall other requests, and unauthenticated endpoints are rate-limited per client
with 429 and Retry-After."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gridmarket.wire import API

from ..conftest import Devnet
from .harness import Server, fresh_escrow, scheduler

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, devnet: Devnet, ipfs_daemon: Any
) -> Iterator[Server]:
    deployment, _ = fresh_escrow(devnet)
    tmp: Path = tmp_path_factory.mktemp("guard")
    with scheduler(tmp, deployment, devnet, ipfs_daemon.api_addr) as s:
        yield s


def test_bodies_over_the_cap_are_refused_before_they_are_read(server: Server) -> None:
    big = b"[" + b"1," * (2 * 1024**2) + b"1]"  # a 4 MB JSON array
    r = httpx.post(server.url + API.QUOTE, content=big, headers=JSON, timeout=30)
    assert r.status_code == 413, r.text
    assert "over the 65536-byte limit for /v1/quote" in r.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams
        yield b"["
        for _ in range(64):
            yield b"1," * 4096
        yield b"1]"

    r = httpx.post(server.url + API.QUOTE, content=chunks(), headers=JSON, timeout=30)
    assert r.status_code == 413 and "65536-byte limit" in r.json()["detail"]
    # a body that is not JSON, on a route with the default cap (1 MiB), streamed
    r = httpx.post(
        server.url + "/v1/nodes/n-x/jobs/0x00/result",
        content=(b"x" * 65536 for _ in range(20)),
        headers={"content-type": "application/octet-stream"},
        timeout=30,
    )
    assert r.status_code == 413 and "1048576-byte limit" in r.json()["detail"]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"resources": {"cpu_cores": NaN}}', "NaN is not a JSON number"),
        (b'{"duration_s": Infinity}', "Infinity is not a JSON number"),
        (b'{"duration_s": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"duration_s": 1e999}', "the number 1e999 is out of range"),
        (b'{"name": "\\ud800"}', "lone UTF-16 surrogate (\\ud800)"),
        (b'{"name": "caf\xe9"}', "not UTF-8 (byte 0xe9 at offset 13)"),
    ],
)
@pytest.mark.parametrize(
    "path", [API.QUOTE, API.REGISTER, API.RESULT.format(node_id="n-1", job_id="0x01")]
)
def test_bad_numbers_and_strings_are_400_naming_the_problem(
    server: Server, path: str, body: bytes, problem: str
) -> None:
    r = httpx.post(server.url + path, content=body, headers=JSON, timeout=10)
    assert r.status_code == 400, r.text
    assert problem in r.json()["detail"]
    # no content type at all is parsed as JSON by FastAPI, so it is checked too
    r = httpx.post(server.url + path, content=body, timeout=10)
    assert r.status_code == 400 and problem in r.json()["detail"]


HOSTILE = {
    "arrays 1,000 deep": (b"[" * 1000 + b"]" * 1000, "[0]" * 32),
    "arrays 5,000 deep": (b"[" * 5000 + b"]" * 5000, "[0]" * 32),
    "objects 1,000 deep": (b'{"a":' * 1000 + b"1" + b"}" * 1000, ".".join("a" * 32)),
    "arrays deep in a field": (
        b'{"nodes": [{"slots": 1}, {"images": ' + b"[" * 2000 + b"]" * 2000 + b"}]}",
        "nodes[1].images" + "[0]" * 29,
    ),
    "1e300000": (b'{"duration_s": 1e300000}', "duration_s"),
    "1e999999999": (b'{"resources": {"cpu_cores": 1e999999999}}', "resources.cpu_cores"),
    "-1e300000": (b'{"duration_s": -1e300000}', "duration_s"),
    "5,000 digits": (b'{"duration_s": ' + b"9" * 5000 + b"}", "duration_s"),
    "NaN": (b'{"duration_s": NaN}', "duration_s"),
    "Infinity": (b'{"load": Infinity}', "load"),
}
"""Issue 32's bodies (about 2-10 KB each) and the field each must be refused naming. Nested
1,000 deep they raised RecursionError in the guard: 500."""


def body_routes(server: Server) -> list[tuple[str, str]]:
    """Every operation of the OpenAPI spec that takes a body, its path parameters filled."""
    spec = httpx.get(server.url + "/openapi.json", timeout=10).json()
    return [
        (method.upper(), re.sub(r"\{[^}]+\}", "n-1", path))
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if isinstance(op, dict) and "requestBody" in op
    ]


def test_hostile_json_is_400_naming_the_field_on_every_body_route(server: Server) -> None:
    routes = body_routes(server)
    assert ("POST", API.REGISTER) in routes and ("POST", API.QUOTE) in routes
    assert ("POST", API.HEARTBEAT.format(node_id="n-1")) in routes and len(routes) >= 6
    auth = {**JSON, "authorization": "Bearer forged"}  # the guard answers before the token
    with httpx.Client(timeout=10) as client:
        for method, path in routes:
            for name, (body, field) in HOSTILE.items():
                r = client.request(method, server.url + path, content=body, headers=auth)
                assert r.status_code == 400, (method, path, name, r.status_code, r.text[:300])
                assert r.json()["field"] == field, (path, name, r.json())
                assert field in r.json()["detail"], (path, name, r.json())


def test_hostile_numbers_in_queries_are_400_naming_the_parameter(server: Server) -> None:
    for value in ("1e300000", "-1e300000", "1e999999999", "9" * 5000):
        r = httpx.get(server.url + API.JOBS, params={"offset": value}, timeout=10)
        assert r.status_code == 400, (value[:20], r.text[:300])
        assert r.json()["field"] == "offset" and "query parameter offset" in r.json()["detail"]
    r = httpx.post(server.url + API.NEXT_JOB.format(node_id="n-1") + "?wait_s=1e300000", timeout=10)
    assert r.status_code == 400 and r.json()["field"] == "wait_s", r.text
    assert httpx.get(server.url + API.JOBS, params={"offset": "0"}, timeout=10).status_code == 200


def test_hostile_bodies_do_not_stall_honest_requests(server: Server) -> None:
    """Four clients send issue 32's bodies round and round while /v1/info is timed."""
    stop = threading.Event()
    codes: list[int] = []
    bodies = [body for body, _ in HOSTILE.values()]

    def flood() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                for body in bodies:
                    codes.append(client.post(server.url + API.QUOTE, content=body).status_code)

    threads = [threading.Thread(target=flood) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        times = []
        with httpx.Client(timeout=10) as client:
            for _ in range(40):
                t0 = time.perf_counter()
                assert client.get(server.url + API.INFO).status_code == 200
                times.append(time.perf_counter() - t0)
                time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    times.sort()
    assert len(codes) > len(bodies) and set(codes) == {400}, set(codes)
    assert times[int(len(times) * 0.95)] < 0.25, times


def test_validation_errors_do_not_echo_large_inputs(server: Server) -> None:
    body = {"resources": "x" * 50_000, "duration_s": [1] * 2000}
    r = httpx.post(server.url + API.QUOTE, json=body, timeout=10)
    assert r.status_code == 422, r.text
    assert len(r.content) < 4000
    errors = r.json()["detail"]
    clipped = [e["input"] for e in errors if isinstance(e.get("input"), str)]
    assert clipped and all(len(c) < 260 for c in clipped)
    assert any("characters in all" in c for c in clipped)
    many = [{"cpu_cores": "x"}] * 100
    r = httpx.post(server.url + API.REGISTER, json={"nodes": many, "x": many}, timeout=10)
    assert r.status_code == 422 and len(r.json()["detail"]) <= 21


def test_large_bodies_do_not_stall_other_requests(server: Server) -> None:
    """Eight clients send 4 MB arrays (streamed, no Content-Length) over and over, while
    /v1/info is timed: it must keep answering fast."""
    stop = threading.Event()
    refused: list[int] = []

    def flood() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                payload = (b"1," * 65536 for _ in range(32))
                r = client.post(server.url + API.QUOTE, content=payload, headers=JSON)
                refused.append(r.status_code)

    threads = [threading.Thread(target=flood) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        times = []
        with httpx.Client(timeout=10) as client:
            for _ in range(40):
                t0 = time.perf_counter()
                assert client.get(server.url + API.INFO).status_code == 200
                times.append(time.perf_counter() - t0)
                time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    times.sort()
    assert refused and set(refused) == {413}
    assert times[int(len(times) * 0.95)] < 0.25, times


def test_unauthenticated_endpoints_are_rate_limited_per_client(
    tmp_path: Path, devnet: Devnet, ipfs_daemon: Any
) -> None:
    deployment, _ = fresh_escrow(devnet)
    with scheduler(
        tmp_path,
        deployment,
        devnet,
        ipfs_daemon.api_addr,
        rate_limit_per_s=0.5,
        rate_limit_burst=5,
        rate_limit_exempt=[],
    ) as s:
        time.sleep(10.5)  # the start-up's polls came out of the same bucket: full again
        # one token every 2 s, so a slow machine refills at most a token or two meanwhile
        codes: list[int] = []
        t0 = time.monotonic()
        r = httpx.get(s.url + API.INFO, timeout=5)
        while True:
            codes.append(r.status_code)
            if r.status_code != 200 or len(codes) == 12:
                break
            r = httpx.get(s.url + API.INFO, timeout=5)
        elapsed = time.monotonic() - t0
        assert codes[:5] == [200] * 5 and codes[-1] == 429, codes
        assert codes.count(200) <= 5 + int(0.5 * elapsed) + 1, (codes, elapsed)
        assert int(r.headers["retry-after"]) >= 1
        assert "too many requests from 127.0.0.1" in r.json()["detail"]
        quote = httpx.post(s.url + API.QUOTE, content=b"{}", headers=JSON, timeout=5)
        assert quote.status_code == 429  # one bucket per client, every public endpoint
        # the health check and the node-token paths are not limited by address
        assert httpx.get(s.url + API.HEALTH, timeout=5).status_code == 200
        heartbeat = httpx.post(
            s.url + API.HEARTBEAT.format(node_id="n-0"),
            content=json.dumps({"running": []}),
            headers={**JSON, "authorization": "Bearer forged"},
            timeout=5,
        )
        assert heartbeat.status_code == 401
        time.sleep(2.5)  # refilled at one token per 2 s
        assert httpx.get(s.url + API.INFO, timeout=5).status_code == 200


def test_docs_off_and_metrics_behind_a_token(
    tmp_path: Path, devnet: Devnet, ipfs_daemon: Any
) -> None:
    deployment, _ = fresh_escrow(devnet)
    with scheduler(
        tmp_path,
        deployment,
        devnet,
        ipfs_daemon.api_addr,
        docs_enabled=False,
        metrics_token="metrics-s3cret",
    ) as s:
        for path in ("/docs", "/redoc", "/openapi.json"):
            r = httpx.get(s.url + path, timeout=5)
            assert r.status_code == 404 and "turned off" in r.json()["detail"], path
        assert httpx.get(s.url + API.METRICS, timeout=5).status_code == 401
        wrong = {"authorization": "Bearer nope"}
        assert httpx.get(s.url + API.METRICS, headers=wrong, timeout=5).status_code == 401
        right = {"authorization": "Bearer metrics-s3cret"}
        r = httpx.get(s.url + API.METRICS, headers=right, timeout=5)
        assert r.status_code == 200 and r.text
        assert httpx.get(s.url + API.INFO, timeout=5).status_code == 200


def test_docs_and_metrics_open_by_default(server: Server) -> None:
    assert httpx.get(server.url + "/openapi.json", timeout=5).status_code == 200
    r = httpx.get(server.url + API.METRICS, timeout=5)
    assert r.status_code == 200
    # the operator key's spend is exported beside the job and node gauges
    assert "gridmarket_jobs" in r.text and "gridmarket_tx_gas_used_total" in r.text
