"""Durable state of the scheduler (SQLAlchemy Core; SQLite or PostgreSQL), one file per concept.

Each public method of :class:`Store` is one database transaction that checks its preconditions
in SQL (``UPDATE ... WHERE state = ...`` and row counts; ``FOR UPDATE SKIP LOCKED`` on
PostgreSQL), so two replicas (or two threads) racing for the same job cannot both win: this is
what makes claims exactly-once. Every transition writes an audit row in the same transaction.
Where a job goes on each event is not decided here: :mod:`scheduler.lifecycle` holds the table,
the store asks it and persists the answer.

``Store`` is a facade built from mixins, one per concept, each a class over the ones it uses
(a job transition frees a node's slot and writes an outbox row in the same transaction, so the
parts share one connection, not one object each)::

    base.py        StoreBase: engines (writer, reader), clock, policy, on_queued, ping, counts
    audit.py       AuditStore(StoreBase): audit rows, attempts
    nodes.py       NodeStore(AuditStore): registration and its nonces, node reads, slots
    reputation.py  ReputationStore(NodeStore): outcomes recorded against nodes
    outbox.py      OutboxStore(StoreBase): on-chain steps waiting to be sent
    jobs.py        JobStore(ReputationStore, OutboxStore): job reads; spec, result, verdict,
                   settlement, refusals; the requeue
    chain.py       ChainStore(JobStore): the block cursor, escrow events folded into jobs
    claims.py      ClaimStore(JobStore): dispatch rounds (exactly-once leases)
    leases.py      LeaseStore(JobStore): heartbeats, lost leases, deadlines, hand-backs
    logs.py        LogStore(AuditStore): live job logs, bounded per job
    checkpoints.py CheckpointStore(AuditStore): checkpoint reports, the keeper's state, resume
    repo.py        Store(ChainStore, ClaimStore, LeaseStore, LogStore, CheckpointStore): the
                   facade
    rows.py        NodeRow, JobRow, OutboxItem, Claim, ClaimedJob and the store's errors
    tables.py      the schema (Alembic migrations in scheduler/migrations/)
    db.py          engines and migration

Mixins rather than composition: callers keep one ``Store`` with flat methods
(``store.job(...)``, ``store.nodes()``), and a method of one part calls another's private
helper (``_audit``, ``_free_slot``) inside its own transaction without passing objects around.
"""

from .repo import Store
from .rows import (
    Claim,
    ClaimedJob,
    ConflictError,
    JobRow,
    NodeRow,
    NotFoundError,
    OfferRefusedError,
    OutboxItem,
    ReplayError,
    SeatTakenError,
    ShortOfCollateralError,
    StoreError,
    node_id_for,
)

__all__ = [
    "Claim",
    "ClaimedJob",
    "ConflictError",
    "JobRow",
    "NodeRow",
    "NotFoundError",
    "OfferRefusedError",
    "OutboxItem",
    "ReplayError",
    "SeatTakenError",
    "ShortOfCollateralError",
    "Store",
    "StoreError",
    "node_id_for",
]
