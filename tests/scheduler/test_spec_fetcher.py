"""The leader's spec fetcher (scheduler/service/loops.py) on the real js-ipfs daemon and both
databases, with the store's clock moved by hand: concurrent bounded fetches, backoff that the
store keeps, retries held to half the pool, the give-up, and every CID encoding."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from multiformats import CID

from gridmarket.chain import Event
from gridmarket.cid import bytes_cid
from gridmarket.ipfs import IpfsStore
from gridmarket.wire import JobSpec
from scheduler import lifecycle
from scheduler.service.loops import SpecFetcher
from scheduler.store import Store

SPEC = JobSpec.model_validate({"executor": "docker", "image": "busybox:1", "command": ["true"]})
SUBMITTER = "0x90F79bf6EB2c4f870365E785982E1f101E93b906"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(db_url: str, clock: Clock) -> Iterator[Store]:
    s = Store(db_url, clock=clock)
    s.migrate()
    yield s
    s.close()


@pytest.fixture
def ipfs(ipfs_daemon: Any) -> Iterator[IpfsStore]:
    s = IpfsStore(ipfs_daemon.api_addr)
    yield s
    s.close()


def fund(store: Store, n: int, spec_cid: str) -> str:
    event = Event(
        name="JobCreated",
        args={
            "jobId": n.to_bytes(32, "big"),
            "submitter": SUBMITTER,
            "bounty": 10**17,
            "deadline": 2**40,
            "feeBps": 250,
            "operator": "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
            "mediator": "0xBcd4042DE499D14e55001CcbB24a551F3b954096",
            "collateral": 10**17,
            "flags": 0,
            "salt": b"\x01" * 32,
            "specCid": spec_cid,
        },
        block=10 + n,
        tx_hash="0x" + "ab" * 32,
        log_index=0,
    )
    store.apply_chain_events([event], through_block=10 + n)
    return "0x" + n.to_bytes(32, "big").hex()


def settle(fetcher: SpecFetcher, timeout: float = 30) -> None:
    """Run passes until no fetch is in flight and none is due."""
    deadline = time.monotonic() + timeout
    while True:
        fetcher.once()
        time.sleep(0.05)
        if fetcher.idle():
            fetcher.once()
            if fetcher.idle():
                return
        assert time.monotonic() < deadline, "the spec fetcher never went idle"


def test_fetches_back_off_give_up_and_take_every_encoding(
    store: Store, clock: Clock, ipfs: IpfsStore
) -> None:
    # first tries get 1.5 s: the two specs that exist must come back within it even on a
    # loaded 2-core CI machine (0.5 s was too short there once: the junk timed out, retried)
    fetcher = SpecFetcher(store, ipfs, workers=4, first_timeout_s=1.5, timeout_s=3.0)
    try:
        missing = [fund(store, i, bytes_cid(os.urandom(40))) for i in range(1, 7)]
        good = ipfs.add_bytes(SPEC.to_bytes())
        zb2 = str(CID.decode(good).set(base="base58btc"))
        honest = fund(store, 10, zb2)
        junk = fund(store, 11, ipfs.add_bytes(b"{not a spec"))
        t0 = time.monotonic()
        settle(fetcher)
        # 8 first tries on 4 workers, 1.5 s each at most: two rounds (~3 s), not one after
        # another (the 6 missing alone would take 9 s)
        assert time.monotonic() - t0 < 7.5
        assert store.job(honest).state == "queued"
        assert store.job(junk).state == "invalid"
        assert "is invalid" in store.job(junk).reason
        for job_id in missing:
            job = store.job(job_id)
            assert (job.state, job.spec_tries, job.spec_retry_at) == (
                "pending_spec",
                1,
                pytest.approx(clock.now + 1.0),
            )
            assert "try 1 failed, next in 1 s" in job.reason
        # in backoff: a pass fetches nothing
        fetcher.once()
        assert fetcher.idle()
        # due again: retries take at most half the pool
        clock.now += 1.5
        fetcher.once()
        assert 0 < len(fetcher._in_flight) <= 2
        settle(fetcher)
        assert {store.job(j).spec_tries for j in missing} == {2}
        assert [store.job(j).spec_retry_at for j in missing] == [clock.now + 2.0] * len(missing)
        # past the give-up time, the next failure makes the job invalid, with the reason
        clock.now += lifecycle.SPEC_GIVE_UP_S
        settle(fetcher)
        for job_id in missing:
            job = store.job(job_id)
            assert job.state == "invalid"
            assert (
                "not retrievable from IPFS" in job.reason and "gave up after 3 tries" in job.reason
            )
    finally:
        fetcher.close()


def test_a_new_job_is_fetched_before_due_retries(
    store: Store, clock: Clock, ipfs: IpfsStore
) -> None:
    fetcher = SpecFetcher(store, ipfs, workers=2, first_timeout_s=0.5, timeout_s=0.5)
    try:
        missing = [fund(store, i, bytes_cid(os.urandom(40))) for i in range(1, 5)]
        settle(fetcher)
        clock.now += 60  # all four due again, and older than anything new
        honest = fund(store, 10, ipfs.add_bytes(SPEC.to_bytes()))
        fetcher.once()
        assert honest in fetcher._in_flight  # first in line, ahead of the four retries
        settle(fetcher)
        assert store.job(honest).state == "queued"
        assert {store.job(j).state for j in missing} == {"pending_spec"}
    finally:
        fetcher.close()


def test_a_spec_is_remembered_by_its_cid_and_refusals_are_not(
    store: Store, ipfs: IpfsStore
) -> None:
    """Jobs funded from one template share a spec: the first fetch reads IPFS, the next ones
    are answered from the remembered spec (proved with an IPFS client that cannot connect),
    bounded to SPECS_KEPT CIDs; a bad spec is read again each time."""
    fetcher = SpecFetcher(store, ipfs, workers=2, first_timeout_s=1.0, timeout_s=1.0)
    dead = IpfsStore("/ip4/127.0.0.1/tcp/9", timeout=1.0)  # the discard port: nothing listens
    try:
        good = ipfs.add_bytes(SPEC.to_bytes())
        other = ipfs.add_bytes(SPEC.model_copy(update={"command": ["false"]}).to_bytes())
        junk = ipfs.add_bytes(b"{not a spec")
        first = [fund(store, i, good) for i in range(1, 4)]
        settle(fetcher)
        assert {store.job(j).state for j in first} == {"queued"}
        # two workers: the first two may both read IPFS, the third comes after one has ended
        remembered = fetcher.specs_remembered
        assert remembered >= 1
        spec, why = fetcher.fetch(good, client=dead)
        assert (spec, why) == (SPEC, "")
        assert fetcher.specs_remembered == remembered + 1
        # never fetched: the dead client is asked, and fails
        spec, why = fetcher.fetch(other, client=dead)
        assert spec is None and why.startswith("retry:")
        # a refusal is not remembered: read (and refused) again
        assert fetcher.fetch(junk)[0] is None
        spec, why = fetcher.fetch(junk, client=dead)
        assert spec is None and why.startswith("retry:")
        # bounded: the oldest CID is forgotten first
        fetcher.SPECS_KEPT = 1
        assert fetcher.fetch(other)[0] is not None
        assert fetcher.fetch(other, client=dead)[0] is not None
        assert fetcher.fetch(good, client=dead)[0] is None
    finally:
        dead.close()
        fetcher.close()
