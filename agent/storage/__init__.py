"""Where datasets come from and outputs go: a :class:`Storage` protocol and its IPFS adapter."""

from agent.storage.base import Storage

__all__ = ["Storage"]
