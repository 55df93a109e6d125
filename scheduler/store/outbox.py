"""The transaction outbox: each on-chain step a state change needs is a row written in the
same transaction, sent later in order by the leader (``scheduler/outbox.py``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, insert, select, update

from .base import StoreBase
from .rows import OutboxItem
from .tables import outbox

__all__ = ["OutboxStore"]


class OutboxStore(StoreBase):
    """The ``outbox`` table."""

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
