"""The mediator: an app beside the scheduler, with its own key, that rules on results of the
jobs naming it (docs/mediator.md).

It follows the escrow's events from the deployment block (:class:`gridmarket.watcher.ChainWatcher`
over a cursor kept in its own SQLite file, :mod:`mediator.state`), folds the jobs
whose ``job.mediator`` is its address with :func:`gridmarket.escrow.apply_event`, and owes each
of their results one integrity check (:func:`gridmarket.verify.verify_output`):

- a result just submitted (``check``): if the output fails for a reason that is the provider's
  (the CID does not decode or is not a UnixFS CID, its bytes hash to another CID, it is over the
  job spec's cap, or it stays unreachable over several tries within the challenge window), the
  mediator rules it wrong (``rule(false)``) before the window closes; if it passes, nothing is
  sent and the result is paid after the window by whoever finalizes it;
- a disputed result (``dispute``): checked again and ruled wrong if it fails. If it passes and
  the job is deterministic (``JobSpec.comparable``: WASM, or Docker pinned by digest and
  declared ``deterministic``), the mediator funds a **re-run** of the same spec through the
  market, as a submitter with its own key, naming itself mediator and excluding the disputed
  provider and the disputing submitter (``exclude_providers``). When the re-run's result is on
  chain it compares the two output CIDs as binary CIDs: the same, upheld; different (and the
  re-run's output intact), ruled wrong. It then releases the re-run so its provider is paid.
  A job that is not deterministic, or whose re-run cannot be had before the mediation window
  closes, is ruled on integrity alone (upheld), and the reason says so.

A check the mediator cannot conclude (its own IPFS daemon is down, the job's own cap is
unknown) never slashes anyone.

**Spot checks** (a job with ``FLAG_SPOT`` whose spec carries ``spot``, :mod:`gridmarket.spot`):
on each submitted result the mediator opens the seed sealed to its key and draws the attempt;
a drawn attempt whose output does not fail its integrity check outright is disputed by the
mediator itself (``dispute``, sending nothing: the check deposit was locked at funding), and the
dispute path above re-runs and rules it. A seed that does not open or match the commitment (the
submitter's mistake) means no check. Once the job is settled the seed is revealed to the
scheduler (``POST API.SPOT``), never before.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

import httpx
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak
from hexbytes import HexBytes
from web3.exceptions import TransactionNotFound

from gridmarket import spot as spot_draw
from gridmarket.chain import ChainError, Deployment, EscrowClient, Event
from gridmarket.cid import CidError, same_cid
from gridmarket.escrow import (
    FLAG_SPOT,
    JOB_EVENTS,
    ZERO_ADDRESS,
    InvalidText,
    JobState,
    Status,
    Terms,
    apply_event,
    seat_ids,
)
from gridmarket.escrow import job_id as escrow_job_id
from gridmarket.ipfs import IpfsStore
from gridmarket.retry import RetryPolicy, describe, is_transient
from gridmarket.token import TokenClient
from gridmarket.verify import VerdictCode, verify_output
from gridmarket.watcher import ChainWatcher
from gridmarket.wire import API, MAX_EXCLUDED, MAX_SPEC_BYTES, JobLimits, JobSpec, SpotReveal
from mediator.state import MediatorState, Rerun, SpotSeed, Task, pos_of
from mediator.tasks import HANDLERS, Kind

__all__ = [
    "Decision",
    "Mediator",
    "MediatorConfig",
    "MediatorError",
]

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
    rerun: bool = True
    """Re-run a disputed deterministic job on another provider and compare outputs (else
    every dispute is ruled on integrity alone)."""
    rerun_min_s: float = 60.0
    """A re-run is funded only if at least this long is left before the mediation window
    closes (less ``window_margin_s``); else the dispute is ruled on integrity."""
    rerun_poll_s: float = 5.0
    """How often a dispute waiting for its re-run looks at the re-run's state."""
    rerun_max_bounty_wei: int | None = None
    """The most this mediator pays for one re-run of a job paid in ETH (it offers the disputed
    job's own bounty, the price the market already accepted); None: no cap. Over it: integrity
    only."""
    rerun_max_bounty_token: int | None = None
    """The same for a job paid in an ERC-20 token (escrow v4): the re-run is paid in the job's
    token, from this mediator's own balance of it (a permit in the same transaction), so the cap
    is in that token's smallest units, whatever the token; None: no cap."""
    scheduler_url: str | None = None
    """Where a settled spot job's seed is revealed (``POST {scheduler_url}/v1/jobs/{id}/spot``);
    None: seeds are kept in the state file, revealed by nobody but the submitter."""
    reveal_retry_s: float = 60.0
    """Wait before posting a reveal again (the scheduler down, or not yet aware that the job
    is settled)."""
    reveal_attempts: int = 30
    """Reveals the scheduler answers "unknown job" before the mediator gives up on it."""

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
        if self.rerun_min_s < 0 or self.rerun_poll_s <= 0:
            raise ValueError("rerun_min_s must be >= 0 and rerun_poll_s > 0")
        if self.reveal_retry_s <= 0 or self.reveal_attempts < 1:
            raise ValueError("reveal_retry_s must be > 0 and reveal_attempts >= 1")


