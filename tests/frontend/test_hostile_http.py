"""Hostile HTTP against the front end of the real stack (tests/frontend/conftest.py): bodies
over their cap and JSON that Python would accept but the app must not (NaN, Infinity, lone
surrogates) are refused with 413 and 400; JSON nested thousands deep and amounts with huge
exponents or thousands of digits (issue 32) are 400s naming the field, in bodies and queries,
answered at once while honest requests go on; requests that wait on IPFS do not hold the
threads pages need, and one client's waiting requests are capped."""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from frontend_api.backend import Backend
from frontend_api.settings import Settings
from gridmarket.cid import bytes_cid
from tests.frontend.conftest import FrontendStack, unrunnable_spec

JSON = {"content-type": "application/json"}

DEEP_JSON = {
    "arrays 1,000 deep": (b"[" * 1000 + b"]" * 1000, "[0]" * 32),
    "arrays 5,000 deep": (b"[" * 5000 + b"]" * 5000, "[0]" * 32),
    "objects 5,000 deep": (b'{"a":' * 5000 + b"1" + b"}" * 5000, ".".join("a" * 32)),
    "1e300000": (b'{"spec": {"resources": {"cpu_cores": 1e300000}}}', "spec.resources.cpu_cores"),
    "-1e300000": (b'{"bounty_wei": -1e300000}', "bounty_wei"),
    "1e999999999": (b'{"stake_eth": 1e999999999}', "stake_eth"),
    "5,000 digits": (b'{"bounty_wei": ' + b"9" * 5000 + b"}", "bounty_wei"),
    "NaN": (b'{"wait_s": NaN}', "wait_s"),
}
"""JSON bodies of issue 32 and the field each is refused naming (nested 5,000 deep it was a
RecursionError: 500)."""

AMOUNTS = {
    "1e300000": "too large",
    "1e999999999": "too large",
    "-1e300000": "negative",
    "9" * 5000: "characters",  # too long (or over a model field's max_length: 422)
    "NaN": "not an amount",
    "Infinity": "not an amount",
}
"""Amounts as strings (which no guard can tell from text) and what the answer says of each.
``1e300000`` took 4 s of the event loop: ``int()`` of a 300,000-digit Decimal."""


def test_oversized_bodies_and_bad_json_are_refused(stack: FrontendStack) -> None:
    big = b"[" + b"1," * (2 * 1024**2) + b"1]"
    r = stack.post("/api/quote", content=big, headers=JSON)
    assert r.status_code == 413
    assert "over the 1048576-byte limit for /api/quote" in r.json()["detail"]
    for body, problem in (
        (b'{"spec": {"resources": {"cpu_cores": NaN}}}', "NaN is not a JSON number"),
        (b'{"bounty_wei": Infinity}', "Infinity is not a JSON number"),
        (b'{"from": "\\udfff"}', "lone UTF-16 surrogate"),
    ):
        for path in ("/api/quote", "/api/jobs/prepare"):
            r = stack.post(path, content=body, headers=JSON)
            assert r.status_code == 400 and problem in r.json()["detail"], (path, r.text)


def test_hostile_json_is_400_naming_the_field_on_every_body_route(stack: FrontendStack) -> None:
    spec = stack.get("/api/openapi.json").json()
    routes = [
        (method.upper(), re.sub(r"\{[^}]+\}", "0x01", path))
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if isinstance(op, dict) and "requestBody" in op
    ]
    assert ("POST", "/api/jobs/prepare") in routes and ("POST", "/api/quote") in routes
    assert len(routes) >= 7, routes
    with httpx.Client(timeout=10) as client:
        for method, path in routes:
            for name, (body, field) in DEEP_JSON.items():
                url = stack.frontend_url + path
                r = client.request(method, url, content=body, headers=JSON)
                assert r.status_code == 400, (method, path, name, r.status_code, r.text[:300])
                assert r.json()["field"] == field, (path, name, r.json())


def _refused(response: httpx.Response, field: str, words: str) -> None:
    assert response.status_code in (400, 422), (field, response.status_code, response.text[:300])
    assert response.json()["field"] == field, (field, response.json())
    assert words in response.json()["detail"], (field, words, response.json())


