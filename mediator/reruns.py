"""The mediator's re-runs of disputes: a disputed deterministic job funded again through the market,
excluding the disputed provider and the submitter, followed, compared with the disputed output
and paid (docs/mediator.md "The re-run of a dispute").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak

from gridmarket.chain import ChainError
from gridmarket.cid import CidError, same_cid
from gridmarket.escrow import (
    ZERO_ADDRESS,
    JobState,
    Status,
    Terms,
)
from gridmarket.escrow import job_id as escrow_job_id
from gridmarket.verify import verify_output
from gridmarket.wire import MAX_EXCLUDED, JobSpec
from mediator.checks import Checks
from mediator.core import (
    _one_line,
)
from mediator.state import Rerun, Task
from mediator.tasks import Kind

__all__ = ["ABANDONED", "COMPARED", "FUNDED", "FUNDING", "HELD", "RERUN_SALT_TAG", "Reruns"]

log = logging.getLogger(__name__)

RERUN_SALT_TAG = b"gridmarket.mediator.rerun.v1"
"""The re-run of a dispute is funded with salt ``keccak(tag, job id, attempt)``, its tie-break
(run 2) with ``keccak(tag, job id, attempt, run)``: their job ids are known before ``createJob``
is sent, and a second ``createJob`` for either would revert."""

# re-run states (the ``reruns`` table)
FUNDING = "funding"  # recorded; createJob sent or about to be
FUNDED = "funded"  # on chain; waiting for its result
HELD = "held"  # run 1's output differed: held unpaid until the tie-break (run 2) decides
COMPARED = "compared"  # its output was compared and the dispute ruled on
ABANDONED = "abandoned"  # no usable re-run before the window closed: ruled on integrity


class Reruns(Checks):
    """Judges an intact disputed result: funds, follows and compares its re-run."""

    if TYPE_CHECKING:  # :class:`mediator.tiebreaks.TieBreaks`, which run 1's difference leads to

        def _follow_tie_break(
            self, task: Task, state: JobState, first: Rerun, now: int, closes: int
        ) -> None: ...

    def _judge(self, task: Task, state: JobState, now: int, closes: int, intact: str) -> None:
        """A disputed result passed its integrity check: start a re-run of a deterministic job,
        or rule on integrity alone (upheld) and say why."""
        spec, why = self._spec(state)
        if spec is None:
            self._integrity_only(task, state, intact, why)
            return
        obstacle = self._no_rerun(state, spec, closes - self.config.window_margin_s - now, closes)
        if obstacle is not None:
            self._integrity_only(task, state, intact, obstacle)
            return
        self._fund_rerun(task, state, spec, closes)

    def _no_rerun(self, state: JobState, spec: JobSpec, left: float, closes: int) -> str | None:
        """Why a disputed result of this job cannot be judged by a re-run (``left`` seconds
        before the ruling's last moment), or None when it can."""
        if not self.config.rerun:
            return "re-runs are off on this mediator"
        if not spec.comparable:
            return (
                "the job is not deterministic (a Docker job must pin its image by digest and "
                "declare deterministic: true), so a re-run's output cannot judge it"
            )
        # the re-run's deadline is the ruling's last moment; the escrow wants it minDuration
        # (plus the time to mine createJob) ahead
        need = max(self.config.rerun_min_s, self.min_duration + 10)
        if left < need:
            return (
                f"no time for a re-run: {left:.0f} s left before the mediation window closes "
                f"at {closes} (a re-run needs {need:g} s)"
            )
        bounty = state.job.bounty
        in_eth = state.job.token == ZERO_ADDRESS
        cap = self.config.rerun_max_bounty_wei if in_eth else self.config.rerun_max_bounty_token
        if cap is not None and bounty > cap:
            unit = "wei" if in_eth else f"units of token {state.job.token}"
            return f"a re-run would cost {bounty} {unit}, over this mediator's cap {cap}"
        return None

    def _fund_rerun(
        self,
        task: Task,
        state: JobState,
        spec: JobSpec,
        closes: int,
        exclude: tuple[str, ...] = (),
        on_unfunded: Callable[[str], None] | None = None,
        *,
        run: int = 1,
    ) -> None:
        """Fund the re-run: the job's spec with the disputed provider and the disputing
        submitter excluded, the job's own bounty, a deadline at the ruling's last moment, this
        mediator as its submitter and mediator. Recorded before ``createJob`` is sent."""
        excluded: list[str] = []
        for wallet in (state.job.provider, state.job.submitter, *exclude, *spec.exclude_providers):
            address = to_checksum_address(wallet)
            if address not in excluded:
                excluded.append(address)
        rerun_spec = JobSpec.model_validate(
            {
                **spec.model_dump(mode="json"),
                "name": f"rerun-{spec.name}"[:80],
                "exclude_providers": excluded[:MAX_EXCLUDED],
                "spot": None,  # the re-run is no spot job (and its commitment is the job's)
            }
        )
        spec_cid = self.ipfs.add_bytes(rerun_spec.to_bytes())
        salt = keccak(RERUN_SALT_TAG + task.job_id + task.attempt.to_bytes(2, "big"))
        if run > 1:  # the tie-break: its own salt, as fixed in advance
            salt = keccak(salt + run.to_bytes(2, "big"))
        rerun = Rerun(
            job_id=task.job_id,
            attempt=task.attempt,
            rerun_id=escrow_job_id(self.address, spec_cid, salt),
            spec_cid=spec_cid,
            salt=salt,
            bounty=state.job.bounty,
            deadline=int(closes - self.config.window_margin_s),
            status=FUNDING,
            note=f"excluding {', '.join(excluded[:MAX_EXCLUDED])}",
            at=time.time(),
            run=run,
        )
        self._specs[rerun.rerun_id] = rerun_spec
        self.state.start_rerun(rerun)
        self._send_rerun(task, state, rerun, on_unfunded)

    def _send_rerun(
        self,
        task: Task,
        state: JobState,
        rerun: Rerun,
        on_unfunded: Callable[[str], None] | None = None,
    ) -> None:
        """Send the re-run's ``createJob`` (again, after a crash: the fixed salt makes a second
        one revert), then wait for its result. A job paid in a token is re-run in that token
        (``createJobWith`` after this mediator's permit, one transaction)."""
        if int(self.client.call("statusOf", rerun.rerun_id)) == Status.NONE:
            terms = Terms(
                mediator=self.address,
                collateral=self.client.min_collateral(rerun.bounty),
                flags=0,
                token=state.job.token,
            )
            try:
                _, sent = self.client.create_job(
                    self.account,
                    rerun.salt,
                    rerun.spec_cid,
                    rerun.deadline,
                    rerun.bounty,
                    terms,
                )
            except ChainError as exc:
                if int(self.client.call("statusOf", rerun.rerun_id)) == Status.NONE:
                    why = _one_line(exc.reason or str(exc))
                    self.state.set_rerun(
                        task.job_id, task.attempt, ABANDONED, f"not funded: {why}", run=rerun.run
                    )
                    self.counters["reruns_not_funded"] += 1
                    if on_unfunded is not None:
                        on_unfunded(f"the re-run could not be funded: {why}")
                    else:
                        self._integrity_only(
                            task, state, None, f"the re-run could not be funded: {why}"
                        )
                    return
                sent = None  # it was funded after all (an earlier send landed)
            tx = sent.tx_hash if sent is not None else "an earlier transaction"
        else:
            tx = "an earlier transaction"
        self.state.set_rerun(
            task.job_id, task.attempt, FUNDED, f"{rerun.note}; funded in {tx}", run=rerun.run
        )
        self.counters["reruns_funded"] += 1
        log.info(
            "mediator: job 0x%s attempt %d disputed: re-run 0x%s funded (%d %s, deadline %d, "
            "spec %s) in %s; %s",
            task.job_id.hex(),
            task.attempt,
            rerun.rerun_id.hex(),
            rerun.bounty,
            "wei" if state.job.token == ZERO_ADDRESS else f"of token {state.job.token}",
            rerun.deadline,
            rerun.spec_cid,
            tx,
            rerun.note,
        )
        self.state.retry_task(
            task,
            time.time() + self.config.rerun_poll_s,
            f"waiting for re-run 0x{rerun.rerun_id.hex()}",
            tried=False,
        )

    def _follow_rerun(
        self, task: Task, state: JobState, rerun: Rerun, now: int, closes: int
    ) -> None:
        """Compare the re-run's output once it is on chain; give up on it (integrity ruling)
        when the window is about to close or the re-run cannot end."""
        if rerun.status == FUNDING:  # recorded, createJob perhaps not sent: send (again)
            self._send_rerun(task, state, rerun)
            return
        mine = self.state.job(rerun.rerun_id)
        if mine is not None and self._compare(task, state, rerun, mine, now, closes):
            return
        why = self._wait_or_abandon(task, rerun, mine, now, closes)
        if why is not None:
            self._integrity_only(task, state, None, why)

    def _wait_or_abandon(
        self, task: Task, rerun: Rerun, mine: JobState | None, now: int, closes: int
    ) -> str | None:
        """Re-run ``rerun`` (run 1, or run 2: the tie-break; ``mine``, its job as seen on
        chain) has no usable result yet: wait for it (the task retried; None) while the
        mediation window leaves time and its job can still end. Otherwise abandon it, cancel its
        job if nobody took it (the bounty back), and return why (the caller rules without it)."""
        name = "tie-break re-run" if rerun.run == 2 else "re-run"
        waiting = (
            "its JobCreated not seen yet"
            if mine is None
            else f"it is {mine.status.name} at attempt {mine.job.attempt}"
        )
        give_up = now >= closes - self.config.window_margin_s or (
            mine is not None and mine.status is Status.REFUNDED
        )
        if not give_up:
            self.state.retry_task(
                task,
                time.time() + self.config.rerun_poll_s,
                f"waiting for {name} 0x{rerun.rerun_id.hex()}: {waiting}",
                tried=False,
            )
            return None
        why = (
            f"{name} 0x{rerun.rerun_id.hex()} gave no usable result before the mediation "
            f"window closes at {closes} ({waiting})"
        )
        self.state.set_rerun(task.job_id, task.attempt, ABANDONED, why, run=rerun.run)
        self.counters["reruns_abandoned"] += 1
        if mine is not None and mine.status is Status.FUNDED:  # nobody took it: bounty back
            try:
                self.client.call_job(self.account, "cancel", mine)
            except ChainError as exc:
                log.warning("mediator: could not cancel re-run 0x%s: %s", rerun.rerun_id.hex(), exc)
        return why

    def _compare(
        self, task: Task, state: JobState, rerun: Rerun, mine: JobState, now: int, closes: int
    ) -> bool:
        """Rule on the dispute from the re-run's result if it has a usable one (True): the same
        output upholds it; a different one (intact) starts the tie-break (run 2), or, with no
        time or means for one, rules it wrong as one re-run says."""
        if mine.status not in (Status.SUBMITTED, Status.RELEASED) or mine.output_problem:
            return False
        theirs, ours = state.output_cid, mine.output_cid
        if not isinstance(theirs, str) or not isinstance(ours, str):
            return False
        spec = self._specs.get(rerun.rerun_id)
        if spec is not None and spec.excludes(mine.job.provider):
            log.error(
                "mediator: re-run 0x%s went to excluded provider %s: its output is not used",
                rerun.rerun_id.hex(),
                mine.job.provider,
            )
            return False
        if mine.job.provider in (state.job.provider, state.job.submitter):
            return False  # never compare a party with itself (the spec was not read back)
        try:
            same = same_cid(theirs, ours)
        except CidError:
            return False
        where = (
            f"re-run 0x{rerun.rerun_id.hex()} by {mine.job.provider} gave output {ours}; "
            f"the disputed result is {theirs}"
        )
        if not same:
            verdict = verify_output(
                self.ipfs,
                ours,
                max_bytes=self._cap(state)[0],
                timeout_s=self.config.fetch_timeout_s,
                work_dir=self.work_dir,
            )
            if not verdict.ok:  # the re-run's own check rules on it; wait for another run
                log.warning(
                    "mediator: %s, which fails its integrity check (%s): not used",
                    where,
                    _one_line(verdict.message),
                )
                return False
        self.counters["reruns_same" if same else "reruns_different"] += 1
        if not same:  # one re-run may be the liar: a second one breaks the tie
            self.state.set_rerun(task.job_id, task.attempt, HELD, f"different: {where}")
            self._follow_tie_break(
                task, state, replace(rerun, status=HELD, note=f"different: {where}"), now, closes
            )
            return True
        self.state.set_rerun(task.job_id, task.attempt, COMPARED, f"same: {where}")
        self._rule(task, state, True, f"{where}: the same CID")
        self._pay_rerun(rerun, mine, "it agrees with the disputed result")
        return True

    def _current(self, rerun: Rerun, folded: JobState) -> JobState | None:
        """This mediator's re-run job as the chain has it now: the folded state if the chain's
        ``statusOf`` agrees (else its events since: one job's events, read back)."""
        try:
            on_chain = Status(int(self.client.call("statusOf", rerun.rerun_id)))
            fresh = self.state.job(rerun.rerun_id) or folded
            if fresh.status is on_chain:
                return fresh
            return self.client.job_state(rerun.rerun_id)
        except (ChainError, ValueError) as exc:
            log.warning("mediator: re-run 0x%s not read: %s", rerun.rerun_id.hex(), exc)
            return None

    def _pay_rerun(self, rerun: Rerun, folded: JobState, why: str) -> None:
        """Pay a re-run's provider now: ``release`` it (or, held by this mediator's dispute,
        rule it upheld as its mediator)."""
        mine = self._current(rerun, folded)
        if mine is None or mine.status not in (Status.SUBMITTED, Status.DISPUTED):
            return
        try:
            if mine.status is Status.SUBMITTED:
                self.client.call_job(self.account, "release", mine)
            else:
                own = Task(rerun.rerun_id, mine.job.attempt, Kind.DISPUTE, 0, time.time(), "")
                self._rule(own, mine, True, f"re-run paid: {why}")
            log.info("mediator: re-run 0x%s paid: %s", rerun.rerun_id.hex(), why)
        except ChainError as exc:
            log.warning(
                "mediator: re-run 0x%s not released (%s); it is paid after its window",
                rerun.rerun_id.hex(),
                _one_line(exc.reason or str(exc)),
            )
