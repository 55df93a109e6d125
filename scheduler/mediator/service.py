"""The mediator: a mode of the scheduler with its own key that rules on results of the jobs
naming it (docs/mediator.md).

It follows the escrow's events from the deployment block (:class:`scheduler.chain.ChainWatcher`
over a cursor kept in its own SQLite file, :mod:`scheduler.mediator.state`), folds the jobs
whose ``job.mediator`` is its address with :func:`gridmarket.escrow.apply_event`, and owes each
of their results one integrity check (:func:`scheduler.verify.verify_output`):

- a result just submitted (``check``): if the output fails for a reason that is the provider's
  (the CID does not decode or is not a UnixFS CID, its bytes hash to another CID, it is over the
  job spec's cap, or it stays unreachable over several tries within the challenge window), the
  mediator rules it wrong (``rule(false)``) before the window closes; if it passes, nothing is
  sent and the result is paid after the window by whoever finalizes it;
- a disputed result (``dispute``): checked again, upheld (``rule(true)``) if it passes, ruled
  wrong if it fails.

This rules on integrity only: whether the bytes are the output the job asked for is not checked
(re-running the job elsewhere is the next step, docs/mediator.md). A check the mediator cannot
conclude (its own IPFS daemon is down, the job's own cap is unknown) never slashes anyone.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils.address import to_checksum_address

from gridmarket.chain import ChainError, Deployment, EscrowClient, Event
from gridmarket.escrow import JOB_EVENTS, InvalidText, JobState, Status, apply_event
from gridmarket.ipfs import IpfsStore
from gridmarket.wire import MAX_SPEC_BYTES, JobLimits, JobSpec
from scheduler.chain.retry import RetryPolicy, describe, is_transient
from scheduler.chain.watcher import ChainWatcher
from scheduler.mediator.state import MediatorState, Task
from scheduler.verify import VerdictCode, verify_output

__all__ = ["CHECK", "DISPUTE", "Decision", "Mediator", "MediatorConfig", "MediatorError"]

log = logging.getLogger(__name__)

CHECK = "check"
"""A task: check a submitted result within its challenge window (rule only if it fails)."""
DISPUTE = "dispute"
"""A task: rule on a disputed result (upheld if it passes the check, not upheld if it fails)."""


class MediatorError(RuntimeError):
    """The mediator cannot run as configured (wrong key, wrong state file)."""


@dataclass(frozen=True)
class MediatorConfig:
    """How the mediator checks and how hard it tries (defaults suit a public testnet)."""

    fetch_timeout_s: float = 60.0
    """Time limit of one integrity check (the whole fetch from IPFS)."""
    fetch_attempts: int = 3
    """Checks that must find the output unreachable before it is ruled wrong (fewer if the
    challenge window would close before the next one)."""
    retry_delay_s: float = 30.0
    """Wait between two checks of an unreachable output."""
    max_output_bytes: int = JobLimits().output_max_bytes
    """The most this mediator fetches. An output over it is ruled wrong only when the job spec's
    own cap (``limits.output_max_bytes``) is known and not larger."""
    spec_timeout_s: float = 10.0
    """Time limit of fetching a job spec (for its output cap)."""
    window_margin_s: float = 30.0
    """A ruling within a window is sent no later than this before the window closes."""
    poll_interval_s: float = 2.0
    confirmations: int = 0
    batch_blocks: int = 2000
    error_backoff: RetryPolicy = field(
        default_factory=lambda: RetryPolicy(initial_delay_s=1.0, max_delay_s=60.0)
    )
    """Waits after transient RPC or IPFS errors (exponential, jittered)."""
    work_dir: Path | None = None
    """Where outputs are fetched to (always emptied); default: beside the state file."""

    def __post_init__(self) -> None:
        if self.fetch_attempts < 1:
            raise ValueError(f"fetch_attempts must be >= 1, got {self.fetch_attempts}")
        for name in ("fetch_timeout_s", "spec_timeout_s", "poll_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.retry_delay_s < 0 or self.window_margin_s < 0:
            raise ValueError("retry_delay_s and window_margin_s must be >= 0")
        if self.max_output_bytes < 1:
            raise ValueError(f"max_output_bytes must be >= 1, got {self.max_output_bytes}")


@dataclass(frozen=True)
class Decision:
    """What the mediator concluded about one job attempt (one log line each)."""

    job_id: bytes
    attempt: int
    kind: str
    verdict: str  # "upheld", "not upheld" or "no ruling"
    reason: str
    tx_hash: str | None = None

    @property
    def upheld(self) -> bool | None:
        return {"upheld": True, "not upheld": False}.get(self.verdict)


class _Outcome(Enum):
    INTACT = "intact"  # the output is intact
    FAIL = "fail"  # the output fails for a reason that is the provider's
    UNSURE = "unsure"  # the check cannot say whose fault it is: never rule on it
    RETRY = "retry"  # try again later


@dataclass(frozen=True)
class _Check:
    outcome: _Outcome
    reason: str
    tried: bool = False  # a retry that counts as one "unreachable" try against the provider


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class Mediator:
    """Follows one escrow and rules, with ``account``, on the jobs that name it.

    Drive it with :meth:`poll_once` (one pass: new events, then the checks due) or
    :meth:`run_forever` / :meth:`start` (a loop that never raises). State lives in
    ``state_path``; a restart resumes from its cursor and never rules on a job attempt twice.
    """

    def __init__(
        self,
        client: EscrowClient,
        account: LocalAccount,
        ipfs: IpfsStore,
        state_path: Path,
        config: MediatorConfig | None = None,
    ) -> None:
        self.config = config or MediatorConfig()
        self.client = client
        self.account = account
        self.address = to_checksum_address(account.address)
        self.ipfs = ipfs
        operator = to_checksum_address(client.call("operator"))
        if operator == self.address:
            raise MediatorError(
                f"{self.address} is the escrow's operator: the mediator needs its own key"
            )
        if not client.call("isListedMediator", self.address):
            log.warning(
                "mediator %s is not listed on escrow %s: only jobs that name it anyway "
                "(none can, unless it is their submitter) will be ruled on",
                self.address,
                client.address,
            )
        self.challenge_window = int(client.call("challengeWindow"))
        self.mediation_window = int(client.call("mediationWindow"))
        self.state = MediatorState(
            state_path, escrow=client.address, chain_id=client.deployment.chain_id
        )
        self.work_dir = self.config.work_dir or state_path.with_name(state_path.name + ".work")
        self.watcher = ChainWatcher(
            client,
            self.state,
            self._sink,
            confirmations=self.config.confirmations,
            batch_blocks=self.config.batch_blocks,
            poll_interval_s=self.config.poll_interval_s,
        )
        self.counters: Counter[str] = Counter()
        """Events folded, jobs ignored, events refused, checks by verdict, rulings..."""
        self.decisions: list[Decision] = []
        """This process's decisions, in order."""
        self._spec_caps: dict[bytes, int] = {}
        self._errors: dict[tuple[bytes, int, str], Any] = {}
        self._probe: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def connect(
        cls,
        rpc_url: str,
        deployment: Deployment | Path,
        key: str,
        ipfs_api: str,
        state_path: Path,
        config: MediatorConfig | None = None,
    ) -> Mediator:
        """A mediator for the escrow in ``deployment`` (a file or a loaded one)."""
        if isinstance(deployment, Path):
            deployment = Deployment.load(deployment)
        client = EscrowClient.connect(rpc_url, deployment)
        ipfs = IpfsStore(ipfs_api)
        try:
            return cls(client, Account.from_key(key), ipfs, state_path, config)
        except BaseException:
            ipfs.close()
            raise

    # ------------------------------------------------------------------ running
    def poll_once(self) -> list[Decision]:
        """Fold the new events, then run the checks that are due; the decisions made.

        Raises what the event poll raised (RPC down); the checks handle their own errors.
        """
        before = len(self.decisions)
        self.watcher.poll_once()
        self.work()
        return self.decisions[before:]

    def run_forever(self, stop: threading.Event) -> None:
        """Poll and check until ``stop`` is set; never raises (failures wait with backoff)."""
        log.info(
            "mediator %s on escrow %s (chain %d) from block %s, state %s",
            self.address,
            self.client.address,
            self.client.deployment.chain_id,
            self.state.load(),
            self.state.path,
        )
        delays = self.config.error_backoff.delays()
        failing = 0
        while not stop.is_set():
            wait = self.config.poll_interval_s
            try:
                self.watcher.poll_once()
                if failing:
                    log.warning("mediator: event poll recovered after %d failures", failing)
                failing = 0
                delays = self.config.error_backoff.delays()
            except Exception as exc:
                failing += 1
                wait = next(delays)
                if failing == 1 or failing % 20 == 0:
                    log.warning("mediator: event poll failed (%d): %s", failing, describe(exc))
            try:
                self.work(stop)
            except Exception:
                log.exception("mediator: the checks failed; trying again")
            stop.wait(wait)
        log.info("mediator stopped at block %s", self.state.load())

    def start(self) -> threading.Thread:
        """Run :meth:`run_forever` in a daemon thread until :meth:`stop`."""
        if self._thread is not None and self._thread.is_alive():
            return self._thread
        self._stop.clear()
        self._thread = threading.Thread(
            target=self.run_forever, args=(self._stop,), name="mediator", daemon=True
        )
        self._thread.start()
        return self._thread

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def close(self) -> None:
        """Stop the thread if any, close the state file and the IPFS client."""
        self.stop()
        self.state.close()
        self.ipfs.close()
        if self._probe is not None:
            self._probe.close()

    def __enter__(self) -> Mediator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ events
    def _sink(self, events: list[Event], through: int) -> None:
        """Fold ``events`` and move the cursor to ``through``, in one transaction. An event that
        does not fold is logged, counted and skipped: no event stops the mediator."""
        with self.state.batch():
            for event in events:
                try:
                    self._fold(event)
                except sqlite3.Error:
                    raise  # the state file, not the event: roll back, poll again
                except Exception as exc:
                    self.counters["events_refused"] += 1
                    log.error(
                        "mediator: skipping %s in tx %s log %d (block %d): %s",
                        event.name,
                        event.tx_hash,
                        event.log_index,
                        event.block,
                        _one_line(repr(exc))[:300],
                    )
            self.state.set_cursor(through)

    def _fold(self, event: Event) -> None:
        if event.name not in JOB_EVENTS:
            return
        job_id = bytes(event.args["jobId"])
        known: JobState | None = None
        if event.name == "JobCreated":
            if to_checksum_address(event.args["mediator"]) != self.address:
                self.counters["jobs_ignored"] += 1
                return
            state = apply_event(self.state.job(job_id), event.name, event.args)
            self.counters["jobs_followed"] += 1
        else:
            known = self.state.job(job_id)  # the state before this event
            if known is None:
                return  # another mediator's job
            state = apply_event(known, event.name, event.args)
        self.state.put_job(state)
        self.counters["events_folded"] += 1
        attempt = state.job.attempt
        if event.name == "ResultSubmitted":
            self.state.add_task(job_id, attempt, CHECK, time.time())
        elif event.name == "ResultDisputed":
            self.state.add_task(job_id, attempt, DISPUTE, time.time())
        elif event.name == "Ruled":
            ruled = int(event.args["attempt"])
            upheld = bool(event.args["upheld"])
            prior = self.state.ruling(job_id, ruled)
            reason = prior.reason if prior else "ruled (seen on chain)"
            self.state.record_ruling(job_id, ruled, upheld, reason, "confirmed", event.tx_hash)
            if prior is not None and prior.outcome == "sending":
                # sent, but the answer was lost (or the process died): the chain says it landed
                kind = DISPUTE if known is not None and known.status is Status.DISPUTED else CHECK
                self._log_decision(
                    Decision(
                        job_id,
                        ruled,
                        kind,
                        "upheld" if upheld else "not upheld",
                        f"{reason} (confirmed by its Ruled event)",
                        event.tx_hash,
                    ),
                    known.job.provider if known is not None else "?",
                )

    # ------------------------------------------------------------------ checks
    def work(self, stop: threading.Event | None = None) -> int:
        """Run every check that is due; the number run. Errors put a check back with backoff."""
        done = 0
        for task in self.state.due_tasks(time.time()):
            if stop is not None and stop.is_set():
                break
            key = (task.job_id, task.attempt, task.kind)
            try:
                self._handle(task)
                self._errors.pop(key, None)
            except sqlite3.Error:
                raise
            except Exception as exc:
                delays = self._errors.setdefault(key, self.config.error_backoff.delays())
                delay = next(delays)
                self.counters["errors"] += 1
                note = f"error, again in {delay:.1f} s: {describe(exc)}"
                self.state.retry_task(task, time.time() + delay, note, tried=False)
                if is_transient(exc):
                    log.warning("mediator: job 0x%s %s: %s", task.job_id.hex(), task.kind, note)
                else:
                    log.error(
                        "mediator: job 0x%s %s: %s",
                        task.job_id.hex(),
                        task.kind,
                        note,
                        exc_info=exc,
                    )
            done += 1
        return done

    def _handle(self, task: Task) -> None:
        state = self.state.job(task.job_id)
        if state is None:
            self.state.finish_task(task, "unknown job")
            return
        want = Status.SUBMITTED if task.kind == CHECK else Status.DISPUTED
        if state.job.attempt != task.attempt or state.status is not want:
            self.state.finish_task(
                task, f"moot: the job is {state.status.name} at attempt {state.job.attempt}"
            )
            return
        prior = self.state.ruling(task.job_id, task.attempt)
        if prior is not None and prior.outcome in ("sent", "confirmed"):
            self.state.finish_task(task, f"already ruled: {prior.outcome}")
            return
        # a ruling the escrow refused (the job moved on, e.g. disputed meanwhile) blocks nothing
        now = self._chain_now()
        if task.kind == CHECK:
            closes = state.job.since + self.challenge_window
            if now >= closes - self.config.window_margin_s:
                self._decide(
                    task,
                    state,
                    None,
                    f"the challenge window closes at {closes} (now {now}) before a ruling "
                    "could be mined",
                )
                return
        else:
            closes = state.job.disputed_at + self.mediation_window
        if prior is not None and prior.outcome == "sending":  # the send did not go through
            self._rule(task, state, prior.upheld, prior.reason)
            return
        check = self._check(state, task, now, closes)
        if check.outcome is _Outcome.RETRY:
            due = time.time() + self.config.retry_delay_s
            self.state.retry_task(task, due, check.reason, tried=check.tried)
            log.info(
                "mediator: job 0x%s attempt %d %s: checking again in %g s: %s",
                task.job_id.hex(),
                task.attempt,
                task.kind,
                self.config.retry_delay_s,
                check.reason,
            )
        elif check.outcome is _Outcome.FAIL:
            self._rule(task, state, False, check.reason)
        elif check.outcome is _Outcome.INTACT and task.kind == DISPUTE:
            self._rule(task, state, True, check.reason)
        elif check.outcome is _Outcome.INTACT:
            self._decide(task, state, None, f"{check.reason}; paid after the challenge window")
        else:
            self._decide(task, state, None, f"cannot conclude: {check.reason}")

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

    def _cap(self, state: JobState) -> tuple[int, str | None]:
        """The byte cap to check the output with, and None if it is the job spec's own cap
        (else why not: then an output over it is no proof against the provider)."""
        limit = self.config.max_output_bytes
        cached = self._spec_caps.get(state.job_id)
        if cached is None:
            if state.spec_problem:
                return limit, f"the job spec CID is unusable: {state.spec_problem}"
            try:
                data = self.ipfs.cat(
                    state.spec_cid, max_bytes=MAX_SPEC_BYTES, timeout_s=self.config.spec_timeout_s
                )
                cached = JobSpec.from_bytes(data).limits.output_max_bytes
            except Exception as exc:
                return limit, f"job spec {state.spec_cid} not read: {_one_line(str(exc))[:200]}"
            self._spec_caps[state.job_id] = cached
        if cached > limit:
            return limit, f"the job spec allows {cached} bytes, this mediator fetches {limit}"
        return cached, None

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

    # ------------------------------------------------------------------ rulings
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
    ) -> None:
        verdict = "no ruling" if upheld is None else "upheld" if upheld else "not upheld"
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
