"""The transaction outbox: each on-chain step a state change needs is a row written in the
same transaction, sent later in order by the leader (``scheduler/service/loops.py``).

A row may wait for a time (``not_before``, in chain time: the escrow's clock): ``finalize``
until the challenge window has passed, an operator's ``unassign``/reassign until the
provider's hold is over (``max(since + reassignDelay, holdUntil)``). A job's rows go in order,
so a waiting row holds its job's later rows back (and no other job's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, bindparam, exists, insert, or_, select, update

from .base import StoreBase
from .rows import OutboxItem
from .tables import outbox

__all__ = ["OutboxStore"]

_INSERT = insert(outbox)  # built once: each step the chain must take writes one
_TRIED = (  # a try of row ``id_`` counted; the other columns set are bound per call
    update(outbox).where(outbox.c.id == bindparam("id_")).values(tries=outbox.c.tries + 1)
)


class OutboxStore(StoreBase):
    """The ``outbox`` table."""

    def _outbox(
        self,
        conn: Connection,
        job_id: str,
        kind: str,
        payload: dict[str, Any],
        *,
        not_before: float | None = None,
    ) -> None:
        now = self.clock()
        conn.execute(
            _INSERT,
            {
                "job_id": job_id,
                "kind": kind,
                "payload": payload,
                "status": "pending",
                "tries": 0,
                "error": "",
                "created_at": now,
                "updated_at": now,
                "not_before": not_before,
            },
        )

    def outbox_add(
        self, job_id: str, kind: str, payload: dict[str, Any], *, not_before: float | None = None
    ) -> None:
        """A row written on its own (a step that follows a mined one, like ``finalize`` after
        a relayed result)."""
        with self.engine.begin() as conn:
            self._outbox(conn, job_id, kind, payload, not_before=not_before)

    def outbox_waiting(self) -> bool:
        """Whether some pending row waits for a time (the caller then needs the chain's)."""
        with self.reader.connect() as conn:
            q = select(outbox.c.id).where(
                outbox.c.status == "pending", outbox.c.not_before.is_not(None)
            )
            return conn.execute(q.limit(1)).first() is not None

    def outbox_pending(self, limit: int = 64, *, now: float | None = None) -> list[OutboxItem]:
        """Pending rows due at chain time ``now`` (None: every row is due), oldest first; a row
        behind one of its job's rows that is not due yet is not due either."""
        with self.reader.connect() as conn:
            q = select(outbox).where(outbox.c.status == "pending")
            if now is not None:
                early = outbox.alias("early")
                q = q.where(
                    or_(outbox.c.not_before.is_(None), outbox.c.not_before <= now),
                    ~exists().where(
                        early.c.job_id == outbox.c.job_id,
                        early.c.status == "pending",
                        early.c.id < outbox.c.id,
                        early.c.not_before > now,
                    ),
                )
            q = q.order_by(outbox.c.id).limit(limit)
            return [
                OutboxItem(
                    r.id, r.job_id, r.kind, dict(r.payload), r.tries, r.created_at, r.not_before
                )
                for r in conn.execute(q)
            ]

    def outbox_of(self, job_id: str) -> list[dict[str, Any]]:
        """A job's outbox rows, oldest first (operators' view, tests)."""
        with self.reader.connect() as conn:
            q = select(outbox).where(outbox.c.job_id == job_id).order_by(outbox.c.id)
            return [dict(r._mapping) for r in conn.execute(q)]

    def outbox_finish(
        self, item_id: int, *, status: str, tx_hash: str | None = None, error: str = ""
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                _TRIED,
                {
                    "id_": item_id,
                    "status": status,
                    "tx_hash": tx_hash,
                    "error": error[:2000],
                    "updated_at": self.clock(),
                },
            )

    def outbox_done_many(self, done: Sequence[tuple[int, str | None]]) -> None:
        """Rows ``(id, tx_hash)`` done, in one statement (an outbox pass's rows)."""
        if not done:
            return
        now = self.clock()
        with self.engine.begin() as conn:
            conn.execute(
                _TRIED,
                [
                    {"id_": i, "status": "done", "tx_hash": tx, "error": "", "updated_at": now}
                    for i, tx in sorted(done)
                ],
            )

    def outbox_retry(self, item_id: int, error: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                _TRIED, {"id_": item_id, "error": error[:2000], "updated_at": self.clock()}
            )

    def outbox_defer(self, item_id: int, not_before: float, why: str) -> None:
        """The chain refuses ``item_id`` until chain time ``not_before`` (too early): it waits,
        and its job's later rows with it. Not a try."""
        with self.engine.begin() as conn:
            conn.execute(
                update(outbox)
                .where(outbox.c.id == item_id)
                .values(not_before=not_before, error=why[:2000], updated_at=self.clock())
            )

    def outbox_counts(self) -> dict[str, int]:
        return self._counts(outbox.c.status)
