"""Row locks in one order on PostgreSQL: jobs before nodes. A heartbeat flush that updated its
nodes first and then the leases of their jobs deadlocked with a verdict on another replica,
which holds the job and frees the node's slot; so did a fold of many jobs' chain events that
wrote each job's node as it went (both seen as ``DeadlockDetected`` in the 100,000-job
soak)."""

from __future__ import annotations

import threading
import time
from functools import partial

import pytest
from sqlalchemy import create_engine, select, text, update

from scheduler.store import Claim, ClaimedJob, JobRow, Store
from scheduler.store.tables import jobs, nodes

from .test_store import WALLETS, jid, node, offer, queue_jobs, refunded, take


def wait_for_a_lock_wait(url: str, what: str) -> None:
    """Until some session of the test database waits for a row lock."""
    watch = create_engine(url)
    deadline = time.monotonic() + 10
    try:
        with watch.connect() as w:
            q = text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
            while not w.execute(q).scalar():
                assert time.monotonic() < deadline, f"{what} never waited for a row lock"
                time.sleep(0.02)
    finally:
        watch.dispose()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("path", ["flush", "heartbeat"])
def test_a_heartbeat_waits_for_a_held_job_before_it_takes_the_node(store: Store, path: str) -> None:
    """Both heartbeat paths: the batched flush of the fast path and a single heartbeat."""
    queue_jobs(store, 1)
    n = node(store)
    (job_id,) = take(store, n)
    other = create_engine(store.url)  # another replica's verdict on the job
    errors: list[BaseException] = []
    beat_at = store.clock()

    def beat() -> None:
        try:
            if path == "flush":
                store.flush_heartbeats({n: (beat_at, [job_id])}, lease_ttl=300)
            else:
                store.heartbeat(n, [job_id], lease_ttl=300)
        except BaseException as exc:
            errors.append(exc)

    try:
        with other.connect() as conn:
            tx = conn.begin()
            conn.execute(select(jobs.c.job_id).where(jobs.c.job_id == job_id).with_for_update())
            beater = threading.Thread(target=beat, daemon=True)
            beater.start()
            wait_for_a_lock_wait(store.url, "the heartbeat")
            # the verdict frees the node's slot: with the node's row taken by the heartbeat
            # first, this waited for it while it waited for the job (a deadlock)
            conn.execute(update(nodes).where(nodes.c.node_id == n).values(running=nodes.c.running))
            tx.commit()
        beater.join(timeout=10)
        assert not beater.is_alive() and errors == []
    finally:
        other.dispose()
    # the heartbeat went through whole
    assert (store.node(n).last_seen or 0) >= beat_at
    assert (store.job(job_id).lease_expires or 0) >= beat_at + 300


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_fold_of_many_jobs_writes_their_nodes_after_every_job(store: Store) -> None:
    """Jobs 1 and 2, leased to nodes X and Y, are refunded on-chain in one watcher batch. The
    fold frees each one's slot and ends each attempt; had it written X as it folded job 1, it
    would hold X while it waited for job 2, held by another replica's verdict that then waits
    for X (the 100,000-job soak's remaining deadlocks, with reputation writes of paid jobs)."""
    queue_jobs(store, 2)
    x, y = node(store, WALLETS[0]), node(store, WALLETS[1])
    offer(store, jid(1), x)
    offer(store, jid(2), y)
    assert (store.node(x).running, store.node(y).running) == (1, 1)
    other = create_engine(store.url)
    errors: list[BaseException] = []
    batch = [refunded(1, block=20), refunded(2, block=20)]

    def fold() -> None:
        try:
            store.apply_chain_events(batch, through_block=20)
        except BaseException as exc:
            errors.append(exc)

    try:
        with other.connect() as conn:
            tx = conn.begin()
            conn.execute(select(jobs.c.job_id).where(jobs.c.job_id == jid(2)).with_for_update())
            folder = threading.Thread(target=fold, daemon=True)
            folder.start()
            wait_for_a_lock_wait(store.url, "the fold")
            # the verdict on job 2 writes node X: it must not wait for the fold
            conn.execute(update(nodes).where(nodes.c.node_id == x).values(running=nodes.c.running))
            tx.commit()
        folder.join(timeout=10)
        assert not folder.is_alive() and errors == []
    finally:
        other.dispose()
    assert [store.job(jid(n)).state for n in (1, 2)] == ["refunded", "refunded"]
    assert (store.node(x).running, store.node(y).running) == (0, 0)
    assert store.chain_cursor() == 20


