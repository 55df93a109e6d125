"""Nodes: registration (with the wallet's replay-proof nonce), reads, and slot accounting."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from sqlalchemy import Connection, bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError

from gridmarket.wire import NodeCapacityIn

from .audit import AuditStore
from .rows import NodeRow, NotFoundError, ReplayError, node_id_for
from .tables import nodes, wallets

__all__ = ["NodeStore"]


_NODE = select(nodes).where(nodes.c.node_id == bindparam("node_id_"))  # built once (hot path)
_NODE_FOR_UPDATE = _NODE.with_for_update()
# the writes to node rows put off to the end of a transaction of many jobs (``conn.info`` lives
# with the pooled DB-API connection, so it is always removed when the transaction ends)
_NODE_WRITES = "node_writes"


class NodeStore(AuditStore):
    """The ``nodes`` and ``wallets`` tables."""

    def _node(self, conn: Connection, node_id: str, *, lock: bool = False) -> NodeRow:
        q = _NODE_FOR_UPDATE if lock and self.postgres else _NODE
        row = conn.execute(q, {"node_id_": node_id}).first()
        if row is None:
            raise NotFoundError(f"no node {node_id}")
        return NodeRow.of(row)

    @contextmanager
    def _begin_jobs_first(self) -> Iterator[Connection]:
        """A transaction over many jobs that also writes their nodes (a fold of chain events,
        the sweeper's expiries, a node going offline): each node write (``_node_write``) waits
        until the body is done, then they all run in node-id order, each node's in the order
        they were asked. So such a transaction keeps the store's lock order, every job row
        before any node row and nodes by id: written as they came (job A, its node X, job B)
        it held X while it waited for B, and deadlocked with a dispatch round or a verdict that
        held B and waited for X (PostgreSQL, the 100,000-job soak)."""
        with self.engine.begin() as conn:
            conn.info[_NODE_WRITES] = []
            try:
                yield conn
                writes: list[tuple[str, Callable[[], object]]] = conn.info.pop(_NODE_WRITES)
                for _, write in sorted(writes, key=lambda w: w[0]):  # stable: per node, in order
                    write()
            finally:
                conn.info.pop(_NODE_WRITES, None)

    def _node_write(self, conn: Connection, node_id: str, write: Callable[[], object]) -> None:
        """Run ``write`` (an update of ``node_id``'s row) now, or at the end of the enclosing
        :meth:`_begin_jobs_first` transaction."""
        pending = conn.info.get(_NODE_WRITES)
        if pending is None:
            write()
        else:
            pending.append((node_id, write))

    def _free_slot(self, conn: Connection, node_id: str) -> None:
        self._node_write(
            conn,
            node_id,
            lambda: conn.execute(
                update(nodes)
                .where(nodes.c.node_id == node_id, nodes.c.running > 0)
                .values(running=nodes.c.running - 1)
            ),
        )

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

    def nodes_by_id(self, node_ids: Sequence[str]) -> dict[str, NodeRow]:
        """The rows of ``node_ids`` that exist (one ``SELECT`` per 500 ids): the API's node-row
        cache refreshes the rows it serves with this, many at a time
        (``scheduler/api/nodecache.py``)."""
        ids = list(dict.fromkeys(node_ids))
        out: dict[str, NodeRow] = {}
        with self.reader.connect() as conn:
            for i in range(0, len(ids), 500):
                q = select(nodes).where(nodes.c.node_id.in_(ids[i : i + 500]))
                for r in conn.execute(q):
                    row = NodeRow.of(r)
                    out[row.node_id] = row
        return out

    def nodes(
        self, *, status: str | None = None, limit: int = 1000, offset: int = 0
    ) -> list[NodeRow]:
        q = select(nodes).order_by(nodes.c.node_id).limit(limit).offset(offset)
        if status is not None:
            q = q.where(nodes.c.status == status)
        with self.reader.connect() as conn:
            return [NodeRow.of(r) for r in conn.execute(q)]

    def node_counts(self) -> dict[str, int]:
        return self._counts(nodes.c.status)

    def touch_nodes(self, node_ids: Sequence[str]) -> None:
        """Nodes seen alive now (long-polling): ``last_seen`` moves, nothing else."""
        if not node_ids:
            return
        ids = sorted(set(node_ids))
        with self.engine.begin() as conn:
            if self.postgres:
                # one UPDATE ... IN locks its rows in the order it finds them: take them in id
                # order first, as every other transaction does (it deadlocked with the chain
                # folds' node writes in the 100,000-job soak)
                conn.execute(
                    select(nodes.c.node_id)
                    .where(nodes.c.node_id.in_(ids))
                    .order_by(nodes.c.node_id)
                    .with_for_update()
                )
            conn.execute(
                update(nodes)
                .where(nodes.c.node_id.in_(ids), nodes.c.status == "online")
                .values(last_seen=self.clock())
            )
