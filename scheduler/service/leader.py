"""Leader election: which replica runs the chain watcher, the outbox and the spec fetcher (the
*chain* duty), and which runs the verifier (the *verify* duty).

Each duty has its own lock. On PostgreSQL its holder holds a session advisory lock on a
dedicated connection; when it dies the lock goes with its connection and another replica that
takes the duty (``Settings.duties``) takes it on its next try. On SQLite there is one replica
and it holds both.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import text

from scheduler.store import Store

__all__ = ["DUTY_LOCK_KEYS", "LEADER_LOCK_KEY", "VERIFIER_LOCK_KEY", "LeaderLock"]

log = logging.getLogger(__name__)

LEADER_LOCK_KEY = 0x6D61726B6574  # "market": the chain duty
VERIFIER_LOCK_KEY = LEADER_LOCK_KEY + 1  # the verify duty
DUTY_LOCK_KEYS = {"chain": LEADER_LOCK_KEY, "verify": VERIFIER_LOCK_KEY}


class LeaderLock:
    """One duty's lock (``key``: the chain duty's unless given), tried with :meth:`try_lead`
    until it is held; held until :meth:`close`."""

    def __init__(self, store: Store, key: int = LEADER_LOCK_KEY) -> None:
        self.store = store
        self.key = key
        self._conn: Any = None

    def try_lead(self) -> bool:
        """Take the lock if it is free (False when another replica holds it or the database
        failed: try again later)."""
        if not self.store.postgres:
            return True
        try:
            if self._conn is None:
                self._conn = self.store.engine.connect()
            got = self._conn.execute(
                text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}
            ).scalar()
            self._conn.commit()
            return bool(got)
        except Exception:
            log.warning("leader election failed; will retry", exc_info=True)
            self._conn = None
            return False

    def close(self) -> None:
        """Let go of the lock (with its connection)."""
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                log.debug("closing the leader connection failed", exc_info=True)