def test_hostile_amounts_are_400_naming_the_field_at_once(stack: FrontendStack) -> None:
    """Every way an amount comes in: the terms' query (the guard's check of a number, and the
    parser's of ``...ETH``, which the guard cannot tell from text), a job's bounty in ETH, in
    tUSD and in wei, its collateral, a provider's stake."""
    sender = stack.submitter.address
    base = {"from": sender, "spec": unrunnable_spec(name="hostile"), "ttl_s": 3600, "dry_run": True}
    with httpx.Client(base_url=stack.frontend_url, timeout=10) as client:
        for value, words in AMOUNTS.items():
            t0 = time.perf_counter()
            for query in ({"bounty_eth": value}, {"bounty_eth": value + " ETH"}):
                r = client.get("/api/terms", params={"submitter": sender, **query})
                if value[0].isdigit() or value[0] == "-":
                    assert r.status_code == 400 and r.json()["field"] == "bounty_eth", r.text
                else:
                    _refused(r, "bounty_eth", words)
            _refused(client.get("/api/terms", params={"bounty_wei": value}), "bounty_wei", "")
            for extra, field in (
                ({"bounty_eth": value}, "bounty_eth"),
                ({"currency": "tUSD", "bounty": value}, "bounty"),
                ({"bounty_eth": "0.01", "collateral_eth": value}, "collateral_eth"),
            ):
                _refused(client.post("/api/jobs/prepare", json={**base, **extra}), field, words)
            _refused(
                client.post("/api/jobs/prepare", json={**base, "bounty_wei": value}),
                "bounty_wei",
                "",
            )
            prepare = {"from": sender, "stake_eth": value}
            _refused(client.post("/api/providers/prepare", json=prepare), "stake_eth", words)
            assert time.perf_counter() - t0 < 3, (value[:20], time.perf_counter() - t0)


def _timed_while(stack: FrontendStack, attack: Callable[[httpx.Client], int]) -> list[float]:
    """/api/info's answer times while two clients run ``attack`` over and over (each call
    returns its status, which must be 400)."""
    stop = threading.Event()
    codes: list[int] = []

    def run() -> None:
        with httpx.Client(base_url=stack.frontend_url, timeout=30) as client:
            while not stop.is_set():
                codes.append(attack(client))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            assert stack.get("/api/info").status_code == 200
            times.append(time.perf_counter() - t0)
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert codes and set(codes) == {400}, set(codes)
    return sorted(times)


@pytest.mark.parametrize("attack", ["query", "query ETH", "tUSD bounty", "deep JSON"])
def test_hostile_input_does_not_stall_honest_requests(stack: FrontendStack, attack: str) -> None:
    """Issue 32: during ``/api/terms?bounty_eth=1e300000`` every honest /api/info waited up to
    3.9 s."""
    sender = stack.submitter.address
    calls: dict[str, Callable[[httpx.Client], httpx.Response]] = {
        "query": lambda c: c.get("/api/terms", params={"bounty_eth": "1e300000"}),
        "query ETH": lambda c: c.get("/api/terms", params={"bounty_eth": "1e300000ETH"}),
        "tUSD bounty": lambda c: c.post(
            "/api/jobs/prepare",
            json={
                "from": sender,
                "spec": unrunnable_spec(name="hostile"),
                "ttl_s": 3600,
                "currency": "tUSD",
                "bounty": "1e300000",
                "dry_run": True,
            },
        ),
        "deep JSON": lambda c: c.post("/api/jobs/prepare", content=b"[" * 5000, headers=JSON),
    }
    times = _timed_while(stack, lambda c: calls[attack](c).status_code)
    assert times[len(times) // 2] < 0.5 and times[-1] < 2.0, times


def test_waiting_requests_do_not_hold_the_page_threads(stack: FrontendStack) -> None:
    """More IPFS reads of CIDs nobody has than the default thread pool holds (6 on 2 cores):
    pages still answer fast, and a client past its cap of waiting requests gets 429."""
    per_client = 8
    missing = [bytes_cid(os.urandom(32)) for _ in range(per_client + 1)]
    codes: list[int] = []

    def read(cid: str) -> None:
        codes.append(httpx.get(f"{stack.frontend_url}/ipfs/{cid}", timeout=90).status_code)

    threads = [threading.Thread(target=read, args=(cid,)) for cid in missing[:per_client]]
    for t in threads:
        t.start()
    try:
        time.sleep(1.5)  # all of them are waiting on IPFS now
        over = stack.get(f"/ipfs/{missing[-1]}")
        assert over.status_code == 429, over.text
        assert "at most 8 at once" in over.json()["detail"]
        assert over.headers["retry-after"] == "2"
        times = []
        for path in ("/jobs", "/api/info", "/payouts", "/api/jobs", "/"):
            t0 = time.perf_counter()
            r = stack.get(path, headers={"accept": "text/html"})
            times.append(time.perf_counter() - t0)
            assert r.status_code == 200, (path, r.text[:300])
        assert max(times) < 2.0, times
        assert not codes  # the reads are still waiting
    finally:
        for t in threads:
            t.join(timeout=90)
    assert len(codes) == per_client and set(codes) <= {502, 504}, codes


def test_pages_carry_security_headers(stack: FrontendStack) -> None:
    r = stack.get("/jobs", headers={"accept": "text/html"})
    assert r.status_code == 200
    csp = r.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "object-src 'none'" in csp
    nonce = csp.split("'nonce-", 1)[1].split("'", 1)[0]
    assert f'<script nonce="{nonce}">' in r.text  # the inline script may run, no other
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "same-origin"
    other = stack.get("/jobs", headers={"accept": "text/html"})
    assert other.headers["content-security-policy"] != csp  # a fresh nonce per answer
    api = stack.get("/api/info")
    assert api.headers["x-frame-options"] == "DENY"


def test_cross_origin_uploads_are_refused_and_host_is_not_reflected(stack: FrontendStack) -> None:
    files = {"file": ("m.wasm", stack.wasm_module.read_bytes())}
    for headers in (
        {"origin": "http://evil.example"},
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "same-site", "origin": stack.frontend_url},
        {"origin": "null"},
    ):
        r = stack.post("/api/uploads/module", files=files, headers=headers)
        assert r.status_code == 403, (headers, r.text)
        assert "refused" in r.json()["detail"]
    same = {"origin": stack.frontend_url, "sec-fetch-site": "same-origin"}
    assert stack.post("/api/uploads/module", files=files, headers=same).status_code == 200
    # a trailing-slash redirect does not send the browser to the Host it was given
    r = httpx.get(
        stack.frontend_url + "/jobs/",
        headers={"host": "evil.example", "accept": "text/html"},
        follow_redirects=False,
        timeout=10,
    )
    assert r.status_code in (307, 308), r.status_code
    assert r.headers["location"] == "/jobs"


