"""The scheduler's durable state and every transition of it, each in one transaction.

The store is the only place the scheduler's state changes. Each public method is one database
transaction that checks its preconditions in SQL (``UPDATE ... WHERE state = ...`` and row counts),
so two replicas (or two threads) racing for the same job cannot both win: this is what makes
claims exactly-once. Every transition writes an audit row in the same transaction.

Jobs (``jobs.state``)::

    pending_spec -> queued -> leased -> verifying -> settling -> released
                      ^         |           |            |
                      +---------+-----------+------------+  (lease lost, failed run, rejected)
    any open state -> refunded (chain) | expired (deadline) | failed (attempts used up)
    pending_spec -> invalid (spec missing or malformed: the submitter can cancel)

The on-chain struct of each job (``chain_job``) is folded from escrow events in log order by
:meth:`Store.apply_chain_events` (the watcher) and :meth:`Store.apply_sent` (our own receipts);
``chain_pos`` makes both idempotent.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, Engine, and_, bindparam, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from gridmarket.escrow import JOB_EVENTS, Job, JobState, Status, apply_event
from gridmarket.wire import JobSpec, NodeCapacityIn, ResultReport
from scheduler.matching.reputation import (
    DEFAULT_POLICY,
    Outcome,
    ReputationPolicy,
    ReputationState,
    is_excluded,
    record,
    score,
)

from .db import make_engine, migrate
from .tables import attempts, audit, cursors, jobs, nodes, outbox, wallets

__all__ = [
    "Claim",
    "ClaimedJob",
    "ConflictError",
    "JobRow",
    "NodeRow",
    "NotFoundError",
    "OutboxItem",
    "ReplayError",
    "Store",
    "StoreError",
]

OPEN_STATES = ("pending_spec", "queued", "leased", "verifying", "settling")
LEASED_STATES = ("leased",)
CHAIN_CURSOR = "escrow"


class StoreError(Exception):
    """Base of the store's refusals."""


class NotFoundError(StoreError, LookupError):
    """No such node or job."""


class ConflictError(StoreError):
    """The request does not fit the current state (a stale attempt, a job not yours, ...)."""


class ReplayError(StoreError):
    """A registration nonce at or below one already used by that wallet."""


def node_id_for(wallet: str, name: str) -> str:
    """Stable id of a wallet's node ``name`` (re-registering keeps it)."""
    return "n-" + hashlib.sha256(f"{wallet.lower()}/{name}".encode()).hexdigest()[:16]


def pos_of(block: int, log_index: int) -> int:
    """Total order of a log in the chain (block, then log index)."""
    return block * 100_000 + log_index


def job_to_json(state: JobState) -> dict[str, Any]:
    j = state.job
    return {
        "submitter": j.submitter,
        "bounty": str(j.bounty),
        "provider": j.provider,
        "deadline": j.deadline,
        "submitted_at": j.submitted_at,
        "fee_bps": j.fee_bps,
        "attempt": j.attempt,
        "result_digest": "0x" + j.result_digest.hex(),
        "output_cid": state.output_cid,
    }


@dataclass(frozen=True, slots=True)
class NodeRow:
    node_id: str
    wallet: str
    name: str
    capacity: NodeCapacityIn
    tier: str
    region: str
    slots: int
    running: int
    status: str
    agent_version: str
    registered_at: float
    last_seen: float
    reputation: ReputationState
    jobs_done: int
    jobs_failed: int
    suspended: bool

    def score(self, now: float, policy: ReputationPolicy = DEFAULT_POLICY) -> float:
        return score(self.reputation, now, policy)

    def excluded(self, now: float, policy: ReputationPolicy = DEFAULT_POLICY) -> bool:
        return self.suspended or is_excluded(self.reputation, now, policy)

    @classmethod
    def of(cls, r: Any) -> NodeRow:
        return cls(
            node_id=r.node_id,
            wallet=r.wallet,
            name=r.name,
            capacity=NodeCapacityIn.model_validate(r.capacity),
            tier=r.tier,
            region=r.region,
            slots=r.slots,
            running=r.running,
            status=r.status,
            agent_version=r.agent_version,
            registered_at=r.registered_at,
            last_seen=r.last_seen,
            reputation=ReputationState(
                good=r.rep_good,
                bad=r.rep_bad,
                at=r.rep_at,
                streak=r.rep_streak,
                last_bad_at=r.rep_last_bad,
            ),
            jobs_done=r.jobs_done,
            jobs_failed=r.jobs_failed,
            suspended=r.suspended,
        )


_SPECS: dict[str, JobSpec] = {}


def _spec(cid: str, data: Any) -> JobSpec:
    """Parsed job specs by CID: a CID's content never changes, so each is validated once."""
    spec = _SPECS.get(cid)
    if spec is None:
        if len(_SPECS) > 50_000:
            _SPECS.clear()
        spec = _SPECS[cid] = JobSpec.model_validate(data)
    return spec


