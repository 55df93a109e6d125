"""The operator account's nonce sequence, shared in the process, and the signed transaction
(:class:`Broadcast`) that takes one of its nonces."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from gridmarket.chain import EscrowClient


@dataclass
class NonceSequence:
    """The next nonce of one account; ``lock`` is held from choosing a nonce to acceptance."""

    lock: threading.Lock
    next: int | None = None
    # Transactions of this process broadcast and not yet settled (mined, or given up on).
    waiting: int = 0
    count_lock: threading.Lock = field(default_factory=threading.Lock)


SEQUENCES: dict[tuple[str, int, str], NonceSequence] = {}
_LOCK = threading.Lock()


def sequence_for(client: EscrowClient, address: str) -> NonceSequence:
    """The sequence of ``address`` on ``client``'s endpoint and chain, made on first use."""
    provider = client.w3.provider
    endpoint = str(getattr(provider, "endpoint_uri", None) or f"provider-{id(provider)}")
    key = (endpoint, client.deployment.chain_id, address)
    with _LOCK:
        seq = SEQUENCES.get(key)
        if seq is None:
            seq = SEQUENCES[key] = NonceSequence(threading.Lock())
        return seq


@dataclass(frozen=True)
class Broadcast:
    """A signed transaction, its hash, nonce and fees: the unit that is broadcast (again)."""

    tx_hash: str
    nonce: int
    raw: bytes
    max_fee: int = 0
    tip: int = 0
    sent_at: float = field(default_factory=time.monotonic)
