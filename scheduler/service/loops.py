"""The replica's background loops, each one pass at a time (``once``) run by :func:`run_loop`:

- :func:`sweep` (every replica): silent nodes offline, expired leases and deadlines;
- :class:`Watch` (leader): escrow events into the store;
- :class:`OutboxLoop` (leader): pending on-chain steps, in order per job
  (what each kind sends: ``outbox_rules.py``);
- :class:`SpecFetcher` (leader): job specs from IPFS, concurrently, failures in backoff;
- :class:`Verifier` (leader): reported outputs checked before payment.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from eth_account.signers.local import LocalAccount

from gridmarket.chain import ChainError, Deployment, EscrowClient
from gridmarket.cid import CidError, cid_matches
from gridmarket.escrow import Job
from gridmarket.ipfs import IpfsStore
from gridmarket.registry_policy import RegistryPolicy
from gridmarket.verify import Verdict, VerdictCode, verify_output
from gridmarket.wire import MAX_SPEC_BYTES, JobSpec, RunReason
from scheduler import lifecycle
from scheduler.chain import (
    BATCH_MAX_CALLS,
    BATCH_MAX_GAS,
    ChainWatcher,
    FeePolicy,
    TxSender,
)
from scheduler.settings import Settings
from scheduler.spot import intake_refusal
from scheduler.store import JobRow, OutboxItem, Store

from .outbox_rules import NotYetError, OutboxRules

__all__ = [
    "OutboxLoop",
    "SpecFetcher",
    "Verifier",
    "Wakes",
    "Watch",
    "line",
    "run_loop",
    "sweep",
]

log = logging.getLogger(__name__)


class Wakes:
    """One event per loop name: a wake-up cuts that loop's idle wait short."""

    def __init__(self) -> None:
        self._events: dict[str, threading.Event] = {}

    def wake(self, name: str) -> None:
        """Run loop ``name`` now instead of at its next period (a no-op for a loop that does not
        run here). Safe from any thread."""
        event = self._events.get(name)
        if event is not None:
            event.set()

    def wait(self, name: str, period: float) -> None:
        wake = self._events.setdefault(name, threading.Event())
        wake.wait(period)
        wake.clear()


def run_loop(
    name: str, fn: Callable[[], int], period: float, stop: threading.Event, wakes: Wakes
) -> None:
    """Run ``fn`` until stopped: at once again when it did work, after ``period`` when idle
    (or when woken), with exponential backoff (and jitter) while it keeps failing."""
    failures = 0
    while not stop.is_set():
        try:
            did = fn()
            failures = 0
        except Exception as exc:
            failures += 1
            delay = min(30.0, 0.5 * 2 ** min(failures, 6)) * (0.5 + random.random() / 2)  # noqa: S311
            log.warning("%s failed (%s); retrying in %.1f s", name, line(exc), delay)
            stop.wait(delay)
            continue
        if not did:
            wakes.wait(name, period)


def sweep(store: Store, settings: Settings, stop: threading.Event) -> None:
    """Every replica's sweeper: silent nodes, lost leases, passed deadlines."""
    s = settings
    # Nodes cannot reach a replica that is down. After a (re)start, give every node one full
    # node timeout to check in before judging silences and leases: a restarted scheduler
    # must not take running jobs away (and run them twice) for its own absence.
    judge_from = time.monotonic() + s.node_timeout_s
    while not stop.wait(s.sweep_interval_s):
        if time.monotonic() >= judge_from:
            gone = store.mark_offline(s.node_timeout_s)
            if gone:
                log.info("nodes offline (silent > %.0f s): %s", s.node_timeout_s, gone)
            lost = store.expire_leases()
            if lost:
                log.info("leases expired, jobs requeued: %s", lost)
        store.expire_deadlines()


class Watch:
    """The chain watcher's pass: new escrow events folded into the store with the cursor."""

    def __init__(
        self,
        store: Store,
        chain: EscrowClient,
        deployment: Deployment,
        settings: Settings,
        on_created: Callable[[int], None],
        on_events: Callable[[list[Any]], None] | None = None,
    ) -> None:
        self.store = store
        self.chain = chain
        self.deployment = deployment
        self.settings = settings
        self.on_created = on_created
        self.on_events = on_events
        """Told every batch of events once it is folded (the collateral view forgets the
        wallets whose stake changed: :meth:`scheduler.collateral.CollateralView.observe`)."""
        self._watcher: ChainWatcher | None = None

    def once(self) -> int:
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
                head_tag=self.settings.chain_head,
                reorgs=self.store,  # follows blocks by hash; rolls back what a reorg removed
            )
        return self._watcher.poll_once()

    def _sink(self, events: list[Any], through_block: int, block_hash: str | None = None) -> None:
        created = self.store.apply_chain_events(events, through_block, block_hash)
        if self.on_events is not None and events:
            self.on_events(events)
        if created:
            self.on_created(created)


