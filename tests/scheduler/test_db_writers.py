"""SQLite writers of one process queue on a lock (scheduler/store/db.py ``_serialize_writers``)
instead of sleeping in SQLite's busy handler; the lock is never left held."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from scheduler.store.db import make_engine


def engine(tmp_path: Path):  # type: ignore[no-untyped-def]
    e = make_engine(f"sqlite:///{tmp_path / 'w.db'}")
    with e.begin() as c:
        c.execute(text("CREATE TABLE t (x INTEGER NOT NULL)"))
    return e


def write_in_thread(e, value: int, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    """Write from another thread; fail if it cannot within ``timeout`` (the lock left held)."""
    done = threading.Event()

    def run() -> None:
        with e.begin() as c:
            c.execute(text("INSERT INTO t VALUES (:x)"), {"x": value})
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(timeout), "a writer could not get in: the write lock was left held"


def test_a_rolled_back_transaction_lets_the_next_writer_in(tmp_path: Path) -> None:
    e = engine(tmp_path)
    with pytest.raises(ZeroDivisionError), e.begin() as c:
        c.execute(text("INSERT INTO t VALUES (1)"))
        _ = 1 / 0
    write_in_thread(e, 2)
    with e.connect() as c:
        assert c.execute(text("SELECT x FROM t")).scalars().all() == [2]


def test_a_failed_statement_and_a_failed_begin_release_the_lock(tmp_path: Path) -> None:
    e = engine(tmp_path)
    with pytest.raises(Exception, match="no such table"), e.begin() as c:
        c.execute(text("INSERT INTO missing VALUES (1)"))
    write_in_thread(e, 3)


def test_one_connection_may_begin_again_before_it_is_returned(tmp_path: Path) -> None:
    e = engine(tmp_path)
    with e.connect() as c:
        with c.begin():
            c.execute(text("INSERT INTO t VALUES (1)"))
        with c.begin():  # the same connection: it keeps the lock, no self-deadlock
            c.execute(text("INSERT INTO t VALUES (2)"))
    write_in_thread(e, 3)
    with e.connect() as c:
        assert sorted(c.execute(text("SELECT x FROM t")).scalars()) == [1, 2, 3]


def test_writers_from_many_threads_all_commit_and_readers_are_not_held(tmp_path: Path) -> None:
    e = engine(tmp_path)
    reader = make_engine(f"sqlite:///{tmp_path / 'w.db'}", readonly=True)
    errors: list[BaseException] = []

    def hammer(k: int) -> None:
        try:
            for i in range(100):
                with e.begin() as c:
                    c.execute(text("INSERT INTO t VALUES (:x)"), {"x": k * 1000 + i})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    with e.begin() as held:  # a writer holds the lock: a reader still reads at once
        held.execute(text("INSERT INTO t VALUES (-1)"))
        t0 = time.monotonic()
        with reader.connect() as r:
            r.execute(text("SELECT count(*) FROM t")).scalar()
        assert time.monotonic() - t0 < 1.0
    for t in threads:
        t.join()
    assert errors == []
    with e.connect() as c:
        assert c.execute(text("SELECT count(*) FROM t")).scalar() == 801
