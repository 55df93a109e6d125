"""The provider daemon: register, heartbeat, long-poll for work, run it, report it, shut down clean.

Threads (all waiting on events or sockets, never spinning):

``main``       :meth:`Agent.run`: registers, starts the others, waits for a stop signal, then
               drives the shutdown.
``poll``       long-polls ``next-job`` whenever a slot is free. Each offer is checked against the
               node's acceptance policy (:mod:`agent.acceptance`): declined, it is handed back
               with the reason logged; accepted, the node signs the EIP-712 acceptance and posts
               it, and starts a worker only when the scheduler answers ``accepted: true``.
``heartbeat``  on its own schedule (the scheduler's interval, or the configured override):
               reports the running jobs (their leases are renewed) and cancels the runs the
               scheduler says are no longer this node's.
``job-<id>``   one per running job: :meth:`agent.runner.JobRunner.run`.
``reporter``   sends finished results in order, retrying with backoff until the scheduler
               answers: a result is never dropped while the process lives (only a definite
               4xx refusal, e.g. the job was reassigned meanwhile, discards it).
``result-guard`` (with a chain) puts a succeeded result on-chain from the node's wallet when the
               scheduler has not relayed it in time (:class:`agent.onchain.ResultGuard`).
``finalize``   (with a chain) every ``finalize_interval_s``: ``finalize`` this wallet's results
               whose challenge window passed (:class:`agent.onchain.Finalizer`).

Outages: scheduler errors (unreachable, 5xx) back off with full jitter and resume; an expired
token re-registers (:class:`agent.client.NodeSession`); while the local IPFS daemon does not
answer the agent takes no new work. Jobs whose results are not yet delivered stay in the
heartbeat's running list, so their leases survive a scheduler restart.

Shutdown (SIGTERM/SIGINT, or :meth:`Agent.stop`): stop polling; let running jobs finish for
``stop_grace_s``; cancel the rest and hand them back; flush the results for up to
``report_flush_s``; exit 0. A second signal skips the grace period.

Length: about 570 lines, over the 500 the project aims for. The threads above share one
lock and one set of jobs; splitting them by thread is issue 30's open work.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING

from agent.acceptance import AcceptancePolicy, Decision, acceptance_request
from agent.client import (
    Backoff,
    NodeSession,
    NodeSessionError,
    SchedulerRejectedError,
    SchedulerUnavailableError,
    retry_call,
)
from agent.logship import LogShipper, LogShipperSettings
from agent.runner import JobRunner
from gridmarket.checkpoints import CheckpointReport
from gridmarket.wire import Assignment, RegisterResponse, ResultReport, RunReason

if TYPE_CHECKING:
    from agent.onchain import ResultGuard

__all__ = ["Agent"]

log = logging.getLogger(__name__)

MAX_RUNNING_REPORTED = 64  # HeartbeatRequest.running


# --------------------------------------------------------------------------- the daemon


@dataclass
class _Job:
    assignment: Assignment
    cancel: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    accepted_at: float = field(default_factory=time.monotonic)  # the acceptance was taken
    revoked: bool = False  # the scheduler said it is no longer ours: drop the result
    handing_back: bool = False  # cancelled by the shutdown: give it back, do not report

    @property
    def job_id(self) -> str:
        return self.assignment.job_id


class Agent:
    """The pull loop of one node. :meth:`run` blocks until :meth:`stop` (or a signal)."""

    def __init__(
        self,
        client: NodeSession,
        runner: JobRunner,
        *,
        slots: int = 1,
        poll_wait_s: float = 20.0,
        heartbeat_interval_s: float | None = None,
        stop_grace_s: float = 60.0,
        report_flush_s: float = 30.0,
        backoff: Callable[[], Backoff] = Backoff,
        storage_alive: Callable[[], bool] | None = None,
        on_registered: Callable[[RegisterResponse], None] | None = None,
        submit_on_chain: Callable[[str, ResultReport], str | None] | None = None,
        policy: Callable[[Assignment], Decision] | None = None,
        guard: ResultGuard | None = None,
        finalize: Callable[[], object] | None = None,
        finalize_interval_s: float = 300.0,
        live_logs: LogShipperSettings | None = None,
    ) -> None:
        self.client = client
        self.live_logs = live_logs or LogShipperSettings()  # caps of the jobs' live logs
        self._submit_on_chain = submit_on_chain
        default = AcceptancePolicy(client.account.address, expected=self._expected)
        self._policy = policy or default.decide
        self._guard = guard
        self._finalize = finalize
        self.finalize_interval_s = finalize_interval_s
        self.runner = runner
        self.slots = slots
        self.poll_wait_s = poll_wait_s
        self.heartbeat_override = heartbeat_interval_s
        self.stop_grace_s = stop_grace_s
        self.report_flush_s = report_flush_s
        self._backoff = backoff
        self._storage_alive = storage_alive
        self._on_registered = on_registered

        self._lock = threading.Condition()
        self._jobs: dict[str, _Job] = {}
        self._unreported: dict[str, ResultReport] = {}
        self._reports: queue.Queue[str | None] = queue.Queue()
        self._stop = threading.Event()  # stop taking work
        self._hurry = threading.Event()  # a second signal: no grace period
        self._abort_reports = threading.Event()  # the flush time is over
        self._heartbeat_wake = threading.Event()
        self._heartbeat_stop = threading.Event()
        self._storage_suspect = storage_alive is not None  # checked before the first poll
        self.ready = threading.Event()  # registered and serving (for tests and status)
        self.completed = 0  # results delivered or runs handed back
        self.declined = 0  # offers refused by the policy or withdrawn by the scheduler

    # ------------------------------------------------------------------ control

    def stop(self, *, immediate: bool = False) -> None:
        """Ask the daemon to stop (thread- and signal-safe). ``immediate``: no grace period."""
        if immediate:
            self._hurry.set()
        self._stop.set()
        with self._lock:
            self._lock.notify_all()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._stop.is_set():
            log.warning("%s again: cancelling the running jobs now", name)
            self.stop(immediate=True)
        else:
            log.info("%s: stopping (running jobs get %.0f s to finish)", name, self.stop_grace_s)
            self.stop()

    @property
    def running(self) -> list[str]:
        """Job ids this node holds: running, or finished with the result not yet delivered."""
        with self._lock:
            ids = list(self._jobs) + [j for j in self._unreported if j not in self._jobs]
        return ids[:MAX_RUNNING_REPORTED]

    # ------------------------------------------------------------------ main

    def run(self, *, install_signals: bool = True) -> int:
        """Serve until stopped; 0 after a clean shutdown.

        Raises :class:`agent.client.SchedulerRejectedError` when the scheduler refuses the
        registration (bad signature, not a provider on-chain, not staked): a configuration
        problem that retrying cannot fix.
        """
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)
        removed = self.runner.clean_leftovers()
        if removed:
            log.info("removed %d job directories left by a previous run", removed)
        try:
            registration = retry_call(
                self.client.register, backoff=self._backoff(), stop=self._stop, what="registration"
            )
        except SchedulerUnavailableError:
            if self._stop.is_set():
                log.info("stopped before the scheduler could be reached")
                return 0
            raise
        if self._on_registered is not None:
            self._on_registered(registration)
        log.info(
            "serving as node %s: %d slot(s), executors %s",
            registration.node_id,
            self.slots,
            ", ".join(sorted(self.runner.kinds)),
        )
        heartbeat = _thread("heartbeat", self._heartbeat_loop)
        reporter = _thread("reporter", self._report_loop)
        poller = _thread("poll", self._poll_loop)
        if self._guard is not None:
            self._guard.start()
        finalizer = (
            _thread("finalize", self._finalize_loop)
            if self._finalize is not None and self.finalize_interval_s > 0
            else None
        )
        self.ready.set()
        self._stop.wait()
        self._shutdown(poller)
        self._reports.put(None)  # the reporter ends after the queue drains
        reporter.join(self.report_flush_s)
        if reporter.is_alive():
            self._abort_reports.set()
            reporter.join(30)
        with self._lock:
            lost = list(self._unreported)
        if lost:
            log.error("%d result(s) could not be delivered: %s", len(lost), ", ".join(lost))
        if self._guard is not None:
            self._guard.stop(flush_s=max(self.report_flush_s, 1.0))
        self._heartbeat_stop.set()
        self._heartbeat_wake.set()
        heartbeat.join(30)
        if finalizer is not None:
            finalizer.join(30)
        self.client.close()
        log.info("stopped")
        return 0

    def _shutdown(self, poller: threading.Thread) -> None:
        """Stop polling; running jobs get the grace period, then are cancelled and handed back."""
        with self._lock:
            jobs = list(self._jobs.values())
        if jobs:
            log.info("waiting up to %.0f s for %d running job(s)", self.stop_grace_s, len(jobs))
        deadline = time.monotonic() + self.stop_grace_s
        for job in jobs:
            while job.thread is not None and job.thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0 or self._hurry.is_set():
                    break
                job.thread.join(min(left, 0.5))
        with self._lock:
            jobs = list(self._jobs.values())
            for job in jobs:
                job.handing_back = True
                job.cancel.set()
        for job in jobs:
            log.info("job %s: cancelled by the shutdown, handing it back", _short(job.job_id))
        for job in jobs:
            if job.thread is not None:
                job.thread.join()
        poller.join(self.poll_wait_s + self.client.timeout_s + 5)

    # ------------------------------------------------------------------ poll

    def _poll_loop(self) -> None:
        backoff = self._backoff()
        while not self._stop.is_set():
            with self._lock:
                while len(self._jobs) >= self.slots and not self._stop.is_set():
                    self._lock.wait()
            if self._stop.is_set():
                break
            if self._storage_suspect and not self._wait_for_storage(backoff):
                break
            try:
                got = self.client.next_job(self.poll_wait_s)
            except SchedulerUnavailableError as exc:
                self._pause(backoff, exc, exc.retry_after)
                continue
            except SchedulerRejectedError as exc:
                if exc.status == 409:  # "offline: heartbeat first" (we were silent too long)
                    self._heartbeat_wake.set()
                elif exc.status == 404:  # the scheduler forgot us: register again
                    self._reregister()
                self._pause(backoff, exc)
                continue
            except NodeSessionError as exc:
                self._pause(backoff, exc)
                continue
            backoff.reset()
            if isinstance(got, float):
                self._stop.wait(got)
                continue
            if self._stop.is_set():
                log.info("job %s arrived during shutdown: handing it back", _short(got.job_id))
                self._hand_back(got.job_id)
                break
            if not self._accept(got):
                continue
            if self._stop.is_set():  # stopped while accepting: the shutdown would miss it
                log.info("job %s accepted during shutdown: handing it back", _short(got.job_id))
                self._hand_back(got.job_id)
                break
            self._start(got)

    def _expected(self) -> tuple[int, str] | None:
        """The chain and escrow of the scheduler this node registered with."""
        info = self.client.info()
        return info.chain_id, info.escrow

    def _accept(self, offer: Assignment) -> bool:
        """Check an offer against the policy; sign and send the acceptance. True: run it."""
        short = _short(offer.job_id)
        decision = self._policy(offer)
        if not decision.accept:
            log.info("job %s: declined (%s); handing it back", short, decision.reason)
            with self._lock:
                self.declined += 1
            self._hand_back(offer.job_id, count=False)
            return False
        request = acceptance_request(self.client.account, offer)
        left = max(1.0, offer.lease_expires_at - time.time())
        try:
            ack = retry_call(
                functools.partial(self.client.accept, offer.job_id, request),
                backoff=self._backoff(),
                stop=self._stop,
                deadline=time.monotonic() + left,
                what=f"acceptance of {short}",
            )
        except NodeSessionError as exc:
            log.warning("job %s: acceptance not delivered (%s); not running it", short, exc)
            with self._lock:
                self.declined += 1
            if isinstance(exc, SchedulerRejectedError):  # refused: give the offer back at once
                self._hand_back(offer.job_id, count=False)
            return False
        if not ack.accepted:
            log.info("job %s: the scheduler withdrew the offer: %s", short, ack.message or "-")
            with self._lock:
                self.declined += 1
            return False
        log.info("job %s: accepted (%s)", short, decision.reason)
        return True

    def _pause(self, backoff: Backoff, exc: Exception, hint: float | None = None) -> None:
        delay = max(backoff.next_delay(), hint or 0.0)
        log.warning("polling for work failed (%s); next try in %.1f s", exc, delay)
        self._stop.wait(delay)

    def _wait_for_storage(self, backoff: Backoff) -> bool:
        """Block until the IPFS daemon answers (False when stopped meanwhile)."""
        assert self._storage_alive is not None
        warned = False
        while not self._stop.is_set():
            if self._storage_alive():
                if warned:
                    log.info("the IPFS daemon answers again: taking work")
                self._storage_suspect = False
                backoff.reset()
                return True
            delay = backoff.next_delay()
            if not warned:
                log.warning("the IPFS daemon does not answer: taking no work until it does")
                warned = True
            self._stop.wait(delay)
        return False

    def _reregister(self) -> None:
        try:
            self.client.register()
        except NodeSessionError as exc:
            log.warning("registering again failed: %s", exc)

    def _start(self, assignment: Assignment) -> None:
        job = _Job(assignment)
        log.info(
            "job %s (attempt %d): %s %s",
            _short(job.job_id),
            assignment.attempt,
            assignment.spec.executor,
            assignment.spec.image or assignment.spec.module_cid,
        )
        with self._lock:
            self._jobs[job.job_id] = job
        job.thread = _thread(f"job-{job.job_id[2:10]}", lambda: self._work(job))

    # ------------------------------------------------------------------ work

    def _work(self, job: _Job) -> None:
        a = job.assignment
        try:
            # live logs: shipped while it runs, flushed (bounded wait) before the result
            with LogShipper(self.client.post_logs, a.job_id, a.attempt, self.live_logs) as ship:
                report = self.runner.run(
                    a,
                    job.cancel,
                    on_output=ship.feed,
                    on_checkpoint=lambda c: self._post_checkpoint(a.job_id, c),
                    on_note=ship.note,
                )
        except Exception:  # run() reports its own failures; this is a bug: keep serving
            log.exception("job %s: the runner crashed", _short(job.job_id))
            report = None
        handing_back = job.handing_back and (report is None or report.reason is RunReason.CANCELLED)
        if report is not None and self._guard is not None:
            # the chain decides whether it is still ours; the guard's clock is time.monotonic
            self._guard.watch(job.job_id, report, accepted=job.accepted_at)
        with self._lock:
            if report is not None and not job.revoked and not handing_back:
                self._unreported[job.job_id] = report
            del self._jobs[job.job_id]
            self._lock.notify_all()
        if report is not None and report.reason is RunReason.AGENT_ERROR:
            self._storage_suspect = self._storage_alive is not None
        if job.revoked:
            log.info("job %s: no longer ours (scheduler); result dropped", _short(job.job_id))
        elif handing_back:
            self._hand_back(job.job_id)
        elif report is not None:
            self._reports.put(job.job_id)
        else:
            self._hand_back(job.job_id)

    def _post_checkpoint(self, job_id: str, report: CheckpointReport) -> None:
        """Report a checkpoint (from the job's checkpoint thread): retried for a short while;
        a later checkpoint supersedes one that could not be reported."""
        retry_call(
            lambda: self.client.post_checkpoint(job_id, report),
            backoff=self._backoff(),
            deadline=time.monotonic() + 30.0,
            what=f"checkpoint {report.seq} of {_short(job_id)}",
        )

    def _hand_back(self, job_id: str, *, count: bool = True) -> None:
        deadline = time.monotonic() + max(self.report_flush_s, 1.0)
        try:
            retry_call(
                lambda: self.client.hand_back(job_id),
                backoff=self._backoff(),
                deadline=deadline,
                what=f"hand-back of {_short(job_id)}",
            )
        except NodeSessionError as exc:
            log.warning("job %s: hand-back failed (%s); its lease will expire", _short(job_id), exc)
            return
        if count:
            with self._lock:
                self.completed += 1
        log.info("job %s: handed back", _short(job_id))

    def _report_loop(self) -> None:
        while True:
            job_id = self._reports.get()
            if job_id is None:
                return
            with self._lock:
                report = self._unreported.get(job_id)
            if report is None:
                continue  # revoked meanwhile
            if self._submit_on_chain is not None:
                self._chain_submit(job_id, report)
            try:
                ack = retry_call(
                    functools.partial(self.client.report_result, job_id, report),
                    backoff=self._backoff(),
                    stop=self._abort_reports,
                    what=f"result of {_short(job_id)}",
                )
            except SchedulerUnavailableError as exc:
                log.error("job %s: result not delivered before exit (%s)", _short(job_id), exc)
                continue
            except SchedulerRejectedError as exc:
                log.warning("job %s: the scheduler refused the result: %s", _short(job_id), exc)
            except NodeSessionError as exc:
                log.warning("job %s: result sent, odd answer: %s", _short(job_id), exc)
            else:
                log.info(
                    "job %s: result %s delivered (%s)", _short(job_id), report.reason, ack.status
                )
            with self._lock:
                self.completed += 1
                self._unreported.pop(job_id, None)

    def _chain_submit(self, job_id: str, report: ResultReport) -> None:
        """``submitResult`` from this wallet, retried while the chain is unreachable; a refusal
        is logged and the scheduler still gets the report (it can relay the signed result)."""
        assert self._submit_on_chain is not None
        submit = self._submit_on_chain
        try:
            retry_call(
                functools.partial(submit, job_id, report),
                backoff=self._backoff(),
                stop=self._abort_reports,
                what=f"on-chain result of {_short(job_id)}",
                retry_on=(OSError, ConnectionError, TimeoutError),
            )
        except Exception as exc:
            log.warning("job %s: on-chain submission failed: %s", _short(job_id), _line(exc))

    # ------------------------------------------------------------------ finalize

    def _finalize_loop(self) -> None:
        assert self._finalize is not None
        while not self._heartbeat_stop.wait(self.finalize_interval_s):
            try:
                self._finalize()
            except Exception as exc:  # the chain unreachable: next round
                log.warning("finalizing this wallet's results failed: %s", _line(exc))

    # ------------------------------------------------------------------ heartbeat

    def _interval(self) -> float:
        if self.heartbeat_override is not None:
            return self.heartbeat_override
        registration = self.client.registration
        return registration.heartbeat_interval_s if registration is not None else 5.0

    def _heartbeat_loop(self) -> None:
        backoff = self._backoff()
        interval = self._interval()
        while not self._heartbeat_stop.is_set():
            self._heartbeat_wake.wait(interval)
            self._heartbeat_wake.clear()
            if self._heartbeat_stop.is_set():
                return
            try:
                answer = self.client.heartbeat(self.running, _load())
            except SchedulerRejectedError as exc:
                if exc.status == 404:
                    self._reregister()
                log.warning("heartbeat refused: %s", exc)
                interval = min(self._interval(), max(0.5, backoff.next_delay()))
                continue
            except NodeSessionError as exc:
                log.warning("heartbeat failed: %s", exc)
                interval = min(self._interval(), max(0.5, backoff.next_delay()))
                continue
            backoff.reset()
            self._cancel_revoked(answer.cancel)
            interval = self.heartbeat_override or answer.next_heartbeat_s

    def _cancel_revoked(self, job_ids: list[str]) -> None:
        with self._lock:
            for job_id in job_ids:
                job = self._jobs.get(job_id)
                if job is not None and not job.revoked:
                    log.warning("job %s: the scheduler took it back; cancelling", _short(job_id))
                    job.revoked = True
                    job.cancel.set()
                elif self._unreported.pop(job_id, None) is not None:
                    log.warning("job %s: the scheduler took it back; result dropped", job_id)


def _thread(name: str, target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # pragma: no cover - not on Linux
        return None


def _short(job_id: str) -> str:
    return job_id[:10]


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
