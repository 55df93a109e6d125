"""The node fast path (``scheduler/api/fastpath.py``: heartbeats, ``next-job`` polls and
acceptances) and the node-row cache (``scheduler/api/nodecache.py``).

Two real schedulers on the same escrow and token secret, one with the fast path (production's
app) and one without (FastAPI's routes alone): every error case gets the same status, message
and headers from both, the answers agree, and requests are counted as served by the fast path
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

from gridmarket.chain import EscrowClient
from gridmarket.ipfs import IpfsStore
from gridmarket.wire import API, JobSpec
from scheduler.api.nodecache import NodeCache
from scheduler.auth import issue
from scheduler.store import Store

from ..conftest import Devnet
from .harness import (
    CPU_CAP,
    Provider,
    Server,
    fresh_escrow,
    register_on_chain,
    scheduler,
    submit_job,
)

SECRET = "fast-path-test-secret-0123456789abcdef"
JSON = {"content-type": "application/json"}
JOB = "0x" + "ab" * 32
OUTPUT = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"  # a run's output CID
SPEC = JobSpec.model_validate(
    {"executor": "docker", "image": "busybox:1", "command": ["true"], "max_attempts": 3}
)


Pair = tuple[Server, Server, list[Provider], list[Provider]]


@pytest.fixture
def pair(chain_pair: tuple[Pair, EscrowClient]) -> Pair:
    """(fast, slow) schedulers and providers 0 and 1 registered with each."""
    return chain_pair[0]


@pytest.fixture
def chain_pair(
    tmp_path: Path, devnet: Devnet, ipfs_daemon: Any
) -> Iterator[tuple[Pair, EscrowClient]]:
    """:func:`pair` and the escrow's client."""
    deployment, client = fresh_escrow(devnet)
    for p in devnet.providers[:2]:
        register_on_chain(client, p)
    addr = ipfs_daemon.api_addr
    common: dict[str, Any] = {"token_secret": SECRET, "rate_limit_per_s": 0}
    with (
        scheduler(tmp_path, deployment, devnet, addr, **common) as fast,
        scheduler(tmp_path, deployment, devnet, addr, node_fast_path=False, **common) as slow,
    ):
        nodes: list[list[Provider]] = []
        for server in (fast, slow):
            ps = [Provider(p, server, name="n", capacity=CPU_CAP) for p in devnet.providers[:2]]
            for p in ps:
                assert p.register().status_code == 200
            nodes.append(ps)
        assert [p.node_id for p in nodes[0]] == [p.node_id for p in nodes[1]]
        yield (fast, slow, nodes[0], nodes[1]), client


def fast_beats(server: Server, name: str = "heartbeats_fast_path") -> int:
    text = server.get(API.METRICS).text
    for line in text.splitlines():
        if line.startswith(f'gridmarket_events{{name="{name}"}}'):
            return int(float(line.split()[-1]))
    return 0


def fast_counts(server: Server) -> tuple[int, int, int]:
    """(polls, acceptances, results) served by the fast path."""
    return (
        fast_beats(server, "polls_fast_path"),
        fast_beats(server, "acceptances_fast_path"),
        fast_beats(server, "results_fast_path"),
    )


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


