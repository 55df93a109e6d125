"""The mediator's tie-breaks: a second re-run when a dispute's first re-run differed (the re-run
that lied is outvoted and slashed), and the re-run that breaks a replicated job's tie
(docs/mediator.md "The re-run of a dispute", "The tie-break of a replicated job").
"""

from __future__ import annotations

import logging
import time

from gridmarket.chain import ChainError
from gridmarket.cid import CidError, same_cid
from gridmarket.escrow import (
    ZERO_ADDRESS,
    JobState,
    Status,
    seat_ids,
)
from gridmarket.token import TokenClient
from gridmarket.verify import verify_output
from mediator.core import (
    _one_line,
)
from mediator.reruns import ABANDONED, COMPARED, FUNDED, FUNDING, Reruns
from mediator.rulings import seat_ruling_blocked
from mediator.state import Rerun, Task
from mediator.tasks import Kind

__all__ = ["TieBreaks"]

log = logging.getLogger(__name__)


class TieBreaks(Reruns):
    """Breaks ties: of a dispute whose re-run differed, and of a replicated job's seats."""

    def _follow_tie_break(
        self, task: Task, state: JobState, first: Rerun, now: int, closes: int
    ) -> None:
        """Run 1's intact output differed from the disputed result: fund run 2 (the tie-break,
        excluding run 1's provider too) if there is time and means, hold run 1 unpaid, and rule
        by the majority of the three outputs once run 2's result is on chain. With no time or
        means for run 2, or no usable result from it before the window closes, rule as run 1
        says (the disputed result wrong) and say why."""
        mine1 = self.state.job(first.rerun_id)
        where1 = first.note.removeprefix("different: ")
        if mine1 is None:  # cannot happen (it was compared): rule as today
            self._by_first(task, state, first, None, where1, "run 1's job is unknown here")
            return
        second = self.state.rerun(task.job_id, task.attempt, 2)
        margin = self.config.window_margin_s

        def unfunded(why: str) -> None:
            self._by_first(task, state, first, mine1, where1, f"no tie-break: {why}")

        if second is None:
            spec, why = self._spec(state)
            obstacle = (
                why if spec is None else self._no_rerun(state, spec, closes - margin - now, closes)
            )
            if obstacle is not None or spec is None:
                unfunded(obstacle or why)
                return
            self._hold(first, mine1, closes)
            self._fund_rerun(task, state, spec, closes, (mine1.job.provider,), unfunded, run=2)
            return
        if second.status == FUNDING:
            self._send_rerun(task, state, second, unfunded)
            return
        if second.status == ABANDONED:
            unfunded(second.note)
            return
        if second.status != FUNDED:  # compared, yet the dispute is open: its ruling was refused
            self.state.finish_task(task, f"tie-break {second.status}: {second.note}"[:2000])
            return
        self._hold(first, mine1, closes)
        mine2 = self.state.job(second.rerun_id)
        if mine2 is not None and self._tie_break(task, state, first, mine1, where1, second, mine2):
            return
        abandoned = self._wait_or_abandon(task, second, mine2, now, closes)
        if abandoned is not None:
            self._by_first(task, state, first, mine1, where1, f"no tie-break: {abandoned}")

    def _by_first(
        self,
        task: Task,
        state: JobState,
        first: Rerun,
        mine1: JobState | None,
        where1: str,
        why: str,
    ) -> None:
        """Rule as run 1 alone says (the disputed result wrong), as before the tie-break."""
        self.state.set_rerun(task.job_id, task.attempt, COMPARED, f"different: {where1}; {why}")
        self._rule(task, state, False, f"{where1}: different CID; {why}")
        if mine1 is not None:
            self._pay_rerun(first, mine1, "one re-run decided")

    def _tie_break(
        self,
        task: Task,
        state: JobState,
        first: Rerun,
        mine1: JobState,
        where1: str,
        second: Rerun,
        mine2: JobState,
    ) -> bool:
        """Rule by the majority of the disputed result, run 1 and run 2 if run 2 has a usable
        result (True)."""
        if mine2.status not in (Status.SUBMITTED, Status.RELEASED) or mine2.output_problem:
            return False
        theirs, ours1, ours2 = state.output_cid, mine1.output_cid, mine2.output_cid
        if not (isinstance(theirs, str) and isinstance(ours1, str) and isinstance(ours2, str)):
            return False
        spec = self._specs.get(second.rerun_id)
        parties = (state.job.provider, state.job.submitter, mine1.job.provider)
        if (
            spec is not None and spec.excludes(mine2.job.provider)
        ) or mine2.job.provider in parties:
            log.error(
                "mediator: tie-break re-run 0x%s went to excluded provider %s: not used",
                second.rerun_id.hex(),
                mine2.job.provider,
            )
            return False
        try:
            with_disputed, with_first = same_cid(theirs, ours2), same_cid(ours1, ours2)
        except CidError:
            return False
        if not with_disputed and not with_first:
            verdict = verify_output(
                self.ipfs,
                ours2,
                max_bytes=self._cap(state)[0],
                timeout_s=self.config.fetch_timeout_s,
                work_dir=self.work_dir,
            )
            if not verdict.ok:  # the re-run's own check rules on it; wait for another run
                log.warning(
                    "mediator: tie-break re-run 0x%s gave %s, which fails its integrity check "
                    "(%s): not used",
                    second.rerun_id.hex(),
                    ours2,
                    _one_line(verdict.message),
                )
                return False
        where2 = f"tie-break re-run 0x{second.rerun_id.hex()} by {mine2.job.provider} gave {ours2}"
        reason = f"{where1}: different CID; {where2}"
        self.state.set_rerun(task.job_id, task.attempt, COMPARED, f"different: {where1}")
        if with_disputed:  # 2 of 3: the disputed result stands and run 1 lied
            self.counters["ties_upheld"] += 1
            self.state.set_rerun(task.job_id, task.attempt, COMPARED, f"agrees: {where2}", run=2)
            self._rule(task, state, True, f"{reason}: the same as the disputed result (2 of 3)")
            self._rule_rerun_wrong(
                first, mine1, f"{where1}; the disputed result and {where2} agree (2 of 3)"
            )
            self._pay_rerun(second, mine2, "it agrees with the disputed result")
        elif with_first:  # 2 of 3: the disputed result is wrong
            self.counters["ties_not_upheld"] += 1
            self.state.set_rerun(task.job_id, task.attempt, COMPARED, f"agrees: {where2}", run=2)
            self._rule(task, state, False, f"{reason}: the same as re-run 1 (2 of 3)")
            self._pay_rerun(first, mine1, "the tie-break agrees with it")
            self._pay_rerun(second, mine2, "it agrees with re-run 1")
        else:  # no majority: nothing proves the provider wrong
            self.counters["ties_no_majority"] += 1
            self.state.set_rerun(task.job_id, task.attempt, COMPARED, f"differs: {where2}", run=2)
            self._integrity_only(
                task,
                state,
                None,
                f"{reason}: all three outputs differ, so nothing proves the provider wrong",
            )
            self._pay_rerun(first, mine1, "no majority: nothing proves it wrong")
            self._pay_rerun(second, mine2, "no majority: nothing proves it wrong")
        return True

    def _hold(self, first: Rerun, mine1: JobState, closes: int) -> None:
        """Keep run 1 unpaid until the tie-break decides: its result stays Submitted (nobody
        but this mediator releases it) while its challenge window outlasts the dispute's ruling
        (``closes``); else this mediator, its submitter, disputes it (the deposit comes back to
        this mediator whichever way it rules as its mediator), which holds it for a mediation
        window more. Idempotent: sent only while it is Submitted on chain."""
        now1 = self._current(first, mine1)
        if now1 is None or now1.status is not Status.SUBMITTED:
            return
        window = now1.job.since + self.challenge_window - self.config.window_margin_s
        if window >= closes:
            return  # ruled within its own challenge window
        deposit = int(self.client.call("depositOf", now1.job.as_tuple()))
        in_eth = now1.job.token == ZERO_ADDRESS
        try:
            if not in_eth:  # the deposit is pulled in the token: allow it
                token = TokenClient(self.client.w3, now1.job.token)
                if token.allowance(self.address, self.client.address) < deposit:
                    token.send(self.account, "approve", self.client.address, deposit)
                    self.client.forget_nonce(self.address)
            _, sent = self.client.call_job(
                self.account, "dispute", now1, value=deposit if in_eth else 0
            )
        except (ChainError, RuntimeError) as exc:
            why = _one_line(getattr(exc, "reason", None) or str(exc))
            log.warning(
                "mediator: re-run 0x%s not held (%s): it is paid after its window %d unless "
                "ruled before",
                first.rerun_id.hex(),
                why,
                now1.job.since + self.challenge_window,
            )
            return
        self.counters["reruns_held"] += 1
        log.info(
            "mediator: re-run 0x%s held for the tie-break: disputed by this mediator in %s",
            first.rerun_id.hex(),
            sent.tx_hash,
        )

    def _rule_rerun_wrong(self, rerun: Rerun, folded: JobState, reason: str) -> None:
        """Rule this mediator's own re-run wrong (it lied: its provider's collateral pays this
        mediator, its submitter and mediator), then cancel it (its bounty back)."""
        mine = self._current(rerun, folded)
        if mine is None or mine.status not in (Status.SUBMITTED, Status.DISPUTED):
            got = "unknown" if mine is None else mine.status.name
            log.warning(
                "mediator: re-run 0x%s lied but is %s: not slashed (%s)",
                rerun.rerun_id.hex(),
                got,
                reason,
            )
            return
        kind = Kind.DISPUTE if mine.status is Status.DISPUTED else Kind.CHECK
        own = Task(rerun.rerun_id, mine.job.attempt, kind, 0, time.time(), "")
        self._rule(own, mine, False, f"the tie-break outvoted it: {reason}")
        try:
            funded = self.client.job_state(rerun.rerun_id)
            if funded.status is Status.FUNDED:
                self.client.call_job(self.account, "cancel", funded)
        except ChainError as exc:
            log.warning("mediator: re-run 0x%s not cancelled: %s", rerun.rerun_id.hex(), exc)

    def _tie(self, task: Task, first: JobState) -> None:
        """A replicated job naming this mediator with a seat's intact result: once the escrow
        takes rulings on its seats (every seat delivered, or the deadline passed) and their
        results hold no strict majority, re-run the job on a provider none of the seats' and
        rule each delivered seat against the re-run's output (agreeing: upheld and paid;
        different: wrong, its provider slashed), all before ``deadline + mediationWindow``, the
        last moment the escrow takes a ruling on a seat. No ruling when a majority agrees
        (``resolve`` settles it) or the re-run agrees with no seat: then nobody can tell who is
        right, and ``resolve`` refunds the open seats once that window has passed."""
        k = first.job.replicas
        folded = [self.state.job(i) for i in seat_ids(first.salt, k)]
        if any(s is None for s in folded):
            self.state.finish_task(task, "a seat of this replicated job is unknown here")
            return
        known = [s for s in folded if s is not None]
        if all(s.status.terminal for s in known):
            self.state.finish_task(task, "resolved")
            return
        now = self._chain_now()
        deadline = first.job.deadline
        closes = deadline + self.mediation_window
        blocked = self._tie_blocked(known, now)
        if blocked is not None and blocked[0] == "majority":
            self.state.finish_task(task, f"a majority agrees: {blocked[1]}")
            return
        if now >= closes - self.config.window_margin_s:
            self._tie_give_up(task, f"the seats' mediation window closes at {closes} (now {now})")
            return
        rerun = self.state.rerun(task.job_id, task.attempt)
        if rerun is None:
            if blocked is not None and blocked[0] == "pending":
                self.state.retry_task(
                    task, time.time() + self.config.rerun_poll_s, "seats still running", tried=False
                )
            elif blocked is not None:
                self.state.finish_task(task, f"no ruling: {blocked[1]}"[:2000])
            else:
                self._tie_rerun(task, first, known, now, closes)
            return
        if rerun.status == FUNDING:
            self._send_rerun(task, first, rerun, lambda why: self._tie_give_up(task, why))
            return
        if rerun.status not in (FUNDED, COMPARED):
            self.state.finish_task(task, f"re-run {rerun.status}: {rerun.note}")
            return
        mine = self.state.job(rerun.rerun_id)
        if mine is not None and self._tie_compare(task, known, rerun, mine, now):
            return
        if rerun.status == COMPARED:  # its output is not usable any more: cannot happen
            self.state.finish_task(task, f"re-run {rerun.status}: {rerun.note}")
            return
        if now >= rerun.deadline or (mine is not None and mine.status is Status.REFUNDED):
            why = f"re-run 0x{rerun.rerun_id.hex()} gave no usable result in time"
            self.state.set_rerun(task.job_id, task.attempt, ABANDONED, why)
            if mine is not None and mine.status is Status.FUNDED:
                try:
                    self.client.call_job(self.account, "cancel", mine)
                except ChainError as exc:
                    log.warning("mediator: re-run 0x%s not cancelled: %s", mine.job_id.hex(), exc)
            self._tie_give_up(task, why)
            return
        self.state.retry_task(
            task,
            time.time() + self.config.rerun_poll_s,
            f"waiting for tie-break re-run 0x{rerun.rerun_id.hex()}",
            tried=False,
        )

    def _tie_blocked(self, seats: list[JobState], now: int) -> tuple[str, str] | None:
        """Why the escrow takes no ruling on any of these seats now (:func:`seat_ruling_blocked`
        of the first delivered seat), or None when it does."""
        for i, seat in enumerate(seats):
            if seat.status is Status.SUBMITTED:
                return seat_ruling_blocked(seats, i, now, self.mediation_window)
        running = any(s.status in (Status.FUNDED, Status.ASSIGNED) for s in seats)
        if running and now <= seats[0].job.deadline:
            return "pending", "seats still running"
        return "status", "no seat holds a result to rule on"

    def _tie_rerun(
        self, task: Task, first: JobState, seats: list[JobState], now: int, closes: int
    ) -> None:
        """Fund the tie-break re-run, due at the last moment the escrow takes a ruling on the
        seats (``closes``: their deadline plus the mediation window, less the margin)."""
        if not self.config.rerun:
            self._tie_give_up(task, "re-runs are off on this mediator")
            return
        spec, why = self._spec(first)
        if spec is None or not spec.comparable:
            self._tie_give_up(task, why or "the job is not deterministic: a re-run cannot judge it")
            return
        left = closes - self.config.window_margin_s - now
        need = max(self.config.rerun_min_s, self.min_duration + 10)
        if left < need:
            self._tie_give_up(
                task,
                f"no time for a re-run: {left:.0f} s left before the seats' mediation window "
                f"closes at {closes} (a re-run needs {need:g} s)",
            )
            return
        providers = tuple(s.job.provider for s in seats if s.job.provider != ZERO_ADDRESS)
        self._fund_rerun(
            task, first, spec, closes, providers, lambda why: self._tie_give_up(task, why)
        )

    def _tie_compare(
        self, task: Task, seats: list[JobState], rerun: Rerun, mine: JobState, now: int
    ) -> bool:
        """Rule the delivered seats against the re-run's result if it has a usable one (True):
        those that agree with it upheld first, then those that differ wrong, each while the
        escrow takes it (a seat ruled wrong runs again, and no other seat is ruled until it
        delivers again or the deadline passes: the task waits for that)."""
        if mine.status not in (Status.SUBMITTED, Status.RELEASED) or mine.output_problem:
            return False
        ours = mine.output_cid
        if not isinstance(ours, str) or mine.job.provider in {s.job.provider for s in seats}:
            return False
        if rerun.status != COMPARED:
            verdict = verify_output(
                self.ipfs,
                ours,
                max_bytes=self._cap(seats[0])[0],
                timeout_s=self.config.fetch_timeout_s,
                work_dir=self.work_dir,
            )
            if not verdict.ok:
                return False

        def agrees(seat: JobState) -> bool:
            try:
                return isinstance(seat.output_cid, str) and same_cid(seat.output_cid, ours)
            except CidError:
                return False

        where = f"tie-break re-run 0x{rerun.rerun_id.hex()} by {mine.job.provider} gave {ours}"
        if rerun.status != COMPARED:
            voted = [s for s in seats if s.status in (Status.SUBMITTED, Status.RELEASED)]
            if not any(agrees(s) for s in voted):
                self.state.set_rerun(
                    task.job_id, task.attempt, COMPARED, f"agrees with no seat: {where}"
                )
                self.state.finish_task(task, f"no ruling: {where}, which agrees with no seat")
                return True
            self.state.set_rerun(task.job_id, task.attempt, COMPARED, where)
            self.counters["ties_broken"] += 1
            if mine.status is Status.SUBMITTED:  # pay the re-run's provider now
                try:
                    self.client.call_job(self.account, "release", mine)
                except ChainError as exc:
                    log.warning("mediator: re-run 0x%s not released: %s", mine.job_id.hex(), exc)
        elif rerun.note.startswith("agrees with no seat"):
            self.state.finish_task(task, f"no ruling: {where}, which agrees with no seat")
            return True
        current = self._seats_now(seats[0])
        ruled = 0
        waiting: str | None = None
        order = sorted(range(len(current)), key=lambda i: not agrees(current[i]))
        for i in order:
            seat = current[i]
            if seat.status is not Status.SUBMITTED:
                continue
            prior = self.state.ruling(seat.job_id, seat.job.attempt)
            if prior is not None and prior.outcome in ("sending", "sent", "confirmed"):
                continue
            blocked = seat_ruling_blocked(current, i, self._chain_now(), self.mediation_window)
            if blocked is not None:
                if blocked[0] == "pending" and waiting is None:
                    waiting = blocked[1]
                continue
            same = agrees(seat)
            seat_task = Task(seat.job_id, seat.job.attempt, Kind.TIE, 0, time.time(), "")
            reason = (
                f"{where}; this seat gave {seat.output_cid}: {'the same' if same else 'different'}"
            )
            after = self._rule(seat_task, seat, same, reason, current)
            if after is not None:
                current[i] = after
                ruled += 1
        if waiting is not None:
            self.state.retry_task(
                task,
                time.time() + self.config.rerun_poll_s,
                f"{where}; ruled {ruled} seats, the rest wait: {waiting}",
                tried=False,
            )
        else:
            self.state.finish_task(task, f"ruled {ruled} seats: {where}")
        return True

    def _tie_give_up(self, task: Task, why: str) -> None:
        """No tie-break: the seats stay as they are (``resolve`` refunds them, slashing nobody,
        once the mediation window after the deadline has passed)."""
        self.counters["ties_not_broken"] += 1
        self.state.finish_task(task, f"no ruling: {why}"[:2000])
        log.info(
            "mediator: replicated job of seat 0x%s: tie not broken: %s", task.job_id.hex(), why
        )
