"""Live logs: a running job's stdout/stderr shipped to the scheduler while it runs.

The executor's output reader (:class:`agent.executors.docker._LogPump`, the WASM executor's
stdout/stderr callbacks) calls :meth:`LogShipper.feed` with what the job wrote; the shipper cuts
it into lines stamped with the time they were read and a thread of its own posts them in
batches (``POST /v1/nodes/{node_id}/jobs/{job_id}/logs``, the node's bearer token) every
``flush_s`` seconds or ``flush_chars`` characters, whichever comes first.

The job's output is hostile, so everything is bounded (docs/provider.md):

* ``rate`` bytes a second per job (past it, bytes are dropped and the next batch says how many);
* ``cap`` bytes per attempt (past it, one ``[log truncated: N bytes dropped]`` at the end);
* ``max_pending`` bytes waiting to be posted (a slow scheduler costs memory up to that, then
  drops, counted like the rate);
* a line longer than ``max_line`` is cut into pieces.

``feed`` only appends under a lock: it never waits on the network, so the job's output reader
(and with it the job) never slows down because of the scheduler. Posts go through the node's
session (its own connection from the pool, a short timeout), never the heartbeat thread; a
failed post is retried ``retries`` times and then dropped (a refusal, 4xx, at once; after a 404
or 405, a scheduler without live logs, nothing more is sent): logs are best effort and the result
path does not depend on them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gridmarket.joblogs import MAX_CHUNKS, MAX_TEXT, LogBatch, LogChunk, LogStream, clean_text

__all__ = ["LogShipper", "LogShipperSettings"]

log = logging.getLogger(__name__)

KiB = 1024
MiB = 1024 * KiB


class LogShipperSettings:
    """The caps and pacing of one attempt's shipper (the defaults are documented)."""

    def __init__(
        self,
        *,
        rate: int = 64 * KiB,
        cap: int = 8 * MiB,
        flush_s: float = 2.0,
        flush_chars: int = 16 * KiB,
        max_pending: int = 256 * KiB,
        max_line: int = 4 * KiB,
        retries: int = 3,
        retry_s: float = 0.5,
    ) -> None:
        self.rate = rate
        self.cap = cap
        self.flush_s = flush_s
        self.flush_chars = flush_chars
        self.max_pending = max_pending
        self.max_line = max_line
        self.retries = retries
        self.retry_s = retry_s


