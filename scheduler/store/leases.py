"""Leases after the claim: heartbeats that renew them (at once, or written behind in batches),
lost leases (silent nodes, expired leases), deadlines, hand-backs, and what a node runs."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import BigInteger, Connection, bindparam, select, update

from gridmarket.wire import JobSpec
from scheduler import lifecycle
from scheduler.lifecycle import Event, State
from scheduler.matching.reputation import Outcome

from .jobs import JobStore
from .rows import SPEC_CACHE, ConflictError, JobRow, NotFoundError, cached_spec
from .tables import job_columns, jobs, nodes

__all__ = ["LeaseStore"]

LEASED = State.LEASED.value
PAST_DEADLINE = select(jobs.c.job_id, jobs.c.node_id, jobs.c.attempt, jobs.c.state).where(
    jobs.c.state.in_([s.value for s in lifecycle.sources(Event.DEADLINE_PASSED)]),
    # an integer bound: ``deadline`` is a BIGINT, and compared with a float PostgreSQL casts
    # every row's and cannot use ``ix_jobs_state_deadline`` (the sweeper then read every queued
    # job each second on every replica: 0.4-0.8 s a read at 92,000 queued)
    jobs.c.deadline < bindparam("now_", type_=BigInteger),
)
"""Open jobs past their deadline; ``now_``: :func:`math.ceil` of the time (``deadline <
now`` for a whole-second deadline)."""


class LeaseStore(JobStore):
    """Renewing, losing and handing back leases."""

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
            # jobs before the node (the store's lock order): the leases are extended first
            leased: list[str] = []
            mine: dict[str, str] = {}
            if running:
                mine = {
                    r.job_id: r.state
                    for r in conn.execute(
                        select(jobs.c.job_id, jobs.c.state).where(
                            jobs.c.job_id.in_(list(running)), jobs.c.node_id == node_id
                        )
                    )
                }
                leased = sorted(j for j, s in mine.items() if s == LEASED)
            if leased:
                # an offer is not renewed: it must be accepted within the lease TTL
                conn.execute(
                    update(jobs)
                    .where(
                        jobs.c.job_id.in_(leased),
                        jobs.c.node_id == node_id,
                        jobs.c.acceptance.is_not(None),
                    )
                    .values(lease_expires=expires)
                )
            n = conn.execute(
                update(nodes)
                .where(nodes.c.node_id == node_id)
                .values(last_seen=now, status="online")
            ).rowcount
            if n != 1:
                raise NotFoundError(f"no node {node_id}")
            keep = set(mine)  # verifying/settling: the node may still be uploading its result
            cancel = [j for j in running if j not in keep]
            return {j: expires for j in leased}, cancel

    def leases_of(self, node_id: str, running: Sequence[str]) -> tuple[list[str], list[str]]:
        """Read-only half of a heartbeat: (the running jobs whose lease the node holds, the jobs
        it must stop). Verifying/settling jobs are neither: the node may still be reporting.

        Jobs this replica knows leased to the node (its own claims, or an earlier read) need no
        read: the answer comes from memory. A job that left the node elsewhere (another replica,
        a chain event) is forgotten at the next flush (:meth:`flush_heartbeats`), whose lease
        extension is guarded in SQL; the node then hears ``cancel`` on its next heartbeat."""
        if not running:
            return [], []
        known = self.leases_known(node_id, running)
        if known is not None:
            return known, []
        with self.reader.connect() as conn:
            mine = {
                r.job_id: (r.state, r.spec_cid)
                for r in conn.execute(
                    select(jobs.c.job_id, jobs.c.state, jobs.c.spec_cid).where(
                        jobs.c.job_id.in_(list(running)), jobs.c.node_id == node_id
                    )
                )
            }
        leased = [j for j, (st, _) in mine.items() if st == LEASED]
        if leased:
            self._held_add(node_id, [(j, str(mine[j][1])) for j in leased])
        return leased, [j for j in running if j not in mine]

    def leases_known(self, node_id: str, running: Sequence[str]) -> list[str] | None:
        """:meth:`leases_of` from memory alone (no I/O, safe on the event loop): the running
        jobs, once each, when this replica knows every one of them leased to ``node_id``;
        else None (read them)."""
        known = self._held_jobs(node_id)
        if known is None or not all(j in known for j in running):
            return None
        return list(dict.fromkeys(running))

    def flush_heartbeats(self, beats: dict[str, tuple[float, list[str]]], lease_ttl: float) -> None:
        """Write half of many heartbeats in one transaction: each node's ``last_seen`` (and
        online again), and the leases of the jobs it reported (still leased to it)."""
        if not beats:
            return
        # rows are locked in one order everywhere, jobs before nodes, each by id: a flush that
        # took its nodes first (in arrival order) deadlocked with verdicts and dispatch rounds
        # holding a job and waiting for its node (PostgreSQL, the 100,000-job soak)
        node_rows = [{"nid": nid, "seen": beats[nid][0]} for nid in sorted(beats)]
        lease_rows = sorted(
            (
                {"jid": jid, "nid": nid, "exp": seen + lease_ttl}
                for nid, (seen, leased) in beats.items()
                for jid in leased
            ),
            key=lambda r: (r["jid"], r["nid"]),
        )
        with self.engine.begin() as conn:
            if lease_rows:
                conn.execute(
                    update(jobs)
                    .where(
                        jobs.c.job_id == bindparam("jid"),
                        jobs.c.node_id == bindparam("nid"),
                        jobs.c.state == LEASED,
                        jobs.c.acceptance.is_not(None),  # an offer is not renewed
                    )
                    .values(lease_expires=bindparam("exp")),
                    lease_rows,
                )
                # reconcile what heartbeats answered from memory: jobs reported as leased
                # that are no longer leased to that node are forgotten (read, not guessed)
                self._forget_moved(conn, lease_rows)
            conn.execute(
                update(nodes)
                .where(nodes.c.node_id == bindparam("nid"))
                .values(last_seen=bindparam("seen"), status="online"),
                node_rows,
            )

    def _forget_moved(self, conn: Connection, lease_rows: list[dict[str, Any]]) -> None:
        reported = [(r["nid"], r["jid"]) for r in lease_rows]
        ids = list({jid for _, jid in reported})
        holder: dict[str, str | None] = {}
        for i in range(0, len(ids), 500):
            q = select(jobs.c.job_id, jobs.c.node_id, jobs.c.state).where(
                jobs.c.job_id.in_(ids[i : i + 500])
            )
            for job_id, nid, state in conn.execute(q):
                holder[job_id] = nid if state == LEASED else None
        moved: dict[str, list[str]] = {}
        for nid, jid in reported:
            if holder.get(jid) != nid:
                moved.setdefault(nid, []).append(jid)
        for nid, jids in moved.items():
            self._held_drop(nid, jids)

    def mark_offline(self, timeout: float) -> list[str]:
        """Nodes silent for ``timeout``: offline, and their leased jobs back to the queue."""
        now = self.clock()
        gone: list[str] = []
        with self._begin_jobs_first() as conn:
            rows = conn.execute(
                select(nodes.c.node_id)
                .where(nodes.c.status == "online", nodes.c.last_seen < now - timeout)
                .order_by(nodes.c.node_id)
            ).all()
            for (node_id,) in rows:
                self._node_write(conn, node_id, self._offline_write(conn, node_id))
                self._audit(conn, "node", node_id, "offline", silent_for=timeout)
                gone.append(node_id)
                for r in conn.execute(
                    select(*job_columns).where(jobs.c.node_id == node_id, jobs.c.state == LEASED)
                ).all():
                    self._lose_lease(conn, JobRow.of(r), "node went offline")
            queued = conn.info.pop("queued", 0)
        if queued:
            self.on_queued(queued)
        return gone

    @staticmethod
    def _offline_write(conn: Connection, node_id: str) -> Callable[[], object]:
        return lambda: conn.execute(
            update(nodes).where(nodes.c.node_id == node_id).values(status="offline")
        )

    def _lose_lease(self, conn: Connection, job: JobRow, why: str) -> None:
        assert job.node_id is not None
        self._held_drop(job.node_id, [job.job_id])
        self._end_attempt(conn, job.job_id, job.attempt, "timeout", why)
        self._free_slot(conn, job.node_id)
        self._reputation(conn, job.node_id, Outcome.TIMEOUT)
        reason = f"lease lost: {why}"
        if self._requeue(conn, job, Event.LEASE_LOST, exclude=True, reason=reason) == "queued":
            conn.info.setdefault("queued", 0)
            conn.info["queued"] += 1

    def expire_leases(self) -> list[str]:
        """Leased jobs whose lease ran out go back to the queue (never to the same node)."""
        now = self.clock()
        lost: list[str] = []
        with self._begin_jobs_first() as conn:
            q = select(*job_columns).where(jobs.c.state == LEASED, jobs.c.lease_expires < now)
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
        with self._begin_jobs_first() as conn:
            rows = conn.execute(PAST_DEADLINE, {"now_": math.ceil(now)}).all()
            for job_id, node_id, attempt, state in rows:
                to = lifecycle.step(state, Event.DEADLINE_PASSED).value
                if state == LEASED and node_id:
                    self._held_drop(node_id, [job_id])
                    self._free_slot(conn, node_id)
                    self._end_attempt(conn, job_id, attempt, "expired", "deadline passed")
                conn.execute(
                    update(jobs)
                    .where(jobs.c.job_id == job_id)
                    .values(
                        state=to,
                        reason="deadline passed before a result: the submitter can refund",
                        node_id=None,
                        lease_expires=None,
                        updated_at=now,
                    )
                )
                self._audit(conn, "job", job_id, to)
            return [r[0] for r in rows]

    def running_specs(self, node_id: str, *, fresh_s: float = 1.0) -> list[JobSpec]:
        """The specs of the jobs leased to ``node_id`` (what its capacity is busy with): two
        columns per row and the parsed-spec cache, not whole job rows (the poll's hot path).

        On SQLite (one replica: every lease is granted by this process) a complete list read
        less than ``fresh_s`` ago, kept up to date by this process's claims, answers without a
        read; a job leaving the node makes the next call read. It only shapes what the node is
        offered: the claim's SQL guards still decide every lease. PostgreSQL (replicas, each
        granting leases) always reads."""
        known = self.running_specs_known(node_id, fresh_s=fresh_s)
        if known is not None:
            return known
        version = self._held_version(node_id)
        with self.reader.connect() as conn:
            q = select(jobs.c.job_id, jobs.c.spec_cid).where(
                jobs.c.node_id == node_id, jobs.c.state == LEASED
            )
            held = {str(jid): str(cid) for jid, cid in conn.execute(q)}
            missing = [cid for cid in set(held.values()) if cid not in SPEC_CACHE]
            if missing:  # parse each spec once; later polls read only the CIDs
                q = select(jobs.c.spec_cid, jobs.c.spec).where(
                    jobs.c.spec_cid.in_(missing), jobs.c.spec.is_not(None)
                )
                for cid, data in conn.execute(q):
                    cached_spec(cid, data)
        self._held_set(node_id, held, version)
        return [SPEC_CACHE[cid] for cid in held.values() if cid in SPEC_CACHE]

    def running_specs_known(self, node_id: str, *, fresh_s: float = 1.0) -> list[JobSpec] | None:
        """:meth:`running_specs` from memory alone (no I/O, safe on the event loop), or None
        where it must read (PostgreSQL; no complete picture under ``fresh_s`` old)."""
        if self.postgres:
            return None
        known = self._held_jobs(node_id, fresh_s=fresh_s)
        if known is None or not all(cid in SPEC_CACHE for cid in known.values()):
            return None
        return [SPEC_CACHE[cid] for cid in known.values()]

    def running_jobs(self, node_id: str) -> list[JobRow]:
        with self.reader.connect() as conn:
            q = select(*job_columns).where(jobs.c.node_id == node_id, jobs.c.state == LEASED)
            return [JobRow.of(r) for r in conn.execute(q)]

    def hand_back(self, job_id: str, node_id: str, *, delivered: bool = True) -> str:
        """The node gives a job back unfinished (shutdown), or declines an offer (then the job is
        not offered to that node again, unless the offer never reached it: ``delivered``
        false): queued again, no penalty, and an accepted lease's on-chain assignment undone
        (outbox ``unassign``, written by the requeue; the escrow lets the operator do it once
        the node's hold is over, ``max(since + reassignDelay, holdUntil)``, while the provider
        itself may hand it back on-chain at any time)."""
        self._held_drop(node_id, [job_id])
        with self.engine.begin() as conn:
            job = self._job(conn, job_id, lock=True)
            if job.node_id != node_id or lifecycle.target(job.state, Event.HANDED_BACK) is None:
                raise ConflictError(f"job {job_id} is not leased to node {node_id}")
            outcome = "declined" if job.acceptance is None else "handed_back"
            self._end_attempt(conn, job_id, job.attempt, outcome)
            self._free_slot(conn, node_id)
            declined = job.acceptance is None
            reason = f"{'declined' if declined else 'handed back'} by {node_id}"
            # the escrow refuses to assign a job to the provider it holds it for: the requeue
            # undoes an accepted lease's assignment, so any wallet, this node's too (a
            # restarted agent), may take it again
            state = self._requeue(conn, job, Event.HANDED_BACK, exclude=False, reason=reason)
            if declined and delivered and node_id not in job.excluded:
                # its agent refused these terms: not offered to that node again (no fault, and
                # the wallet's other nodes may still take it)
                conn.execute(
                    update(jobs)
                    .where(jobs.c.job_id == job_id)
                    .values(excluded=[*job.excluded, node_id])
                )
        if state == "queued":
            self.on_queued(1)
        return state
