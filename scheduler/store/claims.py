"""Claims: one dispatch round leases queued jobs to waiting nodes, exactly once.

A lease starts as an offer: nothing goes on-chain until the node accepts it (escrow v2: the
provider signs its acceptance of the job's terms, :meth:`JobStore.accept`).

On PostgreSQL the queued rows are taken ``FOR UPDATE SKIP LOCKED``; a job is leased only by
``UPDATE ... WHERE state = 'queued'`` and a node's slot only by ``UPDATE ... WHERE running <
slots``, so neither two nodes on one job nor two jobs on one node beyond its slots.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sqlalchemy import Connection, bindparam, insert, select, update

from scheduler import lifecycle
from scheduler.lifecycle import Event

from .jobs import JobStore
from .rows import Claim, ClaimedJob, JobRow
from .tables import attempts, audit, job_columns, jobs, nodes

__all__ = ["ClaimStore"]

_FROM = lifecycle.sources(Event.LEASE_GRANTED)[0].value  # queued
_TO = lifecycle.step(_FROM, Event.LEASE_GRANTED).value  # leased

# A round's statements, built once with bound parameters (issue 12's claims profile: building
# them per job cost more than running them)
_QUEUED = (
    select(*job_columns)
    .where(jobs.c.state == _FROM)
    .order_by(jobs.c.queued_at, jobs.c.job_id)
    .limit(bindparam("window_"))
    .offset(bindparam("offset_"))
)
_QUEUED_SKIP_LOCKED = _QUEUED.with_for_update(skip_locked=True)
_TAKE_SLOT = (
    update(nodes)
    .where(
        nodes.c.node_id == bindparam("node_id_"),
        nodes.c.status == "online",
        nodes.c.running < nodes.c.slots,
    )
    .values(running=nodes.c.running + 1)
    .returning(nodes.c.wallet)
)
_LEASE = (
    update(jobs)
    .where(jobs.c.job_id == bindparam("job_id_"), jobs.c.state == _FROM)
    .values(state=_TO, acceptance=None)
)


class ClaimStore(JobStore):
    """Dispatch rounds."""

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
        new_audit: list[dict[str, Any]] = []
        window = min(window or limit, limit)
        with self.engine.begin() as conn:
            offset = 0
            claims: list[Claim] = []
            by_id: dict[str, JobRow] = {}
            while offset < limit:
                q = _QUEUED_SKIP_LOCKED if self.postgres else _QUEUED
                rows = [
                    JobRow.of(r) for r in conn.execute(q, {"window_": window, "offset_": offset})
                ]
                if not rows:
                    break
                by_id.update((j.job_id, j) for j in rows)
                claims.extend(decide(rows))
                if len(rows) < window or not wants_more():
                    break
                offset += window
            # every window's jobs are locked before any node's slot is taken, and the slots in
            # one node order for the whole round: a slot taken per window let a later window's
            # lower node id wait behind a fold holding it while the fold waited for a node the
            # earlier window held (a deadlock left in the 100,000-job soak)
            self._lease(conn, claims, by_id, now, lease_ttl, won, new_attempts, new_audit)
            if won:  # one multi-row statement each (executemany)
                conn.execute(insert(attempts), new_attempts)
                conn.execute(insert(audit), new_audit)
        for c in won:  # committed: this replica now knows these leases (see StoreBase)
            self._held_add(c.node_id, [(c.job.job_id, c.job.spec_cid)])
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
        new_audit: list[dict[str, Any]],
    ) -> None:
        # the nodes' rows in id order (stable: a node's own claims keep their priority): two
        # replicas' rounds taking the same nodes' slots in other orders deadlocked
        for claim in sorted(claims, key=lambda c: c.node_id):
            job = by_id[claim.job_id]
            slot = conn.execute(_TAKE_SLOT, {"node_id_": claim.node_id}).first()
            if slot is None:
                continue
            # the run starts when its slot is taken: after the round's `now`, the slot update
            # may have waited for another transaction freeing it (a verdict on another replica)
            taken = self.clock()
            # the attempt the escrow's next assign makes (the acceptance signs it); an offer
            # that is never accepted leaves the chain where it is, so the next offer of the
            # job has the same number
            attempt = job.chain.job.attempt + 1
            expires = now + lease_ttl
            n = conn.execute(
                _LEASE,
                {
                    "job_id_": job.job_id,
                    "node_id": claim.node_id,
                    "attempt": attempt,
                    "lease_expires": expires,
                    "reason": f"offered to {claim.node_id}; waiting for its acceptance",
                    "updated_at": now,
                },
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
                    "started_at": taken,
                    "detail": "",
                }
            )
            new_audit.append(
                {
                    "ts": taken,
                    "entity": "job",
                    "entity_id": job.job_id,
                    "event": _TO,
                    "detail": {"node_id": claim.node_id, "attempt": attempt},
                }
            )
            leased = replace(
                job,
                state=_TO,
                node_id=claim.node_id,
                attempt=attempt,
                lease_expires=expires,
                updated_at=now,
            )
            won.append(ClaimedJob(job=leased, node_id=claim.node_id, wallet=wallet))
