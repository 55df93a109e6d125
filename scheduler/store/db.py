"""Database engines for the store: SQLite (embedded, one replica) or PostgreSQL (replicas).

SQLite runs in WAL mode and every transaction is ``BEGIN IMMEDIATE`` (one writer at a time, no
lock-upgrade deadlocks between threads). PostgreSQL transactions are READ COMMITTED; the claim
path locks the rows it looks at with ``FOR UPDATE SKIP LOCKED`` so replicas never wait on (nor
take) each other's jobs.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import StaticPool

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def make_engine(url: str, *, readonly: bool = False) -> Engine:
    """An engine for ``url`` with this project's settings for its dialect.

    ``readonly`` (SQLite): no ``BEGIN`` at all, so reads run beside the writer (WAL) instead
    of queueing for the write lock, and each statement is its own read transaction (SQLite's
    autocommit). Every read through the reader is one ``SELECT`` (or, in ``running_specs``,
    two whose consistency does not matter: a spec's content never changes), so the explicit
    ``BEGIN`` bought nothing and cost a round trip per read (a tenth of the claim path).
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        memory = database in ("", ":memory:")
        if not memory:
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        pool: dict[str, Any] = (
            {"poolclass": StaticPool}
            if memory
            # as many pooled connections as the app's worker threads: a connection made on
            # demand and closed after use costs its PRAGMAs every time (the claim path's cost)
            else {"pool_size": 48, "max_overflow": 16}
        )
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, **pool
        )

        @event.listens_for(engine, "connect")
        def _connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            if not memory:
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        if not readonly:
            _serialize_writers(engine)
        return engine
    if parsed.get_backend_name() == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        return create_engine(parsed, pool_size=16, max_overflow=16, pool_pre_ping=True)
    raise ValueError(
        f"database_url {parsed.render_as_string(hide_password=True)!r}: use sqlite:///path or "
        "postgresql+psycopg://user@host/db"
    )


_HELD = "gridmarket_write_lock"


def _serialize_writers(engine: Engine) -> None:
    """Every transaction of ``engine`` is ``BEGIN IMMEDIATE``, taken under one in-process lock.

    SQLite lets one writer in at a time. Left to SQLite, the threads that find the write lock
    taken wait in its busy handler, which sleeps 1, 2, 5, 10, 15, 20, 25 ... 100 ms between
    tries, so under the claim path's load (acceptances, dispatch rounds, the outbox, the
    heartbeat flush, all writing) a waiter slept on long after the lock was free. Threads of
    this process now queue on a lock and enter as soon as the previous writer's connection is
    back in the pool (right after its commit or rollback: every writer uses
    ``engine.begin()``); ``busy_timeout`` still covers another process writing the same file.
    A connection that begins again before it is returned keeps the lock it holds."""
    lock = threading.Lock()

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        if not conn.info.get(_HELD):
            lock.acquire()
            conn.info[_HELD] = True
        try:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        except BaseException:
            if conn.info.pop(_HELD, False):
                lock.release()
            raise

    @event.listens_for(engine.pool, "checkin")
    def _checkin(_dbapi: Any, record: Any) -> None:
        if record is not None and record.info.pop(_HELD, False):
            lock.release()

    @event.listens_for(engine.pool, "invalidate")
    def _invalidated(_dbapi: Any, record: Any, _exc: Any) -> None:
        if record is not None and record.info.pop(_HELD, False):
            lock.release()


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision (idempotent; safe on every start)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
