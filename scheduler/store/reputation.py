"""Reputation: a node's record of outcomes (``scheduler.matching.reputation`` decides the
numbers; this writes them, with the node's done/failed counters)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, update

from scheduler.matching.reputation import Outcome, record

from .nodes import NodeStore
from .tables import nodes

__all__ = ["ReputationStore"]


class ReputationStore(NodeStore):
    """Outcomes recorded against nodes."""

    def _reputation(self, conn: Connection, node_id: str, outcome: Outcome) -> None:
        at = self.clock()
        self._node_write(conn, node_id, lambda: self._record(conn, node_id, outcome, at))

    def _record(self, conn: Connection, node_id: str, outcome: Outcome, at: float) -> None:
        node = self._node(conn, node_id)
        rep = record(node.reputation, outcome, at, self.policy)
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
