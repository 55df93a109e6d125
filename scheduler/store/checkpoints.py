"""Checkpoints of long jobs (``job_checkpoints``): the reports nodes post while they run an
attempt of a checkpointing job, the keeper's state of each (kept on the scheduler's IPFS node,
given up, unpinned again), the checkpoint the next attempt resumes from, and the progress
readers see (docs/scheduler.md, "Checkpoints").

A report is accepted only from the node the attempt was leased to, while the attempt runs or
within :data:`scheduler.store.logs.LATE_S` of its end (the agent takes a last copy when a run
is stopped); a repost of the same ``(job, attempt, seq)`` is a no-op. A job keeps at most
``keep_rows`` rows: the oldest go, never one still pinned on the scheduler's node.

The keeper's row states: *pending* (``kept_at`` and ``keep_error`` NULL), *kept* (``kept_at``
set; pinned while ``unpinned_at`` is NULL), *given up* (``keep_error`` says why: the keeper
failed, or a newer report of the job superseded it before it was kept).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, and_, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from gridmarket.checkpoints import CheckpointRef, CheckpointReport, Progress
from scheduler.lifecycle import OPEN, State

from .audit import AuditStore
from .logs import check_assignee
from .tables import attempts, job_checkpoints, jobs

__all__ = ["SETTLED_STATES", "CheckpointStore", "checkpoint_view"]

log = logging.getLogger(__name__)

SETTLED_STATES = tuple(s.value for s in State if s not in OPEN)
"""Job states the scheduler no longer works on (released, refunded, failed, invalid, expired):
no attempt runs again, so the job's checkpoints are unpinned once the retention has passed since
the job got there (its ``updated_at``)."""

_C = job_checkpoints.c
_PINNED = and_(_C.kept_at.is_not(None), _C.unpinned_at.is_(None))
_PENDING = and_(_C.kept_at.is_(None), _C.keep_error.is_(None))


def _progress(row: Any) -> Progress | None:
    if row.step is None:
        return None
    try:
        return Progress(step=row.step, total=row.total, metrics=row.metrics or {})
    except ValueError:  # stored by an older rule: shown without it rather than failing the read
        return None


def checkpoint_view(row: Any) -> dict[str, Any]:
    """One row as ``GET /v1/jobs/{job_id}/checkpoints`` shows ``latest`` and ``resume``."""
    progress = _progress(row)
    return {
        "attempt": row.attempt,
        "seq": row.seq,
        "cid": row.cid,
        "size": row.size,
        "files": row.files,
        "node_id": row.node_id,
        "wallet": row.wallet,
        "taken_at": row.taken_at,
        "final": bool(row.final),
        "kept": row.kept_at is not None and row.unpinned_at is None,
        "progress": progress.model_dump(mode="json") if progress else None,
    }


class CheckpointStore(AuditStore):
    """Writes and reads of ``job_checkpoints`` (and ``attempts.resume_cid``)."""

    # ------------------------------------------------------------------ reports

    def add_checkpoint(
        self,
        job_id: str,
        node_id: str,
        wallet: str,
        report: CheckpointReport,
        *,
        keep_rows: int,
    ) -> bool:
        """Store ``node_id``'s (signed, already checked) report; False when that ``seq`` of the
        attempt was already stored. Raises :class:`NotAssigneeError` when the attempt is not
        ``node_id``'s, :class:`ConflictError` when it ended more than ``LATE_S`` ago."""
        now = self.clock()
        progress = report.progress
        try:
            with self.engine.begin() as conn:
                check_assignee(conn, job_id, report.attempt, node_id, now)
                seen = conn.execute(
                    select(_C.id).where(
                        _C.job_id == job_id, _C.attempt == report.attempt, _C.seq == report.seq
                    )
                ).first()
                if seen is not None:
                    return False
                conn.execute(
                    insert(job_checkpoints).values(
                        job_id=job_id,
                        attempt=report.attempt,
                        seq=report.seq,
                        node_id=node_id,
                        wallet=wallet,
                        cid=report.cid,
                        size=report.size,
                        files=report.files,
                        step=progress.step if progress else None,
                        total=progress.total if progress else None,
                        metrics=dict(progress.metrics) if progress else None,
                        final=report.final,
                        taken_at=report.taken_at,
                        received_at=now,
                        signature=report.signature.lower(),
                    )
                )
                self._trim_checkpoints(conn, job_id, keep_rows)
        except IntegrityError:  # a concurrent repost of the same seq (another replica)
            return False
        return True

    def _trim_checkpoints(self, conn: Connection, job_id: str, keep_rows: int) -> None:
        """Delete the job's oldest rows past ``keep_rows``; a pinned row stays (the keeper
        unpins it first), so the newest kept checkpoint is never lost."""
        count = conn.execute(
            select(func.count()).select_from(job_checkpoints).where(_C.job_id == job_id)
        ).scalar_one()
        if count <= keep_rows:
            return
        old = conn.execute(
            select(_C.id)
            .where(_C.job_id == job_id, ~_PINNED)
            .order_by(_C.attempt, _C.seq)
            .limit(count - keep_rows)
        ).scalars()
        ids = list(old)
        if ids:
            conn.execute(delete(job_checkpoints).where(_C.id.in_(ids)))

    # ------------------------------------------------------------------ the keeper

    def checkpoints_to_keep(self, limit: int, skip: Iterable[int] = ()) -> list[dict[str, Any]]:
        """Up to ``limit`` pending rows for the keeper, one per job: its newest report. Older
        pending rows of those jobs, and pending rows older than their job's newest kept one,
        are given up as superseded on the way (they would be unpinned at once)."""
        skip = set(skip)
        with self.reader.connect() as conn:  # a pass with nothing to keep writes nothing
            rows = conn.execute(
                select(_C.id, _C.job_id, _C.attempt, _C.seq, _C.cid, _C.size)
                .where(_PENDING)
                .order_by(_C.id)
                .limit(max(limit * 8, 64))
            ).all()
            newest: dict[str, Any] = {}
            for r in rows:
                best = newest.get(r.job_id)
                if best is None or (r.attempt, r.seq) > (best.attempt, best.seq):
                    newest[r.job_id] = r
            kept: dict[str, tuple[int, int]] = {}
            if newest:
                for k in conn.execute(
                    select(_C.job_id, _C.attempt, _C.seq).where(
                        _C.job_id.in_(list(newest)), _C.kept_at.is_not(None)
                    )
                ):
                    kept[k.job_id] = max(kept.get(k.job_id, (0, 0)), (k.attempt, k.seq))
        superseded: list[tuple[int, str]] = []
        for r in rows:
            best = newest[r.job_id]
            if r.id != best.id:
                superseded.append((r.id, f"superseded by attempt {best.attempt} seq {best.seq}"))
        out = []
        for job_id, r in newest.items():
            if kept.get(job_id, (0, 0)) >= (r.attempt, r.seq):
                superseded.append((r.id, "superseded by a newer checkpoint already kept"))
            elif r.id not in skip:
                out.append(dict(r._mapping))
        if superseded:
            with self.engine.begin() as conn:
                for row_id, why in superseded:
                    conn.execute(
                        update(job_checkpoints)
                        .where(_C.id == row_id, _PENDING)
                        .values(keep_error=why)
                    )
        return out[:limit]

    def checkpoint_kept(self, row_id: int) -> None:
        """The keeper pinned row ``row_id``'s CID on the scheduler's IPFS node."""
        with self.engine.begin() as conn:
            conn.execute(
                update(job_checkpoints)
                .where(_C.id == row_id, _C.kept_at.is_(None))
                .values(kept_at=self.clock(), keep_error=None)
            )

    def checkpoint_not_kept(self, row_id: int, why: str) -> None:
        """The keeper gave row ``row_id`` up: ``why`` (shown to operators, bounded)."""
        with self.engine.begin() as conn:
            conn.execute(
                update(job_checkpoints)
                .where(_C.id == row_id, _PENDING)
                .values(keep_error=why[:2000])
            )

    def checkpoints_to_release(self, settled_before: float, limit: int = 200) -> list[Any]:
        """Pinned rows the scheduler no longer needs, as ``(id, cid)``: each one older than its
        job's newest kept row, and every one of a job settled (:data:`SETTLED_STATES`) before
        ``settled_before``."""
        newer = job_checkpoints.alias("newer")
        superseded = (
            select(newer.c.id)
            .where(
                newer.c.job_id == _C.job_id,
                newer.c.kept_at.is_not(None),
                or_(
                    newer.c.attempt > _C.attempt,
                    and_(newer.c.attempt == _C.attempt, newer.c.seq > _C.seq),
                ),
            )
            .exists()
        )
        settled = (
            select(jobs.c.job_id)
            .where(
                jobs.c.job_id == _C.job_id,
                jobs.c.state.in_(SETTLED_STATES),
                jobs.c.updated_at < settled_before,
            )
            .exists()
        )
        with self.reader.connect() as conn:
            q = select(_C.id, _C.cid).where(_PINNED, or_(superseded, settled)).limit(limit)
            return list(conn.execute(q).all())

    def cid_pinned_by_others(self, cid: str, ids: Iterable[int]) -> bool:
        """Whether a pinned row other than ``ids`` holds ``cid`` (two checkpoints, of one job
        or of two, may be the same bytes: unpinning one must not drop the other)."""
        with self.reader.connect() as conn:
            q = select(_C.id).where(_PINNED, _C.cid == cid, _C.id.not_in(list(ids))).limit(1)
            return conn.execute(q).first() is not None

    def checkpoints_unpinned(self, ids: Iterable[int]) -> None:
        ids = list(ids)
        if not ids:
            return
        with self.engine.begin() as conn:
            conn.execute(
                update(job_checkpoints)
                .where(_C.id.in_(ids), _C.unpinned_at.is_(None))
                .values(unpinned_at=self.clock())
            )

    # ------------------------------------------------------------------ resume and reads

    def resume_for(self, job_id: str, attempt: int, node_id: str) -> CheckpointRef | None:
        """The newest checkpoint of ``job_id`` the scheduler keeps (by attempt, then seq), as
        the ``Assignment.resume`` of ``attempt`` (leased to ``node_id``), recorded in that
        attempt's ``resume_cid``; None when it keeps none. The dispatcher calls it while it
        hands out an offer: a database failure is logged and answered None (the attempt starts
        from the beginning rather than not at all, and the dispatcher keeps running)."""
        try:
            return self._resume_for(job_id, attempt, node_id)
        except SQLAlchemyError:
            log.exception("reading the checkpoint job %s resumes from failed", job_id)
            return None

    def _resume_for(self, job_id: str, attempt: int, node_id: str) -> CheckpointRef | None:
        with self.engine.begin() as conn:
            row = conn.execute(
                select(job_checkpoints)
                .where(_C.job_id == job_id, _PINNED)
                .order_by(_C.attempt.desc(), _C.seq.desc())
                .limit(1)
            ).first()
            if row is None:
                return None
            conn.execute(
                update(attempts)
                .where(
                    attempts.c.job_id == job_id,
                    attempts.c.attempt == attempt,
                    attempts.c.node_id == node_id,
                )
                .values(resume_cid=row.cid)
            )
        return CheckpointRef(
            cid=row.cid,
            size=row.size,
            attempt=row.attempt,
            seq=row.seq,
            wallet=row.wallet,
            signature=row.signature,
            progress=_progress(row),
        )

    def checkpoints_of(self, job_id: str, keep_points: int) -> dict[str, Any]:
        """``latest`` (the newest report), ``resume`` (the newest kept one) and ``points``
        (the newest ``keep_points`` reports that carried progress, oldest first)."""
        order = (_C.attempt.desc(), _C.seq.desc())
        with self.reader.connect() as conn:
            latest = conn.execute(
                select(job_checkpoints).where(_C.job_id == job_id).order_by(*order).limit(1)
            ).first()
            resume = conn.execute(
                select(job_checkpoints)
                .where(_C.job_id == job_id, _PINNED)
                .order_by(*order)
                .limit(1)
            ).first()
            points = conn.execute(
                select(_C.attempt, _C.seq, _C.step, _C.total, _C.metrics, _C.taken_at, _C.final)
                .where(_C.job_id == job_id, _C.step.is_not(None))
                .order_by(*order)
                .limit(keep_points)
            ).all()
        return {
            "latest": checkpoint_view(latest) if latest is not None else None,
            "resume": checkpoint_view(resume) if resume is not None else None,
            "points": [
                {
                    "attempt": p.attempt,
                    "seq": p.seq,
                    "step": p.step,
                    "total": p.total,
                    "metrics": p.metrics or {},
                    "taken_at": p.taken_at,
                    "final": bool(p.final),
                }
                for p in reversed(points)
            ],
        }

    def latest_progress(self, job_id: str) -> Progress | None:
        """The progress of the job's newest report that carried one."""
        with self.reader.connect() as conn:
            row = conn.execute(
                select(_C.step, _C.total, _C.metrics)
                .where(_C.job_id == job_id, _C.step.is_not(None))
                .order_by(_C.attempt.desc(), _C.seq.desc())
                .limit(1)
            ).first()
        return _progress(row) if row is not None else None