class OutboxLoop:
    """The outbox's pass: pending rows oldest first, each job's in order; a job whose row
    failed waits for the next pass (its later rows depend on it). A pass goes in rounds: the
    first pending row of every job, sent together (:meth:`OutboxRules.send_many`: the
    operator calls batched in ``multicall`` transactions), then the next row of each, and so
    on."""

    def __init__(
        self,
        store: Store,
        chain: EscrowClient,
        operator: LocalAccount | None,
        rules: OutboxRules,
        *,
        fees: FeePolicy | None = None,
        receipt_timeout_s: float = 600.0,
        batch_calls: int = BATCH_MAX_CALLS,
        batch_gas: int = BATCH_MAX_GAS,
    ) -> None:
        self.store = store
        self.chain = chain
        self.operator = operator
        self.rules = rules
        self.fees = fees
        self.receipt_timeout_s = receipt_timeout_s
        self.batch_calls = batch_calls
        self.batch_gas = batch_gas
        self._sender: TxSender | None = None

    def once(self) -> int:
        # rows that wait for a time wait for the chain's clock (the escrow decides by it)
        now = self._chain_time() if self.store.outbox_waiting() else None
        # two batches a pass: a job's next row (a settle after its assign) goes in the second
        items = self.store.outbox_pending(limit=2 * self.batch_calls, now=now)
        if not items:
            return 0
        if self.operator is None:
            raise RuntimeError("no operator_key configured: cannot send transactions")
        if self._sender is None:
            self._sender = TxSender(
                self.chain,
                self.operator,
                fees=self.fees,
                receipt_timeout_s=self.receipt_timeout_s,
            )
        done = 0
        blocked: set[str] = set()
        remaining = items
        while remaining:
            # one round: the first pending row of each job, sent together (multicall batches)
            now_round: list[OutboxItem] = []
            later: list[OutboxItem] = []
            seen: set[str] = set()
            for item in remaining:
                if item.job_id in blocked:
                    continue  # keep each job's transactions in order
                (later if item.job_id in seen else now_round).append(item)
                seen.add(item.job_id)
            if not now_round:
                break
            try:
                outcomes = self.rules.send_many(
                    self._sender, now_round, max_calls=self.batch_calls, max_gas=self.batch_gas
                )
            except Exception as exc:  # transient: RPC down, timeout, outcome unknown
                for item in now_round:
                    self.store.outbox_retry(item.id, line(exc))
                raise
            for item, outcome in zip(now_round, outcomes, strict=True):
                done += self._record(item, outcome, blocked)
            remaining = later
        return done

    def _record(self, item: OutboxItem, outcome: ChainError | None, blocked: set[str]) -> int:
        """Record one row's outcome; 1 if it is settled (done or refused for good)."""
        if outcome is None:
            return 1
        if isinstance(outcome, NotYetError):
            # the escrow takes this step later (the provider's hold, challenge window): wait
            self.store.outbox_defer(item.id, outcome.at, f"waiting: {outcome.reason or outcome}")
            blocked.add(item.job_id)
            return 0
        reason = outcome.reason or str(outcome)
        if not self._state_current(item.job_id):
            # our copy of the job is behind the chain (a transaction whose receipt we
            # missed): let the watcher catch up, then decide again
            self.store.outbox_retry(item.id, f"stale job state: {reason}")
            blocked.add(item.job_id)
            return 0
        log.warning("outbox %s %s for %s refused: %s", item.id, item.kind, item.job_id, reason)
        self.store.outbox_finish(item.id, status="failed", error=reason)
        self.rules.refused(item, reason)
        return 1

    def _chain_time(self) -> float:
        return float(self.chain.w3.eth.get_block("latest")["timestamp"])

    def _state_current(self, job_id: str) -> bool:
        state = self.store.job(job_id).chain
        return bool(self.chain.call("isCurrent", state.job_id, state.job.as_tuple()))