def _put_block(stack: FrontendStack, data: bytes, fmt: str) -> str:
    r = httpx.post(
        f"{stack.ipfs_url}/api/v0/block/put",
        params={"format": fmt, "mhtype": "sha2-256", "cid-version": 1},
        files={"file": ("block", data)},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    key: str = r.json()["Key"]
    return key


def test_hostile_directory_entries_are_a_clear_error_not_a_500(stack: FrontendStack) -> None:
    """Directories whose entries no file system can hold: a 300-character name, two entries
    with one name. The proxy answers 502 naming the problem."""
    from multiformats import CID

    from gridmarket import cid as cidlib

    leaf = b"hello\n"
    leaf_cid = _put_block(stack, leaf, "raw")
    raw = bytes(CID.decode(leaf_cid))
    for links, problem in (
        ([(raw, "x" * 300, len(leaf))], "over the 255-byte limit"),
        ([(raw, "same.txt", len(leaf)), (raw, "same.txt", len(leaf))], "two entries named"),
    ):
        block = cidlib._dag_pb(cidlib._unixfs(cidlib._DIRECTORY), links)
        directory = _put_block(stack, block, "dag-pb")
        r = stack.get(f"/ipfs/{directory}?format=json")
        assert r.status_code == 502, r.text
        assert problem in r.json()["detail"]


def test_the_download_cache_stays_within_its_budget(stack: FrontendStack) -> None:
    """A Backend (what the app builds) against the stack's IPFS, with a 3000-byte budget:
    fetching a third 1200-byte file evicts the least recently used one from disk."""
    settings = Settings(
        scheduler_url=stack.scheduler.url,
        rpc_url=stack.devnet.url,
        deployment_file=stack.deployment_file,
        ipfs_api=stack.ipfs_api,
        download_cache_bytes=3000,
        download_cache_grace_s=0.0,
    )
    b = Backend(settings)
    try:
        cids = []
        for i in range(3):
            r = stack.post(
                "/api/uploads/module", files={"file": ("m", b"\0asm" + bytes([i]) * 1196)}
            )
            assert r.status_code == 200, r.text
            cids.append(r.json()["cid"])
        first = b.fetch_tree(cids[0])
        b.fetch_tree(cids[1])
        assert b.fetch_tree(cids[0]) == first  # a hit: now the most recently used
        b.fetch_tree(cids[2])
        entries, used = b.cache_usage()  # the files plus each entry's small marker file
        assert entries == 2 and 2400 <= used <= 3000
        assert (b.cache_dir / cids[0]).exists() and not (b.cache_dir / cids[1]).exists()
        assert b.fetch_tree(cids[1]).read_bytes()[:4] == b"\0asm"  # fetched again when asked
        assert b.cache_usage()[1] <= 3000
    finally:
        b.waits.close()
        shutil.rmtree(b.cache_dir, ignore_errors=True)
