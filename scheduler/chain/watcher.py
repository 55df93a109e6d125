"""Turns the escrow's event log into calls of a sink, block range by block range, exactly once
for an idempotent sink, across restarts and RPC outages.

The store owns the cursor (the last block fully handled). The watcher reads it, fetches the
escrow's logs for the next blocks up to ``head - confirmations``, and hands them to the sink with
the block they run through; the sink writes the events and the new cursor in one database
transaction. The watcher never keeps progress of its own that the store does not have: after a
crash it starts again from what :meth:`CursorStore.load` says, so a batch whose commit did not
happen is delivered again. A sink must therefore upsert by ``(tx_hash, log_index)``
(docs/scheduler-chain.md).

Event data is hostile (the contract takes any bytes as a string): the client decodes each log on
its own, hands over a string that does not decode as an
:class:`~gridmarket.escrow.InvalidText` (the job it creates can never be fetched, so it ends
``invalid`` with a reason naming the field) and skips a log that does not decode at all, logged
and counted in :attr:`WatcherStatus.logs_skipped`. No event can stop the watcher.

Chain reorganisations deeper than ``confirmations`` are not handled: choose ``confirmations`` at
least as deep as the chain's practical finality (0 is right for anvil and other instant-finality
devnets).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from gridmarket.chain import EscrowClient, Event
from scheduler.chain.retry import RetryPolicy, describe, is_transient

log = logging.getLogger(__name__)

EventSink = Callable[[list[Event], int], None]
"""``sink(events, through_block)``: persist ``events`` (the escrow's decoded events of the
blocks after the cursor up to ``through_block``, in (block, log_index) order, possibly none)
and set the cursor to ``through_block``, atomically. Called from one thread at a time."""


def _invalid(event: Event) -> int:
    """How many of ``event``'s strings did not decode to a usable value (the contract's own
    prose, ``Credited.reason``, is decoded as text: gridmarket.escrow.PROSE_FIELDS)."""
    return len(event.problems)


class CursorStore(Protocol):
    """Where the store keeps the watcher's progress."""

    def load(self) -> int | None:
        """The last block whose events were fully handled; None before the first batch."""
        ...


@dataclass(frozen=True)
class WatcherStatus:
    """A snapshot for health checks and metrics."""

    cursor: int | None  # last block delivered (as the store last said, or delivered since)
    head: int | None  # chain head seen at the last successful poll
    target: int | None  # last block deliverable at that time: head - confirmations
    events_delivered: int  # since this watcher started
    consecutive_failures: int
    last_error: str | None
    last_success_at: float | None  # time.time() of the last successful poll
    logs_skipped: int = 0  # escrow logs that did not decode at all (each logged), client-wide
    invalid_fields: int = 0  # event strings that did not decode, delivered as InvalidText

    @property
    def lag_blocks(self) -> int | None:
        """Blocks behind the confirmed head at the last poll (0 when caught up)."""
        if self.target is None:
            return None
        return max(0, self.target - (self.cursor if self.cursor is not None else -1))


