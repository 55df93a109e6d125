"""Leases after the claim: heartbeats that renew them (at once, or written behind in batches),
lost leases (silent nodes, expired leases), deadlines, hand-backs, and what a node runs."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, bindparam, select, update

from gridmarket.wire import JobSpec
from scheduler import lifecycle
from scheduler.lifecycle import Event, State
from scheduler.matching.reputation import Outcome

from .jobs import JobStore
from .rows import SPEC_CACHE, ConflictError, JobRow, NotFoundError, cached_spec
from .tables import jobs, nodes

__all__ = ["LeaseStore"]

LEASED = State.LEASED.value


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
            leased = [j for j, s in mine.items() if s == LEASED]
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
        leased = [j for j, st in mine.items() if st == LEASED]
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
                        jobs.c.state == LEASED,
                    )
                    .values(lease_expires=bindparam("exp")),
                    lease_rows,
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
                    select(jobs).where(jobs.c.node_id == node_id, jobs.c.state == LEASED)
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
        reason = f"lease lost: {why}"
        if self._requeue(conn, job, Event.LEASE_LOST, exclude=True, reason=reason) == "queued":
            conn.info.setdefault("queued", 0)
            conn.info["queued"] += 1

    def expire_leases(self) -> list[str]:
        """Leased jobs whose lease ran out go back to the queue (never to the same node)."""
        now = self.clock()
        lost: list[str] = []
        with self.engine.begin() as conn:
            q = select(jobs).where(jobs.c.state == LEASED, jobs.c.lease_expires < now)
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
                    jobs.c.state.in_([s.value for s in lifecycle.sources(Event.DEADLINE_PASSED)]),
                    jobs.c.deadline < now,
                )
            ).all()
            for job_id, node_id, attempt, state in rows:
                to = lifecycle.step(state, Event.DEADLINE_PASSED).value
                if state == LEASED and node_id:
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

    def running_specs(self, node_id: str) -> list[JobSpec]:
        """The specs of the jobs leased to ``node_id`` (what its capacity is busy with): two
        columns per row and the parsed-spec cache, not whole job rows (the poll's hot path)."""
        with self.reader.connect() as conn:
            q = select(jobs.c.spec_cid).where(jobs.c.node_id == node_id, jobs.c.state == LEASED)
            cids = [str(cid) for (cid,) in conn.execute(q)]
            missing = [cid for cid in set(cids) if cid not in SPEC_CACHE]
            if missing:  # parse each spec once; later polls read only the CIDs
                q = select(jobs.c.spec_cid, jobs.c.spec).where(
                    jobs.c.spec_cid.in_(missing), jobs.c.spec.is_not(None)
                )
                for cid, data in conn.execute(q):
                    cached_spec(cid, data)
            return [SPEC_CACHE[cid] for cid in cids if cid in SPEC_CACHE]

    def running_jobs(self, node_id: str) -> list[JobRow]:
        with self.reader.connect() as conn:
            q = select(jobs).where(jobs.c.node_id == node_id, jobs.c.state == LEASED)
            return [JobRow.of(r) for r in conn.execute(q)]

    def hand_back(self, job_id: str, node_id: str) -> str:
        """The node gives a job back unfinished (shutdown): queued again, no penalty, and the
        on-chain assignment undone (outbox ``unassign``)."""
        with self.engine.begin() as conn:
            job = self._job(conn, job_id, lock=True)
            if job.node_id != node_id or lifecycle.target(job.state, Event.HANDED_BACK) is None:
                raise ConflictError(f"job {job_id} is not leased to node {node_id}")
            self._end_attempt(conn, job_id, job.attempt, "handed_back")
            self._free_slot(conn, node_id)
            reason = f"handed back by {node_id}"
            state = self._requeue(conn, job, Event.HANDED_BACK, exclude=False, reason=reason)
            # the escrow refuses to assign a job to the provider it holds it for: undo the
            # assignment, so any wallet, this node's too (a restarted agent), may take it again
            if state == State.QUEUED:
                self._outbox(conn, job_id, "unassign", {})
        if state == "queued":
            self.on_queued(1)
        return state