def poll_and_accept_cases(node: Provider, other: Provider) -> list[tuple[str, dict[str, Any]]]:
    """(name, httpx request arguments) of polls and acceptances that end in an error or an
    empty poll, on no job: the fast path leaves the first kind to the route and answers the
    rest itself, exactly as the route would."""
    poll = API.NEXT_JOB.format(node_id=node.node_id)
    accept = API.ACCEPT.format(node_id=node.node_id, job_id=JOB)
    good = {"authorization": f"Bearer {node.token}", **JSON}
    body = json.dumps({"attempt": 1, "signature": "0x" + "11" * 65})
    result = API.RESULT.format(node_id=node.node_id, job_id=JOB)
    failed = json.dumps({"attempt": 1, "reason": "exit_code", "exit_code": 3, "duration_s": 1})
    success = {"attempt": 1, "reason": "succeeded", "duration_s": 1, "output_cid": OUTPUT}
    unsigned = json.dumps(success)
    forged = json.dumps({**success, "signature": "0x" + "11" * 65})
    return [
        ("poll, no token", {"url": poll, "params": {"wait_s": 0}}),
        ("poll, bad token", {"url": poll, "headers": {"authorization": "Bearer x"}}),
        ("poll, other node's token", {"url": poll, "params": {"wait_s": 0}, "headers": other.auth}),
        ("poll, wait_s < 0", {"url": poll, "params": {"wait_s": -1}, "headers": node.auth}),
        ("poll, wait_s > 120", {"url": poll, "params": {"wait_s": 121}, "headers": node.auth}),
        ("poll, wait_s nan", {"url": poll, "params": {"wait_s": "nan"}, "headers": node.auth}),
        ("poll, wait_s text", {"url": poll, "params": {"wait_s": "x"}, "headers": node.auth}),
        ("poll, GET", {"method": "GET", "url": poll, "headers": node.auth}),
        ("poll, empty", {"url": poll, "params": {"wait_s": 0}, "headers": node.auth}),
        (
            "poll, other parameter too",
            {"url": poll, "params": {"wait_s": 0, "x": 1}, "headers": node.auth},
        ),
        ("accept, no token", {"url": accept, "content": body, "headers": JSON}),
        (
            "accept, other node's token",
            {"url": accept, "content": body, "headers": {**JSON, **other.auth}},
        ),
        ("accept, malformed JSON", {"url": accept, "content": "{", "headers": good}),
        (
            "accept, attempt 0",
            {"url": accept, "content": body.replace(": 1,", ": 0,"), "headers": good},
        ),
        (
            "accept, short signature",
            {"url": accept, "content": '{"attempt": 1, "signature": "0x11"}', "headers": good},
        ),
        ("accept, no content type", {"url": accept, "content": body, "headers": node.auth}),
        ("accept, unknown job", {"url": accept, "content": body, "headers": good}),
        ("result, no token", {"url": result, "content": failed, "headers": JSON}),
        (
            "result, other node's token",
            {"url": result, "content": failed, "headers": {**JSON, **other.auth}},
        ),
        ("result, malformed JSON", {"url": result, "content": "{", "headers": good}),
        ("result, success unsigned", {"url": result, "content": unsigned, "headers": good}),
        ("result, no content type", {"url": result, "content": failed, "headers": node.auth}),
        ("result, unknown job", {"url": result, "content": failed, "headers": good}),
        ("result, success badly signed", {"url": result, "content": forged, "headers": good}),
    ]


def test_poll_and_accept_errors_are_the_routes_own(
    pair: Pair,
) -> None:
    fast, slow, fast_nodes, slow_nodes = pair
    assert fast_nodes[0].heartbeat().status_code == 200  # the node rows are cached
    assert slow_nodes[0].heartbeat().status_code == 200
    before = fast_counts(fast)
    got_fast = [(n, answer(fast, r)) for n, r in poll_and_accept_cases(*fast_nodes)]
    got_slow = [(n, answer(slow, r)) for n, r in poll_and_accept_cases(*slow_nodes)]
    for (name, a), (_, b) in zip(got_fast, got_slow, strict=True):
        assert a == b, name
    codes = {name: a[0] for name, a in got_fast}
    assert codes == {
        "poll, no token": 401,
        "poll, bad token": 401,
        "poll, other node's token": 403,
        "poll, wait_s < 0": 422,
        "poll, wait_s > 120": 422,
        "poll, wait_s nan": 422,
        "poll, wait_s text": 422,
        "poll, GET": 405,
        "poll, empty": 204,
        "poll, other parameter too": 204,
        "accept, no token": 401,
        "accept, other node's token": 403,
        "accept, malformed JSON": 422,
        "accept, attempt 0": 422,
        "accept, short signature": 422,
        "accept, no content type": 422,
        "accept, unknown job": 404,
        "result, no token": 401,
        "result, other node's token": 403,
        "result, malformed JSON": 422,
        "result, success unsigned": 422,
        "result, no content type": 422,
        "result, unknown job": 404,
        "result, success badly signed": 401,
    }
    assert {n: a[1] for n, a in got_fast}["accept, unknown job"] == {"detail": f"no job {JOB}"}
    # the empty poll, the unknown jobs and the bad signature were served by the fast path, the
    # rest by the routes
    assert fast_counts(fast) == (before[0] + 1, before[1] + 1, before[2] + 2)
    assert fast_counts(slow) == (0, 0, 0)


