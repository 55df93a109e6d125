"""The scheduler's transactions with the operator key: assign (with the provider's acceptance),
unassign, settle, relay, release, finalize.

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
- **EIP-1559 fees under a cap** (:class:`FeePolicy`): ``maxFeePerGas`` = base fee x multiplier +
  tip, never above ``max_fee_per_gas``; when the base fee alone is above the cap nothing is sent
  (:class:`FeeCapExceededError`, retried later). A transaction not mined within
  ``replace_after_s`` is **replaced**: the same nonce, the same call, both fees raised by at least
  12.5% (what nodes require of a replacement); only one of the versions can be mined.
- **A restart with transactions in flight**: before its first nonce, the sender waits for the
  account's pending transactions (found in the node's pool), replacing them if they are stuck,
  so a restarted scheduler never queues new work behind, or duplicates, what it sent before.
- **What it spends** is counted in :data:`REGISTRY` (Prometheus): gas, fees in wei,
  replacements, stuck transactions, fee-cap refusals, transactions in flight.

Around it: the fee policy in :mod:`scheduler.chain.fees`, the nonce sequence in
:mod:`scheduler.chain.nonces`, the pool read of a restart in :mod:`scheduler.chain.in_flight`,
the retry loop in :mod:`gridmarket.retry`, the counters in :mod:`scheduler.chain.tx_metrics`.
This module stays long (~680 lines) because what is left is one thing: :class:`TxSender`'s
send -> broadcast -> await -> replace cycle, whose steps share the nonce lock, the in-flight
count and the versions of one nonce; cut apart, each half would need the other's state.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

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
from gridmarket.escrow import JobState, assign_target, fold_events
from gridmarket.retry import (
    ChainUnavailableError,
    Deadline,
    RetryPolicy,
    Throttle,
    describe,
    is_transient,
    retrying,
)
from scheduler.chain import tx_metrics as metrics
from scheduler.chain.fees import (
    FeeCapExceededError,
    FeePolicy,
    bumped,
    price,
    replacement_price,
)
from scheduler.chain.in_flight import adopted, pool_of
from scheduler.chain.nonces import Broadcast, sequence_for
from scheduler.chain.tx_metrics import REGISTRY

__all__ = [
    "BATCH_MAX_CALLS",
    "BATCH_MAX_GAS",
    "EFFECTS",
    "REGISTRY",
    "Call",
    "FeeCapExceededError",
    "FeePolicy",
    "TxOutcomeUnknownError",
    "TxSender",
    "apply_sent",
    "bumped",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

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


BATCH_MAX_CALLS = 64
"""The outbox's default bound on calls per ``multicall`` transaction (``send_many``;
``OUTBOX_BATCH_CALLS``). 16 mined 8.5 rows a second at 100,000 jobs on anvil, where each block
costs about a second whatever it holds (docs/benchmarks.md, 2026-11-28 fifth session)."""
_TRY_OVERHEAD_GAS = 20_000
"""Gas added to a ``tryMulticall`` over the estimate of its calls: its ``bool[]`` and loop."""
BATCH_MAX_GAS = 8_000_000
"""The outbox's default bound on the summed gas estimates of one batch (``OUTBOX_BATCH_GAS``;
about a quarter of a 30M block: 64 settles, the dearest step, estimate under it)."""


EFFECTS = {
    "assign": "JobAssigned",
    "unassign": "JobUnassigned",
    "settle": "JobReleased",
    "release": "JobReleased",
    "finalize": "JobReleased",
    "submitResultFor": "ResultSubmitted",
    "resolve": "Resolved",
}
"""The event each batchable operator call emits for its job (``Resolved``: for its group)
when it takes effect: what tells, in a ``tryMulticall`` receipt, which calls were skipped."""


@dataclass(frozen=True)
class Call:
    """One escrow call of the operator: ``fn_name(*args)`` (a job step, for a batch).
    ``subject``: the id (a job's, or a group's for ``resolve``) whose :data:`EFFECTS` event
    shows the call took effect; None: the call is never batched (nothing would tell)."""

    fn_name: str
    args: tuple[Any, ...]
    subject: bytes | None = None

    @classmethod
    def job(cls, fn_name: str, state: JobState, *extra: Any) -> Call:
        """``fn_name(jobId, job, *extra)`` for the job ``state`` describes."""
        return cls(fn_name, (state.job_id, state.job.as_tuple(), *extra), state.job_id)

    @classmethod
    def assign(cls, state: JobState, provider: str, hold_for: int, acceptance: bytes) -> Call:
        """``assign(id, seat, job, provider, holdFor, acceptance)`` of the job (or seat:
        :func:`gridmarket.escrow.assign_target`) ``state`` describes."""
        target, seat = assign_target(state)
        args = (target, seat, state.job.as_tuple(), provider, hold_for, acceptance)
        return cls("assign", args, state.job_id)

    @classmethod
    def resolve(cls, group_id: bytes, seats: Sequence[JobState]) -> Call:
        """``resolve(groupId, seats)`` (the seats in seat order)."""
        return cls("resolve", (group_id, [s.job.as_tuple() for s in seats]), group_id)

    @property
    def batchable(self) -> bool:
        """Whether a batch's receipt can tell if this call took effect."""
        return self.subject is not None and self.fn_name in EFFECTS

    def took_effect(self, sent: Sent) -> bool:
        """Whether the mined batch ``sent`` holds this call's :data:`EFFECTS` event."""
        name = EFFECTS[self.fn_name]
        key = "groupId" if name == "Resolved" else "jobId"
        return any(
            e.name == name and bytes(e.args.get(key, b"")) == self.subject for e in sent.events
        )


