"""The store's hot paths (issue 12), SQLite and PostgreSQL. The in-memory view of the leases
each node holds (heartbeats answered without a read, polls offered capacity without re-reading
running jobs) may only ever shortcut a read, never grant or keep a lease the database does not
hold. A dispatch round's explanations are written in one transaction, to queued jobs only."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import update

from scheduler.dispatch import Dispatcher
from scheduler.settings import Settings
from scheduler.store import Claim, Store
from scheduler.store.tables import jobs

from .test_store import SPEC, WALLETS, jid, node, ok_report, queue_jobs, take


def _reads(store: Store) -> list[str]:
    """The SELECTs run through the reader from now on (as SQL text)."""
    seen: list[str] = []
    from sqlalchemy import event

    @event.listens_for(store.reader, "before_cursor_execute")
    def _log(_conn, _cur, statement, *_a):  # type: ignore[no-untyped-def]
        seen.append(statement)

    return seen


def test_heartbeat_of_own_claims_needs_no_read_and_flush_forgets_moved_jobs(
    store: Store,
) -> None:
    queue_jobs(store, 2)
    n = node(store)
    (job_id,) = take(store, n)
    reads = _reads(store)
    assert store.leases_of(n, [job_id, job_id]) == ([job_id], [])
    assert reads == []  # answered from this replica's claim
    # the job leaves the node behind this replica's back (another replica, a chain event)
    with store.engine.begin() as conn:
        conn.execute(
            update(jobs).where(jobs.c.job_id == job_id).values(state="queued", node_id=None)
        )
    # until the next flush the answer comes from memory; the flush's extension is guarded
    store.flush_heartbeats({n: (store.clock(), [job_id])}, lease_ttl=300)
    assert store.job(job_id).lease_expires is not None
    # ... and the flush read which reported jobs are still leased: this one is forgotten
    assert store.leases_of(n, [job_id]) == ([], [job_id])
    assert reads  # read from the database this time


def test_unknown_jobs_are_read_and_then_known(store: Store) -> None:
    queue_jobs(store, 2)
    n = node(store)
    (job_id,) = take(store, n)
    other = Store(store.url)  # a second replica (or a restarted one): knows nothing yet
    try:
        assert other.leases_of(n, [job_id, jid(2)]) == ([job_id], [jid(2)])
        reads = _reads(other)
        assert other.leases_of(n, [job_id]) == ([job_id], [])
        assert reads == []
    finally:
        other.close()


def test_running_specs_follow_claims_and_results(store: Store) -> None:
    queue_jobs(store, 3)
    n = node(store, slots=3)
    assert store.running_specs(n) == []
    (first,) = take(store, n)
    assert store.running_specs(n) == [SPEC]
    (second,) = take(store, n)
    reads = _reads(store)
    assert store.running_specs(n) == [SPEC, SPEC]
    if not store.postgres:  # one replica: its own claims keep the picture complete
        assert reads == []
    assert store.record_result(first, n, ok_report(1)) == "verifying"
    assert store.running_specs(n) == [SPEC]  # the run ended: read again, one job left
    assert reads
    store.hand_back(second, n)
    assert store.running_specs(n) == []


def test_a_stale_picture_is_read_again(store: Store) -> None:
    queue_jobs(store, 1)
    n = node(store, WALLETS[1], slots=2)
    (job_id,) = take(store, n)
    assert store.running_specs(n) == [SPEC]
    # the job leaves the node by a path that does not tell the view (a chain event)
    with store.engine.begin() as conn:
        conn.execute(
            update(jobs).where(jobs.c.job_id == job_id).values(state="queued", node_id=None)
        )
    assert store.running_specs(n, fresh_s=0.0) == []  # older than fresh_s: read


def test_reasons_are_written_in_one_go_to_queued_jobs_only(store: Store) -> None:
    queue_jobs(store, 3)
    n = node(store)
    (taken,) = take(store, n)
    store.set_reasons([(jid(2), "no idle node is waiting for work"), (taken, "nope")])
    store.set_reasons([])
    assert store.job(jid(2)).reason == "no idle node is waiting for work"
    assert store.job(taken).reason == f"accepted by {n}; assigning on-chain"  # leased: left alone
    assert store.job(jid(3)).reason != "nope"


def test_a_full_nodes_poll_is_held_within_its_wait(store: Store) -> None:
    """A node whose slots are all taken gets None, but not at once (a client that ignores
    Retry-After must not spin on the event loop): held up to 0.25 s, never past wait_s."""
    queue_jobs(store, 1)
    n = node(store, WALLETS[2], slots=1)
    take(store, n)
    row = store.node(n)
    assert row.running == 1
    settings = Settings.model_validate({})
    d = Dispatcher(store, settings, chain_id=1, escrow="0x" + "22" * 20)

    async def poll(wait_s: float) -> tuple[object, float]:
        t0 = time.monotonic()
        got = await d.next_job(row, wait_s)
        return got, time.monotonic() - t0

    got, took = asyncio.run(poll(5.0))
    assert got is None and 0.2 <= took < 1.0
    got, took = asyncio.run(poll(0.0))
    assert got is None and took < 0.1


def test_delivered_offers_are_remembered_for_one_lease_ttl(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The acceptance route checks a signature against the offer the dispatcher delivered
    (``Dispatcher.offered``): kept until accepted or refused, and for one lease TTL at most,
    so offers never answered cannot pile up in memory."""
    queue_jobs(store, 3)
    n = node(store, WALLETS[3], slots=3)
    won = store.dispatch(lambda rows: [Claim(r.job_id, n) for r in rows], limit=8, lease_ttl=30.0)
    assert len(won) == 3
    settings = Settings.model_validate({"lease_ttl_s": 30.0})
    d = Dispatcher(store, settings, chain_id=1, escrow="0x" + "22" * 20)
    clock = [1000.0]
    monkeypatch.setattr("scheduler.dispatch.time.monotonic", lambda: clock[0])
    d._remember_offer(won[0].job)
    clock[0] += 20
    d._remember_offer(won[1].job)
    offered = d.offered(won[0].job.job_id)
    assert offered is not None and offered.node_id == n and offered.state == "leased"
    d.settle_offer(won[1].job.job_id)  # accepted
    assert d.offered(won[1].job.job_id) is None
    clock[0] += 11  # the first is past its TTL: not used, and dropped at the next delivery
    assert d.offered(won[0].job.job_id) is None
    d._remember_offer(won[2].job)
    assert list(d._offers) == [won[2].job.job_id]
