"""The scheduler's moving parts behind the API: chain watcher, transaction outbox, job-spec
fetcher, result verifier, and the sweeper for heartbeats, leases and deadlines.

Every replica runs the API, the dispatcher and the sweeper. Exactly one replica, the *leader*,
runs the chain watcher, the outbox (the operator key's only sender, so nonces never collide),
the spec fetcher and the verifier. On PostgreSQL the leader holds a session advisory lock on a
dedicated connection; when it dies the lock goes with its connection and another replica takes
over within ``leader_retry_s``. On SQLite there is one replica and it leads.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from sqlalchemy import text

from gridmarket.chain import ChainError, Deployment, EscrowClient
from gridmarket.cid import CidError, bytes_cid, params_for
from gridmarket.escrow import Status
from gridmarket.ipfs import IpfsStore
from gridmarket.wire import MAX_SPEC_BYTES, JobSpec, RunReason, checksum
from scheduler.chain import (
    ChainUnavailableError,
    ChainWatcher,
    TxOutcomeUnknownError,
    TxSender,
)
from scheduler.settings import Settings
from scheduler.store import OutboxItem, Store
from scheduler.verify import verify_output

log = logging.getLogger(__name__)

LEADER_LOCK_KEY = 0x6D61726B6574  # "market"


@dataclass
class Worker:
    name: str
    fn: Callable[[threading.Event], None]
    thread: threading.Thread | None = None


class Grid:
    """Owns the store, the chain client and the background workers of one replica."""

    def __init__(self, settings: Settings, store: Store | None = None) -> None:
        self.settings = settings
        self.store = store or Store(settings.database_url)
        self.deployment = Deployment.load(Path(settings.deployment_file))
        self.chain = EscrowClient.connect(settings.rpc_url, self.deployment)
        key = settings.operator_key
        self.operator: LocalAccount | None = (
            Account.from_key(key.get_secret_value()) if key is not None else None
        )
        self.operator_address = checksum(str(self.chain.call("operator")))
        if self.operator is not None and self.operator.address != self.operator_address:
            raise ValueError(
                f"operator_key is for {self.operator.address}, but the escrow's operator is "
                f"{self.operator_address}"
            )
        self.fee_bps = int(self.chain.call("feeBps"))
        self.ipfs = IpfsStore(
            settings.ipfs_api,
            timeout=settings.ipfs_timeout_s,
            resolve_timeout=settings.verify_timeout_s,
        )
        self.is_leader = False
        self._stop = threading.Event()
        self._workers: list[Worker] = []
        self._leader_conn: Any = None
        self._wakes: dict[str, threading.Event] = {}
        self.counters: dict[str, int] = {}

    @property
    def chain_id(self) -> int:
        return self.deployment.chain_id

    @property
    def escrow(self) -> str:
        return self.deployment.escrow

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.store.migrate()
        cursor = self.store.chain_cursor()
        head = int(self.chain.w3.eth.block_number)
        if cursor is not None and cursor > head:
            raise RuntimeError(
                f"the database at {self.settings.database_url} has read the chain up to block "
                f"{cursor}, but {self.settings.rpc_url} is at block {head}: it belongs to "
                "another chain (a restarted devnet?). Use a fresh database."
            )
        self._workers = [
            Worker("sweeper", self._sweeper),
            Worker("leader", self._leader_loop),
        ]
        for w in self._workers:
            w.thread = threading.Thread(target=self._guard, args=(w,), name=w.name, daemon=True)
            w.thread.start()

    def stop(self) -> None:
        self._stop.set()
        for w in self._workers:
            if w.thread is not None:
                w.thread.join(timeout=10)
        if self._leader_conn is not None:
            try:
                self._leader_conn.close()
            except Exception:
                log.debug("closing the leader connection failed", exc_info=True)
        self.ipfs.close()
        self.store.close()

    def _guard(self, worker: Worker) -> None:
        while not self._stop.is_set():
            try:
                worker.fn(self._stop)
                return
            except Exception:
                log.exception("worker %s crashed; restarting in 1 s", worker.name)
                self._stop.wait(1.0)

    # ------------------------------------------------------------------ sweeper (all)
    def _sweeper(self, stop: threading.Event) -> None:
        s = self.settings
        # Nodes cannot reach a replica that is down. After a (re)start, give every node one full
        # node timeout to check in before judging silences and leases: a restarted scheduler
        # must not take running jobs away (and run them twice) for its own absence.
        judge_from = time.monotonic() + s.node_timeout_s
        while not stop.wait(s.sweep_interval_s):
            if time.monotonic() >= judge_from:
                gone = self.store.mark_offline(s.node_timeout_s)
                if gone:
                    log.info("nodes offline (silent > %.0f s): %s", s.node_timeout_s, gone)
                lost = self.store.expire_leases()
                if lost:
                    log.info("leases expired, jobs requeued: %s", lost)
            self.store.expire_deadlines()

    # ------------------------------------------------------------------ leadership
    def _try_lead(self) -> bool:
        if not self.store.postgres:
            return True
        try:
            if self._leader_conn is None:
                self._leader_conn = self.store.engine.connect()
            got = self._leader_conn.execute(
                text("SELECT pg_try_advisory_lock(:k)"), {"k": LEADER_LOCK_KEY}
            ).scalar()
            self._leader_conn.commit()
            return bool(got)
        except Exception:
            log.warning("leader election failed; will retry", exc_info=True)
            self._leader_conn = None
            return False

    def _leader_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if not self._try_lead():
                stop.wait(2.0)
                continue
            self.is_leader = True
            log.info(
                "replica %s leads: chain watcher, outbox, specs, verifier", self.settings.replica_id
            )
            threads = [
                threading.Thread(target=self._loop, args=(name, fn, period), name=name, daemon=True)
                for name, fn, period in (
                    ("watcher", self._watch_once, self.settings.chain_poll_s),
                    ("outbox", self._outbox_once, 0.25),
                    ("specs", self._specs_once, 0.5),
                    ("verifier", self._verify_once, 0.5),
                )
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return

    def _loop(self, name: str, fn: Callable[[], int], period: float) -> None:
        """Run ``fn`` until stopped: at once again when it did work, after ``period`` when
        idle, with exponential backoff (and jitter) while it keeps failing."""
        failures = 0
        while not self._stop.is_set():
            try:
                did = fn()
                failures = 0
            except Exception as exc:
                failures += 1
                delay = min(30.0, 0.5 * 2 ** min(failures, 6)) * (0.5 + random.random() / 2)  # noqa: S311
                log.warning("%s failed (%s); retrying in %.1f s", name, _line(exc), delay)
                self._stop.wait(delay)
                continue
            if not did:
                wake = self._wakes.setdefault(name, threading.Event())
                wake.wait(period)  # a wake-up (new work elsewhere in this process) cuts it short
                wake.clear()

    def wake(self, name: str) -> None:
        """Run the leader loop ``name`` (specs, outbox, verifier) now instead of at its next
        period; a no-op on a replica that does not lead. Safe from any thread."""
        event = self._wakes.get(name)
        if event is not None:
            event.set()

    # ------------------------------------------------------------------ chain watcher
    _watcher: ChainWatcher | None = None

    def _watch_once(self) -> int:
        if self._watcher is None:
            store = self.store

            class _Cursor:
                def load(self) -> int | None:
                    return store.chain_cursor()

            self._watcher = ChainWatcher(
                self.chain,
                _Cursor(),
                self._sink,
                confirmations=self.settings.confirmations,
                start_block=self.deployment.block,
            )
        return self._watcher.poll_once()

    def _sink(self, events: list[Any], through_block: int) -> None:
        created = self.store.apply_chain_events(events, through_block)
        if created:
            self.count("jobs_seen", created)
            self.wake("specs")

    # ------------------------------------------------------------------ outbox
    _sender: TxSender | None = None

    def _outbox_once(self) -> int:
        items = self.store.outbox_pending(limit=32)
        if not items:
            return 0
        if self.operator is None:
            raise RuntimeError("no operator_key configured: cannot send transactions")
        if self._sender is None:
            self._sender = TxSender(self.chain, self.operator)
        done = 0
        blocked: set[str] = set()
        for item in items:
            if item.job_id in blocked:
                continue  # keep each job's transactions in order
            try:
                self._send(self._sender, item)
                done += 1
            except (TxOutcomeUnknownError, ChainUnavailableError) as exc:
                self.store.outbox_retry(item.id, _line(exc))
                blocked.add(item.job_id)
                raise
            except ChainError as exc:
                reason = exc.reason or str(exc)
                if not self._state_current(item.job_id):
                    # our copy of the job is behind the chain (a transaction whose receipt we
                    # missed): let the watcher catch up, then decide again
                    self.store.outbox_retry(item.id, f"stale job state: {reason}")
                    blocked.add(item.job_id)
                    continue
                log.warning(
                    "outbox %s %s for %s refused: %s", item.id, item.kind, item.job_id, reason
                )
                self.store.outbox_finish(item.id, status="failed", error=reason)
                self._refused(item, reason)
                done += 1
            except Exception as exc:  # transient: RPC down, timeout
                self.store.outbox_retry(item.id, _line(exc))
                blocked.add(item.job_id)
                raise
        return done

    def _send(self, sender: TxSender, item: OutboxItem) -> None:
        job = self.store.job(item.job_id)
        state = job.chain
        p = item.payload
        tx: str | None = None
        if item.kind == "assign":
            if state.job.attempt >= p["attempt"]:
                pass  # already on-chain (a retry after an unknown outcome)
            elif state.status not in (Status.FUNDED, Status.ASSIGNED):
                raise ChainError(f"job is {state.status.name}", f"JobStatus({state.status.name})")
            else:
                if state.job.attempt + 1 != p["attempt"]:
                    log.warning(
                        "job %s: lease attempt %s but chain attempt %s",
                        item.job_id,
                        p["attempt"],
                        state.job.attempt,
                    )
                sent = sender.assign(state, p["provider"])
                self.store.apply_sent(item.job_id, sent.events)
                tx = sent.tx_hash
        elif item.kind == "settle":
            if state.status is Status.SUBMITTED:  # the provider submitted it on-chain meanwhile
                sent = sender.release(state)
                self.store.apply_sent(item.job_id, sent.events)
                tx = sent.tx_hash
            elif state.status is not Status.RELEASED:
                sent = sender.settle(state, p["output_cid"], bytes.fromhex(p["signature"][2:]))
                self.store.apply_sent(item.job_id, sent.events)
                tx = sent.tx_hash
            self.store.settled(item.job_id, paid=True, detail=f"tx {tx}")
            self.count("jobs_paid")
        elif item.kind == "release":
            if state.status is Status.SUBMITTED:
                sent = sender.release(state)
                self.store.apply_sent(item.job_id, sent.events)
                tx = sent.tx_hash
            self.store.settled(item.job_id, paid=True, detail=f"tx {tx}")
            self.count("jobs_paid")
        elif item.kind in ("submit_reject", "reject"):
            if item.kind == "submit_reject" and state.status is Status.ASSIGNED:
                sent = sender.submit_result_for(
                    state, p["output_cid"], bytes.fromhex(p["signature"][2:])
                )
                self.store.apply_sent(item.job_id, sent.events)
                state = self.store.job(item.job_id).chain
            if state.status is Status.SUBMITTED:
                sent = sender.reject(state)
                self.store.apply_sent(item.job_id, sent.events)
                tx = sent.tx_hash
            self.store.settled(item.job_id, paid=False, detail=f"slashed in tx {tx}")
            self.count("results_rejected")
        elif item.kind == "unassign":
            if state.status is Status.ASSIGNED:
                sent = sender.unassign(state)
                self.store.apply_sent(item.job_id, sent.events)
                tx = sent.tx_hash
        else:
            raise ChainError(f"unknown outbox kind {item.kind}", "UnknownKind")
        self.store.outbox_finish(item.id, status="done", tx_hash=tx)

    def _state_current(self, job_id: str) -> bool:
        state = self.store.job(job_id).chain
        return bool(self.chain.call("isCurrent", state.job_id, state.job.as_tuple()))

    def _refused(self, item: OutboxItem, reason: str) -> None:
        if item.kind == "assign":
            self.store.assign_failed(item.job_id, int(item.payload["attempt"]), reason)
        else:
            self.store.fail_job(item.job_id, f"{item.kind} refused on-chain: {reason}")

    # ------------------------------------------------------------------ specs
    def _specs_once(self) -> int:
        jobs = self.store.pending_specs(limit=16)
        for job in jobs:
            spec, reason = self.fetch_spec(job.spec_cid)
            if spec is None and reason.startswith("retry:"):
                if time.time() - job.created_at < 120:
                    continue  # IPFS may be catching up; try again on the next pass
                reason = reason.removeprefix("retry:")
            state = self.store.set_spec(job.job_id, spec, reason)
            log.info("job %s spec %s: %s", job.job_id, job.spec_cid, state if spec else reason)
        return 0  # sleep a period between passes: specs wait on IPFS, not on us

    def fetch_spec(self, cid: str) -> tuple[JobSpec | None, str]:
        """The job spec at ``cid``, or None and why (``retry:`` prefix: try again later)."""
        try:
            data = self.ipfs.cat(cid, max_bytes=MAX_SPEC_BYTES, timeout_s=5.0)
        except ValueError as exc:
            return None, f"job spec {cid} is unusable: {exc}"
        except Exception as exc:
            return None, f"retry:job spec {cid} not retrievable from IPFS: {_line(exc)}"
        try:
            if not any(bytes_cid(data, p) == cid for p in params_for(cid)):
                return None, f"job spec bytes do not hash to {cid}"
        except CidError as exc:
            return None, f"job spec CID {cid} is invalid: {exc}"
        try:
            return JobSpec.from_bytes(data), ""
        except ValueError as exc:
            return None, f"job spec {cid} is invalid: {_line(exc)}"

    # ------------------------------------------------------------------ verification
    def _verify_once(self) -> int:
        jobs = self.store.verifying(limit=4)
        for job in jobs:
            assert job.spec is not None
            cid = job.output_cid or job.chain.output_cid
            if cid is None:
                self.store.verified(job.job_id, False, "no output CID")
                continue
            report = job.result
            if report is not None and report.reason is not RunReason.SUCCEEDED:
                self.store.verified(job.job_id, False, f"run ended with {report.reason.value}")
                continue
            work = Path(self.settings.work_dir)
            work.mkdir(parents=True, exist_ok=True)
            verdict = verify_output(
                self.ipfs,
                cid,
                max_bytes=job.spec.limits.output_max_bytes,
                timeout_s=self.settings.verify_timeout_s,
                work_dir=work,
            )
            self.count("verified_ok" if verdict.ok else "verified_bad")
            self.store.verified(job.job_id, verdict.ok, verdict.message)
            self.wake("outbox")
        return len(jobs)


def _line(exc: BaseException) -> str:
    text_ = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text_[0] if text_ else ''}"[:300]