def _chunks(ready: list[tuple[int, int]], max_calls: int, max_gas: int) -> Iterator[list[int]]:
    """Indexes of ``ready`` calls, in order, in groups of at most ``max_calls`` whose gas adds up
    to at most ``max_gas`` (a call above ``max_gas`` alone goes in a group of its own)."""
    group: list[int] = []
    gas = 0
    for i, g in ready:
        if group and (len(group) >= max_calls or gas + g > max_gas):
            yield group
            group, gas = [], 0
        group.append(i)
        gas += g
    if group:
        yield group


def apply_sent(state: JobState, sent: Sent) -> JobState:
    """``state`` after the transaction ``sent``: its job events folded in chain order.

    Events of other jobs in the same transaction are ignored. Raises
    :class:`gridmarket.escrow.EventOrderError` if ``state`` was not the job's state before.
    """
    in_order = sorted(sent.events, key=lambda e: e.log_index)
    return fold_events(state, in_order)


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
        fees: FeePolicy | None = None,
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
        self.fees = fees or FeePolicy()
        metrics.CAP.set(self.fees.max_fee_per_gas)
        self._seq = sequence_for(client, operator.address)

    @property
    def address(self) -> str:
        """The operator's address."""
        return str(self.account.address)

    # ------------------------------------------------------------------ job transitions
    def assign(self, state: JobState, provider: str, hold_for: int, acceptance: bytes) -> Sent:
        """Assign a Funded job (or seat) to ``provider``, or reassign an Assigned one (attempt
        + 1, only once its hold is over: ``max(since + reassignDelay, holdUntil)``), with the
        provider's EIP-712 ``acceptance`` of that attempt, the job's terms and ``hold_for``."""
        call = Call.assign(state, provider, hold_for, acceptance)
        return self.send(call.fn_name, *call.args)

    def unassign(self, state: JobState) -> Sent:
        """Take an Assigned job back (lease lost, result refused): it is Funded again. The
        escrow allows it only once the hold is over, ``max(since + reassignDelay, holdUntil)``
        (``JobEscrowTooEarly``)."""
        return self.send_job("unassign", state)

    def settle(self, state: JobState, output_cid: str, signature: bytes) -> Sent:
        """Relay the assigned provider's signed result and pay it in one transaction."""
        return self.send_job("settle", state, output_cid, signature)

    def submit_result_for(self, state: JobState, output_cid: str, signature: bytes) -> Sent:
        """Relay the assigned provider's signed result without paying (challenge window runs)."""
        return self.send_job("submitResultFor", state, output_cid, signature)

    def release(self, state: JobState) -> Sent:
        """Pay a Submitted result of an on-verify job (the operator's own check)."""
        return self.send_job("release", state)

    def finalize(self, state: JobState) -> Sent:
        """Pay a Submitted result nobody objected to once the challenge window has passed (or a
        Disputed one the mediator left unruled for ``mediationWindow``); anyone may."""
        return self.send_job("finalize", state)

    def resolve(self, group_id: bytes, seats: Sequence[JobState]) -> Sent:
        """Resolve a replicated job's seats (given in seat order); anyone may."""
        return self.send("resolve", group_id, [s.job.as_tuple() for s in seats])

    def send_job(self, fn_name: str, state: JobState, *extra: Any) -> Sent:
        """``fn_name(jobId, job, *extra)`` for the job ``state`` describes."""
        return self.send(fn_name, state.job_id, state.job.as_tuple(), *extra)

    # ------------------------------------------------------------------ any call
    def send(
        self,
        fn_name: str,
        *args: Any,
        value: int = 0,
        prepared: TxParams | None = None,
        estimate: Callable[[], TxParams] | None = None,
    ) -> Sent:
        """Send ``fn_name(*args)`` from the operator key and wait for it to be mined.
        ``prepared``: its transaction as :meth:`EscrowClient.prepare` just built it (gas
        estimated), used for the first try instead of estimating again; ``estimate``: what
        builds the transaction instead of :meth:`EscrowClient.prepare` (a ``tryMulticall``'s
        gas comes from its calls' estimates)."""
        build = estimate or (lambda: self.client.prepare(self.account, fn_name, *args, value=value))
        deadline = Deadline(self.retry.deadline_s)
        self._settle_in_flight(fn_name)
        for rebuild in range(_MAX_REBUILDS + 1):
            params = (
                prepared
                if prepared is not None and rebuild == 0
                else self._retrying(f"{fn_name}: estimate", deadline, build)
            )
            fees = self._fees(fn_name, deadline)
            sent = self._broadcast(fn_name, params, fees, deadline)
            metrics.SENT.labels(fn_name).inc()
            try:
                receipt = self._await_receipt(fn_name, sent, params)
            except _NonceTakenError:
                self._settled()
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
            except BaseException:
                self._settled()
                raise
            self._settled()
            self._count_mined(fn_name, receipt)
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

    def send_many(
        self,
        calls: Sequence[Call],
        *,
        max_calls: int = BATCH_MAX_CALLS,
        max_gas: int = BATCH_MAX_GAS,
    ) -> list[Sent | ChainError]:
        """Send ``calls`` (operator calls of different jobs, independent of each other) in as
        few transactions as the bounds allow: ``tryMulticall`` batches of at most ``max_calls``
        calls whose estimates add up to at most ``max_gas``; one call alone (or one that is not
        :attr:`Call.batchable`) is sent as itself.

        Returns one outcome per call, in order: the mined transaction that carried it (the
        same :class:`Sent` for every call of a batch; fold it with :func:`apply_sent`), or the
        :class:`ChainError` that refused it (``reason`` set for a revert), exactly what
        :meth:`send` would have raised for that call alone. Transient failures
        (:class:`ChainUnavailableError`, :class:`TxOutcomeUnknownError`) are raised, as by
        :meth:`send`; a batch is one nonce, so a restart with one in flight finds it in the
        pool and settles it before any preflight (steps it made are then refused by their
        estimates: ``JobEscrowJobMismatch``), and nothing is sent twice.

        The calls are first taken ``max_calls`` at a time and each group estimated as a strict
        ``multicall`` (it reverts if any call would): when that passes (the usual case) the
        group is sent as ``tryMulticall`` with that gas, one estimate for the batch instead of
        one per call (the preflights were 5% of a scheduler's CPU under claims, issue 12); the
        calls of a group that would revert or exceed ``max_gas`` are preflighted one by one, and
        those that pass go out in ``tryMulticall`` batches (their estimates summed for gas).
        A call that would revert on the latest state never goes out in a batch.

        A call may still fail once mined: someone else took the step between the estimate and
        the block (the provider posted its own result, anyone finalized), or two calls that pass
        alone do not together (one provider's collateral for two assigns). ``tryMulticall``
        skips it instead of reverting the batch, so the other calls land. Which calls were
        skipped is read from the receipt's events (:meth:`Call.took_effect`), not from the
        ``bool[]`` it returns: a receipt carries no return data, and an ``eth_call`` before
        sending only predicts the state of a later block, while the events are what was mined.
        A skipped call is then handled as a single send: :meth:`send` estimates it first, so it
        is answered with the revert that refuses it now (nothing sent: the outbox resolves the
        row from the chain, ``isCurrent`` and the watcher's events, as for any refusal) or, when
        it passes again, sent alone once; never batched again by this call.

        ``tryMulticall``'s own gas estimate is not used: a node's estimate searches for the
        least gas the transaction succeeds with, and with every inner call allowed to fail for
        lack of gas that is the gas of skipping them all.
        """
        if max_calls < 1 or max_gas < 1:
            raise ValueError(f"max_calls and max_gas must be >= 1, got {max_calls}, {max_gas}")
        if len(calls) <= 1 or max_calls == 1:
            return [self._one(call) for call in calls]
        self._settle_in_flight("tryMulticall")
        out: list[Sent | ChainError | None] = [None] * len(calls)
        batchable = [i for i, call in enumerate(calls) if call.batchable]
        for i, call in enumerate(calls):
            if not call.batchable:
                out[i] = self._one(call)
        each: list[int] = []  # the calls to preflight one by one
        for start in range(0, len(batchable), max_calls):
            chunk = batchable[start : start + max_calls]
            whole = self._whole([calls[i] for i in chunk], max_gas) if len(chunk) > 1 else None
            if whole is None:
                each.extend(chunk)
                continue
            self._settle_batch(calls, chunk, whole, out)
        ready: list[tuple[int, int]] = []  # (index, estimated gas) of calls that pass alone
        deadline = Deadline(self.retry.deadline_s)
        for i in each:
            call = calls[i]
            try:
                params = self._retrying(
                    f"{call.fn_name}: preflight",
                    deadline,
                    functools.partial(self.client.prepare, self.account, call.fn_name, *call.args),
                )
            except (ChainUnavailableError, TxOutcomeUnknownError):
                raise
            except ChainError as exc:
                out[i] = exc
                continue
            ready.append((i, int(params.get("gas", 0))))
        gas_of = dict(ready)
        for chunk in _chunks(ready, max_calls, max_gas):
            if len(chunk) == 1:
                out[chunk[0]] = self._one(calls[chunk[0]])
                continue
            data = [self.client.encode(calls[i].fn_name, *calls[i].args) for i in chunk]
            # each estimate counts a transaction's 21,000 intrinsic gas: their sum covers the
            # batch's delegatecalls with room to spare
            gas = sum(gas_of[i] for i in chunk) + _TRY_OVERHEAD_GAS
            try:
                sent = self._send_try(data, gas)
            except (ChainUnavailableError, TxOutcomeUnknownError):
                raise
            except ChainError as exc:
                log.warning(
                    "tryMulticall of %d calls reverted (%s); sending them one by one",
                    len(chunk),
                    exc.reason or exc,
                )
                metrics.BATCH_FALLBACKS.inc()
                for i in chunk:
                    out[i] = self._one(calls[i])
                continue
            self._settle_batch(calls, chunk, sent, out)
        assert all(o is not None for o in out)
        return cast(list[Sent | ChainError], out)

    def _settle_batch(
        self,
        calls: Sequence[Call],
        chunk: Sequence[int],
        sent: Sent,
        out: list[Sent | ChainError | None],
    ) -> None:
        """The outcome of each call of ``chunk``, mined together in ``sent``: that transaction
        for the calls whose events it holds; a single send for each one it skipped."""
        skipped = [i for i in chunk if not calls[i].took_effect(sent)]
        metrics.BATCHED.inc(len(chunk) - len(skipped))
        for i in chunk:
            out[i] = sent
        if skipped:
            log.info(
                "tryMulticall %s skipped %d of its %d calls (%s): settling them one by one",
                sent.tx_hash,
                len(skipped),
                len(chunk),
                ", ".join(calls[i].fn_name for i in skipped),
            )
            metrics.BATCH_SKIPPED.inc(len(skipped))
        for i in skipped:
            out[i] = self._one(calls[i])

    def _send_try(self, data: list[bytes], gas: int) -> Sent:
        """``tryMulticall(data)`` with ``gas``, never estimated as itself (see
        :meth:`send_many`)."""
        params: TxParams = {
            "from": self.account.address,
            "to": cast(Any, self.client.address),
            "value": cast(Any, 0),
            "data": self.client.encode("tryMulticall", data),
            "gas": cast(Any, gas),
        }
        return self.send("tryMulticall", data, prepared=params, estimate=lambda: params)

    def _whole(self, calls: Sequence[Call], max_gas: int) -> Sent | None:
        """``calls`` sent as one ``tryMulticall`` if their strict ``multicall`` estimate passes
        within ``max_gas``; None when it would revert or is over ``max_gas`` (the caller then
        preflights each call). Transient failures are raised."""
        data = [self.client.encode(call.fn_name, *call.args) for call in calls]
        try:
            params = self._retrying(
                "multicall: preflight",
                Deadline(self.retry.deadline_s),
                functools.partial(self.client.prepare, self.account, "multicall", data),
            )
        except (ChainUnavailableError, TxOutcomeUnknownError):
            raise
        except ChainError as exc:
            log.info("multicall of %d calls refused whole (%s): preflighting each", len(calls), exc)
            return None
        gas = int(params.get("gas", 0))
        if gas > max_gas:
            return None
        try:
            return self._send_try(data, gas + _TRY_OVERHEAD_GAS)
        except (ChainUnavailableError, TxOutcomeUnknownError):
            raise
        except ChainError as exc:
            log.info("tryMulticall of %d calls reverted (%s): preflighting each", len(calls), exc)
            return None

    def _one(self, call: Call) -> Sent | ChainError:
        """``call`` sent alone: the mined transaction, or the error that refused it."""
        try:
            return self.send(call.fn_name, *call.args)
        except (ChainUnavailableError, TxOutcomeUnknownError):
            raise
        except ChainError as exc:
            return exc

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
    def _settle_in_flight(self, fn_name: str) -> None:
        if self._seq.waiting == 0:
            # Nothing of ours in flight, yet the account may have pending transactions: an
            # earlier process's (a restart), or ours given up on (TxOutcomeUnknownError). They
            # are settled before anything is estimated, so a step already sent is seen on-chain
            # (and refused by the estimate) instead of being sent again behind it.
            with self._seq.lock:
                if self._seq.waiting == 0:
                    self._adopt_in_flight(fn_name)

    def _retrying(self, what: str, deadline: Deadline, fn: Callable[[], T]) -> T:
        return retrying(self.retry, what, deadline, fn)

    def _fees(self, fn_name: str, deadline: Deadline) -> tuple[int, int]:
        """``(maxFeePerGas, maxPriorityFeePerGas)`` for a transaction now, within the cap.

        Raises :class:`FeeCapExceededError` when the latest base fee alone exceeds the cap."""
        policy = self.fees
        w3 = self.client.w3
        block = self._retrying(f"{fn_name}: base fee", deadline, lambda: w3.eth.get_block("latest"))
        base = int(block.get("baseFeePerGas") or 0)
        tip = policy.priority_fee
        if tip is None:
            tip = self._retrying(
                f"{fn_name}: priority fee", deadline, lambda: int(w3.eth.max_priority_fee)
            )
        return price(policy, fn_name, base, tip)

    def _count_mined(self, fn_name: str, receipt: TxReceipt) -> None:
        gas = int(receipt["gasUsed"])
        price = int(receipt.get("effectiveGasPrice") or 0)
        metrics.MINED.labels(fn_name, "ok" if receipt["status"] == 1 else "reverted").inc()
        metrics.GAS.inc(gas)
        metrics.FEES.inc(gas * price)

    def _broadcast(
        self, fn_name: str, params: TxParams, fees: tuple[int, int], deadline: Deadline
    ) -> Broadcast:
        """Choose a nonce, sign, and have the node accept the transaction, under the lock.

        On any failure the cached nonce is dropped, so the next send reads the node's 'pending'
        count, which tells whether a transaction whose fate was unknown took its nonce.
        """
        with self._seq.lock:
            try:
                tx = self._broadcast_locked(fn_name, params, fees, deadline)
            except BaseException:
                self._seq.next = None
                raise
            self._seq.next = tx.nonce + 1
            with self._seq.count_lock:
                self._seq.waiting += 1
            return tx

    def _settled(self) -> None:
        """One of this process's transactions is no longer awaited."""
        with self._seq.count_lock:
            self._seq.waiting -= 1

    def _pending_nonce(self, fn_name: str, deadline: Deadline) -> int:
        return self._retrying(
            f"{fn_name}: nonce",
            deadline,
            lambda: int(self.client.w3.eth.get_transaction_count(self.account.address, "pending")),
        )

    def _broadcast_locked(
        self, fn_name: str, params: TxParams, fees: tuple[int, int], deadline: Deadline
    ) -> Broadcast:
        nonce = self._seq.next
        if nonce is None:
            nonce = self._pending_nonce(fn_name, deadline)
        tx = self._sign(params, nonce, fees)
        delays = self.retry.delays()
        throttle = Throttle()
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
                tx = self._sign(params, fresh, fees)
                outcome_unknown = False
            except Exception as exc:
                if not is_transient(exc):
                    raise
                outcome_unknown = True  # it may have reached the node before the failure
                time.sleep(self._backoff_or_give_up(fn_name, tx, exc, delays, deadline, throttle))

    def _sign(self, params: TxParams, nonce: int, fees: tuple[int, int]) -> Broadcast:
        """An EIP-1559 (type 2) transaction of ``params`` with ``nonce`` and ``fees``."""
        max_fee, tip = fees
        tx: dict[str, Any] = {
            **params,
            "type": 2,
            "maxFeePerGas": max_fee,
            "maxPriorityFeePerGas": tip,
            "nonce": nonce,
            "chainId": self.client.deployment.chain_id,
        }
        tx.pop("from", None)
        tx.pop("gasPrice", None)
        signed = self.account.sign_transaction(cast(Any, tx))
        metrics.MAX_FEE.set(max_fee)
        return Broadcast(
            "0x" + bytes(signed.hash).hex(), nonce, bytes(signed.raw_transaction), max_fee, tip
        )

    def _try_broadcast(self, fn_name: str, tx: Broadcast, outcome_unknown: bool) -> None:
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
        tx: Broadcast,
        exc: Exception,
        delays: Iterator[float],
        deadline: Deadline,
        throttle: Throttle,
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

    def _await_receipt(self, fn_name: str, tx: Broadcast, params: TxParams | None) -> TxReceipt:
        """Poll for the receipt of an accepted transaction; re-broadcast it if it was dropped,
        replace it with higher fees (same nonce) if it is not mined within ``replace_after_s``
        (``params`` None: never replace).

        Raises :class:`_NonceTakenError` if the transaction vanished and its nonce was consumed by
        another one, and :class:`TxOutcomeUnknownError` after ``receipt_timeout_s``.
        """
        deadline = Deadline(self.receipt_timeout_s)
        poll = self.receipt_poll_s
        last_check = time.monotonic()
        failures = 0
        throttle = Throttle()
        versions = [tx]  # every signed version of this nonce; at most one can be mined
        stuck_counted = False
        metrics.IN_FLIGHT.inc()
        try:
            while True:
                try:
                    for version in reversed(versions):
                        receipt = self._receipt(version.tx_hash)
                        if receipt is not None:
                            if len(versions) > 1:
                                log.info(
                                    "%s: nonce %d mined as %s (version %d of %d)",
                                    fn_name,
                                    tx.nonce,
                                    version.tx_hash,
                                    versions.index(version) + 1,
                                    len(versions),
                                )
                            return receipt
                    latest = versions[-1]
                    if time.monotonic() - latest.sent_at >= self.fees.replace_after_s:
                        if not stuck_counted:
                            metrics.STUCK.inc()
                            stuck_counted = True
                        if params is not None:
                            new = self._replace(fn_name, params, latest)
                            if new.tx_hash == latest.tx_hash:  # at the cap: wait again
                                versions[-1] = new
                            else:
                                versions.append(new)
                            last_check = time.monotonic()
                    if failures or time.monotonic() - last_check >= self.pool_check_s:
                        # Not mined yet, and a while passed (or the node was away: it may have
                        # restarted with an empty pool): make sure it still holds the transaction.
                        last_check = time.monotonic()
                        self._recheck(fn_name, versions)
                    if failures:
                        log.warning(
                            "%s: RPC answered again after %.1fs and %d failed polls",
                            fn_name,
                            throttle.elapsed,
                            failures,
                        )
                        failures, throttle = 0, Throttle()
                except Exception as exc:
                    if not is_transient(exc):
                        raise
                    failures += 1
                    if throttle.failed():
                        log.warning(
                            "%s: waiting for tx %s: RPC failing for %.1fs (%d polls): %s",
                            fn_name,
                            versions[-1].tx_hash,
                            throttle.elapsed,
                            throttle.failures,
                            describe(exc),
                        )
                if deadline.expired:
                    raise TxOutcomeUnknownError(
                        f"{fn_name}: tx {versions[-1].tx_hash} (nonce {tx.nonce}) not mined within "
                        f"{self.receipt_timeout_s:.1f}s",
                        versions[-1].tx_hash,
                        tx.nonce,
                    )
                time.sleep(min(poll, deadline.remaining))
                poll = min(poll * 1.5, 1.0) if not failures else min(max(poll, 0.25) * 2, 5.0)
        finally:
            metrics.IN_FLIGHT.dec()

    def _replace(self, fn_name: str, params: TxParams, old: Broadcast) -> Broadcast:
        """A replacement of ``old``: same nonce and call, both fees bumped (and at least what the
        chain asks now), capped. At the cap the old version stays, and waits: that is logged and
        counted, and its wait starts again."""
        deadline = Deadline(self.retry.deadline_s)
        try:
            asked_max, asked_tip = self._fees(fn_name, deadline)
        except FeeCapExceededError:
            asked_max, asked_tip = 0, 0
        fees = replacement_price(self.fees, (old.max_fee, old.tip), (asked_max, asked_tip))
        if fees is None:
            log.warning(
                "%s: tx %s (nonce %d) not mined after %.0fs at maxFeePerGas %d; a replacement "
                "needs %d, above the cap max_fee_per_gas=%d: waiting at the cap",
                fn_name,
                old.tx_hash,
                old.nonce,
                time.monotonic() - old.sent_at,
                old.max_fee,
                bumped(old.max_fee),
                self.fees.max_fee_per_gas,
            )
            return replace(old, sent_at=time.monotonic())
        max_fee, tip = fees
        new = self._sign(params, old.nonce, fees)
        log.warning(
            "%s: tx %s (nonce %d) not mined after %.0fs; replacing it with %s: maxFeePerGas "
            "%d -> %d, tip %d -> %d",
            fn_name,
            old.tx_hash,
            old.nonce,
            time.monotonic() - old.sent_at,
            new.tx_hash,
            old.max_fee,
            max_fee,
            old.tip,
            tip,
        )
        try:
            self.client.w3.eth.send_raw_transaction(new.raw)
        except Web3RPCError as exc:
            message = rpc_error_message(exc)
            if is_transient(exc) or is_already_known(message) or is_nonce_too_low(message):
                # an old version was mined meanwhile, or the pool wants more: the next poll
                # settles it, and the next replacement starts from these fees
                log.info("%s: replacement %s not taken: %s", fn_name, new.tx_hash, message)
                return new
            raise ChainError(f"{fn_name}: replacement of {old.tx_hash} refused: {message}") from exc
        metrics.REPLACED.inc()
        return new

    def _adopt_in_flight(self, fn_name: str) -> None:
        """Settle the account's transactions still pending from before (an earlier process):
        wait for each to be mined, replacing it when stuck, before any new nonce is used.

        They are found in the node's pool (``txpool_content``: anvil, geth, reth, erigon). A node
        without that method is waited on until its pending count is mined, without replacing.
        """
        w3 = self.client.w3
        address = self.account.address
        deadline = Deadline(self.retry.deadline_s)

        def count(block: str) -> int:
            return self._retrying(
                f"{fn_name}: in-flight check",
                deadline,
                lambda: int(w3.eth.get_transaction_count(address, cast(Any, block))),
            )

        mined = count("latest")
        pending = count("pending")
        if pending <= mined:
            return
        log.warning(
            "%s: %d transaction(s) of %s still pending from before (nonces %d..%d): settling "
            "them before sending",
            fn_name,
            pending - mined,
            address,
            mined,
            pending - 1,
        )
        pool = self._retrying(f"{fn_name}: txpool", deadline, lambda: pool_of(w3, address))
        for nonce in range(mined, pending):
            found = pool.get(nonce)
            if found is None:
                continue
            old, params = adopted(found, nonce, address)
            try:
                receipt = self._await_receipt(f"{fn_name} (in flight, nonce {nonce})", old, params)
            except _NonceTakenError:
                continue  # another transaction took the nonce: nothing of ours to wait for
            self._count_mined("in_flight", receipt)
        deadline = Deadline(self.receipt_timeout_s)
        while count("latest") < pending:
            if deadline.expired:
                raise TxOutcomeUnknownError(
                    f"{fn_name}: transactions of {address} up to nonce {pending - 1} are still "
                    f"pending after {self.receipt_timeout_s:.0f}s",
                    "",
                    pending - 1,
                )
            time.sleep(min(0.5, deadline.remaining))

    def _receipt(self, tx_hash: str) -> TxReceipt | None:
        try:
            return self.client.w3.eth.get_transaction_receipt(HexBytes(tx_hash))
        except TransactionNotFound:
            return None

    def _recheck(self, fn_name: str, versions: list[Broadcast]) -> None:
        """A nonce still unmined: make sure the node still holds one of its versions, else send
        the newest version's bytes again, or raise :class:`_NonceTakenError` if the nonce went to
        another transaction."""
        tx = versions[-1]
        if any(self._known(v.tx_hash) for v in reversed(versions)):
            return
        mined = int(self.client.w3.eth.get_transaction_count(self.account.address, "latest"))
        if mined > tx.nonce:
            if all(self._receipt(v.tx_hash) is None for v in versions):
                raise _NonceTakenError()  # not mined between the two calls either
            return
        if not tx.raw:
            return  # adopted from the pool: its bytes are unknown; the pool count decides
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
