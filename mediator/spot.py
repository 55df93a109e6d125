"""The mediator's spot checks: the seed sealed to its key opened, the attempt drawn, a drawn
attempt disputed by the mediator itself, and the seed revealed to the scheduler once the job is
settled (docs/mediator.md "Spot checks").
"""

from __future__ import annotations

import logging
import time

import httpx

from gridmarket import spot as spot_draw
from gridmarket.chain import ChainError
from gridmarket.escrow import (
    JobState,
)
from gridmarket.wire import API, SpotReveal
from mediator.core import (
    _Draw,
    _one_line,
)
from mediator.state import SpotSeed, Task
from mediator.tiebreaks import TieBreaks

__all__ = ["SpotChecks"]

log = logging.getLogger(__name__)


class SpotChecks(TieBreaks):
    """Draws spot checks and reveals their seeds."""

    def _draw(self, state: JobState) -> _Draw:
        """Whether the submitted attempt of a ``FLAG_SPOT`` job is checked: the seed sealed in
        its spec, opened with this mediator's key (once per job, kept in the state file)."""
        kept = self.state.spot(state.job_id)
        if kept is None:
            kept, retry = self._open_seed(state)
            if kept is None:
                return _Draw(False, retry, retry=True)
        if kept.seed is None:
            return _Draw(False, kept.note)
        attempt = state.job.attempt
        if not self.config.rerun:  # a check must be judged by a re-run, never pocketed
            return _Draw(False, "no spot check: re-runs are off on this mediator")
        drawn = spot_draw.checked(kept.seed, attempt, kept.p_bps)
        what = "drawn" if drawn else "not drawn"
        return _Draw(drawn, f"spot check {what} (p={kept.p_bps} bps, attempt {attempt})")

    def _open_seed(self, state: JobState) -> tuple[SpotSeed | None, str]:
        """Read the spot job's spec and open its seed; the kept row, or None and why the spec
        could not be read (try again later). A seed that does not open, does not match the
        commitment, or whose commitment another job's opened seed already has (the same
        submitter's reuse: :meth:`MediatorState.spot_sharing`) is kept as "no seed", with why."""
        spec, why = self._spec(state)
        if spec is None:
            return None, f"spot draw not made yet: {why}"
        policy = spec.spot
        seed: bytes | None = None
        commit, p_bps, note = b"", 0, ""
        if policy is None:
            note = (
                "no spot check: the job carries FLAG_SPOT but its spec has no spot policy "
                "(the submitter's mistake, never charged to the provider)"
            )
        else:
            commit, p_bps = policy.commit_bytes, policy.p_bps
            shared = self.state.spot_sharing(state.job_id, commit)
            if shared:
                note = (
                    f"no spot check: the spec's commitment {policy.commit} is also job "
                    f"0x{shared[0].hex()}'s: a reused seed is never drawn on (the submitter's "
                    "mistake, never charged to the provider)"
                )
            else:
                try:
                    seed = spot_draw.unseal(
                        policy.sealed_bytes, self._key, state.job.submitter, commit
                    )
                except spot_draw.SpotError as exc:
                    note = (
                        f"no spot check: {exc} (the submitter's mistake, never charged to the "
                        "provider)"
                    )
        if note:
            self.counters["spot_no_seed"] += 1
            log.warning("mediator: job 0x%s: %s", state.job_id.hex(), note)
        kept = self.state.put_spot(
            SpotSeed(state.job_id, commit, p_bps, seed, note, None, time.time())
        )
        return kept, ""

    def _spot_check(self, task: Task, state: JobState, draw: _Draw, intact: str, now: int) -> None:
        """Open the check of a drawn attempt: ``dispute`` the result as the job's mediator
        (sending nothing: the check deposit was locked at funding). The ``ResultDisputed`` it
        emits makes a dispute task, judged like any other (a re-run elsewhere, compared)."""
        spec, why = self._spec(state)
        left = self.mediation_window - self.config.window_margin_s
        closes = now + self.mediation_window
        obstacle = why if spec is None else self._no_rerun(state, spec, left, closes)
        if obstacle is not None:  # the deposit pays a re-run, or the check is not opened
            self._decide(
                task,
                state,
                None,
                f"{draw.note}, not opened: {obstacle}; {intact}; paid after the challenge window",
            )
            return
        try:
            _, sent = self.client.call_job(self.account, "dispute", state)
        except ChainError as exc:  # the job moved on (finalized, disputed by its submitter)
            refused = _one_line(exc.reason or str(exc))
            self.counters["spot_checks_refused"] += 1
            self._decide(
                task, state, None, f"{draw.note}: the escrow refused the check ({refused})"
            )
            return
        self.counters["spot_checks"] += 1
        self._decide(
            task,
            state,
            None,
            f"{draw.note}: disputed by this mediator, to be re-run on another provider "
            f"and ruled; {intact}",
            sent.tx_hash,
            verdict="disputed",
        )

    def _reveal(self, task: Task, state: JobState) -> None:
        """Reveal a settled spot job's seed to the scheduler (``POST API.SPOT``); never before
        the job is Released or Refunded, nor while another job shares its commitment open."""
        retry = time.time() + self.config.reveal_retry_s
        if not state.status.terminal:  # a reorg took the settlement back: wait for it again
            self.state.retry_task(task, retry, f"not settled: {state.status.name}", tried=False)
            return
        kept = self.state.spot(state.job_id)
        if kept is None:  # never checked (no result submitted): open it now
            kept, why = self._open_seed(state)
            if kept is None:
                if task.tries + 1 >= self.config.reveal_attempts:
                    self.state.finish_task(task, f"nothing revealed: {why}")
                else:
                    self.state.retry_task(task, retry, why, tried=True)
                return
        if kept.seed is None:
            self.state.finish_task(task, f"nothing to reveal: {kept.note}"[:2000])
            return
        for other in self.state.spot_sharing(state.job_id, kept.commit):
            theirs = self.state.job(other)
            if theirs is not None and not theirs.status.terminal:
                note = f"job 0x{other.hex()} shares the commitment and is not settled"
                self.state.retry_task(task, retry, note, tried=False)
                return
        url = self.config.scheduler_url
        if not url:
            self.state.finish_task(task, "no scheduler URL: the seed stays in the state file")
            return
        job = "0x" + state.job_id.hex()
        body = SpotReveal(seed="0x" + kept.seed.hex()).model_dump(mode="json")
        try:
            if self._http is None:
                self._http = httpx.Client(timeout=10.0)
            r = self._http.post(url.rstrip("/") + API.SPOT.format(job_id=job), json=body)
        except httpx.HTTPError as exc:
            note = f"scheduler {url} unreachable ({_one_line(str(exc))[:200]}): again later"
            self.state.retry_task(task, retry, note, tried=False)
            log.info("mediator: job %s: seed not revealed yet: %s", job, note)
            return
        answer = _one_line(r.text)[:300]
        if r.status_code in (200, 201):
            self.state.set_revealed(state.job_id, "revealed")
            self.state.finish_task(task, "revealed")
            self.counters["spot_revealed"] += 1
            log.info("mediator: job %s settled (%s): spot seed revealed", job, state.status.name)
        elif r.status_code == 404 and task.tries + 1 < self.config.reveal_attempts:
            self.state.retry_task(task, retry, f"the scheduler: {answer}", tried=True)
        elif r.status_code == 409 or r.status_code >= 500:  # not folded there yet, or down
            self.state.retry_task(task, retry, f"the scheduler: {answer}", tried=False)
        else:
            self.state.set_revealed(state.job_id, f"refused: {r.status_code} {answer}")
            self.state.finish_task(task, f"refused by the scheduler: {r.status_code} {answer}")
            log.error("mediator: job %s: the scheduler refused the seed: %s", job, answer)
