"""The periodic and per-poll reads stay index reads as the tables grow (issue 12's soak: the
past-deadline read went through every queued job each second on every replica, and a poll's
read of its node's leased jobs through every job the node still held)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import event, text, update

from scheduler.store import Store
from scheduler.store.tables import jobs

from .test_store import SPEC, created, jid, node, take


def queue_with_deadlines(store: Store, deadlines: list[int]) -> list[str]:
    events = [created(i, deadline=d) for i, d in enumerate(deadlines, start=1)]
    store.apply_chain_events(events, through_block=10)
    for i in range(1, len(deadlines) + 1):
        assert store.set_spec(jid(i), SPEC) == "queued"
    return [jid(i) for i in range(1, len(deadlines) + 1)]


def index_conditions(store: Store, call: Callable[[], object], marker: str) -> str:
    """The PostgreSQL plan of the one statement containing ``marker`` that ``call`` sends,
    with the parameters it sent (seq scans off: a small table would be scanned whole)."""
    sent: list[tuple[str, object]] = []

    def seen(_conn, _cur, statement, params, *_a):  # type: ignore[no-untyped-def]
        if marker in statement:
            sent.append((statement, params))

    engines = list({id(e): e for e in (store.engine, store.reader)}.values())
    for engine in engines:
        event.listen(engine, "before_cursor_execute", seen)
    try:
        call()
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", seen)
    ((statement, params),) = sent  # the store's own read, as it went to the server
    with store.engine.connect() as conn:
        conn.execute(text("SET enable_seqscan = off"))
        return "\n".join(row[0] for row in conn.exec_driver_sql("EXPLAIN " + statement, params))


def test_a_deadline_passes_after_its_whole_second(store: Store) -> None:
    """``deadline < now``, compared with an integer bound (``math.ceil(now)``)."""
    d = 2_000_000_000
    job_id, later = queue_with_deadlines(store, [d, d + 10])
    for now in (d - 0.5, float(d)):
        store.clock = lambda now=now: now
        assert store.expire_deadlines() == []
    store.clock = lambda: d + 0.25
    assert store.expire_deadlines() == [job_id]
    assert store.job(job_id).state == "expired"
    assert store.job(later).state == "queued"


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_the_past_deadline_read_uses_its_index_on_postgresql(store: Store) -> None:
    """With a float bound PostgreSQL casts every row's BIGINT deadline and the index can only
    narrow by state: the read was 0.4-0.8 s at 92,000 queued jobs."""
    queue_with_deadlines(store, [2_000_000_000 + i for i in range(200)])
    store.clock = lambda: 1_999_999_999.5
    plan = index_conditions(store, store.expire_deadlines, "deadline <")
    assert "ix_jobs_state_deadline" in plan, plan
    cond = [line for line in plan.splitlines() if "Index Cond" in line]
    assert cond and "deadline <" in cond[0], plan


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_polls_read_of_its_leased_jobs_is_bounded_by_state(store: Store) -> None:
    """A node's jobs waiting for their settles keep its ``node_id``; the poll's read of its
    leased jobs must not go through them."""
    ids = queue_with_deadlines(store, [2_000_000_000] * 300)
    n = node(store, slots=4)
    take(store, n)
    with store.engine.begin() as conn:  # 299 results of the node waiting for their settles
        conn.execute(
            update(jobs)
            .where(jobs.c.job_id.in_(ids), jobs.c.state == "queued")
            .values(state="settling", node_id=n)
        )
        conn.execute(text("ANALYZE jobs"))
    plan = index_conditions(
        store, lambda: store.running_specs(n), "SELECT jobs.job_id, jobs.spec_cid"
    )
    assert "ix_jobs_node_id_state" in plan, plan
    cond = [line for line in plan.splitlines() if "Index Cond" in line]
    assert cond and "state" in cond[0] and "node_id" in cond[0], plan
