"""The agent's IPFS storage: :class:`gridmarket.ipfs.IpfsStore` raising the agent's errors.

Nothing fetched is trusted: entry names are checked before anything touches the disk, sizes are
counted while streaming, and the finished tree must hash back to the requested CID or it is
deleted. Outputs are added as CIDv1 with raw leaves and the daemon's answer is checked the same
way (see :mod:`gridmarket.ipfs`).
"""

from __future__ import annotations

from agent.errors import DatasetTooLargeError, DatasetVerificationError, StorageError
from gridmarket.ipfs import MAX_DEPTH, IpfsStore

__all__ = ["MAX_DEPTH", "AgentIpfsStore"]


class AgentIpfsStore(IpfsStore):
    """:class:`agent.storage.Storage` on an IPFS daemon: the shared :class:`IpfsStore`, raising
    the agent's errors; a context manager (closes the client)."""

    error = StorageError
    too_large_error = DatasetTooLargeError
    verification_error = DatasetVerificationError
    noun = "dataset"