class ThreadClients:
    """One IPFS client per worker thread, like ``ipfs`` (no HTTP session shared between
    threads); :meth:`close` closes them all."""

    def __init__(self, ipfs: IpfsStore) -> None:
        self.ipfs = ipfs
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[IpfsStore] = []

    def get(self) -> IpfsStore:
        client: IpfsStore | None = getattr(self._local, "client", None)
        if client is None:
            client = IpfsStore(
                self.ipfs.api_addr,
                timeout=self.ipfs.timeout,
                resolve_timeout=self.ipfs.resolve_timeout,
            )
            self._local.client = client
            with self._lock:
                self._all.append(client)
        return client

    def close(self) -> None:
        with self._lock:
            clients, self._all = self._all, []
        for client in clients:
            client.close()


class SpecFetcher:
    """The spec fetcher: each ``pending_spec`` job's spec from IPFS, queued or invalid.

    Fetches run concurrently in a bounded pool (``workers`` threads, one IPFS client each), each
    bounded in time: a job's first try gets ``first_timeout_s``, later ones twice the last, up
    to ``timeout_s``. A fetch that fails but may pass later (IPFS cannot find the CID yet) gives
    the job a next-try time with exponential backoff (:func:`scheduler.lifecycle.spec_retry_in`),
    written to the store (a restarted leader keeps it); the store's query skips jobs in backoff
    and hands out jobs never tried before the oldest due retries, and retries use at most half
    the pool. So a job whose spec nobody has delays no other: a new job finds a free worker
    within about one first-try timeout per ``workers`` jobs ahead of it. After
    :data:`scheduler.lifecycle.SPEC_GIVE_UP_S` (and at least ``SPEC_MIN_TRIES`` tries) the job
    goes ``invalid`` with the reason.

    :meth:`once` only hands jobs to the pool and returns; a finished fetch wakes it (``wake``)
    to fill the freed worker.

    A spec read whole, hashed back to its CID and parsed is remembered by that CID (the last
    ``SPECS_KEPT``): the bytes of a CID cannot change, and jobs funded from one template share
    a spec, so only the first of them waits on IPFS. Refusals are not remembered.
    """

    SPECS_KEPT = 4096

    def __init__(
        self,
        store: Store,
        ipfs: IpfsStore,
        *,
        workers: int = 64,
        first_timeout_s: float = 1.0,
        timeout_s: float = 5.0,
        wake: Callable[[], None] = lambda: None,
        registries: RegistryPolicy | None = None,
    ) -> None:
        if workers < 2:
            raise ValueError(f"workers must be at least 2, not {workers}")
        self.store = store
        self.ipfs = ipfs
        self.workers = workers
        self.first_timeout_s = first_timeout_s
        self.timeout_s = timeout_s
        self.wake = wake
        self.registries = registries or RegistryPolicy(setting="image_registries")
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="spec-fetch")
        self._lock = threading.Lock()
        self._in_flight: dict[str, bool] = {}  # job id -> is a retry
        self._clients = ThreadClients(ipfs)
        self._specs: OrderedDict[str, JobSpec] = OrderedDict()  # CID -> spec, oldest first
        self.specs_remembered = 0  # fetches answered from ``_specs``

    def once(self) -> int:
        with self._lock:
            busy = dict(self._in_flight)
        free = self.workers - len(busy)
        if free <= 0:
            return 0
        retry_room = self.workers // 2 - sum(busy.values())
        for job in self.store.pending_specs(limit=free, skip=list(busy)):
            retry = job.spec_tries > 0
            if retry:
                if retry_room <= 0:
                    continue
                retry_room -= 1
            with self._lock:
                self._in_flight[job.job_id] = retry
            self._pool.submit(self._work, job)
        return 0  # sleep a period between passes (or until a fetch ends): specs wait on IPFS

    def idle(self) -> bool:
        """No fetch in flight."""
        with self._lock:
            return not self._in_flight

    def close(self) -> None:
        """Stop the pool (fetches in flight end within their time limit) and its clients."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._clients.close()

    def _client(self) -> IpfsStore:
        return self._clients.get()

    def _work(self, job: JobRow) -> None:
        try:
            timeout = min(self.timeout_s, self.first_timeout_s * 2**job.spec_tries)
            spec, reason = self.fetch(job.spec_cid, timeout_s=timeout, client=self._client())
            if spec is None and reason.startswith("retry:"):
                reason = reason.removeprefix("retry:")
                now = self.store.clock()
                tries = job.spec_tries + 1
                delay = lifecycle.spec_retry_in(tries, now - job.created_at)
                if delay is not None:
                    self.store.spec_retry(
                        job.job_id,
                        now + delay,
                        f"waiting for the job spec (try {tries} failed, next in {delay:g} s): "
                        f"{reason}",
                    )
                    return
                reason = f"{reason} (gave up after {tries} tries)"
            refusal = "" if spec is None else self._refusal(spec, job.chain.job)
            state = self.store.set_spec(job.job_id, spec, reason, refusal=refusal)
            why = reason if spec is None else refusal
            log.info(
                "job %s spec %s: %s%s", job.job_id, job.spec_cid, state, f": {why}" * bool(why)
            )
        except Exception:  # the store is down: the job stays due, the next pass tries again
            log.exception("spec fetch of job %s failed", job.job_id)
        finally:
            with self._lock:
                self._in_flight.pop(job.job_id, None)
            self.wake()

    def _refusal(self, spec: JobSpec, job: Job) -> str:
        """Why a fetched spec is not offered: its spot terms, or an image on a registry no
        agent would pull from (:mod:`gridmarket.registry_policy`); "" when it may be."""
        image = self.registries.refusal(spec.image) if spec.image else None
        if image is not None:
            return f"{image}; not offered, the submitter can cancel"
        return intake_refusal(spec, job) or ""

    def fetch(
        self, cid: str, *, timeout_s: float = 5.0, client: IpfsStore | None = None
    ) -> tuple[JobSpec | None, str]:
        """The job spec at ``cid``, or None and why (``retry:`` prefix: try again later)."""
        with self._lock:
            known = self._specs.get(cid)
            if known is not None:
                self._specs.move_to_end(cid)
                self.specs_remembered += 1
                return known, ""
        try:
            data = (client or self.ipfs).cat(cid, max_bytes=MAX_SPEC_BYTES, timeout_s=timeout_s)
        except ValueError as exc:
            return None, f"job spec {cid} is unusable: {exc}"
        except Exception as exc:
            return None, f"retry:job spec {cid} not retrievable from IPFS: {line(exc)}"
        try:
            if not cid_matches(data, cid):
                return None, f"job spec bytes do not hash to {cid}"
        except CidError as exc:
            return None, f"job spec CID {cid} is invalid: {exc}"
        try:
            spec = JobSpec.from_bytes(data)
        except ValueError as exc:
            return None, f"job spec {cid} is invalid: {line(exc)}"
        with self._lock:
            self._specs[cid] = spec
            while len(self._specs) > self.SPECS_KEPT:
                self._specs.popitem(last=False)
        return spec, ""


class Verifier:
    """The verifier: each ``verifying`` job's output checked (``gridmarket/verify.py``), the
    verdict handed to the store, the outbox woken to send it.

    Outputs are fetched concurrently in a bounded pool (``settings.verify_workers`` threads,
    one IPFS client each): a fetch waits on the network (on a real grid, on the provider's own
    IPFS node), so one slow or unreachable output must not hold up every other verdict, and
    each node's slot stays taken until its verdict (:data:`scheduler.lifecycle.HOLDS_SLOT`).
    :meth:`once` only hands jobs to the pool and returns; a finished check wakes it to fill the
    freed worker. A job is never in two checks at once, and a verdict is taken only for the
    attempt and output it checked (:meth:`scheduler.store.Store.verified`).

    An output the verifier's IPFS node cannot fetch (``unreachable``) is not rejected at the
    first miss: the provider's node may be restarting, or the two nodes reconnecting after a
    blip. The job stays ``verifying`` (its reason says so) and is tried again, backing off
    (1, 2, 4 ... 30 s between tries), until ``verify_patience_s`` has passed since the first
    miss; only then is the attempt rejected as the node's fault. Tries again use at most half
    the pool, so outputs that keep missing cannot starve new ones. Every other bad verdict
    (invalid CID, too large, bytes that do not hash to the CID) is final at once. The misses
    are counted in memory, per (job, attempt, output CID): a restarted scheduler starts the
    patience again."""

    BACKOFF_MAX_S = 30.0

    def __init__(
        self,
        store: Store,
        ipfs: IpfsStore,
        settings: Settings,
        count: Callable[[str], None],
        wake_outbox: Callable[[], None],
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
        self.ipfs = ipfs
        self.settings = settings
        self.count = count
        self.wake_outbox = wake_outbox
        self.wake = wake
        self.workers = settings.verify_workers
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="verify")
        self._lock = threading.Lock()
        self._in_flight: dict[str, bool] = {}  # job id -> is a try again
        self._clients = ThreadClients(ipfs)
        # (job, attempt, output CID) -> (first miss started, misses, next try), monotonic
        self._misses: dict[tuple[str, int, str], tuple[float, int, float]] = {}

    def once(self) -> int:
        now = time.monotonic()
        # A job not read in a pass may still be verifying (many wait; the deferred ones go to
        # the back): its misses are kept, or its patience would start again each time it came
        # back. Entries are forgotten only long after the patience (a job still verifying
        # then was starved, not patient), which bounds the memory.
        forget = max(10 * self.settings.verify_patience_s, 3600.0)
        with self._lock:
            for key in [k for k, (first, _, _) in self._misses.items() if now - first > forget]:
                del self._misses[key]
            busy = dict(self._in_flight)
            misses = dict(self._misses)
        free = self.workers - len(busy)
        if free <= 0:
            return 0
        retry_room = max(1, self.workers // 2) - sum(busy.values())
        # read only as many jobs as there are free workers: each pass follows a finished check
        # (reading a window of whole rows per verdict was 16% of the leader's time in a soak)
        waiting = self._deferred(misses, now)
        decided = 0
        for job in self.store.verifying(limit=free, skip=[*busy, *waiting]):
            if free <= 0:
                break
            cid = job.output_cid or job.chain.output_cid
            report = job.result
            if cid is None:
                self.store.verified(job.job_id, False, "no output CID", attempt=job.attempt)
                decided += 1
                continue
            if report is not None and report.reason is not RunReason.SUCCEEDED:
                why = f"run ended with {report.reason.value}"
                self.store.verified(job.job_id, False, why, attempt=job.attempt)
                decided += 1
                continue
            missed = misses.get((job.job_id, job.attempt, cid))
            if missed is not None:
                if missed[2] > now:
                    continue  # backing off
                if retry_room <= 0:
                    continue
                retry_room -= 1
            with self._lock:
                self._in_flight[job.job_id] = missed is not None
            free -= 1
            self._pool.submit(self._work, job, cid)
        return decided  # checks wait on IPFS: a finished one wakes the next pass

    @staticmethod
    def _deferred(
        misses: dict[tuple[str, int, str], tuple[float, int, float]], now: float
    ) -> set[str]:
        """The jobs backing off after a miss."""
        return {job_id for (job_id, _, _), (_, _, next_try) in misses.items() if next_try > now}

    def idle(self) -> bool:
        """No check in flight."""
        with self._lock:
            return not self._in_flight

    def close(self) -> None:
        """Stop the pool (checks in flight end within ``verify_timeout_s``) and its clients."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._clients.close()

    def _client(self) -> IpfsStore:
        return self._clients.get()

    def _work(self, job: JobRow, cid: str) -> None:
        try:
            assert job.spec is not None
            work = Path(self.settings.work_dir)
            started = time.monotonic()
            verdict = verify_output(
                self._client(),
                cid,
                max_bytes=job.spec.limits.output_max_bytes,
                timeout_s=self.settings.verify_timeout_s,
                work_dir=work,
            )
            key = (job.job_id, job.attempt, cid)
            if verdict.code is VerdictCode.UNREACHABLE and self._try_again(key, started, verdict):
                return
            with self._lock:
                self._misses.pop(key, None)
            self.count("verified_ok" if verdict.ok else "verified_bad")
            self.store.verified(
                job.job_id, verdict.ok, verdict.message, attempt=job.attempt, output_cid=cid
            )
            self.wake_outbox()
        except Exception:  # the store is down: the job stays verifying, a later pass tries again
            log.exception("verification of job %s failed", job.job_id)
        finally:
            with self._lock:
                self._in_flight.pop(job.job_id, None)
            self.wake()

    def _try_again(self, key: tuple[str, int, str], started: float, verdict: Verdict) -> bool:
        """Count a miss of ``key``'s output; True when the job waits for another try (its
        reason says so), False when the patience is spent (the miss is the verdict)."""
        with self._lock:
            first, misses, _ = self._misses.get(key, (started, 0, 0.0))
        misses += 1
        now = time.monotonic()
        patience = self.settings.verify_patience_s
        if now - first >= patience:
            return False
        pause = min(2.0 ** (misses - 1), self.BACKOFF_MAX_S)
        with self._lock:
            self._misses[key] = (first, misses, now + pause)
        self.count("verify_retried")
        job_id, attempt, _cid = key
        left = patience - (now - first)
        self.store.verify_retry(
            job_id,
            attempt,
            f"{verdict.message}; trying again in {pause:g} s (miss {misses}; the attempt is "
            f"rejected if the output is still unreachable in {left:.0f} s)",
        )
        return True


def line(exc: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text_ = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text_[0] if text_ else ''}"[:300]
