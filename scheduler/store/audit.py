"""The trail of every change: audit rows (one per transition, in the same transaction) and the
attempts table (one row per lease of a job, closed with its outcome)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, insert, select, update

from .base import StoreBase
from .tables import attempts, audit

__all__ = ["AuditStore"]

_INSERT_AUDIT = insert(audit)  # built once: every transition writes one (values bound per call)


class AuditStore(StoreBase):
    """Audit rows and attempts."""

    def _audit(
        self, conn: Connection, entity: str, entity_id: str, event: str, **detail: Any
    ) -> None:
        conn.execute(
            _INSERT_AUDIT,
            {
                "ts": self.clock(),
                "entity": entity,
                "entity_id": entity_id,
                "event": event,
                "detail": detail,
            },
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
