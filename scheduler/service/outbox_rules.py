"""What the outbox sends for each kind of row, and what a refused transaction undoes.

A row is written by the store in the same transaction as the state change that needs it:

- ``assign`` when the node accepts its offer (the payload carries its signed acceptance);
- ``settle`` / ``release`` with a good verdict on an on-verify job (paid at once);
- ``relay`` with a good verdict on any other job (``submitResultFor``); once it is mined the
  rule writes ``finalize``, due when the challenge window has passed;
- ``finalize`` directly for a good result the provider posted on-chain itself;
- ``unassign`` when a lease the node had accepted ends without a paid result (lost, failed,
  refused by our check, handed back, attempts used up).

Each rule reads the job's on-chain struct first, so a retry after an unknown outcome does not
send twice, and a step someone else already took (the provider submitted or handed back itself,
the submitter released) is not sent again.

The escrow refuses some steps only *for now*: the operator's ``unassign`` and reassign before
``reassignDelay`` (``JobEscrowTooEarly``) and ``finalize`` before the window closes
(``JobEscrowChallengeWindowOpen``). Those raise :class:`NotYetError` with the chain time they
become possible; the outbox waits for it (the row and its job's later rows), it is not a
refusal.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import NoReturn

from gridmarket.chain import ChainError
from gridmarket.escrow import Status
from scheduler.chain import TxSender
from scheduler.store import OutboxItem, Store

__all__ = ["NotYetError", "OutboxRules", "not_yet"]

log = logging.getLogger(__name__)

_TOO_EARLY = re.compile(
    r"(JobEscrowTooEarly|JobEscrowChallengeWindowOpen|JobEscrowNoMajority)\(.*?"
    r"(?:allowedAt|claimableAt|resolvableAt)=(\d+)"
)
_SEATS_PENDING = re.compile(r"JobEscrowSeatsPending\(.*?deadline=(\d+)")


class NotYetError(ChainError):
    """The escrow refuses this step until chain time :attr:`at`: wait, do not give up."""

    def __init__(self, message: str, at: float, reason: str | None = None) -> None:
        super().__init__(message, reason)
        self.at = at


def not_yet(exc: ChainError) -> NotYetError | None:
    """``exc`` as a :class:`NotYetError` when it is a "too early" revert, else None."""
    text = exc.reason or str(exc)
    match = _TOO_EARLY.search(text)
    if match is not None:
        return NotYetError(str(exc), float(match.group(2)), exc.reason)
    pending = _SEATS_PENDING.search(text)
    if pending is not None:  # a seat may still deliver until its deadline
        return NotYetError(str(exc), float(pending.group(1)) + 1, exc.reason)
    return None


class OutboxRules:
    """Sends one outbox row (:meth:`send`); undoes what a refused one needed (:meth:`refused`)."""

    def __init__(self, store: Store, count: Callable[[str], None]) -> None:
        self.store = store
        self.count = count
        self._window: int | None = None
        self._rules: dict[str, Callable[[TxSender, OutboxItem], str | None]] = {
            "assign": self._assign,
            "settle": self._settle,
            "release": self._release,
            "relay": self._relay,
            "finalize": self._finalize,
            "unassign": self._unassign,
            "resolve": self._resolve,
        }

    def send(self, sender: TxSender, item: OutboxItem) -> None:
        """Send ``item`` (or nothing, when the chain already has it) and mark it done.
        A refusal raises :class:`ChainError` and leaves the row to the caller; a step the
        escrow takes only later raises :class:`NotYetError`."""
        rule = self._rules.get(item.kind)
        if rule is None:
            raise ChainError(f"unknown outbox kind {item.kind}", "UnknownKind")
        try:
            tx = rule(sender, item)
        except NotYetError:
            raise
        except ChainError as exc:
            later = not_yet(exc)
            if later is not None:
                raise later from exc
            raise
        self.store.outbox_finish(item.id, status="done", tx_hash=tx)

    def refused(self, item: OutboxItem, reason: str) -> None:
        """The chain refused ``item`` for good: a refused assign ends that lease (the job may go
        to another node); a refused unassign leaves the job as it is (the chain holds it for
        the provider until it hands it back, submits, or the deadline refunds it); any other
        refused step gives the job up."""
        if item.kind == "assign":
            self.store.assign_failed(item.job_id, int(item.payload["attempt"]), reason)
        elif item.kind == "unassign":
            log.warning("job %s: unassign refused: %s", item.job_id, reason)
        elif item.kind == "resolve":
            # the seats stay as the chain has them: anyone may resolve the group later, and the
            # watcher folds it whoever does
            log.warning("job %s: resolve refused: %s", item.job_id, reason)
        else:
            self.store.fail_job(item.job_id, f"{item.kind} refused on-chain: {reason}")

    def challenge_window(self, sender: TxSender) -> int:
        """The escrow's ``challengeWindow`` (immutable: read once)."""
        if self._window is None:
            self._window = int(sender.client.call("challengeWindow"))
        return self._window

    # ------------------------------------------------------------------ per kind
    def _assign(self, sender: TxSender, item: OutboxItem) -> str | None:
        row = self.store.job(item.job_id)
        state = row.chain
        p = item.payload
        if row.node_id != p.get("node_id", row.node_id) or row.attempt != p["attempt"]:
            # the lease this acceptance was for ended before it went on-chain
            log.info(
                "job %s: attempt %s no longer leased; not assigning", item.job_id, p["attempt"]
            )
            return None
        if state.job.attempt >= p["attempt"]:
            return None  # already on-chain (a retry after an unknown outcome)
        if state.status not in (Status.FUNDED, Status.ASSIGNED):
            raise ChainError(f"job is {state.status.name}", f"JobStatus({state.status.name})")
        sent = sender.assign(state, p["provider"], bytes.fromhex(p["acceptance"][2:]))
        self.store.apply_sent(item.job_id, sent.events)
        return sent.tx_hash

    def _settle(self, sender: TxSender, item: OutboxItem) -> str | None:
        state = self.store.job(item.job_id).chain
        p = item.payload
        tx: str | None = None
        if state.status is Status.SUBMITTED:  # the provider submitted it on-chain meanwhile
            sent = sender.release(state)
            self.store.apply_sent(item.job_id, sent.events)
            tx = sent.tx_hash
        elif state.status is not Status.RELEASED:
            try:
                sent = sender.settle(state, p["output_cid"], bytes.fromhex(p["signature"][2:]))
            except ChainError as exc:
                self._moved_on(item, state.status, exc)
            self.store.apply_sent(item.job_id, sent.events)
            tx = sent.tx_hash
        self._paid(item, tx)
        return tx

    def _moved_on(self, item: OutboxItem, used: Status, exc: ChainError) -> NoReturn:
        """A step refused because the job is no longer Assigned on-chain as the rule read it:
        the provider posted its result itself while our ``settle`` or relay was in flight. The
        row is retried once the watcher has folded what the chain has (``NotYetError`` at
        once: the next pass reads the new status, e.g. Submitted, and releases or waits for
        the window), instead of failing the job; any other refusal is raised as it is."""
        if used is Status.ASSIGNED and "JobEscrowWrongStatus" in (exc.reason or str(exc)):
            raise NotYetError(
                f"the job moved on-chain while {item.kind} was in flight: {exc}", 0.0, exc.reason
            ) from exc
        raise exc

    def _release(self, sender: TxSender, item: OutboxItem) -> str | None:
        state = self.store.job(item.job_id).chain
        tx: str | None = None
        if state.status is Status.SUBMITTED:
            sent = sender.release(state)
            self.store.apply_sent(item.job_id, sent.events)
            tx = sent.tx_hash
        self._paid(item, tx)
        return tx

    def _relay(self, sender: TxSender, item: OutboxItem) -> str | None:
        """``submitResultFor``; then ``finalize`` is due at ``since + challengeWindow``."""
        state = self.store.job(item.job_id).chain
        p = item.payload
        tx: str | None = None
        if state.status is Status.ASSIGNED:
            try:
                sent = sender.submit_result_for(
                    state, p["output_cid"], bytes.fromhex(p["signature"][2:])
                )
            except ChainError as exc:
                self._moved_on(item, state.status, exc)
            self.store.apply_sent(item.job_id, sent.events)
            tx = sent.tx_hash
            state = self.store.job(item.job_id).chain
        if state.status is Status.SUBMITTED and state.job.replicas:
            self.store.seat_relayed(item.job_id)
            self.count("results_relayed")
        elif state.status is Status.SUBMITTED:
            self.store.relayed(item.job_id, state.job.since + self.challenge_window(sender))
            self.count("results_relayed")
        elif state.status not in (Status.DISPUTED, Status.RELEASED):
            # not assigned to the provider whose result this is (its assign never went on-chain)
            raise ChainError(f"job is {state.status.name}", f"JobStatus({state.status.name})")
        return tx

    def _finalize(self, sender: TxSender, item: OutboxItem) -> str | None:
        """Pay a result nobody disputed once the window has passed. A disputed one waits for
        the mediator (until ``mediationWindow`` passes unruled: then it stands and is paid); one
        ruled wrong is Funded again (nothing to send)."""
        state = self.store.job(item.job_id).chain
        tx: str | None = None
        if state.status in (Status.SUBMITTED, Status.DISPUTED):
            sent = sender.finalize(state)
            self.store.apply_sent(item.job_id, sent.events)
            tx = sent.tx_hash
        if tx is not None or state.status is Status.RELEASED:
            self._paid(item, tx)
        return tx

    def _resolve(self, sender: TxSender, item: OutboxItem) -> str | None:
        """Resolve a replicated job (``payload.group``): pay the agreeing seats, slash the
        others. Nothing to send when no seat is open any more (resolved meanwhile, by anyone).
        Refused as too early while a seat may still deliver (``JobEscrowSeatsPending``: retried
        after the deadline) or while no majority agrees (``JobEscrowNoMajority``: the mediator
        may rule on the seats meanwhile; retried when the escrow lets anyone close it)."""
        group = str(item.payload["group"])
        seats = self.store.seats(group)
        k = seats[0].chain.job.replicas if seats else 0
        if len(seats) != k:
            raise ChainError(
                f"replicated job {group}: {len(seats)} of its {k} seats are known here",
                "SeatsUnknown",
            )
        if all(s.chain.status.terminal for s in seats):
            return None
        sent = sender.resolve(bytes.fromhex(group[2:]), [s.chain for s in seats])
        self.store.apply_sent(item.job_id, sent.events)  # every seat's events
        self.count("groups_resolved")
        return sent.tx_hash

    def _unassign(self, sender: TxSender, item: OutboxItem) -> str | None:
        """Take the job back from ``provider`` (any provider when the row names none)."""
        state = self.store.job(item.job_id).chain
        provider = item.payload.get("provider")
        if state.status is Status.ASSIGNED and (
            provider is None or state.job.provider.lower() == str(provider).lower()
        ):
            sent = sender.unassign(state)
            self.store.apply_sent(item.job_id, sent.events)
            return sent.tx_hash
        return None

    def _paid(self, item: OutboxItem, tx: str | None) -> None:
        self.store.settled(item.job_id, detail=f"tx {tx}")
        self.count("jobs_paid")
