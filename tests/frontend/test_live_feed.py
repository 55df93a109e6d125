"""frontend_api/live.py's fan-out, in process: one job's view is read once a poll however many
streams follow it, every stream gets each change, streams that do not read cost no reads, a
final view ends them all, and a client past its cap is refused with 429."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastapi import HTTPException

from frontend_api.live import PING, JobFeeds
from frontend_api.records import NotFoundError

POLL_S = 0.02


class Job:
    """What the producer reads: a view that changes when told, and the reads counted."""

    def __init__(self) -> None:
        self.state = "queued"
        self.reads = 0

    async def view(self, job_id: str) -> dict[str, Any]:
        self.reads += 1
        if job_id == "0xmissing":
            raise NotFoundError("no such job")
        return {"job_id": job_id, "state": self.state, "final": self.state == "paid"}


def feeds_of(job: Job, per_client: int = 1000) -> JobFeeds:
    return JobFeeds(
        job.view,
        lambda view: f"<p>{view['state']}</p>",
        poll_s=POLL_S,
        max_s=30,
        per_client=per_client,
        ping_s=0.1,
    )


async def next_event(stream: AsyncIterator[str]) -> tuple[str, Any]:
    """The next ``job`` event's view (pings and the retry line skipped), or ("end", None)."""
    while True:
        chunk = await asyncio.wait_for(stream.__anext__(), 5)
        if chunk.startswith("event: job"):
            data = json.loads(chunk.split("data: ", 1)[1].split("\n", 1)[0])
            return ("end" if "event: end" in chunk else "job"), data


def test_one_read_a_poll_for_all_streams_and_every_stream_gets_each_change() -> None:
    async def run() -> None:
        job = Job()
        feeds = feeds_of(job)
        streams = [feeds.open("0xjob", f"10.0.0.{i % 7}") for i in range(100)]
        firsts = [await next_event(s) for s in streams]
        assert {f[1]["view"]["state"] for f in firsts} == {"queued"}
        assert firsts[0][1]["html"] == "<p>queued</p>"
        assert len(feeds.feeds) == 1
        before = job.reads
        await asyncio.sleep(POLL_S * 15)
        polls = job.reads - before
        assert 1 <= polls <= 20, polls  # about one a poll, not one a stream a poll
        job.state = "running"
        assert {(await next_event(s))[1]["view"]["state"] for s in streams} == {"running"}
        job.state = "paid"
        ends = [await next_event(s) for s in streams]
        assert {e[0] for e in ends} == {"end"} and ends[0][1]["view"]["final"] is True
        for s in streams:  # a final job's streams end
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(s.__anext__(), 5)
        await asyncio.sleep(POLL_S * 3)
        assert feeds.feeds == {} and feeds.open_by_client == {}

    asyncio.run(run())


def test_idle_streams_are_pinged_from_the_producer_and_missing_jobs_say_so() -> None:
    async def run() -> None:
        job = Job()
        feeds = feeds_of(job)
        stream = feeds.open("0xmissing", "10.0.0.1")
        kind, data = await next_event(stream)
        assert kind == "job" and data["view"]["missing"] == "no such job"
        assert data["html"] is None
        assert await asyncio.wait_for(stream.__anext__(), 5) == PING  # no change: a ping
        await stream.aclose()  # the client left: the producer stops with its last listener
        await asyncio.sleep(POLL_S * 5)
        reads = job.reads
        await asyncio.sleep(POLL_S * 5)
        assert job.reads == reads and feeds.feeds == {} and feeds.open_by_client == {}

    asyncio.run(run())


def test_a_client_past_its_cap_gets_429_and_its_slots_come_back() -> None:
    async def run() -> None:
        feeds = feeds_of(Job(), per_client=3)
        held = [feeds.open(f"0x{i}", "10.0.0.9") for i in range(3)]
        for s in held:
            await next_event(s)
        with pytest.raises(HTTPException) as refused:
            feeds.open("0x4", "10.0.0.9")
        assert refused.value.status_code == 429
        assert "at most 3 at once" in refused.value.detail
        assert refused.value.headers == {"Retry-After": "2"}
        other = feeds.open("0x4", "10.0.0.10")  # another client is not counted with it
        await next_event(other)
        await held[0].aclose()
        again = feeds.open("0x5", "10.0.0.9")
        await next_event(again)
        for s in [*held[1:], other, again]:
            await s.aclose()
        assert feeds.open_by_client == {}

    asyncio.run(run())