@dataclass(frozen=True, slots=True)
class JobRow:
    job_id: str
    submitter: str
    bounty_wei: int
    deadline: int
    fee_bps: int
    salt: str
    spec_cid: str
    spec: JobSpec | None
    state: str
    reason: str
    created_block: int
    created_at: float
    updated_at: float
    queued_at: float | None
    chain: JobState
    chain_pos: int
    output_cid: str | None
    node_id: str | None
    attempt: int
    lease_expires: float | None
    excluded: tuple[str, ...]
    failures: int
    result: ResultReport | None

    @classmethod
    def of(cls, r: Any) -> JobRow:
        cj = r.chain_job
        chain = JobState(
            job_id=bytes.fromhex(r.job_id[2:]),
            job=Job(
                submitter=cj["submitter"],
                bounty=int(cj["bounty"]),
                provider=cj["provider"],
                deadline=cj["deadline"],
                submitted_at=cj["submitted_at"],
                fee_bps=cj["fee_bps"],
                attempt=cj["attempt"],
                result_digest=bytes.fromhex(cj["result_digest"][2:]),
            ),
            status=Status(r.chain_status),
            spec_cid=r.spec_cid,
            salt=bytes.fromhex(r.salt[2:]),
            output_cid=cj.get("output_cid"),
        )
        return cls(
            job_id=r.job_id,
            submitter=r.submitter,
            bounty_wei=int(r.bounty_wei),
            deadline=r.deadline,
            fee_bps=r.fee_bps,
            salt=r.salt,
            spec_cid=r.spec_cid,
            spec=None if r.spec is None else _spec(r.spec_cid, r.spec),
            state=r.state,
            reason=r.reason,
            created_block=r.created_block,
            created_at=r.created_at,
            updated_at=r.updated_at,
            queued_at=r.queued_at,
            chain=chain,
            chain_pos=r.chain_pos,
            output_cid=r.output_cid,
            node_id=r.node_id,
            attempt=r.attempt,
            lease_expires=r.lease_expires,
            excluded=tuple(r.excluded or ()),
            failures=r.failures,
            result=None if r.result is None else ResultReport.model_validate(r.result),
        )


@dataclass(frozen=True, slots=True)
class Claim:
    """A decision of the dispatcher: give ``job_id`` to ``node_id``."""

    job_id: str
    node_id: str


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A claim that won: the job (as leased) and the node's wallet."""

    job: JobRow
    node_id: str
    wallet: str


@dataclass(frozen=True, slots=True)
class OutboxItem:
    id: int
    job_id: str
    kind: str
    payload: dict[str, Any]
    tries: int
    created_at: float


