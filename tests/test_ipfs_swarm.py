"""Several js-ipfs daemons on one loopback swarm (devstack.ipfs ``IpfsSwarm``, ``swarm=True``):
content added on one daemon is fetched through another's RPC API, and the bytes really cross the
swarm (bitswap), not a shared repo. Real daemons, no mocks (docs/platform.md, "IPFS swarm on
loopback")."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.storage.ipfs import AgentIpfsStore
from devstack.ipfs import IpfsDaemon, IpfsSwarm, ServiceError
from gridmarket.cid import bytes_cid, normalize_cid
from gridmarket.ipfs import IpfsError, IpfsStore

MiB = 1 << 20
SHORT = 3.0  # seconds a daemon gets to find content nobody it knows has
BOUND = 15.0  # a failed fetch must end well within this (the client's timeout plus slack)


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IpfsSwarm]:
    """``a`` and ``b`` connected; ``c`` started but connected to nobody (until a test says so)."""
    swarm = IpfsSwarm(tmp_path_factory.mktemp("swarm"), ["a", "b"], websockets=True).start()
    try:
        swarm.add("c", connect=False)
        yield swarm
    finally:
        swarm.stop()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[IpfsSwarm]:
    """A fresh connected pair ``p`` and ``q`` a test may stop and restart."""
    with IpfsSwarm(tmp_path / "pair", ["p", "q"]) as swarm:
        yield swarm


def _store(daemon: IpfsDaemon) -> IpfsStore:
    return IpfsStore(daemon.api_addr, timeout=60, resolve_timeout=SHORT)


def test_daemons_are_separate_nodes_connected_both_ways(trio: IpfsSwarm) -> None:
    a, b, c = trio["a"], trio["b"], trio["c"]
    assert len({a.peer_id, b.peer_id, c.peer_id}) == 3
    assert len({a.repo, b.repo, c.repo}) == 3
    for d in (a, b, c):
        assert d.peer_id.startswith("12D3KooW")
        assert d.swarm_addr.startswith("/ip4/127.0.0.1/tcp/")
        assert d.swarm_addr.endswith(f"/p2p/{d.peer_id}")
        assert d.ws_addr.startswith("/ip4/127.0.0.1/tcp/")
        assert f"/ws/p2p/{d.peer_id}" in d.ws_addr
    assert b.peer_id in a.peers()
    assert a.peer_id in b.peers()
    assert c.peers() == set()


def test_content_added_on_a_is_fetched_through_b(trio: IpfsSwarm, tmp_path: Path) -> None:
    a, b = trio["a"], trio["b"]
    data = os.urandom(MiB + 12345)  # five blocks: a root and four leaves
    with _store(a) as on_a, _store(b) as on_b:
        cid = on_a.add_bytes(data)
        assert cid == bytes_cid(data)
        assert on_b.cat(cid, max_bytes=2 * MiB) == data  # checked against the CID by cat
    # The agent's side: a verified fetch into a directory, through b as well.
    with AgentIpfsStore(b.api_addr, resolve_timeout=SHORT) as agent_store:
        more = os.urandom(300_000)
        with _store(a) as on_a:
            cid2 = on_a.add_bytes(more)
        target = agent_store.fetch(cid2, tmp_path / "got", max_bytes=MiB)
        assert target.read_bytes() == more


def test_unconnected_daemon_cannot_fetch_until_it_connects(trio: IpfsSwarm) -> None:
    """c has its own repo and no peers: the content is not there until c dials a (over
    WebSockets this time); so in the test above the bytes crossed the swarm."""
    a, c = trio["a"], trio["c"]
    data = os.urandom(200_000)
    with _store(a) as on_a, _store(c) as on_c:
        cid = on_a.add_bytes(data)
        started = time.monotonic()
        with pytest.raises(IpfsError, match="timed out"):
            on_c.cat(cid, max_bytes=MiB)
        assert time.monotonic() - started < BOUND
        c.connect(a.ws_addr)
        try:
            assert a.peer_id in c.peers()
            assert on_c.cat(cid, max_bytes=MiB) == data
        finally:
            c.disconnect(a.ws_addr)
    assert a.peer_id not in c.peers()


def test_stopped_peer_makes_the_fetch_fail_in_bounded_time(pair: IpfsSwarm) -> None:
    p, q = pair["p"], pair["q"]
    data = os.urandom(100_000)
    with _store(p) as on_p:
        cid = on_p.add_bytes(data)
    p.stop()
    deadline = time.monotonic() + 10
    while p.peer_id in q.peers():  # q sees the connection close
        assert time.monotonic() < deadline, "q still lists the stopped peer"
        time.sleep(0.1)
    with _store(q) as on_q:
        started = time.monotonic()
        with pytest.raises(IpfsError, match="timed out"):
            on_q.cat(cid, max_bytes=MiB, timeout_s=SHORT)
        assert time.monotonic() - started < BOUND
        # The daemon is still healthy afterwards: its own content is served at once.
        own = on_q.add_bytes(b"still here\n")
        assert on_q.cat(own, max_bytes=100) == b"still here\n"


def test_pinned_content_survives_its_source_stopping(pair: IpfsSwarm) -> None:
    """q pins one file and only reads another (cached, unpinned); p stops; after a garbage
    collection q still serves the pinned file and no longer has the other one."""
    p, q = pair["p"], pair["q"]
    kept, cached = os.urandom(700_000), os.urandom(50_000)
    with _store(p) as on_p:
        kept_cid, cached_cid = on_p.add_bytes(kept), on_p.add_bytes(cached)
    q.rpc("pin/add", kept_cid, timeout=60)  # fetches every block of it over the swarm
    pins = q.rpc("pin/ls", kept_cid)["Keys"]  # CIDv1 in base58btc: normalise
    assert {normalize_cid(k): v["Type"] for k, v in pins.items()} == {kept_cid: "recursive"}
    with _store(q) as on_q:
        assert on_q.cat(cached_cid, max_bytes=MiB) == cached
    swarm_addr = p.swarm_addr
    p.stop()
    q.rpc("repo/gc", timeout=60)
    with _store(q) as on_q:
        assert on_q.cat(kept_cid, max_bytes=MiB) == kept
        with pytest.raises(IpfsError, match="timed out"):
            on_q.cat(cached_cid, max_bytes=MiB)
    # p comes back with the same identity and swarm port and is reconnected: q gets it again.
    pair.restart("p")
    assert p.swarm_addr == swarm_addr
    assert p.peer_id in q.peers()
    with _store(q) as on_q:
        assert on_q.cat(cached_cid, max_bytes=MiB) == cached


def test_an_offline_daemon_cannot_connect(tmp_path: Path) -> None:
    daemon = IpfsDaemon(tmp_path / "offline")  # not started: the check comes first
    with pytest.raises(ServiceError, match="offline daemon"):
        daemon.connect(
            "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWLG1scgVFfMrArW2WMSqn6vu7UhU2bUwoMpJyx9h5H5pR"
        )


def test_swarm_names_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="already exists"):
        IpfsSwarm(tmp_path, ["a", "a"])
    with pytest.raises(ValueError, match="bad daemon name"):
        IpfsSwarm(tmp_path, ["../x"])
