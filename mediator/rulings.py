"""The mediator's rulings: deciding on a job attempt, sending ``rule`` once (the ``rulings`` row
written first) and logging each decision (docs/mediator.md "Never twice").
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

from gridmarket import spot as spot_draw
from gridmarket.chain import ChainError
from gridmarket.escrow import (
    FLAG_SPOT,
    JobState,
    Status,
    seat_ids,
)
from mediator.core import (
    Decision,
    MediatorBase,
    _one_line,
)
from mediator.state import Task
from mediator.tasks import Kind

__all__ = ["Rulings", "seat_ruling_blocked"]

log = logging.getLogger(__name__)


def seat_ruling_blocked(
    seats: Sequence[JobState], i: int, now: int, mediation_window: int
) -> tuple[str, str] | None:
    """Why the escrow would refuse ``rule`` on seat ``i`` of a replicated job at chain time
    ``now`` (``seats``: the group's seats in order, as on chain), as ``(kind, words)`` with kind
    ``status`` (the seat holds no pending result), ``majority`` (the seats' results hold a
    strict majority: ``resolve`` settles it and nobody overturns it), ``pending`` (a seat is
    still running and the deadline has not passed: it may yet break the tie) or ``closed``
    (``deadline + mediationWindow`` has passed); None when it would take it. Mirrors
    ``JobEscrow.rule`` (version 5)."""
    seat = seats[i]
    if seat.status is not Status.SUBMITTED:
        return "status", f"seat {i} is {seat.status.name}, not SUBMITTED"
    votes = Counter(
        s.job.result_digest for s in seats if s.status in (Status.SUBMITTED, Status.RELEASED)
    )
    k = len(seats)
    agreeing = max(votes.values(), default=0)
    if 2 * agreeing > k:
        return "majority", f"{agreeing} of {k} seats agree: resolve settles them"
    deadline = seat.job.deadline
    if any(s.status in (Status.FUNDED, Status.ASSIGNED) for s in seats) and now <= deadline:
        return "pending", f"a seat is still running before the deadline {deadline}"
    closes = deadline + mediation_window
    if now >= closes:
        return "closed", f"the seats' mediation window closed at {closes} (now {now})"
    return None


class Rulings(MediatorBase):
    """Decides, rules and logs: every ruling of every role goes through :meth:`_rule`."""

    def _integrity_only(self, task: Task, state: JobState, intact: str | None, why: str) -> None:
        """Uphold a disputed result that passed integrity, saying why it was not re-run."""
        self.counters["integrity_only"] += 1
        reason = intact or "integrity ok when the re-run was funded"
        self._rule(task, state, True, f"{reason}; integrity only: {why}")

    def _rule(
        self,
        task: Task,
        state: JobState,
        upheld: bool,
        reason: str,
        seats: Sequence[JobState] | None = None,
    ) -> JobState | None:
        """Send ``rule(upheld)`` for the job attempt, recorded first so it is never sent for
        another verdict; the escrow refusing it (the job moved on) ends the task. A seat of a
        replicated job is ruled with every seat's struct (``seats``, in order; read from the
        chain when not given). The job as the ruling left it, or None when it was refused."""
        self.state.record_ruling(task.job_id, task.attempt, upheld, reason, "sending")
        try:
            group = self._seats_now(state) if state.job.replicas and seats is None else seats
            ruled, sent = self.client.rule(self.account, state, upheld, group or ())
        except (ChainError, ValueError) as exc:  # a revert: the job is not what it was
            why = _one_line(getattr(exc, "reason", None) or str(exc))
            self.state.record_ruling(
                task.job_id, task.attempt, upheld, reason, f"refused: {why}"[:500]
            )
            self.counters["rulings_refused"] += 1
            self._decide(task, state, None, f"ruling refused by the escrow ({why}); {reason}")
            return None
        self.state.record_ruling(task.job_id, task.attempt, upheld, reason, "sent", sent.tx_hash)
        self.counters["rulings_upheld" if upheld else "rulings_not_upheld"] += 1
        self._decide(task, state, upheld, reason, sent.tx_hash)
        return ruled

    def _seats_now(self, state: JobState) -> list[JobState]:
        """Every seat of ``state``'s replicated job as the chain has it now, in seat order: the
        folded state where the chain's ``statusOf`` agrees with it, else its events read back
        (a ruling sent moments ago may not have folded in yet)."""
        seats: list[JobState] = []
        for seat_id in seat_ids(state.salt, state.job.replicas):
            folded = state if seat_id == state.job_id else self.state.job(seat_id)
            on_chain = Status(int(self.client.call("statusOf", seat_id)))
            if folded is None or folded.status is not on_chain:
                folded = self.client.job_state(seat_id)
            seats.append(folded)
        return seats

    def _decide(
        self,
        task: Task,
        state: JobState,
        upheld: bool | None,
        reason: str,
        tx_hash: str | None = None,
        *,
        verdict: str | None = None,
    ) -> None:
        if verdict is None:
            verdict = "no ruling" if upheld is None else "upheld" if upheld else "not upheld"
        if task.kind == Kind.DISPUTE and state.job.flags & FLAG_SPOT:
            kept = self.state.spot(task.job_id)
            seed = kept.seed if kept is not None else None
            if (
                kept is not None
                and seed is not None
                and spot_draw.checked(seed, task.attempt, kept.p_bps)
            ):
                reason = f"spot check drawn (p={kept.p_bps} bps, attempt {task.attempt}): {reason}"
        reason = _one_line(reason)
        self.state.finish_task(task, f"{verdict}: {reason}"[:2000])
        decision = Decision(task.job_id, task.attempt, task.kind, verdict, reason, tx_hash)
        self._log_decision(decision, state.job.provider)

    def _log_decision(self, decision: Decision, provider: str) -> None:
        self.decisions.append(decision)
        self.counters[f"decisions_{decision.verdict.replace(' ', '_')}"] += 1
        log.info(
            "mediator decision: job 0x%s attempt %d (%s) provider %s verdict=%s tx=%s reason=%s",
            decision.job_id.hex(),
            decision.attempt,
            decision.kind,
            provider,
            decision.verdict.replace(" ", "_"),
            decision.tx_hash or "-",
            decision.reason,
        )