class LogShipper:
    """Ships one attempt's output; ``post(job_id, batch)`` sends one batch (raises on failure).

    Use as a context manager around the run: leaving it flushes what is left (waiting at most
    ``close_timeout_s``) and stops the thread.
    """

    def __init__(
        self,
        post: Callable[[str, LogBatch], Any],
        job_id: str,
        attempt: int,
        settings: LogShipperSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        close_timeout_s: float = 5.0,
    ) -> None:
        self._post = post
        self.job_id = job_id
        self.attempt = attempt
        self.s = settings or LogShipperSettings()
        self._clock = clock
        self.close_timeout_s = close_timeout_s
        self._cond = threading.Condition()
        self._chunks: list[LogChunk] = []
        self._pending = 0  # characters in _chunks
        self._partial: dict[LogStream, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self._window = 0.0  # start of the current one-second window of the rate
        self._window_bytes = 0
        self.accepted = 0  # bytes of output taken (towards ``cap``)
        self.dropped_rate = 0  # bytes dropped over the rate or the pending cap, not yet said
        self.dropped_cap = 0  # bytes dropped past the attempt's cap
        self.dropped_total = 0
        self.posted_batches = 0
        self.failed_batches = 0
        self._seq = 0
        self._closed = False
        self.disabled = False  # the scheduler has no live logs (404/405): nothing more is sent
        self._thread = threading.Thread(target=self._loop, name=f"logs-{job_id[2:10]}", daemon=True)
        self._thread.start()

    def __enter__(self) -> LogShipper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ input

    def feed(self, name: str, data: bytes) -> None:
        """Take what the job wrote to ``name`` (from the executor's reader thread)."""
        if not data:
            return
        stream: LogStream = "stderr" if name == "stderr" else "stdout"
        now = self._clock()
        with self._cond:
            if self._closed or self.disabled:
                return
            if now - self._window >= 1.0:
                self._window, self._window_bytes = now, 0
            room_cap = self.s.cap - self.accepted
            room_rate = self.s.rate - self._window_bytes
            room_pending = self.s.max_pending - self._pending
            take = max(0, min(len(data), room_cap, room_rate, room_pending))
            lost = len(data) - take
            if lost:
                self.dropped_total += lost
                if room_cap < len(data) and room_cap <= min(room_rate, room_pending):
                    self.dropped_cap += lost
                else:
                    self.dropped_rate += lost
            if take:
                self.accepted += take
                self._window_bytes += take
                self._lines(stream, data[:take], now)
            if self._pending >= self.s.flush_chars or len(self._chunks) >= MAX_CHUNKS:
                self._cond.notify()

    def note(self, text: str) -> None:
        """Add a line of the agent's own (``system``: resumed from a checkpoint, a checkpoint
        not taken); it does not count against the job's caps."""
        with self._cond:
            if self._closed or self.disabled:
                return
            self._note(clean_text(text.rstrip("\n"))[: MAX_TEXT - 1])
            self._cond.notify()

    def _lines(self, stream: LogStream, data: bytes, now: float) -> None:  # under _cond
        """Cut ``data`` (after what is left of the stream's last line) into lines of at most
        ``max_line`` bytes; whole lines read together share one chunk (up to ``MAX_TEXT``
        characters), a piece of a longer line is a chunk of its own."""
        buf = self._partial[stream]
        buf += data
        run: list[str] = []
        while True:
            cut = buf.find(b"\n")
            if cut < 0 and len(buf) < self.s.max_line:
                break
            end = cut + 1 if 0 <= cut < self.s.max_line else self.s.max_line
            text = clean_text(bytes(buf[:end]))
            del buf[:end]
            if text.endswith("\n") and sum(map(len, run)) + len(text) <= MAX_TEXT:
                run.append(text)
                continue
            self._add(stream, "".join(run), now)
            run = []
            if text.endswith("\n") and len(text) <= MAX_TEXT:
                run.append(text)
            else:
                self._add(stream, text, now)
        self._add(stream, "".join(run), now)

    def _add(self, stream: LogStream, text: str, now: float) -> None:  # under _cond
        for at in range(0, len(text), MAX_TEXT):  # escaping may have made it longer
            piece = text[at : at + MAX_TEXT]
            self._chunks.append(LogChunk(stream=stream, ts=now, text=piece))
            self._pending += len(piece)

    def _note(self, text: str) -> None:  # under _cond
        self._chunks.append(LogChunk(stream="system", ts=self._clock(), text=text + "\n"))
        self._pending += len(text) + 1

    # ------------------------------------------------------------------ output

    def close(self) -> None:
        """Flush what is left (partial lines, the truncation note) and stop; waits at most
        ``close_timeout_s`` for the last posts."""
        with self._cond:
            if self._closed:
                return
            now = self._clock()
            for stream, buf in self._partial.items():
                if buf:
                    self._add(stream, clean_text(bytes(buf)), now)
                    buf.clear()
            if self.dropped_cap:
                self._note(
                    f"[log truncated: {self.dropped_cap} bytes dropped past the cap of "
                    f"{self.s.cap} bytes per attempt]"
                )
            self._closed = True
            self._cond.notify()
        self._thread.join(self.close_timeout_s)

    def _loop(self) -> None:
        while True:
            with self._cond:
                deadline = time.monotonic() + self.s.flush_s
                while (
                    not self._closed
                    and self._pending < self.s.flush_chars
                    and len(self._chunks) < MAX_CHUNKS
                ):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if self.dropped_rate:
                    self._note(
                        f"[log truncated: {self.dropped_rate} bytes dropped (over "
                        f"{self.s.rate} bytes a second, or the scheduler is slow)]"
                    )
                    self.dropped_rate = 0
                batch = self._take()
                closed = self._closed
            if batch is not None:
                self._send(batch)
            if closed:
                with self._cond:
                    if not self._chunks:
                        return

    def _take(self) -> LogBatch | None:  # under _cond
        if not self._chunks:
            return None
        chars = n = 0
        for chunk in self._chunks:
            if n and (chars + len(chunk.text) > self.s.flush_chars or n >= MAX_CHUNKS):
                break
            chars += len(chunk.text)
            n += 1
        chunks, self._chunks = self._chunks[:n], self._chunks[n:]
        self._pending -= chars
        batch = LogBatch(attempt=self.attempt, seq=self._seq, chunks=chunks)
        self._seq += 1
        return batch

    def _send(self, batch: LogBatch) -> None:
        for attempt in range(self.s.retries + 1):
            if self.disabled:
                return
            try:
                self._post(self.job_id, batch)
            except Exception as exc:  # best effort: say why once, then drop
                status = getattr(exc, "status", None)  # SchedulerRejectedError: a 4xx
                refused = isinstance(status, int) and 400 <= status < 500 and status != 429
                if refused and status in (404, 405):  # a scheduler without live logs
                    self.disabled = True
                if refused or attempt == self.s.retries:
                    self.failed_batches += 1
                    log.info(
                        "job %s: a log batch was dropped after %d tries: %s",
                        self.job_id[:10],
                        attempt + 1,
                        exc,
                    )
                    return
                time.sleep(self.s.retry_s * 2**attempt)
            else:
                self.posted_batches += 1
                return
