"""Durable state of the scheduler (SQLAlchemy Core; SQLite or PostgreSQL)."""

from .repo import (
    Claim,
    ClaimedJob,
    ConflictError,
    JobRow,
    NodeRow,
    NotFoundError,
    OutboxItem,
    ReplayError,
    Store,
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
    "OutboxItem",
    "ReplayError",
    "Store",
    "StoreError",
    "node_id_for",
]
