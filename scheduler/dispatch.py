"""Pull-only dispatch: nodes long-poll ``next-job``; rounds match queued jobs to waiting nodes.

(Length: just over 500 lines, one concept: a round and its lock order; the driver gates added
in 2026-11 live in scheduler/matching/rules.py.)

What a node gets is an *offer* (escrow v2): the :class:`~gridmarket.wire.Assignment` carries
the job's on-chain terms; the node signs its acceptance and posts it (``API.ACCEPT``) within the
lease TTL, and only then is the job assigned on-chain (``scheduler/api/nodes.py``).

A node's ``next-job`` request parks a waiter here. The waiting nodes of this replica sit in a
:class:`~scheduler.matching.MatchingEngine` with the capacity they have free. A *round* runs
when a node starts waiting, when a job is queued on this replica, and every ``dispatch_tick_s``
while nodes wait (to see jobs queued by other replicas). A round is one store transaction
(:meth:`scheduler.store.Store.dispatch`): it locks up to ``dispatch_batch`` queued jobs, oldest
first, asks the engine for each job's best waiting node (hard gates, then best fit), and leases
the pairs; each winner's waiter is answered with its :class:`~gridmarket.wire.Assignment` at once.

Best fit is among the nodes waiting on this replica at that moment; exactly-once holds across
replicas because the store takes the rows ``FOR UPDATE SKIP LOCKED`` and claims slots with
conditional updates.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gridmarket.cuda import as_version
from gridmarket.escrow import ZERO_ADDRESS
from gridmarket.holds import HOLD_MARGIN_S, hold_for
from gridmarket.tiers import classify_gpu
from gridmarket.wire import Assignment, JobSpec, JobTerms, offered_price_wei_per_hour
from scheduler.matching import (
    GpuSpec,
    JobRequirements,
    MatchingEngine,
    NodeCapacity,
)
from scheduler.matching.engine import Match
from scheduler.settings import Settings
from scheduler.store import Claim, ClaimedJob, JobRow, NodeRow, Store

log = logging.getLogger(__name__)

__all__ = [
    "Dispatcher",
    "free_capacity",
    "hold_of",
    "refused_wallets",
    "requirements",
    "terms_of",
]

_EXPLAIN_EVERY_S = 2.0
_COALESCE_S = 0.002
_TOUCH_EVERY_S = 1.0
_FULL_HOLD_S = 0.25


def refused_wallets(job: JobRow) -> frozenset[str]:
    """The provider wallets (lower case) ``job`` must not go to: those excluded for it (a node
    of theirs failed it, lost it, had its result rejected or its assign refused) and the
    provider the escrow holds it assigned to (``assign`` refuses the same provider again), and
    those its spec excludes (``JobSpec.exclude_providers``: a mediator's re-run)."""
    wallets = set(job.excluded_wallets)
    if job.spec is not None:
        wallets.update(w.lower() for w in job.spec.exclude_providers)
    provider = job.chain.job.provider
    if int(provider, 16):
        wallets.add(provider.lower())
    return frozenset(wallets)


def hold_of(job: JobRow, margin_s: int = HOLD_MARGIN_S) -> int:
    """The ``holdFor`` offered for ``job``: :func:`gridmarket.holds.hold_for` of its spec's
    timeout (the spec is fixed by its CID, so the acceptance route and the outbox's ``assign``
    work out the same value the offer carried; the store keeps it with the acceptance too)."""
    if job.spec is None:
        raise ValueError(f"job {job.job_id} has no spec: nothing to offer")
    return hold_for(job.spec.limits.timeout_s, margin_s)


def terms_of(job: JobRow, hold_margin_s: int = HOLD_MARGIN_S) -> JobTerms:
    """The terms the node accepts for ``job`` (EIP-712 ``Acceptance``), from its on-chain
    struct as funded (the same values the escrow hashes in ``acceptanceDigest``) and the hold
    offered (:func:`hold_of`, with the deployment's margin)."""
    j = job.chain.job
    return JobTerms(
        bounty_wei=j.bounty,
        fee_bps=j.fee_bps,
        deadline=j.deadline,
        collateral_wei=j.collateral,
        mediator=j.mediator,
        flags=j.flags,
        operator=j.operator,
        token=j.token,
        hold_for=hold_of(job, hold_margin_s),
    )


def requirements(
    job: JobRow, nodes_of: Callable[[str], Iterable[str]] = lambda _wallet: ()
) -> JobRequirements:
    """The matching engine's view of a queued job. ``nodes_of(wallet)``: the node ids of a
    wallet, each excluded when the wallet is (:func:`refused_wallets`). A job paid in a token
    offers its price in the token's units and needs a node with a floor in it."""
    excluded = set(job.excluded)
    for wallet in refused_wallets(job):
        excluded.update(nodes_of(wallet))
    spec = job.spec
    assert spec is not None
    res = spec.resources
    return JobRequirements(
        job_id=job.job_id,
        executor=spec.executor,
        gpu_count=res.gpu_count,
        min_vram_mib=res.min_vram_mib,
        gpu_models=frozenset(res.gpu_models) if res.gpu_models else None,
        cpu_cores=res.cpu_cores,
        ram_mib=res.ram_mib,
        disk_mib=res.disk_mib,
        region=res.region,
        max_price_wei_per_hour=offered_price_wei_per_hour(job.bounty_wei, spec),
        excluded_node_ids=frozenset(excluded),
        image=spec.image,
        token=None if job.chain.job.token == ZERO_ADDRESS else job.chain.job.token,
        min_cuda=as_version(res.min_cuda),
        min_compute_capability=as_version(res.min_compute_capability),
    )


def free_capacity(
    node: NodeRow,
    running: list[JobSpec],
    *,
    now: float,
    reputation: float,
    banned: bool,
    images: frozenset[str] | None = None,
) -> NodeCapacity | None:
    """What ``node`` has free while the ``running`` jobs (their specs) hold part of it; None
    when its running jobs hold every core, all its RAM or every slot (no job can fit).
    ``images``: the images it has cached, as its last heartbeat said (default: as registered)."""
    cap = node.capacity
    used_gpus = used_cores = used_ram = used_disk = 0
    for spec in running:
        r = spec.resources
        used_gpus += r.gpu_count
        used_cores += r.cpu_cores
        used_ram += r.ram_mib
        used_disk += r.disk_mib
    free_cores, free_ram = cap.cpu_cores - used_cores, cap.ram_mib - used_ram
    if free_cores < 1 or free_ram < 1 or len(running) >= node.slots:
        return None
    gpu = None
    if cap.gpu is not None and cap.gpu.count - used_gpus > 0:
        tier = classify_gpu(cap.gpu.name or cap.gpu.model, cap.gpu.vram_mib)
        gpu = GpuSpec(
            model=tier.key,
            vram_mib=cap.gpu.vram_mib,
            count=cap.gpu.count - used_gpus,
            speed=tier.speed,
            cuda=as_version(cap.gpu.cuda_version),
            compute_capability=as_version(cap.gpu.compute_capability),
        )
    return NodeCapacity(
        node_id=node.node_id,
        region=cap.region,
        price_floor_wei_per_hour=cap.price_floor_wei_per_hour,
        price_floors=cap.price_floors,
        cpu_cores=free_cores,
        ram_mib=free_ram,
        disk_mib=max(0, cap.disk_mib - used_disk),
        gpu=gpu,
        executors=frozenset(cap.executors),
        slots=node.slots - len(running),
        reputation=min(1.0, max(0.0, reputation)),
        suspended=banned,
        images=frozenset(cap.images) if images is None else images,
    )


@dataclass
class _Waiter:
    node_id: str
    wallet: str
    future: asyncio.Future[Assignment | None]
    since: float


class Dispatcher:
    """Parks node polls and runs dispatch rounds (one at a time, in a worker thread)."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        chain_id: int,
        escrow: str,
        symbols: Mapping[str, str] | None = None,
        hold_margin_s: int = HOLD_MARGIN_S,
    ) -> None:
        """``symbols``: listed token address -> symbol, to name a job's token in why it waits;
        ``hold_margin_s``: the deployment's hold margin (:func:`gridmarket.holds.margin_of`)."""
        self.store = store
        self.hold_margin_s = hold_margin_s
        self.settings = settings
        self.chain_id = chain_id
        self.escrow = escrow
        self.symbols = dict(symbols or {})
        self.engine = MatchingEngine(ban_below=settings.ban_below)
        self._lock = threading.Lock()  # the engine and the waiters, between loop and thread
        self._waiters: dict[str, _Waiter] = {}
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._explained: dict[str, float] = {}
        self._pending_reasons: list[tuple[str, str]] = []
        self._idle: dict[str, int] = {}
        # the images each node said it has cached in its last heartbeat to this replica (its
        # registration's list until then): matching prefers a node that has the job's image
        self._images: dict[str, frozenset[str]] = {}
        # the nodes seen waiting, by wallet (lower case): a wallet excluded for a job excludes
        # all of them (ids of nodes no longer waiting are harmless in an exclusion set)
        self._wallet_nodes: dict[str, set[str]] = {}
        # the offers this replica delivered and not yet settled, job id -> the job as leased:
        # the acceptance route checks a signature against these terms without reading the row
        # first (the store checks the lease, the attempt and the terms again under its lock)
        # (kept for one lease TTL at most: an offer not accepted by then has lost its lease)
        self._offers: dict[str, tuple[float, JobRow]] = {}
        self.on_claimed: Callable[[], None] = lambda: None  # the app wakes the outbox
        self.rounds = 0
        self.claims = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run(), name="dispatch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with self._lock:
            for w in self._waiters.values():
                if not w.future.done():
                    w.future.set_result(None)
            self._waiters.clear()

    def wake(self, _count: int = 1) -> None:
        """Ask for a round soon; safe from any thread (the store calls it when jobs queue)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if threading.current_thread() is threading.main_thread() and _in_loop(loop):
            self._wake.set()
        else:
            loop.call_soon_threadsafe(self._wake.set)

    def idle_streak(self, node_id: str) -> int:
        """Empty long-polls in a row for ``node_id`` (0 after it got a job)."""
        return self._idle.get(node_id, 0)

    def advertise(self, node_id: str, images: list[str]) -> None:
        """Record the images ``node_id`` has cached now (its heartbeat): used by its next poll
        and, if it is waiting in a long poll now, by the matches of that poll too (a node that
        pulled an image while parked would otherwise be matched without it for up to its
        ``wait_s``)."""
        if len(self._images) > 200_000 and node_id not in self._images:
            self._images.clear()
        cached = frozenset(images)
        self._images[node_id] = cached
        with self._lock:
            if node_id not in self._waiters or node_id not in self.engine:
                return
            capacity = self.engine._node(node_id).capacity
            if capacity.images == cached:
                return
            self.engine.remove_node(node_id)
            self.engine.add_node(dataclasses.replace(capacity, images=cached))

    def images_of(self, node_id: str) -> frozenset[str] | None:
        """The images ``node_id`` last advertised in a heartbeat here (None: none yet)."""
        return self._images.get(node_id)

    def offered(self, job_id: str) -> JobRow | None:
        """The job as this replica leased and offered it, if it delivered that offer and it is
        not settled here yet (accepted or refused); None otherwise (read the store). It may be
        stale (the lease lost, the job offered again elsewhere): whoever uses it must have the
        store check the lease again, as :meth:`Store.accept` does."""
        got = self._offers.get(job_id)
        if got is None or time.monotonic() - got[0] > self.settings.lease_ttl_s:
            return None
        return got[1]

    def settle_offer(self, job_id: str) -> None:
        """Forget the offer of ``job_id`` (accepted or refused)."""
        self._offers.pop(job_id, None)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    # ------------------------------------------------------------------ node side
    async def next_job(self, node: NodeRow, wait_s: float) -> Assignment | None:
        """Wait up to ``wait_s`` for a job for ``node``; None when none came."""
        now = time.time()
        running: list[JobSpec] = []
        # a single-slot node's row says whether it is busy (the slot itself is guarded in SQL);
        # a multi-slot node's free resources come from its running jobs: from memory when the
        # store holds a fresh complete picture (no thread hop), else read
        if node.running or node.slots > 1:
            known = self.store.running_specs_known(node.node_id)
            running = (
                known
                if known is not None
                else await asyncio.to_thread(self.store.running_specs, node.node_id)
            )
        capacity = free_capacity(
            node,
            running,
            now=now,
            reputation=node.score(now, self.store.policy),
            banned=node.excluded(now, self.store.policy),
            images=self._images.get(node.node_id),
        )
        if capacity is None:  # every slot, core or MiB of RAM is taken: nothing can fit
            # Held a moment (within the wait_s it asked for) rather than answered at once: a
            # client that ignores Retry-After would otherwise poll in a tight loop, answered
            # from memory on the event loop, and starve the rounds of the nodes that can take
            # work (measured: rounds over 1 s, their winners' polls gone, jobs handed back).
            await asyncio.sleep(min(wait_s, _FULL_HOLD_S))
            return None
        loop = asyncio.get_running_loop()
        waiter = _Waiter(node.node_id, node.wallet, loop.create_future(), now)
        with self._lock:
            old = self._waiters.pop(node.node_id, None)
            if old is not None and not old.future.done():
                old.future.set_result(None)  # a newer poll from the same node replaces it
            if node.node_id in self.engine:
                self.engine.remove_node(node.node_id)
            self.engine.add_node(capacity)
            self._waiters[node.node_id] = waiter
            if len(self._wallet_nodes) > 200_000:
                self._wallet_nodes.clear()
            self._wallet_nodes.setdefault(node.wallet.lower(), set()).add(node.node_id)
        self._wake.set()
        try:
            got = await asyncio.wait_for(asyncio.shield(waiter.future), timeout=wait_s)
        except TimeoutError:
            # a round may have answered in the same instant: deliver it rather than lose it
            got = waiter.future.result() if waiter.future.done() else None
        finally:
            with self._lock:
                if self._waiters.get(node.node_id) is waiter:
                    del self._waiters[node.node_id]
                    if node.node_id in self.engine:
                        self.engine.remove_node(node.node_id)
        if got is None:
            if len(self._idle) > 200_000:
                self._idle.clear()
            self._idle[node.node_id] = self._idle.get(node.node_id, 0) + 1
        else:
            self._idle.pop(node.node_id, None)
        return got

    # ------------------------------------------------------------------ rounds
    async def _run(self) -> None:
        tick = self.settings.dispatch_tick_s
        touched = 0.0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=tick)
            self._wake.clear()
            if not self._waiters:
                continue
            if time.monotonic() - touched > _TOUCH_EVERY_S:
                # a node parked in a long poll is alive even between its heartbeats
                touched = time.monotonic()
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.store.touch_nodes, list(self._waiters))
            # let polls that arrive together share one round (one transaction for all of them)
            await asyncio.sleep(_COALESCE_S)
            self._wake.clear()
            try:
                won = await asyncio.to_thread(self._round)
                if won:
                    self.on_claimed()
            except Exception:
                log.exception("dispatch round failed")
                await asyncio.sleep(tick)
                continue
            for claimed in won:
                self._deliver(claimed)

    def _round(self) -> list[ClaimedJob]:
        decided: list[Match] = []

        def decide(rows: list[JobRow]) -> list[Claim]:
            claims: list[Claim] = []
            now = time.monotonic()
            with self._lock:
                for job in rows:
                    if not len(self.engine):
                        break
                    if job.spec is None:
                        continue
                    req = requirements(job, self._nodes_of)
                    found = self.engine.match(req, explain=False)
                    if isinstance(found, Match):
                        self.engine.remove_node(found.node_id)  # one job per poll
                        decided.append(found)
                        claims.append(Claim(job.job_id, found.node_id))
                    elif now - self._explained.get(job.job_id, 0.0) > _EXPLAIN_EVERY_S:
                        self._explained[job.job_id] = now
                        why = _reason(self.engine.explain(req).message(self.symbols))
                        if why != job.reason:  # written only when it changed
                            self._pending_reasons.append((job.job_id, why))
            return claims

        self._pending_reasons = []
        won = self.store.dispatch(
            decide,
            limit=self.settings.dispatch_batch,
            window=16 + 2 * len(self._waiters),
            wants_more=lambda: len(self.engine) > 0,
            lease_ttl=self.settings.lease_ttl_s,
        )
        self.rounds += 1
        self.claims += len(won)
        winners = {c.node_id for c in won}
        with self._lock:  # nodes decided on but not won go back to the index
            for m in decided:
                w = self._waiters.get(m.node_id)
                if m.node_id not in winners and w is not None and m.node_id not in self.engine:
                    self._readd(m.node_id)
        if self._pending_reasons:  # one write for the round's explanations
            self.store.set_reasons(self._pending_reasons)
        if len(self._explained) > 100_000:
            self._explained.clear()
        return won

    def _nodes_of(self, wallet: str) -> Iterable[str]:
        return self._wallet_nodes.get(wallet, ())

    def _readd(self, node_id: str) -> None:
        try:
            node = self.store.node(node_id)
            running = self.store.running_specs(node_id)
        except Exception:  # the node is gone: its waiter times out
            return
        now = time.time()
        capacity = free_capacity(
            node,
            running,
            now=now,
            reputation=node.score(now, self.store.policy),
            banned=node.excluded(now, self.store.policy),
            images=self._images.get(node.node_id),
        )
        if capacity is not None:
            self.engine.add_node(capacity)

    def _deliver(self, claimed: ClaimedJob) -> None:
        job = claimed.job
        assert job.spec is not None and job.lease_expires is not None
        assignment = Assignment(
            terms=terms_of(job, self.hold_margin_s),
            job_id=job.job_id,
            attempt=job.attempt,
            spec_cid=job.spec_cid,
            spec=job.spec,  # parsed once per CID (the store's cache); frozen, so shared
            bounty_wei=job.bounty_wei,
            deadline=job.deadline,
            lease_expires_at=job.lease_expires,
            chain_id=self.chain_id,
            escrow=self.escrow,
            # a checkpointing job resumes from the newest checkpoint the scheduler keeps (one
            # indexed read, only for such jobs; recorded as the attempt's resume_cid); not a
            # comparable one: the mediator re-runs those from the start (docs/trust.md)
            resume=self.store.resume_for(job.job_id, job.attempt, claimed.node_id)
            if job.spec.checkpoint is not None and not job.spec.comparable
            else None,
        )
        with self._lock:
            waiter = self._waiters.pop(claimed.node_id, None)
        if waiter is None or waiter.future.done():
            # the poll ended (client gone) between the claim and now: give the job straight back
            log.warning("node %s left before job %s reached it", claimed.node_id, job.job_id)
            asyncio.get_running_loop().run_in_executor(
                None, self._hand_back_quietly, job.job_id, claimed.node_id
            )
            return
        self._remember_offer(job)
        waiter.future.set_result(assignment)

    def _remember_offer(self, job: JobRow) -> None:
        """Keep ``job`` (as leased) for :meth:`offered`, forgetting offers older than a lease
        TTL (never answered: their leases ran out), oldest first, so the memory holds at most
        one TTL of offers."""
        now = time.monotonic()
        self._offers.pop(job.job_id, None)  # re-inserted at the end: the dict stays in age order
        self._offers[job.job_id] = (now, job)
        ttl = self.settings.lease_ttl_s
        while self._offers:
            oldest = next(iter(self._offers))
            if now - self._offers[oldest][0] <= ttl:
                break
            del self._offers[oldest]

    def _hand_back_quietly(self, job_id: str, node_id: str) -> None:
        try:
            self.store.hand_back(job_id, node_id, delivered=False)
        except Exception:
            log.exception("could not hand back undelivered job %s", job_id)


def _reason(message: str) -> str:
    return message.replace("nodes can take", "idle nodes can take").replace(
        "no node is registered", "no idle node is waiting for work"
    )


def _in_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
