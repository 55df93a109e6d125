"""The mediator's rulings: deciding on a job attempt, sending ``rule`` once (the ``rulings`` row
written first) and logging each decision (docs/mediator.md "Never twice").
"""

from __future__ import annotations

import logging

from gridmarket import spot as spot_draw
from gridmarket.chain import ChainError
from gridmarket.escrow import (
    FLAG_SPOT,
    JobState,
)
from mediator.core import (
    Decision,
    MediatorBase,
    _one_line,
)
from mediator.state import Task
from mediator.tasks import Kind

__all__ = ["Rulings"]

log = logging.getLogger(__name__)


class Rulings(MediatorBase):
    """Decides, rules and logs: every ruling of every role goes through :meth:`_rule`."""

    def _integrity_only(self, task: Task, state: JobState, intact: str | None, why: str) -> None:
        """Uphold a disputed result that passed integrity, saying why it was not re-run."""
        self.counters["integrity_only"] += 1
        reason = intact or "integrity ok when the re-run was funded"
        self._rule(task, state, True, f"{reason}; integrity only: {why}")

    def _rule(self, task: Task, state: JobState, upheld: bool, reason: str) -> None:
        """Send ``rule(upheld)`` for the job attempt, recorded first so it is never sent for
        another verdict; the escrow refusing it (the job moved on) ends the task."""
        self.state.record_ruling(task.job_id, task.attempt, upheld, reason, "sending")
        try:
            sent = self.client.send(self.account, "rule", task.job_id, state.job.as_tuple(), upheld)
        except ChainError as exc:  # a revert: the job is not what this state says any more
            why = _one_line(exc.reason or str(exc))
            self.state.record_ruling(
                task.job_id, task.attempt, upheld, reason, f"refused: {why}"[:500]
            )
            self.counters["rulings_refused"] += 1
            self._decide(task, state, None, f"ruling refused by the escrow ({why}); {reason}")
            return
        self.state.record_ruling(task.job_id, task.attempt, upheld, reason, "sent", sent.tx_hash)
        self.counters["rulings_upheld" if upheld else "rulings_not_upheld"] += 1
        self._decide(task, state, upheld, reason, sent.tx_hash)

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
