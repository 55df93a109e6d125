"""Live job streams (``GET /api/jobs/{id}/stream``, server-sent events) fanned out from one
producer per job.

A :class:`Feed` is one job's producer: while anyone listens it reads the job every
``stream_poll_s`` (the chain index and the scheduler, once for all its listeners), and when the
view changes it renders the ``job`` event once (JSON and the live HTML fragment) and wakes the
listeners; every ``ping_s`` without a change it wakes them to send a comment line, which keeps
proxies from closing the stream. A listener costs nothing between wake-ups: it waits on the
feed's event, no timer, no poll of its own. A listener that cannot keep up (its client does not
read) sends the latest view when it can, never a queue of missed ones.

:class:`JobFeeds` holds the feeds and caps the streams one client address holds open
(``streams_per_client``: 429 with ``Retry-After`` past it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from fastapi import HTTPException
from fastapi.responses import StreamingResponse

from . import progress
from .backend import Backend, dumps
from .records import NotFoundError
from .web import env

log = logging.getLogger(__name__)

PING = ": ping\n\n"

env.globals["job_progress"] = progress.page_view  # the progress card of _job_live.html


def stable(view: dict[str, Any]) -> dict[str, Any]:
    """The parts of a job view whose change is worth a push (not lease renewals)."""
    out = {k: v for k, v in view.items() if k not in ("chain_time",)}
    sched = out.get("scheduler")
    if isinstance(sched, dict):
        out["scheduler"] = {
            k: v for k, v in sched.items() if k not in ("lease_expires", "updated_at")
        }
    return out


class Feed:
    """One job's producer and what its listeners read: the latest ``job`` event's text and
    its version, a ping count, ``final`` once the job can no longer change."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.text = ""
        self.version = 0
        self.pings = 0
        self.final = False
        self.listeners = 0
        self.task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    def publish(self, text: str | None) -> None:
        """A new ``job`` event (``text``) or, with None, a ping; wakes every listener."""
        if text is None:
            self.pings += 1
        else:
            self.text = text
            self.version += 1
        woken, self._changed = self._changed, asyncio.Event()
        woken.set()

    async def wait(self, timeout: float) -> None:
        """Until the next publish, or ``timeout`` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)


class JobFeeds:
    """The feeds by job id, and the per-client count of open streams."""

    def __init__(
        self,
        view: Callable[[str], Any],
        render: Callable[[dict[str, Any]], str | None],
        *,
        poll_s: float,
        max_s: float,
        per_client: int,
        ping_s: float = 15.0,
    ) -> None:
        self._view = view  # async job_id -> view dict (raises NotFoundError)
        self._render = render
        self.poll_s = poll_s
        self.max_s = max_s
        self.per_client = per_client
        self.ping_s = ping_s
        self.feeds: dict[str, Feed] = {}
        self.open_by_client: dict[str, int] = {}
        self.views_computed = 0  # for tests and the bench: producer reads, all feeds together

    @classmethod
    def of(cls, b: Backend) -> JobFeeds:
        """The feeds of the app's backend (its settings, its chain index and scheduler)."""
        template = env.get_template("_job_live.html")

        async def view(job_id: str) -> dict[str, Any]:
            await b.refresh()
            found = await b.job_view(job_id)
            await progress.attach(b.scheduler, found)  # a checkpointing job's progress
            return found

        def render(view: dict[str, Any]) -> str | None:
            return template.render(view=view, b=b) if "state" in view else None

        s = b.settings
        return cls(
            view,
            render,
            poll_s=s.stream_poll_s,
            max_s=s.stream_max_s,
            per_client=s.streams_per_client,
            ping_s=s.stream_ping_s,
        )

    def open(self, job_id: str, client: str) -> Listener:
        """A stream of ``job_id``'s events for ``client``, or 429 past its cap (counted from
        now until the stream ends or :meth:`Listener.aclose`)."""
        n = self.open_by_client.get(client, 0)
        if n >= self.per_client:
            raise HTTPException(
                429,
                f"{client} already has {n} live job streams open; at most {self.per_client} "
                "at once (GRIDMARKET_FRONTEND_STREAMS_PER_CLIENT)",
                headers={"Retry-After": "2"},
            )
        self.open_by_client[client] = n + 1
        feed = self.feeds.get(job_id)
        if feed is None:
            feed = self.feeds[job_id] = Feed(job_id)
        feed.listeners += 1
        if feed.task is None:
            feed.task = asyncio.get_running_loop().create_task(
                self._produce(feed), name=f"feed {job_id}"
            )
        log.debug("stream of %s for %s (%d open)", job_id, client, n + 1)
        return Listener(self, feed, client)

    def _release(self, feed: Feed, client: str) -> None:
        feed.listeners -= 1
        n = self.open_by_client.get(client, 0) - 1
        if n > 0:
            self.open_by_client[client] = n
        else:
            self.open_by_client.pop(client, None)

    async def _produce(self, feed: Feed) -> None:
        last = ""
        pinged = time.monotonic()
        try:
            while feed.listeners > 0:
                text = await self._read(feed.job_id, last)
                if text is not None:
                    last, event, final = text
                    feed.final = final
                    feed.publish(event)
                    if final:
                        return
                elif time.monotonic() - pinged >= self.ping_s:
                    pinged = time.monotonic()
                    feed.publish(None)
                await asyncio.sleep(self.poll_s)
        finally:
            if self.feeds.get(feed.job_id) is feed:
                del self.feeds[feed.job_id]

    async def _read(self, job_id: str, last: str) -> tuple[str, str, bool] | None:
        """The job's event text if its view changed since ``last`` (its key, the text, final)."""
        self.views_computed += 1
        try:
            view = await self._view(job_id)
        except NotFoundError as exc:
            view = {"job_id": job_id, "missing": str(exc)}
        except Exception as exc:  # the chain hiccuped: say so, keep polling
            view = {"job_id": job_id, "error": f"{type(exc).__name__}: {exc}"}
        key = dumps(stable(view))
        if key == last:
            return None
        try:
            html = self._render(view)
        except Exception:
            log.exception("rendering job %s's live fragment", job_id)
            html = None
        payload = {"view": view, "html": html}
        event = f"event: job\ndata: {json.dumps(payload, default=str)}\n\n"
        final = bool(view.get("final"))
        if final:
            event += "event: end\ndata: {}\n\n"
        return key, event, final


