"""The ground the store's parts stand on: the engines (a writer, and a reader that does not
queue behind writes on a SQLite file), the clock, the reputation policy and the ``on_queued``
callback, plus the few reads that belong to no one concept."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, func, select

from scheduler.matching.reputation import DEFAULT_POLICY, ReputationPolicy

from .db import make_engine, migrate

__all__ = ["StoreBase"]

_HELD_MAX_NODES = 200_000


@dataclass
class _Held:
    """What this process knows a node holds: job id -> spec CID of jobs leased to it."""

    jobs: dict[str, str] = field(default_factory=dict)
    # monotonic time of the database read that listed all of them; 0.0: maybe partial or
    # over-full (a job left, a transaction may have rolled back): not a full picture
    verified_at: float = 0.0


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
        # This replica's view of the leases each node holds (an offer's and a heartbeat's
        # shortcut, never a grant: the SQL guards in claims.py decide every lease, and the
        # written-behind lease extension is guarded by state and node in SQL). Every change
        # bumps the node's version, so a read that raced a change is not taken as complete.
        self._held: dict[str, _Held] = {}
        self._held_ver: dict[str, int] = {}
        self._held_seq = 0
        self._held_lock = threading.Lock()

    # ------------------------------------------------------------------ held leases
    def _held_bump(self, node_id: str) -> None:  # under _held_lock
        self._held_seq += 1
        self._held_ver[node_id] = self._held_seq

    def _held_version(self, node_id: str) -> int:
        with self._held_lock:
            return self._held_ver.get(node_id, 0)

    def _held_add(self, node_id: str, leased: Iterable[tuple[str, str]]) -> None:
        """Jobs (job id, spec CID) known leased to ``node_id`` (a claim committed here, or a
        read that saw them leased)."""
        with self._held_lock:
            if len(self._held) > _HELD_MAX_NODES:
                self._held.clear()  # versions stay: a read in flight still sees the change
            held = self._held.setdefault(node_id, _Held())
            held.jobs.update(leased)
            self._held_bump(node_id)

    def _held_drop(self, node_id: str, job_ids: Iterable[str]) -> None:
        """Jobs that are (or may be) no longer leased to ``node_id``: forgotten, and the
        node's picture is no longer complete until the next read of its leases."""
        with self._held_lock:
            held = self._held.get(node_id)
            if held is None:
                return
            for job_id in job_ids:
                held.jobs.pop(job_id, None)
            held.verified_at = 0.0
            self._held_bump(node_id)

    def _held_set(self, node_id: str, leased: dict[str, str], version: int) -> None:
        """A read listed every job leased to ``node_id``: the complete picture, unless the
        node's leases changed here since ``version`` (taken before the read)."""
        with self._held_lock:
            if self._held_ver.get(node_id, 0) != version:
                return
            if len(self._held) > _HELD_MAX_NODES:
                self._held.clear()
            self._held[node_id] = _Held(dict(leased), time.monotonic())

    def _held_jobs(self, node_id: str, *, fresh_s: float | None = None) -> dict[str, str] | None:
        """The jobs known leased to ``node_id`` (a copy); with ``fresh_s``, only a complete
        picture read at most ``fresh_s`` ago, else None."""
        with self._held_lock:
            held = self._held.get(node_id)
            if held is None:
                return None
            if fresh_s is not None and (
                not held.verified_at or time.monotonic() - held.verified_at > fresh_s
            ):
                return None
            return dict(held.jobs)

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
