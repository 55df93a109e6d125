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

This module is the mediator's loop: following the chain (events folded into the state file,
reorgs rolled back) and running each due task through its kind's handler
(:mod:`mediator.tasks`). The roles it hands work to are mixins, one module each, over
:class:`mediator.core.MediatorBase`: :mod:`mediator.rulings` (``rule``, never twice),
:mod:`mediator.checks` (integrity), :mod:`mediator.reruns` (re-runs of disputes),
:mod:`mediator.tiebreaks` (a dispute's second re-run, a replicated job's tie) and
:mod:`mediator.spot` (spot draws and reveals).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils.address import to_checksum_address
from hexbytes import HexBytes
from web3.exceptions import TransactionNotFound

from gridmarket.chain import Deployment, EscrowClient, Event
from gridmarket.escrow import (
    FLAG_SPOT,
    JOB_EVENTS,
    JobState,
    Status,
    apply_event,
    assign_target,
    seat_ids,
)
from gridmarket.ipfs import IpfsStore
from gridmarket.retry import describe, is_transient
from gridmarket.watcher import ChainWatcher
from gridmarket.wire import JobSpec
from mediator.core import (
    Decision,
    MediatorConfig,
    MediatorError,
    _Draw,
    _one_line,
    _Outcome,
)
from mediator.reruns import FUNDED, FUNDING, HELD, RERUN_SALT_TAG
from mediator.rulings import seat_ruling_blocked
from mediator.spot import SpotChecks
from mediator.state import MediatorState, Task, pos_of
from mediator.tasks import HANDLERS, Kind

__all__ = ["RERUN_SALT_TAG", "Decision", "Mediator", "MediatorConfig", "MediatorError"]

log = logging.getLogger(__name__)


class Mediator(SpotChecks):
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
            if state.job.replicas:  # a seat is ruled on until the mediation window after its
                closes = state.job.deadline + self.mediation_window  # deadline (version 5)
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
        elif check.outcome is _Outcome.FAIL and state.job.replicas:
            self._seat_failed(task, state, now, check.reason)
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

    def _seat_failed(self, task: Task, state: JobState, now: int, reason: str) -> None:
        """A seat's result failed its check: ruled wrong once the escrow takes a ruling on the
        seat (every seat delivered or the deadline passed, and no majority; until
        ``deadline + mediationWindow``), checked again later while a seat still runs, and left
        to ``resolve`` when the seats' results hold a majority (it slashes a seat that
        disagrees with it)."""
        seats = self._seats_now(state)
        _, i = assign_target(state)
        blocked = seat_ruling_blocked(seats, i, now, self.mediation_window)
        if blocked is None:
            self._rule(task, seats[i], False, reason, seats)
        elif blocked[0] == "pending":
            self.state.retry_task(
                task,
                time.time() + self.config.rerun_poll_s,
                f"{reason}; to be ruled wrong once the seats may be ruled: {blocked[1]}",
                tried=False,
            )
        else:
            self._decide(task, state, None, f"{reason}; no ruling on the seat: {blocked[1]}")