class Store:
    """All reads and writes of the scheduler's database."""

    def __init__(
        self,
        url: str,
        *,
        policy: ReputationPolicy = DEFAULT_POLICY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.engine: Engine = make_engine(url)
        file_sqlite = self.engine.dialect.name == "sqlite" and self.engine.url.database not in (
            None,
            "",
            ":memory:",
        )
        self.reader: Engine = make_engine(url, readonly=True) if file_sqlite else self.engine
        self.policy = policy
        self.clock = clock
        self.postgres = self.engine.dialect.name == "postgresql"
        self.on_queued: Callable[[int], None] = lambda n: None

    def migrate(self) -> None:
        migrate(self.engine)

    def close(self) -> None:
        self.engine.dispose()
        self.reader.dispose()

    # ------------------------------------------------------------------ helpers
    def _audit(
        self, conn: Connection, entity: str, entity_id: str, event: str, **detail: Any
    ) -> None:
        conn.execute(
            insert(audit).values(
                ts=self.clock(), entity=entity, entity_id=entity_id, event=event, detail=detail
            )
        )

    def _node(self, conn: Connection, node_id: str, *, lock: bool = False) -> NodeRow:
        q = select(nodes).where(nodes.c.node_id == node_id)
        if lock and self.postgres:
            q = q.with_for_update()
        row = conn.execute(q).first()
        if row is None:
            raise NotFoundError(f"no node {node_id}")
        return NodeRow.of(row)

    def _job(self, conn: Connection, job_id: str, *, lock: bool = False) -> JobRow:
        q = select(jobs).where(jobs.c.job_id == job_id)
        if lock and self.postgres:
            q = q.with_for_update()
        row = conn.execute(q).first()
        if row is None:
            raise NotFoundError(f"no job {job_id}")
        return JobRow.of(row)

    def _reputation(self, conn: Connection, node_id: str, outcome: Outcome) -> None:
        node = self._node(conn, node_id)
        rep = record(node.reputation, outcome, self.clock(), self.policy)
        values: dict[str, Any] = {
            "rep_good": rep.good,
            "rep_bad": rep.bad,
            "rep_at": rep.at,
            "rep_streak": rep.streak,
            "rep_last_bad": rep.last_bad_at,
        }
        if outcome is Outcome.SUCCESS:
            values["jobs_done"] = nodes.c.jobs_done + 1
        else:
            values["jobs_failed"] = nodes.c.jobs_failed + 1
        conn.execute(update(nodes).where(nodes.c.node_id == node_id).values(**values))

    def _free_slot(self, conn: Connection, node_id: str) -> None:
        conn.execute(
            update(nodes)
            .where(nodes.c.node_id == node_id, nodes.c.running > 0)
            .values(running=nodes.c.running - 1)
        )

    def _end_attempt(
        self, conn: Connection, job_id: str, attempt: int, outcome: str, detail: str = ""
    ) -> None:
        conn.execute(
            update(attempts)
            .where(
                attempts.c.job_id == job_id,
                attempts.c.attempt == attempt,
                attempts.c.ended_at.is_(None),
            )
            .values(ended_at=self.clock(), outcome=outcome, detail=detail[:2000])
        )

    def _requeue(
        self, conn: Connection, job: JobRow, *, exclude: bool, reason: str, failed: bool = False
    ) -> str:
        """Put a leased/verifying job back in the queue (or fail it when attempts are used up)."""
        now = self.clock()
        excluded = list(job.excluded)
        if exclude and job.node_id and job.node_id not in excluded:
            excluded.append(job.node_id)
        failures = job.failures + (1 if failed else 0)
        max_attempts = job.spec.max_attempts if job.spec else 1
        if failures >= max_attempts:
            state, why = "failed", f"{reason}; {failures} failed attempts, no more tries"
            self._outbox(conn, job.job_id, "unassign", {})
        elif now > job.deadline:
            state, why = "expired", f"{reason}; deadline passed"
        else:
            state, why = "queued", reason
        conn.execute(
            update(jobs)
            .where(jobs.c.job_id == job.job_id)
            .values(
                state=state,
                reason=why,
                node_id=None,
                lease_expires=None,
                excluded=excluded,
                failures=failures,
                queued_at=now if state == "queued" else job.queued_at,
                updated_at=now,
            )
        )
        self._audit(conn, "job", job.job_id, state, reason=why, node_id=job.node_id)
        return state

    def _outbox(self, conn: Connection, job_id: str, kind: str, payload: dict[str, Any]) -> None:
        now = self.clock()
        conn.execute(
            insert(outbox).values(
                job_id=job_id,
                kind=kind,
                payload=payload,
                status="pending",
                tries=0,
                error="",
                created_at=now,
                updated_at=now,
            )
        )

    # ------------------------------------------------------------------ nodes
    def register_node(
        self,
        *,
        wallet: str,
        name: str,
        capacity: NodeCapacityIn,
        tier: str,
        agent_version: str,
        nonce: int,
    ) -> NodeRow:
        """Record a verified registration; ReplayError if ``nonce`` is not above the last one."""
        now = self.clock()
        node_id = node_id_for(wallet, name)
        cap = capacity.model_dump(mode="json")
        with self.engine.begin() as conn:
            last = conn.execute(
                select(wallets.c.last_nonce).where(wallets.c.address == wallet)
            ).scalar()
            if last is not None and nonce <= last:
                raise ReplayError(
                    f"registration nonce {nonce} is not above {last}, the last one used by {wallet}"
                )
            if last is None:
                try:
                    with conn.begin_nested():
                        conn.execute(
                            insert(wallets).values(address=wallet, last_nonce=nonce, updated_at=now)
                        )
                except IntegrityError:
                    raise ReplayError(f"concurrent registration for {wallet}") from None
            else:
                n = conn.execute(
                    update(wallets)
                    .where(wallets.c.address == wallet, wallets.c.last_nonce < nonce)
                    .values(last_nonce=nonce, updated_at=now)
                ).rowcount
                if n != 1:
                    raise ReplayError(f"registration nonce {nonce} already used by {wallet}")
            values = {
                "capacity": cap,
                "tier": tier,
                "region": capacity.region,
                "slots": capacity.slots,
                "status": "online",
                "agent_version": agent_version,
                "last_seen": now,
            }
            existing = conn.execute(
                select(nodes.c.node_id).where(nodes.c.node_id == node_id)
            ).first()
            if existing is None:
                conn.execute(
                    insert(nodes).values(
                        node_id=node_id,
                        wallet=wallet,
                        name=name,
                        registered_at=now,
                        running=0,
                        rep_good=0.0,
                        rep_bad=0.0,
                        rep_at=now,
                        rep_streak=0,
                        rep_last_bad=None,
                        jobs_done=0,
                        jobs_failed=0,
                        suspended=False,
                        **values,
                    )
                )
            else:
                conn.execute(update(nodes).where(nodes.c.node_id == node_id).values(**values))
            self._audit(conn, "node", node_id, "registered", wallet=wallet, capacity=cap)
            return self._node(conn, node_id)

    def node(self, node_id: str) -> NodeRow:
        with self.reader.connect() as conn:
            return self._node(conn, node_id)

    def nodes(
        self, *, status: str | None = None, limit: int = 1000, offset: int = 0
    ) -> list[NodeRow]:
        q = select(nodes).order_by(nodes.c.node_id).limit(limit).offset(offset)
        if status is not None:
            q = q.where(nodes.c.status == status)
        with self.reader.connect() as conn:
            return [NodeRow.of(r) for r in conn.execute(q)]

    def _counts(self, column: Any) -> dict[str, int]:
        """Rows per value of ``column`` (a state or status column)."""
        with self.reader.connect() as conn:
            rows = conn.execute(select(column, func.count()).group_by(column))
            return {str(value): int(n) for value, n in rows}

    def node_counts(self) -> dict[str, int]:
        return self._counts(nodes.c.status)

    def heartbeat(
        self, node_id: str, running: Sequence[str], lease_ttl: float
    ) -> tuple[dict[str, float], list[str]]:
        """Mark the node alive and renew the leases of the jobs it runs.

        Returns (renewed leases: job id -> new expiry, jobs the node must stop because they are
        no longer its own: reassigned, refunded, settled by someone else).
        """
        now = self.clock()
        expires = now + lease_ttl
        with self.engine.begin() as conn:
            n = conn.execute(
                update(nodes)
                .where(nodes.c.node_id == node_id)
                .values(last_seen=now, status="online")
            ).rowcount
            if n != 1:
                raise NotFoundError(f"no node {node_id}")
            if not running:
                return {}, []
            mine = {
                r.job_id: r.state
                for r in conn.execute(
                    select(jobs.c.job_id, jobs.c.state).where(
                        jobs.c.job_id.in_(list(running)), jobs.c.node_id == node_id
                    )
                )
            }
            leased = [j for j, s in mine.items() if s in LEASED_STATES]
            if leased:
                conn.execute(
                    update(jobs)
                    .where(jobs.c.job_id.in_(leased), jobs.c.node_id == node_id)
                    .values(lease_expires=expires)
                )
            keep = set(mine)  # verifying/settling: the node may still be uploading its result
            cancel = [j for j in running if j not in keep]
            return {j: expires for j in leased}, cancel

    def leases_of(self, node_id: str, running: Sequence[str]) -> tuple[list[str], list[str]]:
        """Read-only half of a heartbeat: (the running jobs whose lease the node holds, the jobs
        it must stop). Verifying/settling jobs are neither: the node may still be reporting."""
        if not running:
            return [], []
        with self.reader.connect() as conn:
            mine = {
                r.job_id: r.state
                for r in conn.execute(
                    select(jobs.c.job_id, jobs.c.state).where(
                        jobs.c.job_id.in_(list(running)), jobs.c.node_id == node_id
                    )
                )
            }
        leased = [j for j, st in mine.items() if st in LEASED_STATES]
        return leased, [j for j in running if j not in mine]

    def flush_heartbeats(self, beats: dict[str, tuple[float, list[str]]], lease_ttl: float) -> None:
        """Write half of many heartbeats in one transaction: each node's ``last_seen`` (and
        online again), and the leases of the jobs it reported (still leased to it)."""
        if not beats:
            return
        node_rows = [{"nid": nid, "seen": seen} for nid, (seen, _) in beats.items()]
        lease_rows = [
            {"jid": jid, "nid": nid, "exp": seen + lease_ttl}
            for nid, (seen, leased) in beats.items()
            for jid in leased
        ]
        with self.engine.begin() as conn:
            conn.execute(
                update(nodes)
                .where(nodes.c.node_id == bindparam("nid"))
                .values(last_seen=bindparam("seen"), status="online"),
                node_rows,
            )
            if lease_rows:
                conn.execute(
                    update(jobs)
                    .where(
                        jobs.c.job_id == bindparam("jid"),
                        jobs.c.node_id == bindparam("nid"),
                        jobs.c.state == "leased",
                    )
                    .values(lease_expires=bindparam("exp")),
                    lease_rows,
                )

    def touch_nodes(self, node_ids: Sequence[str]) -> None:
        """Nodes seen alive now (long-polling): ``last_seen`` moves, nothing else."""
        if not node_ids:
            return
        with self.engine.begin() as conn:
            conn.execute(
                update(nodes)
                .where(nodes.c.node_id.in_(list(node_ids)), nodes.c.status == "online")
                .values(last_seen=self.clock())
            )

    def mark_offline(self, timeout: float) -> list[str]:
        """Nodes silent for ``timeout``: offline, and their leased jobs back to the queue."""
        now = self.clock()
        gone: list[str] = []
        with self.engine.begin() as conn:
            rows = conn.execute(
                select(nodes.c.node_id).where(
                    nodes.c.status == "online", nodes.c.last_seen < now - timeout
                )
            ).all()
            for (node_id,) in rows:
                conn.execute(
                    update(nodes).where(nodes.c.node_id == node_id).values(status="offline")
                )
                self._audit(conn, "node", node_id, "offline", silent_for=timeout)
                gone.append(node_id)
                for r in conn.execute(
                    select(jobs).where(jobs.c.node_id == node_id, jobs.c.state == "leased")
                ).all():
                    self._lose_lease(conn, JobRow.of(r), "node went offline")
            queued = conn.info.pop("queued", 0)
        if queued:
            self.on_queued(queued)
        return gone

    def _lose_lease(self, conn: Connection, job: JobRow, why: str) -> None:
        assert job.node_id is not None
        self._end_attempt(conn, job.job_id, job.attempt, "timeout", why)
        self._free_slot(conn, job.node_id)
        self._reputation(conn, job.node_id, Outcome.TIMEOUT)
        if self._requeue(conn, job, exclude=True, reason=f"lease lost: {why}") == "queued":
            conn.info.setdefault("queued", 0)
            conn.info["queued"] += 1

    def expire_leases(self) -> list[str]:
        """Leased jobs whose lease ran out go back to the queue (never to the same node)."""
        now = self.clock()
        lost: list[str] = []
        with self.engine.begin() as conn:
            q = select(jobs).where(jobs.c.state == "leased", jobs.c.lease_expires < now)
            if self.postgres:
                q = q.with_for_update(skip_locked=True)
            for r in conn.execute(q).all():
                job = JobRow.of(r)
                self._lose_lease(conn, job, "lease expired")
                lost.append(job.job_id)
            queued = conn.info.pop("queued", 0)
        if queued:
            self.on_queued(queued)
        return lost

    def expire_deadlines(self) -> list[str]:
        """Open jobs past their deadline stop being offered (the submitter can refund)."""
        now = self.clock()
        with self.engine.begin() as conn:
            rows = conn.execute(
                select(jobs.c.job_id, jobs.c.node_id, jobs.c.attempt, jobs.c.state).where(
                    jobs.c.state.in_(("pending_spec", "queued", "leased")),
                    jobs.c.deadline < now,
                )
            ).all()
            for job_id, node_id, attempt, state in rows:
                if state == "leased" and node_id:
                    self._free_slot(conn, node_id)
                    self._end_attempt(conn, job_id, attempt, "expired", "deadline passed")
                conn.execute(
                    update(jobs)
                    .where(jobs.c.job_id == job_id)
                    .values(
                        state="expired",
                        reason="deadline passed before a result: the submitter can refund",
                        node_id=None,
                        lease_expires=None,
                        updated_at=now,
                    )
                )
                self._audit(conn, "job", job_id, "expired")
            return [r[0] for r in rows]

    # ------------------------------------------------------------------ jobs from the chain
    def chain_cursor(self) -> int | None:
        with self.reader.connect() as conn:
            value = conn.execute(
                select(cursors.c.block).where(cursors.c.name == CHAIN_CURSOR)
            ).scalar()
            return None if value is None else int(value)

    def apply_chain_events(self, events: Sequence[Any], through_block: int) -> int:
        """The watcher's sink: fold escrow events into jobs and move the cursor, atomically.

        ``events`` are :class:`gridmarket.chain.Event` in log order. Events at or before a job's
        ``chain_pos`` were applied already (by an earlier batch or by our own receipt) and are
        skipped, so a repeated batch changes nothing. Returns the number of new jobs.
        """
        created = 0
        with self.engine.begin() as conn:
            for ev in events:
                created += self._apply_event(conn, ev)
            n = conn.execute(
                update(cursors).where(cursors.c.name == CHAIN_CURSOR).values(block=through_block)
            ).rowcount
            if n == 0:
                conn.execute(insert(cursors).values(name=CHAIN_CURSOR, block=through_block))
            queued = conn.info.pop("queued", 0)
        if queued:
            self.on_queued(queued)
        return created

    def apply_sent(self, job_id: str, events: Sequence[Any]) -> None:
        """Fold the events of our own mined transaction (before the watcher sees them)."""
        with self.engine.begin() as conn:
            for ev in events:
                self._apply_event(conn, ev)
            queued = conn.info.pop("queued", 0)
        if queued:
            self.on_queued(queued)

    def _apply_event(self, conn: Connection, ev: Any) -> int:
        args = ev.args
        if ev.name not in JOB_EVENTS:
            return 0
        job_id = "0x" + bytes(args["jobId"]).hex()
        pos = pos_of(ev.block, ev.log_index)
        now = self.clock()
        if ev.name == "JobCreated":
            if conn.execute(select(jobs.c.job_id).where(jobs.c.job_id == job_id)).first():
                return 0
            state = apply_event(None, ev.name, args)
            conn.execute(
                insert(jobs).values(
                    job_id=job_id,
                    submitter=state.job.submitter,
                    bounty_wei=str(state.job.bounty),
                    deadline=state.job.deadline,
                    fee_bps=state.job.fee_bps,
                    salt="0x" + state.salt.hex(),
                    spec_cid=state.spec_cid,
                    spec=None,
                    state="pending_spec",
                    reason="fetching the job spec from IPFS",
                    created_block=ev.block,
                    created_at=now,
                    updated_at=now,
                    queued_at=None,
                    chain_status=int(state.status),
                    chain_job=job_to_json(state),
                    chain_pos=pos,
                    output_cid=None,
                    node_id=None,
                    attempt=0,
                    lease_expires=None,
                    excluded=[],
                    failures=0,
                    result=None,
                )
            )
            self._audit(conn, "job", job_id, "created", tx=ev.tx_hash, block=ev.block)
            return 1
        row = conn.execute(select(jobs).where(jobs.c.job_id == job_id)).first()
        if row is None:
            return 0  # a job created before this scheduler's start block
        job = JobRow.of(row)
        if pos <= job.chain_pos:
            return 0
        new = apply_event(job.chain, ev.name, args)
        values: dict[str, Any] = {
            "chain_status": int(new.status),
            "chain_job": job_to_json(new),
            "chain_pos": pos,
            "updated_at": now,
        }
        if ev.name == "JobRefunded" and job.state not in ("refunded",):
            if job.state == "leased" and job.node_id:
                self._free_slot(conn, job.node_id)
                self._end_attempt(conn, job_id, job.attempt, "refunded", "submitter refunded")
            values.update(state="refunded", reason="refunded to the submitter", node_id=None)
        elif ev.name == "JobReleased":
            if job.node_id is not None:
                self._end_attempt(conn, job_id, job.attempt, "success", f"paid in {ev.tx_hash}")
                self._free_slot(conn, job.node_id)
                self._reputation(conn, job.node_id, Outcome.SUCCESS)
            values.update(
                state="released",
                reason="paid",
                output_cid=new.output_cid,
                node_id=None,
                lease_expires=None,
            )
        elif ev.name == "ResultSubmitted" and job.state == "leased":
            # the provider submitted on-chain itself: verify it like a relayed result
            values.update(state="verifying", reason="verifying the result submitted on-chain")
            values["output_cid"] = new.output_cid
        conn.execute(update(jobs).where(jobs.c.job_id == job_id).values(**values))
        self._audit(conn, "job", job_id, "chain:" + ev.name, tx=ev.tx_hash, block=ev.block)
        return 0

    def pending_specs(self, limit: int = 32) -> list[JobRow]:
        with self.reader.connect() as conn:
            q = (
                select(jobs)
                .where(jobs.c.state == "pending_spec")
                .order_by(jobs.c.created_at)
                .limit(limit)
            )
            return [JobRow.of(r) for r in conn.execute(q)]

    def set_spec(self, job_id: str, spec: JobSpec | None, reason: str = "") -> str:
        """The job's spec was fetched: queue it, or mark it invalid with ``reason``."""
        now = self.clock()
        with self.engine.begin() as conn:
            if spec is None:
                values: dict[str, Any] = {"state": "invalid", "reason": reason}
            else:
                values = {
                    "state": "queued",
                    "spec": spec.model_dump(mode="json"),
                    "reason": "waiting for a node",
                    "queued_at": now,
                }
            n = conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id, jobs.c.state == "pending_spec")
                .values(updated_at=now, **values)
            ).rowcount
            if n:
                self._audit(conn, "job", job_id, str(values["state"]), reason=reason)
        if n and spec is not None:
            self.on_queued(1)
        return str(values["state"]) if n else "unchanged"

    def set_reason(self, job_id: str, reason: str) -> None:
        """Why a queued job waits (the matching engine's explanation); no audit row."""
        with self.engine.begin() as conn:
            conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id, jobs.c.state == "queued")
                .values(reason=reason)
            )

    def job(self, job_id: str) -> JobRow:
        with self.reader.connect() as conn:
            return self._job(conn, job_id)

    def jobs(
        self,
        *,
        state: str | None = None,
        submitter: str | None = None,
        node_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[JobRow]:
        q = select(jobs).order_by(jobs.c.created_at.desc()).limit(limit).offset(offset)
        if state is not None:
            q = q.where(jobs.c.state == state)
        if submitter is not None:
            q = q.where(func.lower(jobs.c.submitter) == submitter.lower())
        if node_id is not None:
            q = q.where(jobs.c.node_id == node_id)
        with self.reader.connect() as conn:
            return [JobRow.of(r) for r in conn.execute(q)]

    def job_counts(self) -> dict[str, int]:
        return self._counts(jobs.c.state)

    def attempts_of(self, job_id: str) -> list[dict[str, Any]]:
        with self.reader.connect() as conn:
            q = select(attempts).where(attempts.c.job_id == job_id).order_by(attempts.c.id)
            return [dict(r._mapping) for r in conn.execute(q)]

    def audit_of(self, entity_id: str, limit: int = 500) -> list[dict[str, Any]]:
        with self.reader.connect() as conn:
            q = (
                select(audit)
                .where(audit.c.entity_id == entity_id)
                .order_by(audit.c.id)
                .limit(limit)
            )
            return [dict(r._mapping) for r in conn.execute(q)]

    # ------------------------------------------------------------------ dispatch
    def dispatch(
        self,
        decide: Callable[[list[JobRow]], list[Claim]],
        *,
        limit: int,
        lease_ttl: float,
        window: int | None = None,
        wants_more: Callable[[], bool] = lambda: False,
    ) -> list[ClaimedJob]:
        """One dispatch round in one transaction: lock queued jobs, oldest first, let ``decide``
        pick (job, node) pairs, and lease each pair whose node still has a free slot.

        Jobs are read ``window`` at a time (default: all ``limit`` at once); after each window
        the round goes on to the next only while ``wants_more()`` (nodes still wait) and fewer
        than ``limit`` jobs were looked at. A round for a few waiting nodes thus reads a few
        jobs, yet jobs that fit nobody at the head of the queue cannot starve the ones behind.

        On PostgreSQL the queued rows are taken ``FOR UPDATE SKIP LOCKED``: a replica never sees
        the jobs another replica is deciding on, so no job goes to two nodes. The node's slot
        counter is taken with a conditional update, so no node runs more than its slots.
        """
        now = self.clock()
        won: list[ClaimedJob] = []
        new_attempts: list[dict[str, Any]] = []
        new_outbox: list[dict[str, Any]] = []
        new_audit: list[dict[str, Any]] = []
        window = min(window or limit, limit)
        with self.engine.begin() as conn:
            offset = 0
            while offset < limit:
                q = (
                    select(jobs)
                    .where(jobs.c.state == "queued")
                    .order_by(jobs.c.queued_at, jobs.c.job_id)
                    .limit(window)
                    .offset(offset)
                )
                if self.postgres:
                    q = q.with_for_update(skip_locked=True)
                rows = [JobRow.of(r) for r in conn.execute(q)]
                if not rows:
                    break
                batch = (new_attempts, new_outbox, new_audit)
                by_id = {j.job_id: j for j in rows}
                self._lease(conn, decide(rows), by_id, now, lease_ttl, won, *batch)
                if len(rows) < window or not wants_more():
                    break
                offset += window
            if won:  # one multi-row statement each (executemany)
                conn.execute(insert(attempts), new_attempts)
                conn.execute(insert(outbox), new_outbox)
                conn.execute(insert(audit), new_audit)
        return won

    def _lease(
        self,
        conn: Connection,
        claims: list[Claim],
        by_id: dict[str, JobRow],
        now: float,
        lease_ttl: float,
        won: list[ClaimedJob],
        new_attempts: list[dict[str, Any]],
        new_outbox: list[dict[str, Any]],
        new_audit: list[dict[str, Any]],
    ) -> None:
        for claim in claims:
            job = by_id[claim.job_id]
            slot = conn.execute(
                update(nodes)
                .where(
                    nodes.c.node_id == claim.node_id,
                    nodes.c.status == "online",
                    nodes.c.running < nodes.c.slots,
                )
                .values(running=nodes.c.running + 1)
                .returning(nodes.c.wallet)
            ).first()
            if slot is None:
                continue
            attempt = max(job.attempt, job.chain.job.attempt) + 1
            expires = now + lease_ttl
            n = conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job.job_id, jobs.c.state == "queued")
                .values(
                    state="leased",
                    node_id=claim.node_id,
                    attempt=attempt,
                    lease_expires=expires,
                    reason=f"running on {claim.node_id}",
                    updated_at=now,
                )
            ).rowcount
            if n != 1:  # cannot happen under the row lock; kept as a guard for SQLite
                self._free_slot(conn, claim.node_id)
                continue
            wallet = str(slot[0])
            new_attempts.append(
                {
                    "job_id": job.job_id,
                    "attempt": attempt,
                    "node_id": claim.node_id,
                    "wallet": wallet,
                    "started_at": now,
                    "detail": "",
                }
            )
            new_outbox.append(
                {
                    "job_id": job.job_id,
                    "kind": "assign",
                    "payload": {"provider": wallet, "attempt": attempt},
                    "status": "pending",
                    "tries": 0,
                    "error": "",
                    "created_at": now,
                    "updated_at": now,
                }
            )
            new_audit.append(
                {
                    "ts": now,
                    "entity": "job",
                    "entity_id": job.job_id,
                    "event": "leased",
                    "detail": {"node_id": claim.node_id, "attempt": attempt},
                }
            )
            leased = replace(
                job,
                state="leased",
                node_id=claim.node_id,
                attempt=attempt,
                lease_expires=expires,
                updated_at=now,
            )
            won.append(ClaimedJob(job=leased, node_id=claim.node_id, wallet=wallet))

    def running_specs(self, node_id: str) -> list[JobSpec]:
        """The specs of the jobs leased to ``node_id`` (what its capacity is busy with): two
        columns per row and the parsed-spec cache, not whole job rows (the poll's hot path)."""
        with self.reader.connect() as conn:
            q = select(jobs.c.spec_cid).where(jobs.c.node_id == node_id, jobs.c.state == "leased")
            cids = [str(cid) for (cid,) in conn.execute(q)]
            missing = [cid for cid in set(cids) if cid not in _SPECS]
            if missing:  # parse each spec once; later polls read only the CIDs
                q = select(jobs.c.spec_cid, jobs.c.spec).where(
                    jobs.c.spec_cid.in_(missing), jobs.c.spec.is_not(None)
                )
                for cid, data in conn.execute(q):
                    _spec(cid, data)
            return [_SPECS[cid] for cid in cids if cid in _SPECS]

    def running_jobs(self, node_id: str) -> list[JobRow]:
        with self.reader.connect() as conn:
            q = select(jobs).where(jobs.c.node_id == node_id, jobs.c.state == "leased")
            return [JobRow.of(r) for r in conn.execute(q)]

    def hand_back(self, job_id: str, node_id: str) -> str:
        """The node gives a job back unfinished (shutdown): queued again, no penalty."""
        with self.engine.begin() as conn:
            job = self._job(conn, job_id, lock=True)
            if job.node_id != node_id or job.state != "leased":
                raise ConflictError(f"job {job_id} is not leased to node {node_id}")
            self._end_attempt(conn, job_id, job.attempt, "handed_back")
            self._free_slot(conn, node_id)
            state = self._requeue(conn, job, exclude=False, reason=f"handed back by {node_id}")
        if state == "queued":
            self.on_queued(1)
        return state

    # ------------------------------------------------------------------ results
    def record_result(self, job_id: str, node_id: str, report: ResultReport) -> str:
        """A node reports the end of its run. Success -> ``verifying``; a failed run is
        requeued elsewhere (or fails the job when its attempts are used up)."""
        with self.engine.begin() as conn:
            job = self._job(conn, job_id, lock=True)
            if (
                job.state == "verifying"
                and job.node_id == node_id
                and job.attempt == report.attempt
                and job.result is None
                and report.output_cid == job.output_cid
            ):
                # the node submitted this result on-chain itself and the watcher saw it first:
                # keep the report (logs, exit code) for the submitter
                conn.execute(
                    update(jobs)
                    .where(jobs.c.job_id == job_id)
                    .values(result=report.model_dump(mode="json"))
                )
                return "verifying"
            if job.node_id != node_id or job.state != "leased":
                raise ConflictError(
                    f"job {job_id} is not leased to node {node_id} (it is {job.state})"
                )
            if report.attempt != job.attempt:
                raise ConflictError(
                    f"attempt {report.attempt} is stale: the lease is attempt {job.attempt}"
                )
            result = report.model_dump(mode="json")
            if report.output_cid is not None and report.reason.value == "succeeded":
                conn.execute(
                    update(jobs)
                    .where(jobs.c.job_id == job_id)
                    .values(
                        state="verifying",
                        reason="verifying the output",
                        result=result,
                        output_cid=report.output_cid,
                        lease_expires=None,
                        updated_at=self.clock(),
                    )
                )
                self._audit(conn, "job", job_id, "verifying", output_cid=report.output_cid)
                return "verifying"
            self._end_attempt(conn, job_id, job.attempt, "failure", report.message)
            self._free_slot(conn, node_id)
            self._reputation(conn, node_id, Outcome.FAILURE)
            conn.execute(update(jobs).where(jobs.c.job_id == job_id).values(result=result))
            state = self._requeue(
                conn,
                job,
                exclude=True,
                failed=True,
                reason=f"attempt {job.attempt} failed on {node_id}: {report.reason.value}",
            )
        if state == "queued":
            self.on_queued(1)
        return state

    def verifying(self, limit: int = 16) -> list[JobRow]:
        with self.reader.connect() as conn:
            q = (
                select(jobs)
                .where(jobs.c.state == "verifying")
                .order_by(jobs.c.updated_at)
                .limit(limit)
            )
            return [JobRow.of(r) for r in conn.execute(q)]

    def verified(self, job_id: str, ok: bool, detail: str) -> str:
        """Verification done. Good: settle on-chain (relayed) or release (submitted directly).
        Bad: the result goes on-chain and is rejected (slash), then the job is requeued."""
        with self.engine.begin() as conn:
            job = self._job(conn, job_id, lock=True)
            if job.state != "verifying":
                return job.state
            on_chain = job.chain.status is Status.SUBMITTED
            result = job.result
            if ok:
                if on_chain:
                    kind, payload = "release", {}
                else:
                    assert result is not None and result.signature is not None
                    payload = {"output_cid": job.output_cid, "signature": result.signature}
                    kind = "settle"
                self._outbox(conn, job_id, kind, payload)
                state, reason = "settling", f"verified ({detail}); paying the provider"
            else:
                if on_chain:
                    kind, payload = "reject", {}
                else:
                    assert result is not None and result.signature is not None
                    payload = {"output_cid": job.output_cid, "signature": result.signature}
                    kind = "submit_reject"
                self._outbox(conn, job_id, kind, payload)
                state, reason = "settling", f"verification failed ({detail}); rejecting on-chain"
            conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id)
                .values(state=state, reason=reason, updated_at=self.clock())
            )
            self._audit(conn, "job", job_id, "verified" if ok else "rejected", detail=detail)
            return state

    def settled(self, job_id: str, *, paid: bool, detail: str = "") -> str:
        """The outbox finished a settle/release (``paid``) or a reject (not paid)."""
        with self.engine.begin() as conn:
            job = self._job(conn, job_id, lock=True)
            node_id = job.node_id
            if node_id is None:
                return job.state
            if paid:
                self._end_attempt(conn, job_id, job.attempt, "success", detail)
                self._free_slot(conn, node_id)
                self._reputation(conn, node_id, Outcome.SUCCESS)
                conn.execute(
                    update(jobs)
                    .where(jobs.c.job_id == job_id)
                    .values(state="released", reason="paid", node_id=None, updated_at=self.clock())
                )
                self._audit(conn, "job", job_id, "released", node_id=node_id)
                return "released"
            self._end_attempt(conn, job_id, job.attempt, "rejected", detail)
            self._free_slot(conn, node_id)
            self._reputation(conn, node_id, Outcome.REJECTED)
            state = self._requeue(
                conn, job, exclude=True, failed=True, reason=f"result rejected: {detail}"
            )
        if state == "queued":
            self.on_queued(1)
        return state

    def assign_failed(self, job_id: str, attempt: int, error: str) -> str:
        """The on-chain assign of ``attempt`` reverted: end that lease (no fault of the node)."""
        with self.engine.begin() as conn:
            job = self._job(conn, job_id, lock=True)
            if job.attempt != attempt or job.state != "leased" or job.node_id is None:
                return job.state
            self._end_attempt(conn, job_id, attempt, "assign_failed", error)
            self._free_slot(conn, job.node_id)
            conn.execute(
                update(jobs).where(jobs.c.job_id == job_id).values(attempt=job.chain.job.attempt)
            )
            job = self._job(conn, job_id)
            terminal = "Deadline" in error or "Status" in error
            if terminal:
                conn.execute(
                    update(jobs)
                    .where(jobs.c.job_id == job_id)
                    .values(
                        state="failed",
                        reason=f"on-chain assign refused: {error}",
                        node_id=None,
                        lease_expires=None,
                        updated_at=self.clock(),
                    )
                )
                self._audit(conn, "job", job_id, "failed", error=error)
                return "failed"
            state = self._requeue(
                conn, job, exclude=True, reason=f"on-chain assign refused: {error}"
            )
        if state == "queued":
            self.on_queued(1)
        return state

    def fail_job(self, job_id: str, reason: str) -> None:
        """Give up on an open job (an on-chain step was refused for good)."""
        with self.engine.begin() as conn:
            job = self._job(conn, job_id, lock=True)
            if job.state not in OPEN_STATES:
                return
            if job.node_id is not None:
                self._end_attempt(conn, job_id, job.attempt, "failed", reason)
                self._free_slot(conn, job.node_id)
            conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id)
                .values(
                    state="failed",
                    reason=reason,
                    node_id=None,
                    lease_expires=None,
                    updated_at=self.clock(),
                )
            )
            self._audit(conn, "job", job_id, "failed", reason=reason)

    # ------------------------------------------------------------------ outbox
    def outbox_pending(self, limit: int = 64) -> list[OutboxItem]:
        with self.reader.connect() as conn:
            q = (
                select(outbox)
                .where(outbox.c.status == "pending")
                .order_by(outbox.c.id)
                .limit(limit)
            )
            return [
                OutboxItem(r.id, r.job_id, r.kind, dict(r.payload), r.tries, r.created_at)
                for r in conn.execute(q)
            ]

    def outbox_finish(
        self, item_id: int, *, status: str, tx_hash: str | None = None, error: str = ""
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(outbox)
                .where(outbox.c.id == item_id)
                .values(
                    status=status,
                    tx_hash=tx_hash,
                    error=error[:2000],
                    tries=outbox.c.tries + 1,
                    updated_at=self.clock(),
                )
            )

    def outbox_retry(self, item_id: int, error: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(outbox)
                .where(outbox.c.id == item_id)
                .values(tries=outbox.c.tries + 1, error=error[:2000], updated_at=self.clock())
            )

    def outbox_counts(self) -> dict[str, int]:
        return self._counts(outbox.c.status)

    # ------------------------------------------------------------------ misc
    def ping(self) -> bool:
        with self.reader.connect() as conn:
            conn.execute(select(1))
        return True

    def online_nodes_by(self, ids: Iterable[str]) -> dict[str, NodeRow]:
        ids = list(ids)
        if not ids:
            return {}
        with self.reader.connect() as conn:
            q = select(nodes).where(and_(nodes.c.node_id.in_(ids), nodes.c.status == "online"))
            return {r.node_id: NodeRow.of(r) for r in conn.execute(q)}
