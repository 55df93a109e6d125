"""Row locks in one order on PostgreSQL: jobs before nodes. A heartbeat flush that updated its
nodes first and then the leases of their jobs deadlocked with a verdict on another replica,
which holds the job and frees the node's slot (seen as ``DeadlockDetected`` in the
100,000-job soak)."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import create_engine, select, text, update

from scheduler.store import Store
from scheduler.store.tables import jobs, nodes

from .test_store import node, queue_jobs, take


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_heartbeat_flush_waits_for_a_held_job_before_it_takes_the_node(store: Store) -> None:
    queue_jobs(store, 1)
    n = node(store)
    (job_id,) = take(store, n)
    other = create_engine(store.url)  # another replica's verdict on the job
    watch = create_engine(store.url)
    errors: list[BaseException] = []
    beat_at = store.clock()

    def flush() -> None:
        try:
            store.flush_heartbeats({n: (beat_at, [job_id])}, lease_ttl=300)
        except BaseException as exc:
            errors.append(exc)

    try:
        with other.connect() as conn:
            tx = conn.begin()
            conn.execute(select(jobs.c.job_id).where(jobs.c.job_id == job_id).with_for_update())
            flusher = threading.Thread(target=flush, daemon=True)
            flusher.start()
            deadline = time.monotonic() + 10
            with watch.connect() as w:  # until the flush waits for a row lock
                q = text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
                while not w.execute(q).scalar():
                    assert time.monotonic() < deadline, "the flush never waited for the job"
                    time.sleep(0.02)
            # the verdict frees the node's slot: with the node's row taken by the flush first,
            # this waited for the flush while the flush waited for the job (a deadlock)
            conn.execute(update(nodes).where(nodes.c.node_id == n).values(running=nodes.c.running))
            tx.commit()
        flusher.join(timeout=10)
        assert not flusher.is_alive() and errors == []
        assert store.node(n).last_seen == beat_at  # the flush went through whole
        assert store.job(job_id).lease_expires == beat_at + 300
    finally:
        other.dispose()
        watch.dispose()
