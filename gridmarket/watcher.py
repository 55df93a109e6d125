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

Reorgs (docs/scheduler-chain.md "Reorgs"). The read head is ``latest`` minus ``confirmations``, or
the chain's ``safe`` or ``finalized`` block (``head_tag``). Given a :class:`ReorgStore`, the
watcher also follows the chain by block hash: each batch is delivered with the hash of its last
block (read before and after ``eth_getLogs``: unchanged, so the whole range was one chain), the
store keeps the last few of those checkpoints (the scheduler's: 128) with the cursor, and each
poll first checks that the chain still has the newest one. If not, it walks back to the newest
checkpoint the chain still has (the fork point, or a block before it), has the store roll back
to it (:meth:`ReorgStore.rollback`: forget what came after, rebuild what it folded) and delivers
again from there. A reorg that replaced every kept checkpoint raises :class:`ReorgTooDeepError` on
every poll until someone looks (the store is left as it was, never silently diverging).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from web3.exceptions import BlockNotFound

from gridmarket.chain import EscrowClient, Event
from gridmarket.retry import RetryPolicy, describe, is_transient

log = logging.getLogger(__name__)

EventSink = Callable[..., None]
"""``sink(events, through_block)``: persist ``events`` (the escrow's decoded events of the
blocks after the cursor up to ``through_block``, in (block, log_index) order, possibly none)
and set the cursor to ``through_block``, atomically. Called from one thread at a time. With a
:class:`ReorgStore`, called as ``sink(events, through_block, block_hash)``: the sink also keeps
``(through_block, block_hash)`` as a checkpoint, in the same transaction."""

EventReader = Callable[[int, int, Any], list[Event]]
"""``read(first, last, topics)``: the escrow's events of blocks ``first..last`` (read in
batches), optionally filtered by ``topics`` (``eth_getLogs`` topic filter)."""

HeadTag = Literal["latest", "safe", "finalized"]


class ReorgTooDeepError(RuntimeError):
    """The chain no longer has any block the store kept a checkpoint of: the reorg is deeper
    than the kept checkpoints reach (or the node serves another chain). Nothing is rolled back."""


class ReorgStore(Protocol):
    """What the watcher needs from a store to follow the chain by block hash."""

    def checkpoints(self) -> list[tuple[int, str]]:
        """The kept ``(block, hash)`` of delivered batch ends, oldest first."""
        ...

    def rollback(self, fork_block: int, read: EventReader) -> list[str]:
        """Forget everything delivered after ``fork_block`` (events, checkpoints), rebuild what
        was folded from them using ``read`` for the events up to ``fork_block``, and set the
        cursor to ``fork_block``, atomically; return the ids of what changed (jobs)."""
        ...


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
    reorgs: int = 0  # reorgs rolled back since this watcher started
    last_reorg: str | None = None  # the warning logged for the latest one

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
    keeps that many recent blocks undelivered (``head_tag="latest"`` only); ``head_tag``
    ``"safe"``/``"finalized"`` delivers up to the chain's block of that tag instead. ``reorgs``
    (usually the store itself, which decides how many checkpoints it keeps) turns on the
    block-hash check and rollback. ``poll_interval_s`` is the wait between polls
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
        head_tag: HeadTag = "latest",
        reorgs: ReorgStore | None = None,
    ) -> None:
        if head_tag not in ("latest", "safe", "finalized"):
            raise ValueError(f"head_tag must be latest, safe or finalized, got {head_tag!r}")
        if head_tag != "latest" and confirmations:
            raise ValueError("confirmations apply to head_tag='latest' only")
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
        self.head_tag: HeadTag = head_tag
        self.reorgs = reorgs
        self._poll_lock = threading.Lock()
        self._status = WatcherStatus(None, None, None, 0, 0, None, None)

    # ------------------------------------------------------------------ reads
    def head(self) -> int:
        """The chain's latest block number (raises on RPC failure)."""
        return int(self.client.w3.eth.block_number)

    def tagged_head(self) -> int:
        """The number of the chain's ``head_tag`` block (``latest``: :meth:`head`)."""
        if self.head_tag == "latest":
            return self.head()
        return int(self.client.w3.eth.get_block(self.head_tag)["number"])

    def block_hash(self, number: int) -> str | None:
        """The 0x hash of the chain's block ``number`` now; None when it has none (yet)."""
        try:
            block = self.client.w3.eth.get_block(number)
        except BlockNotFound:
            return None
        return "0x" + bytes(block["hash"]).hex()

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
        if self.reorgs is not None and stored is not None:
            stored = self._follow(stored)
        head = self.tagged_head()
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
        if self.reorgs is None:
            events = self._read(first, last)
            self.sink(events, last)
        else:
            events, block_hash = self._read_hashed(first, last)
            self.sink(events, last, block_hash)
        log.debug("chain watcher: blocks %d..%d: %d events", first, last, len(events))
        self._status = replace(
            self._status,
            cursor=last,
            events_delivered=self._status.events_delivered + len(events),
            logs_skipped=self.client.undecodable_logs,
            invalid_fields=self._status.invalid_fields + sum(_invalid(e) for e in events),
        )
        return len(events), last >= target

    def _read(self, first: int, last: int, topics: Any = None) -> list[Event]:
        events = self.client.events(first, last, topics)
        return sorted(events, key=lambda e: (e.block, e.log_index))

    def _read_batched(self, first: int, last: int, topics: Any = None) -> list[Event]:
        out: list[Event] = []
        while first <= last:
            end = min(last, first + self.batch_blocks - 1)
            out.extend(self._read(first, end, topics))
            first = end + 1
        return out

    def _read_hashed(self, first: int, last: int) -> tuple[list[Event], str]:
        """The events of ``first..last`` and the hash of ``last``, read from one chain: the hash
        is the same before and after ``eth_getLogs`` (a reorg of any block of the range changes
        the hash of ``last``)."""
        for _ in range(5):
            before = self.block_hash(last)
            events = self._read(first, last)
            after = self.block_hash(last)
            if before is not None and before == after:
                return events, before
            log.info("chain watcher: block %d changed while reading it; reading again", last)
        raise RuntimeError(f"block {last} kept changing while its logs were read")

    def _follow(self, stored: int) -> int:
        """Check the chain still has the newest checkpoint; if not, roll the store back to the
        newest one it has. Returns the cursor to continue from."""
        assert self.reorgs is not None
        kept = self.reorgs.checkpoints()
        if not kept:
            return stored  # nothing delivered with a hash yet (or a store from before 0004)
        tip_block, tip_hash = kept[-1]
        if self.block_hash(tip_block) == tip_hash:
            return stored
        fork: int | None = None
        for number, known in reversed(kept[:-1]):
            if self.block_hash(number) == known:
                fork = number
                break
        if fork is None:
            raise ReorgTooDeepError(
                f"chain reorg deeper than the {len(kept)} kept checkpoints (blocks "
                f"{kept[0][0]}..{tip_block}): the chain has none of them; the store is left at "
                f"block {stored}. Re-sync the store from the chain (or keep more checkpoints)"
            )
        affected = self.reorgs.rollback(fork, self._read_batched)
        message = (
            f"chain reorg: block {tip_block} ({tip_hash[:10]}) is gone; rolled back to block "
            f"{fork} (depth <= {tip_block - fork}), {len(affected)} jobs affected"
            + (f": {', '.join(affected[:10])}" if affected else "")
        )
        log.warning(message)
        self._status = replace(
            self._status, cursor=fork, reorgs=self._status.reorgs + 1, last_reorg=message
        )
        return fork

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
