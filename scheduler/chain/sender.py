"""The scheduler's transactions with the operator key: assign, settle, relay, reject, release.

Guarantees (docs/scheduler-chain.md):

- **One nonce sequence per operator account** in the process, shared by every :class:`TxSender`
  built for that account and endpoint. A lock is held from choosing a nonce until the node has
  accepted the signed transaction, so transactions enter the pool in nonce order and a failed
  send never leaves a gap; waiting for receipts happens outside the lock, so sends pipeline.
- **Transient RPC failures are retried** (connection refused, timeouts, HTTP 5xx) with
  exponential backoff and jitter until ``RetryPolicy.deadline_s``.
- **A revert is final**: decoded (``ChainError.reason`` = ``CustomError(arg=value, ...)``) and
  raised without a retry, whether the gas estimate or the mined transaction reverted.
- **No transaction is sent twice.** Once a transaction is signed, its nonce is its idempotency
  key: after an unknown outcome (the send timed out, the connection dropped, a proxy answered
  5xx) the sender looks the transaction up by hash before sending anything, and only ever
  re-broadcasts the same signed bytes, which the chain can include at most once. A new
  transaction is built only when the node proves the old one can never be mined (its nonce was
  consumed by another transaction). Independently, the contract refuses a stale job struct
  (``JobEscrowJobMismatch``), so even a rebuilt transaction cannot apply a transition twice.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from eth_account.signers.local import LocalAccount
from hexbytes import HexBytes
from web3.exceptions import TransactionNotFound, Web3RPCError
from web3.types import TxParams, TxReceipt

from gridmarket.chain import (
    ChainError,
    EscrowClient,
    Sent,
    is_already_known,
    is_nonce_too_low,
    rpc_error_message,
)
from gridmarket.escrow import JOB_EVENTS, JobState, apply_event
from scheduler.chain.retry import (
    ChainUnavailableError,
    Deadline,
    RetryPolicy,
    describe,
    is_transient,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

# While an outage lasts, how often a retrying call repeats its warning.
_LOG_EVERY_S = 10.0
# How many times one call may rebuild its transaction because another one took its nonce.
_MAX_REBUILDS = 3


class TxOutcomeUnknownError(ChainError):
    """A transaction was signed and possibly broadcast, but whether it was mined is not known.

    Raised when the node stayed unreachable past the deadline after a send, or no receipt came
    within the receipt timeout. Do not build a replacement: the transaction may still be mined.
    Reconcile from the chain instead (the watcher will deliver its events if it lands), or call
    :meth:`TxSender.lookup` with :attr:`tx_hash` later.
    """

    def __init__(self, message: str, tx_hash: str, nonce: int) -> None:
        super().__init__(message)
        self.tx_hash = tx_hash
        self.nonce = nonce


class _NonceTakenError(Exception):
    """Internal: another transaction consumed our nonce, so ours can never be mined."""


class _NonceTooLowError(Exception):
    """Internal: the node refused our nonce and does not know our transaction."""


@dataclass
class _NonceSequence:
    """The next nonce of one account; ``lock`` is held from choosing a nonce to acceptance."""

    lock: threading.Lock
    next: int | None = None


_SEQUENCES: dict[tuple[str, int, str], _NonceSequence] = {}
_SEQUENCES_LOCK = threading.Lock()


def _sequence_for(client: EscrowClient, address: str) -> _NonceSequence:
    provider = client.w3.provider
    endpoint = str(getattr(provider, "endpoint_uri", None) or f"provider-{id(provider)}")
    key = (endpoint, client.deployment.chain_id, address)
    with _SEQUENCES_LOCK:
        seq = _SEQUENCES.get(key)
        if seq is None:
            seq = _SEQUENCES[key] = _NonceSequence(threading.Lock())
        return seq


def apply_sent(state: JobState, sent: Sent) -> JobState:
    """``state`` after the transaction ``sent``: its job events folded in chain order.

    Events of other jobs in the same transaction are ignored. Raises
    :class:`gridmarket.escrow.EventOrderError` if ``state`` was not the job's state before.
    """
    for event in sorted(sent.events, key=lambda e: e.log_index):
        if event.name in JOB_EVENTS and bytes(event.args["jobId"]) == state.job_id:
            state = apply_event(state, event.name, event.args)
    return state


class _Throttle:
    """Says when to repeat a warning during an outage: the first time, then every
    ``_LOG_EVERY_S`` (so a minute-long outage gives a handful of lines, not hundreds)."""

    def __init__(self) -> None:
        self.failures = 0
        self.started = 0.0
        self._last = 0.0

    def failed(self) -> bool:
        """Count a failure; True if this one should be logged."""
        now = time.monotonic()
        self.failures += 1
        if self.failures == 1:
            self.started = now
        if self.failures == 1 or now - self._last >= _LOG_EVERY_S:
            self._last = now
            return True
        return False

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started if self.failures else 0.0


@dataclass(frozen=True)
class _Broadcast:
    """A signed transaction, its hash and nonce: the unit that is broadcast (again)."""

    tx_hash: str
    nonce: int
    raw: bytes


class TxSender:
    """Sends the operator's job transitions to the escrow; thread-safe.

    ``retry`` bounds how long an RPC outage is waited out per call, ``receipt_timeout_s`` how
    long a broadcast transaction may take to be mined; ``receipt_poll_s`` is the first receipt
    poll interval (it grows to 1 s), and every ``pool_check_s`` without a receipt the sender
    checks that the node still holds the transaction (a restarted node or an evicting pool may
    have dropped it: the same signed bytes are then broadcast again). Each method returns the mined
    transaction (fold it with :func:`apply_sent`) or raises :class:`ChainError`: with
    ``reason`` set for a revert, :class:`ChainUnavailableError` when nothing could be sent, or
    :class:`TxOutcomeUnknownError` when a transaction may be pending.
    """

    def __init__(
        self,
        client: EscrowClient,
        operator: LocalAccount,
        *,
        retry: RetryPolicy | None = None,
        receipt_timeout_s: float = 120.0,
        receipt_poll_s: float = 0.05,
        pool_check_s: float = 2.0,
    ) -> None:
        if receipt_timeout_s <= 0:
            raise ValueError(f"receipt_timeout_s must be > 0, got {receipt_timeout_s}")
        if receipt_poll_s <= 0:
            raise ValueError(f"receipt_poll_s must be > 0, got {receipt_poll_s}")
        if pool_check_s <= 0:
            raise ValueError(f"pool_check_s must be > 0, got {pool_check_s}")
        self.client = client
        self.account = operator
        self.retry = retry or RetryPolicy()
        self.receipt_timeout_s = receipt_timeout_s
        self.receipt_poll_s = receipt_poll_s
        self.pool_check_s = pool_check_s
        self._seq = _sequence_for(client, operator.address)

    @property
    def address(self) -> str:
        """The operator's address."""
        return str(self.account.address)

    # ------------------------------------------------------------------ job transitions
    def assign(self, state: JobState, provider: str) -> Sent:
        """Assign a Funded job to ``provider``, or reassign an Assigned one (attempt + 1)."""
        return self.send_job("assign", state, provider)

    def unassign(self, state: JobState) -> Sent:
        """Take an Assigned job back (lease lost): it is Funded again."""
        return self.send_job("unassign", state)

    def settle(self, state: JobState, output_cid: str, signature: bytes) -> Sent:
        """Relay the assigned provider's signed result and pay it in one transaction."""
        return self.send_job("settle", state, output_cid, signature)

    def submit_result_for(self, state: JobState, output_cid: str, signature: bytes) -> Sent:
        """Relay the assigned provider's signed result without paying (challenge window runs)."""
        return self.send_job("submitResultFor", state, output_cid, signature)

    def reject(self, state: JobState) -> Sent:
        """Reject a Submitted result: the provider is slashed and the job is Funded again."""
        return self.send_job("reject", state)

    def release(self, state: JobState) -> Sent:
        """Pay a Submitted result."""
        return self.send_job("release", state)

    def send_job(self, fn_name: str, state: JobState, *extra: Any) -> Sent:
        """``fn_name(jobId, job, *extra)`` for the job ``state`` describes."""
        return self.send(fn_name, state.job_id, state.job.as_tuple(), *extra)

    # ------------------------------------------------------------------ any call
    def send(self, fn_name: str, *args: Any, value: int = 0) -> Sent:
        """Send ``fn_name(*args)`` from the operator key and wait for it to be mined."""
        deadline = Deadline(self.retry.deadline_s)
        for rebuild in range(_MAX_REBUILDS + 1):
            params = self._retrying(
                f"{fn_name}: estimate",
                deadline,
                lambda: self.client.prepare(self.account, fn_name, *args, value=value),
            )
            gas_price = self._retrying(
                f"{fn_name}: gas price", deadline, lambda: int(self.client.w3.eth.gas_price)
            )
            sent = self._broadcast(fn_name, params, gas_price, deadline)
            try:
                receipt = self._await_receipt(fn_name, sent)
            except _NonceTakenError:
                log.warning(
                    "%s: tx %s (nonce %d) vanished and another transaction took its nonce; "
                    "building it again (%d/%d)",
                    fn_name,
                    sent.tx_hash,
                    sent.nonce,
                    rebuild + 1,
                    _MAX_REBUILDS,
                )
                self.resync()
                continue
            # Mined: decode it (a revert is replayed on its block to name the error; that read
            # gets a fresh deadline, since the transaction itself is settled).
            return self._retrying(
                f"{fn_name}: decode {sent.tx_hash}",
                Deadline(self.retry.deadline_s),
                functools.partial(self.client.sent_from_receipt, fn_name, params, receipt),
            )
        raise ChainError(
            f"{fn_name}: its nonce was taken by other transactions {_MAX_REBUILDS + 1} times: "
            "is another process sending with the operator key?"
        )

    def lookup(self, tx_hash: str) -> Sent | None:
        """The mined transaction ``tx_hash`` (e.g. from :class:`TxOutcomeUnknownError`), None if it
        is not mined (yet). Raises :class:`ChainError` if it was mined and reverted."""
        try:
            receipt = self.client.w3.eth.get_transaction_receipt(HexBytes(tx_hash))
        except TransactionNotFound:
            return None
        if receipt["status"] != 1:
            raise ChainError(f"tx {tx_hash} reverted")
        return self.client.sent_from_receipt("tx", {}, receipt)

    def resync(self) -> None:
        """Forget the cached nonce: the next send reads it from the node ('pending')."""
        with self._seq.lock:
            self._seq.next = None

    # ------------------------------------------------------------------ internals
    def _retrying(self, what: str, deadline: Deadline, fn: Callable[[], T]) -> T:
        """``fn()``, retrying transient RPC failures with backoff until ``deadline``.

        A JSON-RPC error the node means (not a transient one) becomes :class:`ChainError`;
        reverts already are one (``EscrowClient.prepare``) and pass through untouched.
        """
        delays = self.retry.delays()
        throttle = _Throttle()
        while True:
            try:
                result = fn()
            except Exception as exc:
                if not is_transient(exc):
                    if isinstance(exc, Web3RPCError):  # the node answered, and meant it
                        raise ChainError(f"{what}: {rpc_error_message(exc)}") from exc
                    raise
                if deadline.expired:
                    raise ChainUnavailableError(
                        f"{what}: RPC unreachable, gave up after {deadline.seconds:.1f}s and "
                        f"{throttle.failures + 1} attempts (last error: {describe(exc)})"
                    ) from exc
                if throttle.failed():
                    log.warning(
                        "%s: RPC failing for %.1fs (%d attempts): %s; retrying with backoff "
                        "for up to %.0fs more",
                        what,
                        throttle.elapsed,
                        throttle.failures,
                        describe(exc),
                        deadline.remaining,
                    )
                time.sleep(min(next(delays), deadline.remaining))
                continue
            if throttle.failures:
                log.warning(
                    "%s: RPC answered again after %.1fs and %d failed attempts",
                    what,
                    throttle.elapsed,
                    throttle.failures,
                )
            return result

    def _broadcast(
        self, fn_name: str, params: TxParams, gas_price: int, deadline: Deadline
    ) -> _Broadcast:
        """Choose a nonce, sign, and have the node accept the transaction, under the lock.

        On any failure the cached nonce is dropped, so the next send reads the node's 'pending'
        count, which tells whether a transaction whose fate was unknown took its nonce.
        """
        with self._seq.lock:
            try:
                tx = self._broadcast_locked(fn_name, params, gas_price, deadline)
            except BaseException:
                self._seq.next = None
                raise
            self._seq.next = tx.nonce + 1
            return tx

    def _pending_nonce(self, fn_name: str, deadline: Deadline) -> int:
        return self._retrying(
            f"{fn_name}: nonce",
            deadline,
            lambda: int(self.client.w3.eth.get_transaction_count(self.account.address, "pending")),
        )

    def _broadcast_locked(
        self, fn_name: str, params: TxParams, gas_price: int, deadline: Deadline
    ) -> _Broadcast:
        nonce = self._seq.next
        if nonce is None:
            nonce = self._pending_nonce(fn_name, deadline)
        tx = self._sign(params, nonce, gas_price)
        delays = self.retry.delays()
        throttle = _Throttle()
        outcome_unknown = False
        resyncs = 0
        while True:
            try:
                self._try_broadcast(fn_name, tx, outcome_unknown)
                return tx
            except _NonceTooLowError as exc:
                if resyncs >= _MAX_REBUILDS:
                    raise ChainError(
                        f"{fn_name}: nonce taken by other transactions {resyncs + 1} times in a "
                        "row: is another process sending with the operator key?"
                    ) from exc
                # Another transaction (another process with the key) used this nonce: ours was
                # never accepted and now never can be, so a new one with the next free nonce is
                # not a duplicate.
                resyncs += 1
                fresh = self._pending_nonce(fn_name, deadline)
                log.warning(
                    "%s: nonce %d was used by another transaction; signing again with nonce %d",
                    fn_name,
                    tx.nonce,
                    fresh,
                )
                tx = self._sign(params, fresh, gas_price)
                outcome_unknown = False
            except Exception as exc:
                if not is_transient(exc):
                    raise
                outcome_unknown = True  # it may have reached the node before the failure
                time.sleep(self._backoff_or_give_up(fn_name, tx, exc, delays, deadline, throttle))

    def _sign(self, params: TxParams, nonce: int, gas_price: int) -> _Broadcast:
        signed = self.client.sign(self.account, params, nonce=nonce, gas_price=gas_price)
        return _Broadcast("0x" + bytes(signed.hash).hex(), nonce, bytes(signed.raw_transaction))

    def _try_broadcast(self, fn_name: str, tx: _Broadcast, outcome_unknown: bool) -> None:
        """Send ``tx`` once; return if the node has it. After an unknown outcome, look it up
        first. Raises :class:`_NonceTooLowError`, a refusal as :class:`ChainError`, or the transport
        error (the caller retries those)."""
        if outcome_unknown and self._known(tx.tx_hash):
            log.info(
                "%s: tx %s (nonce %d) had reached the node before the failure; not resending",
                fn_name,
                tx.tx_hash,
                tx.nonce,
            )
            return
        try:
            self.client.w3.eth.send_raw_transaction(tx.raw)
        except Web3RPCError as exc:
            if is_transient(exc):
                raise
            message = rpc_error_message(exc)
            if is_already_known(message):
                return  # an earlier attempt of this very transaction is in the pool
            if is_nonce_too_low(message):
                if self._known(tx.tx_hash):
                    return  # our own earlier attempt was mined: that is what used the nonce
                raise _NonceTooLowError(message) from exc
            raise ChainError(f"{fn_name}: the node refused the transaction: {message}") from exc

    def _backoff_or_give_up(
        self,
        fn_name: str,
        tx: _Broadcast,
        exc: Exception,
        delays: Iterator[float],
        deadline: Deadline,
        throttle: _Throttle,
    ) -> float:
        """The next delay, or :class:`TxOutcomeUnknownError` once the deadline passed."""
        if deadline.expired:
            raise TxOutcomeUnknownError(
                f"{fn_name}: tx {tx.tx_hash} (nonce {tx.nonce}) may or may not have reached the "
                f"node: RPC unreachable for {deadline.seconds:.1f}s (last error: {describe(exc)})",
                tx.tx_hash,
                tx.nonce,
            ) from exc
        if throttle.failed():
            log.warning(
                "%s: sending tx %s (nonce %d) failing for %.1fs (%d attempts): %s; it will be "
                "looked up by hash before any resend",
                fn_name,
                tx.tx_hash,
                tx.nonce,
                throttle.elapsed,
                throttle.failures,
                describe(exc),
            )
        return min(next(delays), deadline.remaining)

    def _known(self, tx_hash: str) -> bool:
        """Whether the node has ``tx_hash``, pending or mined."""
        try:
            self.client.w3.eth.get_transaction(HexBytes(tx_hash))
        except TransactionNotFound:
            return False
        return True

    def _await_receipt(self, fn_name: str, tx: _Broadcast) -> TxReceipt:
        """Poll for the receipt of an accepted transaction; re-broadcast it if it was dropped.

        Raises :class:`_NonceTakenError` if the transaction vanished and its nonce was consumed by
        another one, and :class:`TxOutcomeUnknownError` after ``receipt_timeout_s``.
        """
        deadline = Deadline(self.receipt_timeout_s)
        poll = self.receipt_poll_s
        last_check = time.monotonic()
        failures = 0
        throttle = _Throttle()
        while True:
            try:
                receipt = self._receipt(tx.tx_hash)
                if receipt is not None:
                    return receipt
                if failures or time.monotonic() - last_check >= self.pool_check_s:
                    # Not mined yet, and a while passed (or the node was away: it may have
                    # restarted with an empty pool): make sure it still holds the transaction.
                    last_check = time.monotonic()
                    self._recheck(fn_name, tx)
                if failures:
                    log.warning(
                        "%s: RPC answered again after %.1fs and %d failed polls",
                        fn_name,
                        throttle.elapsed,
                        failures,
                    )
                    failures, throttle = 0, _Throttle()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                failures += 1
                if throttle.failed():
                    log.warning(
                        "%s: waiting for tx %s: RPC failing for %.1fs (%d polls): %s",
                        fn_name,
                        tx.tx_hash,
                        throttle.elapsed,
                        throttle.failures,
                        describe(exc),
                    )
            if deadline.expired:
                raise TxOutcomeUnknownError(
                    f"{fn_name}: tx {tx.tx_hash} (nonce {tx.nonce}) not mined within "
                    f"{self.receipt_timeout_s:.1f}s",
                    tx.tx_hash,
                    tx.nonce,
                )
            time.sleep(min(poll, deadline.remaining))
            poll = min(poll * 1.5, 1.0) if not failures else min(max(poll, 0.25) * 2, 5.0)

    def _receipt(self, tx_hash: str) -> TxReceipt | None:
        try:
            return self.client.w3.eth.get_transaction_receipt(HexBytes(tx_hash))
        except TransactionNotFound:
            return None

    def _recheck(self, fn_name: str, tx: _Broadcast) -> None:
        """A transaction still unmined: make sure the node still holds it, else send its same
        bytes again, or raise :class:`_NonceTakenError` if its nonce went to another transaction."""
        if self._known(tx.tx_hash):
            return
        mined = int(self.client.w3.eth.get_transaction_count(self.account.address, "latest"))
        if mined > tx.nonce:
            if self._receipt(tx.tx_hash) is None:  # not mined between the two calls either
                raise _NonceTakenError()
            return
        log.warning(
            "%s: tx %s (nonce %d) is gone from the node's pool; broadcasting the same bytes again",
            fn_name,
            tx.tx_hash,
            tx.nonce,
        )
        try:
            self.client.w3.eth.send_raw_transaction(tx.raw)
        except Web3RPCError as exc:
            message = rpc_error_message(exc)
            if is_transient(exc) or is_already_known(message) or is_nonce_too_low(message):
                return  # the next poll settles it
            raise ChainError(f"{fn_name}: re-broadcast of {tx.tx_hash} refused: {message}") from exc
