"""Live job logs (``job_logs``): the batches of stdout/stderr a node posts while it runs an
attempt, kept bounded per job, read by anyone who may read the job (docs/scheduler.md).

A batch is accepted only from the node the attempt was leased to, while the attempt runs or
within :data:`LATE_S` of its end (the agent flushes its last lines right before its result);
a repost of the same ``(job, attempt, seq)`` is a no-op. After each insert the job keeps only
its newest ``keep_chars`` characters and ``keep_batches`` batches: older batches are deleted.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, delete, func, insert, select
from sqlalchemy.exc import IntegrityError

from .audit import AuditStore
from .rows import ConflictError, NotFoundError
from .tables import attempts, job_logs, jobs

__all__ = ["LATE_S", "LogStore", "NotAssigneeError", "check_assignee"]

LATE_S = 60.0
"""How long after its attempt ended a node's batches are still taken."""


class NotAssigneeError(ConflictError):
    """The posting node is not the one the attempt was leased to (or no such attempt)."""


def check_assignee(conn: Connection, job_id: str, attempt: int, node_id: str, now: float) -> None:
    """Whether ``node_id`` may post for ``attempt`` of ``job_id`` (live logs, checkpoints): the
    attempt was leased to it and runs, or ended at most :data:`LATE_S` ago. Raises
    :class:`NotAssigneeError` or :class:`ConflictError` naming why not."""
    row = conn.execute(
        select(attempts.c.node_id, attempts.c.ended_at)
        .where(attempts.c.job_id == job_id, attempts.c.attempt == attempt)
        .order_by(attempts.c.id.desc())
        .limit(1)
    ).first()
    if row is None or row.node_id != node_id:
        raise NotAssigneeError(f"attempt {attempt} of job {job_id} is not leased to node {node_id}")
    if row.ended_at is not None and row.ended_at < now - LATE_S:
        ago = now - row.ended_at
        raise ConflictError(f"attempt {attempt} of job {job_id} ended {ago:.0f} s ago")


class LogStore(AuditStore):
    """Writes and reads of ``job_logs``."""

    def add_logs(
        self,
        job_id: str,
        node_id: str,
        attempt: int,
        seq: int,
        chunks: list[dict[str, Any]],
        *,
        keep_chars: int,
        keep_batches: int,
    ) -> bool:
        """Store a batch (``chunks`` already cleaned) of ``node_id``'s ``attempt``; False when
        that ``seq`` was already stored. Raises :class:`NotAssigneeError` when the attempt is
        not ``node_id``'s, :class:`ConflictError` when it ended more than :data:`LATE_S` ago."""
        now = self.clock()
        chars = sum(len(c["text"]) for c in chunks)
        try:
            with self.engine.begin() as conn:
                check_assignee(conn, job_id, attempt, node_id, now)
                seen = conn.execute(
                    select(job_logs.c.id).where(
                        job_logs.c.job_id == job_id,
                        job_logs.c.attempt == attempt,
                        job_logs.c.seq == seq,
                    )
                ).first()
                if seen is not None:
                    return False
                conn.execute(
                    insert(job_logs).values(
                        job_id=job_id,
                        attempt=attempt,
                        seq=seq,
                        node_id=node_id,
                        received_at=now,
                        chars=chars,
                        chunks=chunks,
                    )
                )
                self._trim_logs(conn, job_id, keep_chars, keep_batches)
        except IntegrityError:  # a concurrent repost of the same seq (another replica)
            return False
        return True

    def _trim_logs(self, conn: Any, job_id: str, keep_chars: int, keep_batches: int) -> None:
        """Delete the job's oldest batches past ``keep_chars`` characters or ``keep_batches``."""
        total, count = conn.execute(
            select(func.coalesce(func.sum(job_logs.c.chars), 0), func.count()).where(
                job_logs.c.job_id == job_id
            )
        ).one()
        if total <= keep_chars and count <= keep_batches:
            return
        kept = 0
        cut: int | None = None
        rows = conn.execute(
            select(job_logs.c.id, job_logs.c.chars)
            .where(job_logs.c.job_id == job_id)
            .order_by(job_logs.c.id.desc())
        )
        for n, (row_id, chars) in enumerate(rows):
            kept += chars
            if n >= keep_batches or kept > keep_chars:
                cut = row_id
                break
        if cut is not None:
            conn.execute(delete(job_logs).where(job_logs.c.job_id == job_id, job_logs.c.id <= cut))

    def logs_of(self, job_id: str, after: int = 0, limit: int = 200) -> list[dict[str, Any]]:
        """The job's stored batches with ``id > after``, oldest first, at most ``limit``."""
        with self.reader.connect() as conn:
            rows = conn.execute(
                select(job_logs)
                .where(job_logs.c.job_id == job_id, job_logs.c.id > after)
                .order_by(job_logs.c.id)
                .limit(limit)
            )
            return [dict(r._mapping) for r in rows]

    def require_job(self, job_id: str) -> None:
        """Raises :class:`NotFoundError` when the scheduler does not know the job."""
        with self.reader.connect() as conn:
            if conn.execute(select(jobs.c.job_id).where(jobs.c.job_id == job_id)).first() is None:
                raise NotFoundError(f"no job {job_id}")
