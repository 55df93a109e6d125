"""The sweeper's periodic reads stay index reads as the tables grow (issue 12's soak: the
past-deadline read went through every queued job each second on every replica)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import event, text

from scheduler.store import Store

from .test_store import SPEC, created, jid


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url)
    s.migrate()
    yield s
    s.close()


def queue_with_deadlines(store: Store, deadlines: list[int]) -> list[str]:
    events = [created(i, deadline=d) for i, d in enumerate(deadlines, start=1)]
    store.apply_chain_events(events, through_block=10)
    for i in range(1, len(deadlines) + 1):
        assert store.set_spec(jid(i), SPEC) == "queued"
    return [jid(i) for i in range(1, len(deadlines) + 1)]


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
    narrow by state: the read was 0.4-0.8 s at 92,000 queued jobs. The plan must bound the
    deadline in the index (seq scans off: a small table would be scanned whole anyway)."""
    queue_with_deadlines(store, [2_000_000_000 + i for i in range(200)])
    sent: list[tuple[str, object]] = []

    @event.listens_for(store.engine, "before_cursor_execute")
    def _seen(_conn, _cur, statement, params, *_a):  # type: ignore[no-untyped-def]
        if "deadline <" in statement:
            sent.append((statement, params))

    store.clock = lambda: 1_999_999_999.5
    assert store.expire_deadlines() == []
    ((statement, params),) = sent  # the sweeper's own read, as it went to the server
    with store.engine.connect() as conn:
        conn.execute(text("SET enable_seqscan = off"))
        plan = "\n".join(row[0] for row in conn.exec_driver_sql("EXPLAIN " + statement, params))
    assert "ix_jobs_state_deadline" in plan, plan
    cond = [line for line in plan.splitlines() if "Index Cond" in line]
    assert cond and "deadline <" in cond[0], plan
