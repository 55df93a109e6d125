"""The :class:`Store` facade: one object with every read and write of the scheduler's database,
assembled from one part per concept (see the package docstring)."""

from __future__ import annotations

from .chain import ChainStore
from .checkpoints import CheckpointStore
from .claims import ClaimStore
from .leases import LeaseStore
from .logs import LogStore
from .rows import node_id_for  # imported from here by gridmarket/devstack

__all__ = ["Store", "node_id_for"]


class Store(ChainStore, ClaimStore, LeaseStore, LogStore, CheckpointStore):
    """All reads and writes of the scheduler's database.

    Each base is one concept's persistence (``chain.py``, ``claims.py``, ``leases.py``,
    ``logs.py``, ``checkpoints.py``, and
    under them ``jobs.py``, ``outbox.py``, ``reputation.py``, ``nodes.py``, ``audit.py``,
    ``base.py``); this class adds nothing of its own.
    """
