"""Where datasets come from and outputs go: the :class:`Storage` protocol
(:mod:`agent.storage.base`) and its IPFS adapter, :class:`agent.storage.ipfs.AgentIpfsStore`:
the shared :class:`gridmarket.ipfs.IpfsStore` raising the agent's ``Dataset*`` errors."""

from agent.storage.base import Storage

__all__ = ["Storage"]
