"""Heartbeats written behind: a node's pulse costs a hash check and a dict update; the replica
writes every pulse of the last ``flush_s`` in one transaction.

A heartbeat's answer needs no write (the leases it renews expire ``lease_ttl_s`` from now, known
at once) and, for jobs this replica knows leased to the node, no read either
(``Store.leases_known``; unknown jobs are read, and the jobs to cancel come from that read).
Writing each pulse in its own transaction made heartbeats queue behind each other on the
database's write lock. Liveness and leases lag the pulse by at most ``flush_s`` (0.1 s), against
a node timeout and lease of tens of seconds. Each flush also reconciles the replica's view with
the database (``Store.flush_heartbeats``): a reported job no longer leased to its node (moved by
another replica or a chain event) is forgotten, so that node's next heartbeat reads it and is
told to cancel it; its lease extension was never written (the update is guarded in SQL).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

from scheduler.store import Store

log = logging.getLogger(__name__)


class HeartbeatBuffer:
    """Collects pulses (node id -> time seen, jobs whose lease it holds) and flushes them."""

    def __init__(self, store: Store, lease_ttl_s: float, flush_s: float = 0.1) -> None:
        self.store = store
        self.lease_ttl_s = lease_ttl_s
        self.flush_s = flush_s
        self._lock = threading.Lock()
        self._beats: dict[str, tuple[float, list[str]]] = {}
        self._task: asyncio.Task[None] | None = None
        self.flushed = 0

    def beat(self, node_id: str, leased: list[str]) -> float:
        """Record a pulse now; returns its time (leases run ``lease_ttl_s`` from it)."""
        now = self.store.clock()
        with self._lock:
            self._beats[node_id] = (now, leased)
        return now

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="heartbeats")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.to_thread(self.flush)

    def flush(self) -> int:
        with self._lock:
            beats, self._beats = self._beats, {}
        if beats:
            try:
                self.store.flush_heartbeats(beats, self.lease_ttl_s)
            except Exception:
                with self._lock:  # keep them for the next flush (newer pulses win)
                    self._beats = {**beats, **self._beats}
                raise
            self.flushed += len(beats)
        return len(beats)

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await asyncio.to_thread(self.flush)
            except Exception:
                log.warning("heartbeat flush failed; retrying", exc_info=True)
            await asyncio.sleep(max(0.0, self.flush_s - (time.monotonic() - started)))
