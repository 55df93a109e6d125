"""The store's hot paths (issue 12), SQLite and PostgreSQL. The in-memory view of the leases
each node holds (heartbeats answered without a read, polls offered capacity without re-reading
running jobs) may only ever shortcut a read, never grant or keep a lease the database does not
hold. A dispatch round's explanations are written in one transaction, to queued jobs only."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import update

from scheduler.dispatch import Dispatcher
from scheduler.settings import Settings
from scheduler.store import Store
from scheduler.store.tables import jobs

from .test_store import SPEC, WALLETS, jid, node, ok_report, queue_jobs, take


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url)
    s.migrate()
    yield s
    s.close()


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
