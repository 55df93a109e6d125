"""What the outbox sends for each kind of row, and what a refused transaction undoes.

A row is written by the store in the same transaction as the state change that needs it
(``assign`` with a lease, ``settle``/``release``/``submit_reject``/``reject`` with a verdict,
``unassign`` when attempts are used up). Each rule reads the job's on-chain struct first, so a
retry after an unknown outcome does not send twice, and a step someone else already took
(the provider submitted or claimed itself) is not sent again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gridmarket.chain import ChainError
from gridmarket.escrow import Status
from scheduler.chain import TxSender
from scheduler.store import OutboxItem, Store

__all__ = ["OutboxRules"]

log = logging.getLogger(__name__)


class OutboxRules:
    """Sends one outbox row (:meth:`send`); undoes what a refused one needed (:meth:`refused`)."""

    def __init__(self, store: Store, count: Callable[[str], None]) -> None:
        self.store = store
        self.count = count
        self._rules: dict[str, Callable[[TxSender, OutboxItem], str | None]] = {
            "assign": self._assign,
            "settle": self._settle,
            "release": self._release,
            "submit_reject": self._reject,
            "reject": self._reject,
            "unassign": self._unassign,
        }

    def send(self, sender: TxSender, item: OutboxItem) -> None:
        """Send ``item`` (or nothing, when the chain already has it) and mark it done.
        A refusal raises :class:`ChainError` and leaves the row to the caller."""
        rule = self._rules.get(item.kind)
        if rule is None:
            raise ChainError(f"unknown outbox kind {item.kind}", "UnknownKind")
        tx = rule(sender, item)
        self.store.outbox_finish(item.id, status="done", tx_hash=tx)

    def refused(self, item: OutboxItem, reason: str) -> None:
        """The chain refused ``item`` for good: a refused assign ends that lease (the job may go
        to another node); any other refused step gives the job up."""
        if item.kind == "assign":
            self.store.assign_failed(item.job_id, int(item.payload["attempt"]), reason)
        else:
            self.store.fail_job(item.job_id, f"{item.kind} refused on-chain: {reason}")

    # ------------------------------------------------------------------ per kind
    def _assign(self, sender: TxSender, item: OutboxItem) -> str | None:
        state = self.store.job(item.job_id).chain
        p = item.payload
        if state.job.attempt >= p["attempt"]:
            return None  # already on-chain (a retry after an unknown outcome)
        if state.status not in (Status.FUNDED, Status.ASSIGNED):
            raise ChainError(f"job is {state.status.name}", f"JobStatus({state.status.name})")
        if state.job.attempt + 1 != p["attempt"]:
            log.warning(
                "job %s: lease attempt %s but chain attempt %s",
                item.job_id,
                p["attempt"],
                state.job.attempt,
            )
        sent = sender.assign(state, p["provider"])
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
            sent = sender.settle(state, p["output_cid"], bytes.fromhex(p["signature"][2:]))
            self.store.apply_sent(item.job_id, sent.events)
            tx = sent.tx_hash
        self.store.settled(item.job_id, paid=True, detail=f"tx {tx}")
        self.count("jobs_paid")
        return tx

    def _release(self, sender: TxSender, item: OutboxItem) -> str | None:
        state = self.store.job(item.job_id).chain
        tx: str | None = None
        if state.status is Status.SUBMITTED:
            sent = sender.release(state)
            self.store.apply_sent(item.job_id, sent.events)
            tx = sent.tx_hash
        self.store.settled(item.job_id, paid=True, detail=f"tx {tx}")
        self.count("jobs_paid")
        return tx

    def _reject(self, sender: TxSender, item: OutboxItem) -> str | None:
        """``submit_reject`` puts the relayed result on-chain first; then both reject it."""
        state = self.store.job(item.job_id).chain
        p = item.payload
        tx: str | None = None
        if item.kind == "submit_reject" and state.status is Status.ASSIGNED:
            sent = sender.submit_result_for(
                state, p["output_cid"], bytes.fromhex(p["signature"][2:])
            )
            self.store.apply_sent(item.job_id, sent.events)
            state = self.store.job(item.job_id).chain
        if state.status is Status.SUBMITTED:
            sent = sender.reject(state)
            self.store.apply_sent(item.job_id, sent.events)
            tx = sent.tx_hash
        self.store.settled(item.job_id, paid=False, detail=f"slashed in tx {tx}")
        self.count("results_rejected")
        return tx

    def _unassign(self, sender: TxSender, item: OutboxItem) -> str | None:
        state = self.store.job(item.job_id).chain
        if state.status is Status.ASSIGNED:
            sent = sender.unassign(state)
            self.store.apply_sent(item.job_id, sent.events)
            return sent.tx_hash
        return None
