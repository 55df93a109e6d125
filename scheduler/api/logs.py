"""Live job logs: a node posts its running attempt's stdout/stderr in batches
(``POST /v1/nodes/{node_id}/jobs/{job_id}/logs``), anyone who may read the job reads them
(``GET /v1/jobs/{job_id}/logs?after=<id>``; job details are public on this scheduler).

The job's output is hostile and the agent may be too: a batch is at most
:data:`gridmarket.joblogs.MAX_BATCH_CHARS` characters, a node may post at most
:data:`NODE_RATE_CHARS` characters a second on average (429 with ``Retry-After`` past it), the
text is cleaned (:func:`gridmarket.joblogs.clean_text`) before it is stored, and a job keeps
only its newest :data:`KEEP_CHARS` characters and :data:`KEEP_BATCHES` batches (retention:
docs/scheduler.md).
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, status

from gridmarket.joblogs import (
    JOB_LOGS,
    MAX_BATCH_CHARS,
    NODE_LOGS,
    LogBatch,
    clean_text,
    split_lines,
)
from scheduler.store import ConflictError
from scheduler.store.logs import NotAssigneeError

from .deps import StoreDep, authenticated_node_id

router = APIRouter(tags=["logs"])

KEEP_CHARS = 4 * 1024 * 1024
"""Characters of log kept per job (every attempt together): the newest; older batches go."""
KEEP_BATCHES = 4096
"""Batches kept per job (bounds the rows a chatty node's small batches cost)."""
NODE_RATE_CHARS = 256 * 1024
"""Characters per second one node may post on average, all its jobs together."""
NODE_BURST_CHARS = 1024 * 1024
"""The bucket of :data:`NODE_RATE_CHARS`."""

_JOB_ID = re.compile(r"^0x[0-9a-f]{64}$")


class _Buckets:
    """A token bucket of characters per node (in memory, per replica)."""

    def __init__(self, rate: float, burst: float, max_nodes: int = 100_000) -> None:
        self.rate, self.burst, self.max_nodes = rate, burst, max_nodes
        self._state: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str, amount: float) -> float:
        """0 when ``amount`` was taken, else the seconds until it could be."""
        now = time.monotonic()
        with self._lock:
            if len(self._state) > self.max_nodes:
                self._state.clear()
            level, at = self._state.get(key, (self.burst, now))
            level = min(self.burst, level + (now - at) * self.rate)
            if amount > level:
                self._state[key] = (level, now)
                return (amount - level) / self.rate
            self._state[key] = (level - amount, now)
            return 0.0


buckets = _Buckets(NODE_RATE_CHARS, NODE_BURST_CHARS)


def _job_id(job_id: str) -> str:
    job_id = job_id.lower()
    if not _JOB_ID.match(job_id):
        raise HTTPException(400, f"job_id {job_id!r} must be 0x and 64 hex digits")
    return job_id


@router.post(NODE_LOGS, status_code=status.HTTP_202_ACCEPTED)
async def post_logs(
    job_id: str,
    body: LogBatch,
    store: StoreDep,
    node_id: str = Depends(authenticated_node_id),
) -> dict[str, Any]:
    """Store a batch of the attempt ``body.attempt`` this node runs. 403: the attempt is not
    this node's; 409: it ended over a minute ago; 413: over the batch cap; 429: the node posts
    faster than it may. ``stored`` is false for a repost of a ``seq`` already stored."""
    job_id = _job_id(job_id)
    chars = body.chars()
    if chars > MAX_BATCH_CHARS:
        raise HTTPException(413, f"a batch holds at most {MAX_BATCH_CHARS} characters")
    wait = buckets.take(node_id, chars)
    if wait:
        raise HTTPException(
            429,
            f"node {node_id} posts logs faster than {NODE_RATE_CHARS} characters a second",
            headers={"Retry-After": f"{max(1, round(wait))}"},
        )
    chunks = [{"stream": c.stream, "ts": c.ts, "text": clean_text(c.text)} for c in body.chunks]
    try:
        stored = await asyncio.to_thread(
            store.add_logs,
            job_id,
            node_id,
            body.attempt,
            body.seq,
            chunks,
            keep_chars=KEEP_CHARS,
            keep_batches=KEEP_BATCHES,
        )
    except NotAssigneeError as exc:
        raise HTTPException(403, str(exc)) from None
    except ConflictError as exc:
        raise HTTPException(409, str(exc)) from None
    return {"stored": stored}


@router.get(JOB_LOGS)
async def get_logs(
    job_id: str,
    store: StoreDep,
    after: int = Query(0, ge=0, le=2**62),
    limit: int = Query(200, ge=1, le=1000),
) -> dict[str, Any]:
    """The job's log lines in batches with ``id > after``, oldest first: each line with its
    attempt, node, stream and the agent's timestamp. ``next`` is the ``after`` of the next
    page (the same when nothing new arrived). Only the newest :data:`KEEP_CHARS` characters of
    a job are kept."""
    job_id = _job_id(job_id)
    await asyncio.to_thread(store.require_job, job_id)
    rows = await asyncio.to_thread(store.logs_of, job_id, after, limit)
    lines = [
        {
            "attempt": r["attempt"],
            "node_id": r["node_id"],
            "seq": r["seq"],
            "stream": c.get("stream", "stdout"),
            "ts": c.get("ts", 0.0),
            "text": text,
        }
        for r in rows
        for c in r["chunks"]
        for text in split_lines(str(c.get("text", "")))
    ]
    return {
        "job_id": job_id,
        "lines": lines,
        "next": rows[-1]["id"] if rows else after,
        "more": len(rows) == limit,
        "keep_chars": KEEP_CHARS,
    }