class ChainWatcher:
    """Delivers the escrow's events to ``sink`` in order, batch by batch, behind ``cursor``.

    ``start_block`` (default: the deployment block) is where a store with no cursor starts.
    ``batch_blocks`` bounds one ``eth_getLogs`` range (providers often cap it). ``confirmations``
    keeps that many recent blocks undelivered. ``poll_interval_s`` is the wait between polls
    once caught up; after failures :meth:`run` backs off per ``backoff`` (exponential with
    jitter, its deadline ignored: the watcher never gives up).
    """

    def __init__(
        self,
        client: EscrowClient,
        cursor: CursorStore,
        sink: EventSink,
        *,
        confirmations: int = 0,
        batch_blocks: int = 2000,
        start_block: int | None = None,
        poll_interval_s: float = 0.5,
        backoff: RetryPolicy | None = None,
    ) -> None:
        if confirmations < 0:
            raise ValueError(f"confirmations must be >= 0, got {confirmations}")
        if batch_blocks < 1:
            raise ValueError(f"batch_blocks must be >= 1, got {batch_blocks}")
        if start_block is not None and start_block < 0:
            raise ValueError(f"start_block must be >= 0, got {start_block}")
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s}")
        self.client = client
        self.cursor = cursor
        self.sink = sink
        self.confirmations = confirmations
        self.batch_blocks = batch_blocks
        self.start_block = client.deployment.block if start_block is None else start_block
        self.poll_interval_s = poll_interval_s
        self.backoff = backoff or RetryPolicy(initial_delay_s=0.5, max_delay_s=15.0)
        self._poll_lock = threading.Lock()
        self._status = WatcherStatus(None, None, None, 0, 0, None, None)

    # ------------------------------------------------------------------ reads
    def head(self) -> int:
        """The chain's latest block number (raises on RPC failure)."""
        return int(self.client.w3.eth.block_number)

    def wait_for_block(self, number: int, timeout_s: float = 30.0, poll_s: float = 0.05) -> int:
        """Wait until the head reaches ``number``; return the head. Transient RPC failures are
        waited out; :class:`TimeoutError` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                head = self.head()
                if head >= number:
                    return head
            except Exception as exc:
                if not is_transient(exc):
                    raise
            if time.monotonic() >= deadline:
                raise TimeoutError(f"block {number} not reached within {timeout_s}s")
            time.sleep(poll_s)

    def status(self) -> WatcherStatus:
        """The latest :class:`WatcherStatus` (thread-safe)."""
        return self._status

    # ------------------------------------------------------------------ polling
    def poll_once(self) -> int:
        """Deliver every confirmed block after the cursor; return the number of events.

        Raises what the RPC or the sink raised; whatever was delivered before stays delivered
        (the cursor moved with it), and the next call resumes from the store's cursor.
        """
        total = 0
        with self._poll_lock:
            target = self._begin_poll()
            while True:
                delivered, done = self._deliver_next(target)
                total += delivered
                if done:
                    return total

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set; never raises. Failures are logged and retried with
        backoff; an outage is logged when it starts, every minute while it lasts, and when it
        ends. ``stop`` is checked between batches, so a long catch-up stops promptly."""
        log.info(
            "chain watcher: escrow %s from block %d, %d confirmations, batches of %d blocks",
            self.client.address,
            self.start_block,
            self.confirmations,
            self.batch_blocks,
        )
        delays = self.backoff.delays()
        outage_since: float | None = None
        failures = 0
        last_report = 0.0
        while not stop.is_set():
            try:
                with self._poll_lock:
                    target = self._begin_poll()
                    done = False
                    while not done and not stop.is_set():
                        _, done = self._deliver_next(target)
            except Exception as exc:
                self._failed(exc)
                failures += 1
                now = time.monotonic()
                if outage_since is None:
                    outage_since, last_report = now, now
                    self._log_failure(exc, "chain watcher: poll failed")
                elif now - last_report >= 60:
                    last_report = now
                    self._log_failure(
                        exc, f"chain watcher: still failing after {now - outage_since:.0f}s"
                    )
                else:
                    log.debug("chain watcher: poll failed again: %s", describe(exc))
                stop.wait(next(delays))
                continue
            if outage_since is not None:
                log.warning(
                    "chain watcher: recovered after %.1fs and %d failed polls; at block %s",
                    time.monotonic() - outage_since,
                    failures,
                    self._status.cursor,
                )
                outage_since, failures = None, 0
                delays = self.backoff.delays()
            self._succeeded()
            stop.wait(self.poll_interval_s)
        log.info("chain watcher stopped at block %s", self._status.cursor)

    # ------------------------------------------------------------------ internals
    def _begin_poll(self) -> int:
        """Read the store's cursor and the head; return the last block to deliver."""
        stored = self.cursor.load()
        head = self.head()
        target = head - self.confirmations
        self._status = replace(self._status, cursor=stored, head=head, target=target)
        return target

    def _deliver_next(self, target: int) -> tuple[int, bool]:
        """Deliver the next batch up to ``target``; (events delivered, caught up)."""
        cursor = self._status.cursor
        first = self.start_block if cursor is None else cursor + 1
        if first > target:
            self._succeeded()
            return 0, True
        last = min(target, first + self.batch_blocks - 1)
        events = sorted(self.client.events(first, last), key=lambda e: (e.block, e.log_index))
        self.sink(events, last)
        log.debug("chain watcher: blocks %d..%d: %d events", first, last, len(events))
        self._status = replace(
            self._status,
            cursor=last,
            events_delivered=self._status.events_delivered + len(events),
            logs_skipped=self.client.undecodable_logs,
            invalid_fields=self._status.invalid_fields + sum(_invalid(e) for e in events),
        )
        return len(events), last >= target

    def _succeeded(self) -> None:
        self._status = replace(
            self._status, consecutive_failures=0, last_error=None, last_success_at=time.time()
        )

    def _failed(self, exc: Exception) -> None:
        self._status = replace(
            self._status,
            consecutive_failures=self._status.consecutive_failures + 1,
            last_error=describe(exc),
        )

    def _log_failure(self, exc: Exception, prefix: str) -> None:
        if is_transient(exc):
            log.warning(
                "%s: RPC %s unreachable (%s); retrying with backoff",
                prefix,
                getattr(self.client.w3.provider, "endpoint_uri", "endpoint"),
                describe(exc),
            )
        else:  # the sink or a non-transient RPC error: show the traceback once
            log.error("%s: %s; retrying with backoff", prefix, describe(exc), exc_info=exc)
