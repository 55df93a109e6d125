"""The heartbeat fast path (``scheduler/api/fastpath.py``) and the node-row cache
(``scheduler/api/nodecache.py``).

Two real schedulers on the same escrow and token secret, one with the fast path (production's
app) and one without (FastAPI's route alone): every error case gets the same status, message
and headers from both, the answers agree, and heartbeats are counted as served by the fast path
only where it runs. The node-row cache is checked against a real store."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gridmarket.wire import API
from scheduler.api.nodecache import NodeCache
from scheduler.auth import issue
from scheduler.store import Store

from ..conftest import Devnet
from .harness import CPU_CAP, Provider, Server, fresh_escrow, register_on_chain, scheduler

SECRET = "fast-path-test-secret-0123456789abcdef"
JSON = {"content-type": "application/json"}
JOB = "0x" + "ab" * 32


@pytest.fixture
def pair(
    tmp_path: Path, devnet: Devnet, ipfs_daemon: Any
) -> Iterator[tuple[Server, Server, list[Provider], list[Provider]]]:
    """(fast, slow) schedulers and providers 0 and 1 registered with each."""
    deployment, client = fresh_escrow(devnet)
    for p in devnet.providers[:2]:
        register_on_chain(client, p)
    addr = ipfs_daemon.api_addr
    common: dict[str, Any] = {"token_secret": SECRET, "rate_limit_per_s": 0}
    with (
        scheduler(tmp_path, deployment, devnet, addr, **common) as fast,
        scheduler(tmp_path, deployment, devnet, addr, heartbeat_fast_path=False, **common) as slow,
    ):
        nodes: list[list[Provider]] = []
        for server in (fast, slow):
            ps = [Provider(p, server, name="n", capacity=CPU_CAP) for p in devnet.providers[:2]]
            for p in ps:
                assert p.register().status_code == 200
            nodes.append(ps)
        assert [p.node_id for p in nodes[0]] == [p.node_id for p in nodes[1]]
        yield fast, slow, nodes[0], nodes[1]


def fast_beats(server: Server) -> int:
    text = server.get(API.METRICS).text
    for line in text.splitlines():
        if line.startswith('gridmarket_events{name="heartbeats_fast_path"}'):
            return int(float(line.split()[-1]))
    return 0


def cases(node: Provider, other: Provider) -> list[tuple[str, dict[str, Any]]]:
    """(name, httpx request arguments) of heartbeats the fast path must leave to the route."""
    url = API.HEARTBEAT.format(node_id=node.node_id)
    good = {"authorization": f"Bearer {node.token}", **JSON}
    ok = json.dumps({"running": []})
    secret = SECRET.encode()
    expired, _ = issue(secret, node.node_id, -10)
    unknown_id = "n-" + "0" * 16
    unknown_tok, _ = issue(secret, unknown_id, 60)
    forged = node.token.rsplit(".", 1)[0] + ".AAAAAAAAAAAAAAAAAAAAAA"
    return [
        ("no token", {"url": url, "content": ok, "headers": JSON}),
        (
            "not bearer",
            {"url": url, "content": ok, "headers": {**JSON, "authorization": "Basic x"}},
        ),
        (
            "bearer, no token",
            {"url": url, "content": ok, "headers": {**JSON, "authorization": "Bearer"}},
        ),
        (
            "malformed token",
            {"url": url, "content": ok, "headers": {**JSON, "authorization": "Bearer x"}},
        ),
        (
            "forged token",
            {"url": url, "content": ok, "headers": {**JSON, "authorization": f"Bearer {forged}"}},
        ),
        (
            "expired token",
            {"url": url, "content": ok, "headers": {**JSON, "authorization": f"Bearer {expired}"}},
        ),
        ("other node's token", {"url": url, "content": ok, "headers": {**JSON, **other.auth}}),
        (
            "unknown node",
            {
                "url": API.HEARTBEAT.format(node_id=unknown_id),
                "content": ok,
                "headers": {**JSON, "authorization": f"Bearer {unknown_tok}"},
            },
        ),
        ("malformed JSON", {"url": url, "content": '{"running": [', "headers": good}),
        (
            "malformed JSON, bad token",
            {"url": url, "content": "{", "headers": {**JSON, "authorization": "Bearer x"}},
        ),
        ("not an object", {"url": url, "content": "[]", "headers": good}),
        ("null body", {"url": url, "content": "null", "headers": good}),
        ("empty body", {"url": url, "content": "", "headers": good}),
        ("bad job id", {"url": url, "content": '{"running": ["0x12"]}', "headers": good}),
        ("unknown field", {"url": url, "content": '{"runnin": []}', "headers": good}),
        ("load out of range", {"url": url, "content": '{"load": -1}', "headers": good}),
        (
            "too many jobs",
            {"url": url, "content": json.dumps({"running": [JOB] * 65}), "headers": good},
        ),
        ("NaN", {"url": url, "content": '{"load": NaN}', "headers": good}),
        ("oversize body", {"url": url, "content": " " * (1024**2 + 1) + ok, "headers": good}),
        (
            "text/plain",
            {"url": url, "content": ok, "headers": {**node.auth, "content-type": "text/plain"}},
        ),
        ("no content type", {"url": url, "content": ok, "headers": node.auth}),
        ("GET", {"method": "GET", "url": url, "headers": good}),
        ("PUT", {"method": "PUT", "url": url, "content": ok, "headers": good}),
        ("trailing slash", {"url": url + "/", "content": ok, "headers": good}),
        # answered with 200 by the route: a job this replica does not know is read, and cancelled
        ("unknown job", {"url": url, "content": json.dumps({"running": [JOB]}), "headers": good}),
    ]


def answer(server: Server, request: dict[str, Any]) -> tuple[int, Any, dict[str, str | None]]:
    r = server.http.request(request.pop("method", "POST"), **request)
    try:
        body: Any = r.json()
    except ValueError:
        body = r.text
    keep = ("content-type", "www-authenticate", "allow", "location")
    headers = {k: r.headers.get(k) for k in keep}
    if headers["location"]:  # a redirect names the server's own port
        headers["location"] = httpx.URL(headers["location"]).path
    return r.status_code, body, headers


def test_every_error_is_the_routes_own(
    pair: tuple[Server, Server, list[Provider], list[Provider]],
) -> None:
    fast, slow, fast_nodes, slow_nodes = pair
    assert fast_nodes[0].heartbeat().status_code == 200  # the node rows are cached
    assert slow_nodes[0].heartbeat().status_code == 200
    before = fast_beats(fast)
    got_fast = [(n, answer(fast, r)) for n, r in cases(*fast_nodes)]
    got_slow = [(n, answer(slow, r)) for n, r in cases(*slow_nodes)]
    for (name, a), (_, b) in zip(got_fast, got_slow, strict=True):
        assert a == b, name
    codes = {name: a[0] for name, a in got_fast}
    assert codes == {
        "no token": 401,
        "not bearer": 401,
        "bearer, no token": 401,
        "malformed token": 401,
        "forged token": 401,
        "expired token": 401,
        "other node's token": 403,
        "unknown node": 404,
        "malformed JSON": 422,
        "malformed JSON, bad token": 422,  # FastAPI parses the body before it authenticates
        "not an object": 422,
        "null body": 422,
        "empty body": 422,
        "bad job id": 422,
        "unknown field": 422,
        "load out of range": 422,
        "too many jobs": 422,
        "NaN": 400,
        "oversize body": 413,
        "text/plain": 422,
        "no content type": 422,
        "GET": 405,
        "PUT": 405,
        "trailing slash": 307,  # Starlette's redirect to the route
        "unknown job": 200,
    }
    bodies = {name: a[1] for name, a in got_fast}
    assert (
        bodies["other node's token"]["detail"] == f"this token is for node {fast_nodes[1].node_id}"
    )
    assert bodies["unknown node"]["detail"] == f"no node n-{'0' * 16}"
    assert bodies["expired token"]["detail"] == "node token expired: register again"
    assert bodies["unknown job"]["cancel"] == [JOB] and bodies["unknown job"]["leases"] == {}
    assert fast_beats(fast) == before  # none of them was answered by the fast path
    # the route is still the documented operation
    doc = fast.get("/openapi.json").json()["paths"][API.HEARTBEAT]["post"]
    assert doc["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/HeartbeatRequest"
    )


def test_heartbeats_are_served_by_the_fast_path_with_the_routes_answer(
    pair: tuple[Server, Server, list[Provider], list[Provider]],
) -> None:
    fast, slow, fast_nodes, slow_nodes = pair
    node = fast_nodes[0]
    first = node.heartbeat()  # the node row is read (registration dropped it): the route's
    assert first.status_code == 200
    before = fast_beats(fast)
    answers = [node.heartbeat() for _ in range(20)]
    assert fast_beats(fast) - before == 20  # fails if the fast path is bypassed
    assert fast_beats(slow) == 0
    routes = [slow_nodes[0].heartbeat() for _ in range(3)]
    for r in [first, *answers, *routes]:
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/json"
        assert r.headers["content-length"] == str(len(r.content))
        assert r.json() == {"leases": {}, "cancel": [], "next_heartbeat_s": 0.5}
        assert r.content == routes[0].content  # byte for byte
    # images are advertised through the fast path as through the route
    image = "registry.example/app@sha256:" + "1" * 64
    r = fast.http.post(
        API.HEARTBEAT.format(node_id=node.node_id),
        json={"running": [], "images": [image], "load": 1.5},
        headers=node.auth,
    )
    assert r.status_code == 200 and fast_beats(fast) - before == 21
    # the pulse is written behind: the node's last_seen moves
    seen = {n["node_id"]: n["last_seen"] for n in fast.get(API.NODES).json()["nodes"]}
    time.sleep(0.3)
    node.heartbeat()
    time.sleep(0.3)
    again = {n["node_id"]: n["last_seen"] for n in fast.get(API.NODES).json()["nodes"]}
    assert again[node.node_id] > seen[node.node_id]


# ---------------------------------------------------------------------- the node-row cache


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'cache.db'}")
    s.migrate()
    yield s
    s.close()


def test_the_node_cache_serves_young_rows_and_refreshes_old_ones_in_one_read(store: Store) -> None:
    ids = [
        store.register_node(
            wallet="0x" + f"{i + 1:040x}",
            name="n",
            capacity=CPU_CAP,
            tier="cpu",
            agent_version="t",
            nonce=1,
        ).node_id
        for i in range(3)
    ]
    now = [100.0]

    async def run() -> None:
        cache = NodeCache(store, fresh_s=1.0, max_age_s=2.0, batch_s=0.0, clock=lambda: now[0])
        cache.start()
        try:
            assert cache.get(ids[0]) is None  # never read: the caller reads
            for nid in ids:
                assert (await cache.load(nid)).status == "online"
            store.mark_offline(-1.0)  # every node offline in the database
            now[0] += 0.5
            assert all(cache.get(nid).status == "online" for nid in ids)  # type: ignore[union-attr]
            assert cache.refreshes == 0  # young rows: no read
            now[0] += 0.7  # 1.2 s old: served, and refreshed behind in one read
            cache.pop(ids[2])  # dropped (a registration): never put back by the refresh
            assert all(cache.get(nid).status == "online" for nid in ids[:2])  # type: ignore[union-attr]
            for _ in range(100):
                if cache.refreshes:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            assert cache.refreshes == 1
            assert [cache.get(nid).status for nid in ids[:2]] == ["offline"] * 2  # type: ignore[union-attr]
            assert cache.get(ids[2]) is None
            now[0] += 2.0  # past max_age_s: read again by the caller
            assert cache.get(ids[0]) is None
        finally:
            await cache.stop()
        assert cache.get(ids[1]) is None  # stopped: no refresher, old rows are not served

    asyncio.run(run())
    assert store.nodes_by_id([ids[0], "n-missing", ids[0]]).keys() == {ids[0]}