@dataclass(frozen=True)
class Decision:
    """What the mediator concluded about one job attempt (one log line each)."""

    job_id: bytes
    attempt: int
    kind: Kind
    verdict: str  # "upheld", "not upheld", "no ruling" or "disputed" (a spot check opened)
    reason: str
    tx_hash: str | None = None

    @property
    def upheld(self) -> bool | None:
        return {"upheld": True, "not upheld": False}.get(self.verdict)


@dataclass(frozen=True)
class _Draw:
    """A spot job attempt's draw: checked or not, and the words the decision line carries."""

    drawn: bool
    note: str
    retry: bool = False  # the spec could not be read yet: try again (within the window)


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
        self._key = bytes(account.key)  # opens the spot seeds sealed to this mediator
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
        self.min_duration = int(client.call("minDuration"))
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
            reorgs=self,
        )
        self.counters: Counter[str] = Counter()
        """Events folded, jobs ignored, events refused, checks by verdict, rulings..."""
        self.decisions: list[Decision] = []
        """This process's decisions, in order."""
        self._specs: dict[bytes, JobSpec] = {}
        self._errors: dict[tuple[bytes, int, str], Any] = {}
        self._probe: Any = None
        self._http: httpx.Client | None = None
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
        if self._http is not None:
            self._http.close()

    def __enter__(self) -> Mediator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ reorgs
    def checkpoints(self) -> list[tuple[int, str]]:
        """The watcher's reorg checkpoints (:class:`scheduler.chain.ReorgStore`)."""
        return self.state.checkpoints()

    def rollback(self, fork_block: int, read: Any) -> list[str]:
        """Undo what a reorg removed (:meth:`MediatorState.rollback`); this mediator's own
        transactions after the fork may be gone too, so its nonce is read from the chain again."""
        changed = self.state.rollback(fork_block, read)
        self.client.forget_nonce(self.address)
        self.counters["reorgs"] += 1
        return changed

    # ------------------------------------------------------------------ events
    def _sink(self, events: list[Event], through: int, block_hash: str | None = None) -> None:
        """Fold ``events`` and move the cursor to ``through`` (keeping ``block_hash``, its hash,
        as a reorg checkpoint), in one transaction. An event that does not fold is logged,
        counted and skipped: no event stops the mediator."""
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
            if block_hash is not None:
                self.state.set_checkpoint(through, block_hash)

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
        created = event.block if event.name == "JobCreated" else None
        self.state.put_job(state, pos_of(event.block, event.log_index), created)
        self.counters["events_folded"] += 1
        attempt = state.job.attempt
        if event.name == "ResultSubmitted":
            self.state.add_task(job_id, attempt, Kind.CHECK, time.time())
        elif state.status.terminal and state.job.flags & FLAG_SPOT:
            self.state.add_task(job_id, 0, Kind.REVEAL, time.time())  # settled: reveal its seed
        elif event.name == "ResultDisputed":
            self.state.add_task(job_id, attempt, Kind.DISPUTE, time.time())
        elif event.name == "Ruled":
            ruled = int(event.args["attempt"])
            upheld = bool(event.args["upheld"])
            prior = self.state.ruling(job_id, ruled)
            reason = prior.reason if prior else "ruled (seen on chain)"
            self.state.record_ruling(job_id, ruled, upheld, reason, "confirmed", event.tx_hash)
            if prior is not None and prior.outcome == "sending":
                # sent, but the answer was lost (or the process died): the chain says it landed
                disputed = known is not None and known.status is Status.DISPUTED
                kind = Kind.DISPUTE if disputed else Kind.CHECK
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
        try:
            self._lost_rulings()
        except Exception as exc:  # the node: try again at the next poll
            log.warning("mediator: could not look up its sent rulings: %s", describe(exc))
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

    def _lost_rulings(self) -> None:
        """A ruling sent (mined: its receipt came back) whose ``Ruled`` event never folded in,
        while the job is still open at that attempt, may have been reorged out before this
        mediator saw it: if the node knows the transaction neither mined nor pending, the ruling
        is decided again (the escrow refuses a second one should the first come back)."""
        for ruling in self.state.sent_rulings():
            state = self.state.job(ruling.job_id)
            kind = {Status.SUBMITTED: Kind.CHECK, Status.DISPUTED: Kind.DISPUTE}.get(
                state.status if state is not None else Status.NONE
            )
            if state is None or kind is None or state.job.attempt != ruling.attempt:
                continue  # moved on: the Ruled event folds in (or the job is gone)
            if ruling.tx_hash is None or self._known_tx(ruling.tx_hash):
                continue
            note = f"its ruling {ruling.tx_hash} is no longer on the chain (reorg): decided again"
            log.warning(
                "mediator: job 0x%s attempt %d: %s", ruling.job_id.hex(), ruling.attempt, note
            )
            self.client.forget_nonce(self.address)
            self.state.decide_again(ruling.job_id, ruling.attempt, kind, note)
            self.counters["rulings_lost"] += 1

    def _known_tx(self, tx_hash: str) -> bool:
        """Whether the node has the transaction, mined or in its pool."""
        for lookup in (
            self.client.w3.eth.get_transaction_receipt,
            self.client.w3.eth.get_transaction,
        ):
            try:
                lookup(HexBytes(tx_hash))
                return True
            except TransactionNotFound:
                continue
        return False

    def _handle(self, task: Task) -> None:
        """Run a due task through its kind's handler (:data:`mediator.tasks.HANDLERS`; the moves
        each may make: :data:`mediator.tasks.TABLE`)."""
        state = self.state.job(task.job_id)
        if state is None:
            self.state.finish_task(task, "unknown job")
            return
        handler: Callable[[Task, JobState], None] = getattr(self, HANDLERS[task.kind])
        handler(task, state)

    def _result(self, task: Task, state: JobState) -> None:
        """A ``check`` (a submitted result within its window) or a ``dispute`` (a disputed
        result): moot, already ruled, or checked, then ruled, re-run, drawn or left alone."""
        if task.kind == Kind.DISPUTE and (own := self.state.rerun_by_id(task.job_id)) is not None:
            # this mediator disputed its own re-run to hold it: the tie-break rules on it
            self.state.finish_task(
                task, f"this mediator's own re-run of job 0x{own.job_id.hex()}: its tie-break rules"
            )
            return
        want = Status.SUBMITTED if task.kind == Kind.CHECK else Status.DISPUTED
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
        draw: _Draw | None = None
        if task.kind == Kind.CHECK:
            closes = state.job.since + self.challenge_window
            late = now >= closes - self.config.window_margin_s
            if state.job.flags & FLAG_SPOT and prior is None:
                draw = self._draw(state)
                if draw.retry and not late:
                    self.state.retry_task(
                        task, time.time() + self.config.retry_delay_s, draw.note, tried=False
                    )
                    return
            if late:
                self._decide(
                    task,
                    state,
                    None,
                    f"the challenge window closes at {closes} (now {now}) before a ruling "
                    "could be mined" + (f"; {draw.note}" if draw is not None else ""),
                )
                return
        else:
            closes = state.job.disputed_at + self.mediation_window
        if prior is not None and prior.outcome == "sending":  # the send did not go through
            self._rule(task, state, prior.upheld, prior.reason)
            return
        if task.kind == Kind.DISPUTE:
            rerun = self.state.rerun(task.job_id, task.attempt)
            if rerun is not None and rerun.status == HELD:  # run 1 differed: the tie-break
                self._follow_tie_break(task, state, rerun, now, closes)
                return
            if rerun is not None and rerun.status in (FUNDING, FUNDED):
                # the output passed its integrity check when the re-run was funded
                self._follow_rerun(task, state, rerun, now, closes)
                return
        check = self._check(state, task, now, closes)
        if check.outcome is _Outcome.RETRY and not (draw is not None and draw.drawn):
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
            note = f"; {draw.note}" if draw is not None else ""
            self._rule(task, state, False, check.reason + note)
        elif draw is not None and draw.drawn:  # intact or not known yet: the re-run judges it
            self._spot_check(task, state, draw, check.reason, now)
        elif check.outcome is _Outcome.INTACT and task.kind == Kind.DISPUTE:
            self._judge(task, state, now, closes, check.reason)
        elif check.outcome is _Outcome.INTACT and state.job.replicas:
            self._decide(task, state, None, f"{check.reason}; paid when the seats agree")
            first = seat_ids(state.salt, state.job.replicas)[0]
            self.state.add_task(first, 0, Kind.TIE, time.time())  # once per replicated job
        elif check.outcome is _Outcome.INTACT:
            note = f"; {draw.note}" if draw is not None else ""
            self._decide(
                task, state, None, f"{check.reason}; paid after the challenge window{note}"
            )
        else:
            note = f"; {draw.note}" if draw is not None else ""
            self._decide(task, state, None, f"cannot conclude: {check.reason}{note}")

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

    # ------------------------------------------------------------------ spot checks
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

    # ------------------------------------------------------------------ re-runs
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

    # ------------------------------------------------------------------ the tie-break
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

    # ------------------------------------------------------------------ replicated ties
    def _tie(self, task: Task, first: JobState) -> None:
        """A replicated job naming this mediator whose seats all have a result: with no
        majority among them, re-run the job on a provider none of the seats' and rule each
        seat against the re-run's output (agreeing: upheld and paid; different: wrong, its
        provider slashed and the seat offered again). No ruling when the re-run agrees with no
        seat: then nobody can tell who is right, and ``resolve`` refunds the open seats once
        the mediation window after the deadline has passed."""
        k = first.job.replicas
        seats = [self.state.job(i) for i in seat_ids(first.salt, k)]
        if any(s is None for s in seats):
            self.state.finish_task(task, "a seat of this replicated job is unknown here")
            return
        known = [s for s in seats if s is not None]
        now = self._chain_now()
        deadline = first.job.deadline
        if all(s.status.terminal for s in known):
            self.state.finish_task(task, "resolved")
            return
        if any(s.status in (Status.FUNDED, Status.ASSIGNED) for s in known):
            if now > deadline:
                self.state.finish_task(task, "seats without a result at the deadline")
            else:
                self.state.retry_task(
                    task, time.time() + self.config.rerun_poll_s, "seats still running", tried=False
                )
            return
        voters: dict[bytes, set[str]] = {}
        for s in known:
            if s.status in (Status.SUBMITTED, Status.RELEASED):
                voters.setdefault(s.job.result_digest, set()).add(s.job.provider)
        if any(2 * len(v) > k for v in voters.values()):
            self.state.finish_task(task, "a majority agrees: resolve pays it")
            return
        rerun = self.state.rerun(task.job_id, task.attempt)
        if rerun is None:
            self._tie_rerun(task, first, known, now)
            return
        if rerun.status == FUNDING:
            self._send_rerun(task, first, rerun, lambda why: self._tie_give_up(task, why))
            return
        if rerun.status != FUNDED:
            self.state.finish_task(task, f"re-run {rerun.status}: {rerun.note}")
            return
        mine = self.state.job(rerun.rerun_id)
        if mine is not None and self._tie_compare(task, known, rerun, mine):
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

    def _tie_rerun(self, task: Task, first: JobState, seats: list[JobState], now: int) -> None:
        """Fund the tie-break re-run: due well before the seats' deadline, so that a seat
        ruled wrong can still be run again by another provider."""
        if not self.config.rerun:
            self._tie_give_up(task, "re-runs are off on this mediator")
            return
        spec, why = self._spec(first)
        if spec is None or not spec.comparable:
            self._tie_give_up(task, why or "the job is not deterministic: a re-run cannot judge it")
            return
        left = first.job.deadline - now
        if left < 2 * max(self.config.rerun_min_s, self.min_duration + 10):
            self._tie_give_up(task, f"no time for a re-run: {left} s to the seats' deadline")
            return
        closes = now + left // 2 + int(self.config.window_margin_s)  # half the time left
        providers = tuple(s.job.provider for s in seats)
        self._fund_rerun(
            task, first, spec, closes, providers, lambda why: self._tie_give_up(task, why)
        )

    def _tie_compare(self, task: Task, seats: list[JobState], rerun: Rerun, mine: JobState) -> bool:
        """Rule every open seat against the re-run's result if it has a usable one (True)."""
        if mine.status not in (Status.SUBMITTED, Status.RELEASED) or mine.output_problem:
            return False
        ours = mine.output_cid
        if not isinstance(ours, str) or mine.job.provider in {s.job.provider for s in seats}:
            return False
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

        open_seats = [s for s in seats if s.status is Status.SUBMITTED]
        where = f"tie-break re-run 0x{rerun.rerun_id.hex()} by {mine.job.provider} gave {ours}"
        if not any(agrees(s) for s in seats if s.status in (Status.SUBMITTED, Status.RELEASED)):
            self.state.set_rerun(
                task.job_id, task.attempt, COMPARED, f"agrees with no seat: {where}"
            )
            self.state.finish_task(task, f"no ruling: {where}, which agrees with no seat")
            return True
        self.state.set_rerun(task.job_id, task.attempt, COMPARED, where)
        self.counters["ties_broken"] += 1
        for seat in open_seats:
            same = agrees(seat)
            seat_task = Task(seat.job_id, seat.job.attempt, Kind.TIE, 0, time.time(), "")
            reason = (
                f"{where}; this seat gave {seat.output_cid}: {'the same' if same else 'different'}"
            )
            self._rule(seat_task, seat, same, reason)
        self.state.finish_task(task, f"ruled {len(open_seats)} seats: {where}")
        if mine.status is Status.SUBMITTED:  # pay the re-run's provider now
            try:
                self.client.call_job(self.account, "release", mine)
            except ChainError as exc:
                log.warning("mediator: re-run 0x%s not released: %s", mine.job_id.hex(), exc)
        return True

    def _tie_give_up(self, task: Task, why: str) -> None:
        """No tie-break: the seats stay as they are (``resolve`` refunds them, slashing nobody,
        once the mediation window after the deadline has passed)."""
        self.counters["ties_not_broken"] += 1
        self.state.finish_task(task, f"no ruling: {why}"[:2000])
        log.info(
            "mediator: replicated job of seat 0x%s: tie not broken: %s", task.job_id.hex(), why
        )

    def _integrity_only(self, task: Task, state: JobState, intact: str | None, why: str) -> None:
        """Uphold a disputed result that passed integrity, saying why it was not re-run."""
        self.counters["integrity_only"] += 1
        reason = intact or "integrity ok when the re-run was funded"
        self._rule(task, state, True, f"{reason}; integrity only: {why}")

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
