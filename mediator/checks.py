"""The mediator's integrity checks: an output fetched and checked against its CID and the job
spec's cap (:func:`gridmarket.verify.verify_output`), with whose fault a failure is
(docs/mediator.md "What it decides").
"""

from __future__ import annotations

import logging
import time

from gridmarket.escrow import (
    InvalidText,
    JobState,
)
from gridmarket.verify import VerdictCode, verify_output
from gridmarket.wire import MAX_SPEC_BYTES, JobSpec
from mediator.core import (
    _Check,
    _one_line,
    _Outcome,
)
from mediator.rulings import Rulings
from mediator.state import Task

__all__ = ["Checks"]

log = logging.getLogger(__name__)


class Checks(Rulings):
    """The integrity check of a pending output, the job spec and cap it is checked against."""

    def _check(self, state: JobState, task: Task, now: int, closes: int) -> _Check:
        """The integrity check of the pending output, with whose fault a failure is."""
        cid = state.output_cid
        if cid is None:
            return _Check(_Outcome.UNSURE, "no output CID in the job's events")
        if isinstance(cid, InvalidText) or state.output_problem:
            why = cid.problem if isinstance(cid, InvalidText) else state.output_problem
            return _Check(_Outcome.FAIL, f"output CID unusable: {why}")
        cap, cap_note = self._cap(state)
        verdict = verify_output(
            self.ipfs,
            cid,
            max_bytes=cap,
            timeout_s=self.config.fetch_timeout_s,
            work_dir=self.work_dir,
        )
        self.counters[f"verdict_{verdict.code.value}"] += 1
        message = _one_line(verdict.message)
        if verdict.ok:
            return _Check(_Outcome.INTACT, f"integrity ok: {message}")
        if verdict.code in (VerdictCode.INVALID, VerdictCode.CID_MISMATCH):
            return _Check(_Outcome.FAIL, f"{verdict.code.value}: {message}")
        if verdict.code is VerdictCode.TOO_LARGE:
            if cap_note is None:
                return _Check(_Outcome.FAIL, f"too_large (the job spec's cap): {message}")
            return _Check(_Outcome.UNSURE, f"{message} ({cap_note})")
        # unreachable: the provider's fault only if this mediator's own daemon is up
        if not self._ipfs_up():
            return _Check(_Outcome.RETRY, f"this mediator's IPFS daemon is down: {message}")
        tries = task.tries + 1
        if tries >= self.config.fetch_attempts:
            return _Check(_Outcome.FAIL, f"unreachable after {tries} tries: {message}")
        next_end = now + self.config.retry_delay_s + self.config.fetch_timeout_s
        if next_end + self.config.window_margin_s >= closes:
            return _Check(
                _Outcome.FAIL,
                f"unreachable after {tries} tries, no time for another before the window "
                f"closes at {closes}: {message}",
            )
        return _Check(_Outcome.RETRY, f"unreachable (try {tries}): {message}", tried=True)

    def _spec(self, state: JobState) -> tuple[JobSpec | None, str]:
        """The job's spec from IPFS (cached), or None and why it could not be read."""
        cached = self._specs.get(state.job_id)
        if cached is not None:
            return cached, ""
        if state.spec_problem:
            return None, f"the job spec CID is unusable: {state.spec_problem}"
        try:
            data = self.ipfs.cat(
                state.spec_cid, max_bytes=MAX_SPEC_BYTES, timeout_s=self.config.spec_timeout_s
            )
            spec = JobSpec.from_bytes(data)
        except Exception as exc:
            return None, f"job spec {state.spec_cid} not read: {_one_line(str(exc))[:200]}"
        if len(self._specs) > 10_000:
            self._specs.clear()
        self._specs[state.job_id] = spec
        return spec, ""

    def _cap(self, state: JobState) -> tuple[int, str | None]:
        """The byte cap to check the output with, and None if it is the job spec's own cap
        (else why not: then an output over it is no proof against the provider)."""
        limit = self.config.max_output_bytes
        spec, why = self._spec(state)
        if spec is None:
            return limit, why
        cap = spec.limits.output_max_bytes
        if cap > limit:
            return limit, f"the job spec allows {cap} bytes, this mediator fetches {limit}"
        return cap, None

    def _ipfs_up(self) -> bool:
        try:
            if self._probe is None:
                import ipfshttpclient

                self._probe = ipfshttpclient.Client(self.ipfs.api_addr, timeout=5)
            self._probe.version()
        except Exception as exc:
            log.warning("mediator: IPFS daemon %s not answering: %s", self.ipfs.api_addr, exc)
            return False
        return True

    def _chain_now(self) -> int:
        """The chain's time as the next block will see it (at least the wall clock)."""
        block = self.client.w3.eth.get_block("latest")
        return max(int(block["timestamp"]), int(time.time()))
