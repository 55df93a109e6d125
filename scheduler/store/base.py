"""The ground the store's parts stand on: the engines (a writer, and a reader that does not
queue behind writes on a SQLite file), the clock, the reputation policy and the ``on_queued``
callback, plus the few reads that belong to no one concept."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, func, select

from scheduler.matching.reputation import DEFAULT_POLICY, ReputationPolicy

from .db import make_engine, migrate

__all__ = ["StoreBase"]


class StoreBase:
    """Connections and settings shared by every part of :class:`scheduler.store.Store`."""

    def __init__(
        self,
        url: str,
        *,
        policy: ReputationPolicy = DEFAULT_POLICY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.engine: Engine = make_engine(url)
        file_sqlite = self.engine.dialect.name == "sqlite" and self.engine.url.database not in (
            None,
            "",
            ":memory:",
        )
        self.reader: Engine = make_engine(url, readonly=True) if file_sqlite else self.engine
        self.policy = policy
        self.clock = clock
        self.postgres = self.engine.dialect.name == "postgresql"
        self.on_queued: Callable[[int], None] = lambda n: None

    def migrate(self) -> None:
        migrate(self.engine)

    def close(self) -> None:
        self.engine.dispose()
        self.reader.dispose()

    def _counts(self, column: Any) -> dict[str, int]:
        """Rows per value of ``column`` (a state or status column)."""
        with self.reader.connect() as conn:
            rows = conn.execute(select(column, func.count()).group_by(column))
            return {str(value): int(n) for value, n in rows}

    def ping(self) -> bool:
        with self.reader.connect() as conn:
            conn.execute(select(1))
        return True
