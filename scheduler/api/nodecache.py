"""The node rows of authenticated requests, kept in memory and refreshed behind.

Every node route (heartbeat, next-job, accept, result, hand-back) needs its node's row (status,
capacity). A node heartbeats and polls many times a second in all, so the rows are cached:

* a row read less than ``fresh_s`` (1 s) ago is served as it is;
* a row between ``fresh_s`` and ``max_age_s`` (2 s) old is still served, and its node is queued
  for a refresh: one background task reads every queued row in one ``SELECT`` (one thread hop)
  at most every ``batch_s`` (0.2 s), instead of one read in a worker thread per node per second
  on the request's path;
* a row older than ``max_age_s``, or none, is read at once (:meth:`NodeCache.load`), as before.

So a status change this replica's routes do not make themselves (the sweep marking a silent node
offline, another replica, an operator's suspension) is seen within ``max_age_s`` (2 s; usually
``fresh_s`` + ``batch_s`` + one read). Routes that change a node's row themselves (registration,
a heartbeat back from offline) drop it with :meth:`NodeCache.pop`; a refresh that read before
such a drop never puts the old row back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from scheduler.store import NodeRow, Store

log = logging.getLogger(__name__)

FRESH_S = 1.0
MAX_AGE_S = 2.0
BATCH_S = 0.2
MAX_ENTRIES = 100_000


class NodeCache:
    """Node id -> (monotonic time of the read, row); see the module's docstring. Used on the
    event loop only (no lock)."""

    def __init__(
        self,
        store: Store,
        *,
        fresh_s: float = FRESH_S,
        max_age_s: float = MAX_AGE_S,
        batch_s: float = BATCH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < fresh_s <= max_age_s:
            raise ValueError(f"need 0 < fresh_s <= max_age_s, got {fresh_s}, {max_age_s}")
        self.store = store
        self.fresh_s = fresh_s
        self.max_age_s = max_age_s
        self.batch_s = batch_s
        self.clock = clock
        self._rows: dict[str, tuple[float, NodeRow]] = {}
        self._stale: set[str] = set()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.refreshes = 0
        """Batch reads done by the refresher (tests and metrics)."""

    def get(self, node_id: str) -> NodeRow | None:
        """The cached row if it is younger than ``max_age_s`` (queued for a refresh once older
        than ``fresh_s``), else None: the caller reads it (:meth:`load`)."""
        hit = self._rows.get(node_id)
        if hit is None:
            return None
        age = self.clock() - hit[0]
        if age < self.fresh_s:
            return hit[1]
        if age >= self.max_age_s or self._wake is None:  # no refresher: read it now
            return None
        if node_id not in self._stale:
            self._stale.add(node_id)
            self._wake.set()
        return hit[1]

    async def load(self, node_id: str) -> NodeRow:
        """Read the row now (a worker thread), cache and return it; NotFoundError if none."""
        at = self.clock()
        row = await asyncio.to_thread(self.store.node, node_id)
        self._put(node_id, at, row)
        return row

    def pop(self, node_id: str, default: object = None) -> object:
        """Forget ``node_id``'s row (its next request reads it)."""
        self._stale.discard(node_id)
        hit = self._rows.pop(node_id, None)
        return default if hit is None else hit

    def _put(self, node_id: str, at: float, row: NodeRow) -> None:
        if len(self._rows) >= MAX_ENTRIES and node_id not in self._rows:
            self._rows.clear()  # bounded: a flood of node ids costs reads, not memory
            self._stale.clear()
        self._rows[node_id] = (at, row)

    # ------------------------------------------------------------------ the refresher
    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="node-cache")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None
        self._wake = None

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.refresh()
            except Exception:
                log.warning("node-row refresh failed; rows are read per request", exc_info=True)
            await asyncio.sleep(self.batch_s)

    async def refresh(self) -> int:
        """Re-read every queued row in one batch; returns how many were read."""
        ids, self._stale = list(self._stale), set()
        if not ids:
            return 0
        seen = {node_id: self._rows[node_id][0] for node_id in ids if node_id in self._rows}
        at = self.clock()
        rows = await asyncio.to_thread(self.store.nodes_by_id, list(seen))
        self.refreshes += 1
        for node_id, was in seen.items():
            hit = self._rows.get(node_id)
            if hit is None or hit[0] != was:  # dropped or re-read since: theirs is newer
                continue
            row = rows.get(node_id)
            if row is None:
                self._rows.pop(node_id, None)  # gone: its next request reads (and 404s)
            else:
                self._rows[node_id] = (at, row)
        return len(seen)
