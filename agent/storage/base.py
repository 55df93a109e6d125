"""The content store the agent reads datasets from and writes outputs to."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class Storage(Protocol):
    """Content-addressed storage: fetch by CID (verified), add a directory (returns its CID)."""

    def fetch(self, cid: str, dest: Path, max_bytes: int) -> Path:
        """Download ``cid`` under the empty directory ``dest``, at most ``max_bytes`` of content.

        A directory dataset becomes the contents of ``dest``; a single-file dataset becomes
        ``dest/<cid>``. Returns that path, after checking that its bytes hash back to ``cid``.

        Raises:
            agent.errors.DatasetTooLargeError: more than ``max_bytes`` (nothing is kept).
            agent.errors.DatasetVerificationError: the bytes do not hash to ``cid`` (nothing kept).
            agent.errors.StorageError: the store failed or does not have ``cid``.
        """
        ...

    def add_dir(self, path: Path) -> str:
        """Add the directory tree at ``path`` (regular files and directories only); its root CID.

        Raises:
            agent.errors.StorageError: the tree holds links or special files, or the store failed.
        """
        ...