def test_a_claim_through_the_fast_path_is_the_routes_claim(
    chain_pair: tuple[Pair, EscrowClient], devnet: Devnet, ipfs_daemon: Any
) -> None:
    """A job funded on the shared escrow is offered by both schedulers: the offer, a wrong
    signer's and a stale attempt's refusals and the acceptance are the same from the fast path
    as from the routes, byte for byte (the job id aside, nothing differs between them)."""
    (fast, slow, fast_nodes, slow_nodes), client = chain_pair
    ipfs = IpfsStore(ipfs_daemon.api_addr)
    try:
        job_id = submit_job(client, ipfs, devnet.submitters[0], SPEC)
    finally:
        ipfs.close()
    for node in (fast_nodes[0], slow_nodes[0]):
        assert node.heartbeat().status_code == 200  # the node rows are cached
    before = fast_counts(fast)
    offers = [node.next_job(wait_s=20) for node in (fast_nodes[0], slow_nodes[0])]
    for r in offers:
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "application/json"
        assert r.headers["content-length"] == str(len(r.content))
    a, b = (r.json() for r in offers)
    assert a["job_id"] == job_id
    assert {**a, "lease_expires_at": 0} == {**b, "lease_expires_at": 0}
    intruder = devnet.providers[2]
    refusals = []
    for node, offer in ((fast_nodes[0], a), (slow_nodes[0], b)):
        wrong = node.accept(offer, signer=intruder)
        stale = node.accept(offer, attempt=offer["attempt"] + 1)
        refusals.append(
            [(r.status_code, r.headers.get("www-authenticate"), r.json()) for r in (wrong, stale)]
        )
    assert refusals[0] == refusals[1]
    (wrong_code, _, wrong_body), (stale_code, _, stale_body) = refusals[0]
    assert wrong_code == 401 and intruder.address in wrong_body["detail"]
    assert stale_code == 409 and "stale" in stale_body["detail"]
    # accepted by one scheduler only: both would race to assign it on the one escrow
    right = fast_nodes[0].accept(a)
    again = fast_nodes[0].accept(a)  # the same signature again: a no-op
    ack = {"job_id": job_id, "accepted": True, "message": "accepted; assigning on-chain"}
    assert (right.status_code, right.json()) == (again.status_code, again.json()) == (200, ack)
    # the run's end: a result signed by another wallet is refused alike by both, the node's
    # own is taken (the job goes to verifying), and the same report again is a conflict
    forged = [
        Provider(intruder, server, "n", CPU_CAP, node.node_id, node.token).succeed(offer, OUTPUT)
        for server, node, offer in ((fast, fast_nodes[0], a), (slow, slow_nodes[0], b))
    ]
    (fast_code, fast_body), (slow_code, slow_body) = ((r.status_code, r.json()) for r in forged)
    assert (fast_code, fast_body) == (slow_code, slow_body)
    assert forged[0].status_code == 401 and intruder.address in forged[0].json()["detail"]
    done = fast_nodes[0].succeed(a, OUTPUT)
    assert (done.status_code, done.json()) == (
        202,
        {
            "job_id": job_id,
            "accepted": True,
            "status": "verifying",
            "message": "verifying the output",
        },
    )
    assert fast_nodes[0].succeed(a, OUTPUT).status_code == 409
    assert fast_counts(fast) == (before[0] + 1, before[1] + 4, before[2] + 3)
    assert fast_counts(slow) == (0, 0, 0)


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