def test_node_writes_of_one_node_keep_their_order_and_nodes_go_in_id_order(store: Store) -> None:
    """The writes a fold puts off run at its end by node id, each node's in the order asked
    (a node's reputation outcomes are applied in event order, as before)."""
    seen: list[str] = []
    with store._begin_jobs_first() as conn:
        for nid, tag in (("b", "b1"), ("a", "a1"), ("b", "b2"), ("c", "c1"), ("a", "a2")):
            store._node_write(conn, nid, partial(seen.append, tag))
        assert seen == []  # nothing before the body ends
    assert seen == ["a1", "a2", "b1", "b2", "c1"]
    with store.engine.begin() as conn:  # outside such a transaction a write runs at once
        store._node_write(conn, "a", partial(seen.append, "now"))
        assert seen[-1] == "now"


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_dispatch_round_takes_its_nodes_in_id_order_across_its_windows(store: Store) -> None:
    """A round read in windows of one job: the first window's job goes to the node with the
    higher id, the second's to the lower. Had each window taken its slots at once, the round
    would hold the higher node while it waited for the lower one, held by a transaction (a
    fold writing its nodes in order) that then waits for the higher one."""
    queue_jobs(store, 2)
    lo, hi = sorted([node(store, WALLETS[0], slots=2), node(store, WALLETS[1], slots=2)])
    windows: list[list[str]] = []

    def decide(rows: list[JobRow]) -> list[Claim]:
        windows.append([r.job_id for r in rows])
        return [Claim(rows[0].job_id, hi if len(windows) == 1 else lo)]

    other = create_engine(store.url)
    errors: list[BaseException] = []
    won: list[ClaimedJob] = []

    def round_() -> None:
        try:
            won.extend(
                store.dispatch(decide, limit=2, window=1, wants_more=lambda: True, lease_ttl=30)
            )
        except BaseException as exc:
            errors.append(exc)

    try:
        with other.connect() as conn:
            tx = conn.begin()
            conn.execute(select(nodes.c.node_id).where(nodes.c.node_id == lo).with_for_update())
            rounder = threading.Thread(target=round_, daemon=True)
            rounder.start()
            wait_for_a_lock_wait(store.url, "the round")
            conn.execute(update(nodes).where(nodes.c.node_id == hi).values(running=nodes.c.running))
            tx.commit()
        rounder.join(timeout=10)
        assert not rounder.is_alive() and errors == []
    finally:
        other.dispose()
    assert windows == [[jid(1)], [jid(2)]]
    assert sorted((c.job.job_id, c.node_id) for c in won) == [(jid(1), hi), (jid(2), lo)]
    assert (store.node(lo).running, store.node(hi).running) == (1, 1)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_touching_nodes_takes_them_in_id_order(store: Store) -> None:
    """Long-polling nodes seen alive (one statement for many nodes). The lower node's row is
    moved after the higher one in the table, so an ``UPDATE ... IN`` finds the higher first;
    another transaction holds the lower and then wants the higher (id order, as a fold's node
    writes): the touch must not hold the higher while it waits."""
    lo, hi = sorted([node(store, WALLETS[0]), node(store, WALLETS[1])])
    with store.engine.begin() as conn:  # a new row version: after `hi` in the heap
        conn.execute(update(nodes).where(nodes.c.node_id == lo).values(running=nodes.c.running))
        # and the table read in heap order, as PostgreSQL does once it is past a few pages
        db = conn.execute(text("SELECT current_database()")).scalar()
        for knob in ("enable_indexscan", "enable_bitmapscan", "enable_indexonlyscan"):
            conn.execute(text(f'ALTER DATABASE "{db}" SET {knob} = off'))
    store.engine.dispose()  # the store's next connections take the settings
    other = create_engine(store.url)
    errors: list[BaseException] = []

    def touch() -> None:
        try:
            store.touch_nodes([hi, lo])
        except BaseException as exc:
            errors.append(exc)

    try:
        with other.connect() as conn:
            tx = conn.begin()
            conn.execute(update(nodes).where(nodes.c.node_id == lo).values(running=nodes.c.running))
            toucher = threading.Thread(target=touch, daemon=True)
            toucher.start()
            wait_for_a_lock_wait(store.url, "the touch")
            conn.execute(update(nodes).where(nodes.c.node_id == hi).values(running=nodes.c.running))
            tx.commit()
        toucher.join(timeout=10)
        assert not toucher.is_alive() and errors == []
    finally:
        other.dispose()