def stream_response(listener: Listener) -> StreamingResponse:
    """The SSE response of ``listener``, which gives its slot back however the response ends."""
    return _ListenerResponse(listener)


class _ListenerResponse(StreamingResponse):
    def __init__(self, listener: Listener) -> None:
        super().__init__(
            listener,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.listener = listener

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.listener.aclose()


class Listener:
    """One stream: an async iterator of SSE text. Its slot (the client's count, the feed's
    listener) is given back once, when the stream ends or :meth:`aclose` is called, also when
    it was never iterated (the client left before its first byte)."""

    def __init__(self, feeds: JobFeeds, feed: Feed, client: str) -> None:
        self._feeds = feeds
        self._feed = feed
        self._client = client
        self._open = True
        self._events = self._listen()

    def __aiter__(self) -> Listener:
        return self

    async def __anext__(self) -> str:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        try:
            await self._events.aclose()
        finally:
            self._release()

    def _release(self) -> None:
        if self._open:
            self._open = False
            self._feeds._release(self._feed, self._client)

    async def _listen(self) -> AsyncGenerator[str, None]:
        feed = self._feed
        deadline = time.monotonic() + self._feeds.max_s
        seen, pings = 0, feed.pings
        try:
            yield "retry: 2000\n\n"
            while True:
                if feed.version != seen:
                    seen, text, final = feed.version, feed.text, feed.final
                    yield text  # (the feed may move on while this waits to be sent)
                    if final:
                        return
                    continue
                if feed.pings != pings:
                    pings = feed.pings
                    yield PING
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                await feed.wait(left)
        finally:
            self._release()
