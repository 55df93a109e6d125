"""A job's live logs through the front end: ``GET /api/jobs/{job_id}/logs?after=<id>`` (a page
of the scheduler's stored lines, as JSON) and ``GET /api/jobs/{job_id}/logs/stream`` (server-sent
``log`` events as lines arrive, ``end`` once no run of the job can write more), which the job
page shows. A replicated job's stream carries every seat's lines, each with its ``seat``. And a
checkpointing job's progress: ``GET /api/jobs/{job_id}/checkpoints`` (:mod:`.progress`).

Lines are the scheduler's (``gridmarket.joblogs``: text already cleaned of control characters);
the page inserts them as text, never as HTML.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from . import progress
from .api import BackendDep, _job_id
from .backend import Backend
from .records import NotFoundError
from .waits import client_of

router = APIRouter(prefix="/api", tags=["api"])

RUNNING = frozenset({"pending_spec", "queued", "leased", "verifying"})
"""Scheduler states in which a run of the job may still write log lines (``verifying`` may
fail and queue the job again)."""
_PAGES = 20  # pages read per seat and poll, at most (200 batches each)


@router.get("/jobs/{job_id}/logs")
async def job_logs(
    job_id: str, b: BackendDep, after: int = Query(0, ge=0, le=2**62)
) -> dict[str, Any]:
    """The job's log lines with cursor above ``after`` (each with attempt, node, stream,
    timestamp); ``next`` is the cursor to ask with next, ``more`` whether a full page came."""
    jid = _job_id(job_id)
    page = await b.scheduler.logs(jid, after)
    if page is None:  # not seen by the scheduler yet
        return {"job_id": jid, "lines": [], "next": after, "more": False}
    return {"job_id": jid, **{k: page[k] for k in ("lines", "next", "more") if k in page}}


async def seats_of(b: Backend, jid: str) -> list[tuple[int | None, str]]:
    """``(seat, job id)`` of every seat of the replicated job ``jid`` is a seat of, else
    ``[(None, jid)]``."""
    try:
        view = await b.job_view(jid)
    except (NotFoundError, Exception):  # a chain hiccup: the job alone
        return [(None, jid)]
    group = view.get("group") or {}
    seats: list[tuple[int | None, str]] = [
        (int(s["seat"]), str(s["job_id"])) for s in group.get("seats") or []
    ]
    return seats or [(None, jid)]


def _cursors(header: str | None, seats: list[tuple[int | None, str]]) -> dict[str, int]:
    """The cursors of a reconnecting ``EventSource`` (its ``Last-Event-ID``: one per seat,
    comma-separated), else zeros."""
    values = (header or "").split(",")
    out: dict[str, int] = {}
    for i, (_, sid) in enumerate(seats):
        try:
            out[sid] = max(0, int(values[i])) if i < len(values) else 0
        except ValueError:
            out[sid] = 0
    return out


@router.get("/jobs/{job_id}/logs/stream")
async def job_logs_stream(job_id: str, request: Request, b: BackendDep) -> StreamingResponse:
    """Server-sent events: ``log`` with new lines (``{"lines": [...]}``, each with its
    ``seat`` for a replicated job), ``end`` once no seat can run again. The scheduler is
    polled every ``stream_poll_s``; the stream counts as one of the client's waits."""
    jid = _job_id(job_id)
    client = client_of(request)
    b.waits.acquire(client)

    async def events() -> AsyncIterator[str]:
        try:
            async for chunk in _events():
                yield chunk
        finally:
            b.waits.release(client)

    async def _events() -> AsyncIterator[str]:
        yield "retry: 2000\n\n"
        seats = await seats_of(b, jid)
        cursors = _cursors(request.headers.get("last-event-id"), seats)
        started = time.monotonic()
        while time.monotonic() - started < b.settings.stream_max_s:
            if await request.is_disconnected():
                return
            running = False
            sent = False
            for seat, sid in seats:
                try:
                    job = await b.scheduler.job(sid)
                    running = running or job is None or job.get("state") in RUNNING
                    for _ in range(_PAGES):
                        page = await b.scheduler.logs(sid, cursors[sid])
                        if not page or not page.get("lines"):
                            break
                        cursors[sid] = int(page["next"])
                        lines = [{**line, "seat": seat} for line in page["lines"]]
                        cursor = ",".join(str(cursors[s]) for _, s in seats)
                        yield f"id: {cursor}\nevent: log\ndata: {json.dumps({'lines': lines})}\n\n"
                        sent = True
                        if not page.get("more"):
                            break
                except Exception as exc:  # the scheduler hiccuped: say so, keep polling
                    running = True
                    yield f"event: problem\ndata: {json.dumps({'error': str(exc)[:300]})}\n\n"
            if not running:
                yield "event: end\ndata: {}\n\n"
                return
            if not sent:
                yield ": ping\n\n"
            await asyncio.sleep(b.settings.stream_poll_s)

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get("/jobs/{job_id}/checkpoints")
async def job_checkpoints(job_id: str, b: BackendDep) -> dict[str, Any]:
    """A checkpointing job's newest checkpoint, what a new attempt resumes from and its
    progress points, oldest first: the scheduler's answer (``JOB_CHECKPOINTS``) checked and
    bounded by :func:`frontend_api.progress.normalize`; empty while the scheduler does not know
    the job (as ``/api/jobs/{id}/logs``). For ``gridmarket progress``."""
    jid = _job_id(job_id)
    doc = progress.normalize(await b.scheduler.checkpoints(jid)) or {
        "policy": None,
        "latest": None,
        "resume": None,
        "points": [],
        "keep_points": None,
    }
    return {**doc, "job_id": jid}
