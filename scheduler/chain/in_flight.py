"""What a restarted sender finds in flight: the account's pending transactions read from the
node's pool (``txpool_content``: anvil, geth, reth, erigon), as the sender's own
:class:`~scheduler.chain.nonces.Broadcast` and call, so it can wait for them or replace them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

from eth_utils.address import to_checksum_address
from hexbytes import HexBytes
from web3 import Web3
from web3.types import TxParams

from gridmarket.retry import is_transient
from scheduler.chain.nonces import Broadcast

log = logging.getLogger(__name__)


def quantity(value: Any) -> int:
    """A JSON-RPC quantity (``"0x1a"``, or an int from a node that sends numbers) as an int."""
    if value is None:
        return 0
    return value if isinstance(value, int) else int(str(value), 0)


def pool_of(w3: Web3, address: str) -> dict[int, dict[str, Any]]:
    """The node's pending transactions from ``address`` by nonce; empty if it will not say."""
    try:
        answer = w3.provider.make_request(cast(Any, "txpool_content"), [])
    except Exception as exc:
        if is_transient(exc):
            raise
        answer = {}
    result = answer.get("result") if isinstance(answer, Mapping) else None
    if not isinstance(result, Mapping):
        log.warning("the node has no txpool_content: pending transactions are not replaced")
        return {}
    out: dict[int, dict[str, Any]] = {}
    for section in ("pending", "queued"):
        by_sender = result.get(section) or {}
        for sender, txs in by_sender.items():
            if str(sender).lower() != address.lower() or not isinstance(txs, Mapping):
                continue
            for nonce, tx in txs.items():
                if isinstance(tx, Mapping) and "hash" in tx:
                    out[int(nonce)] = dict(tx)
    return out


def adopted(found: Mapping[str, Any], nonce: int, address: str) -> tuple[Broadcast, TxParams]:
    """A pool entry ``found`` at ``nonce`` of ``address``: as a broadcast whose bytes are unknown,
    and the call it makes (so that a replacement can be signed)."""
    old = Broadcast(
        "0x" + bytes(HexBytes(found["hash"])).hex(),
        nonce,
        b"",
        quantity(found.get("maxFeePerGas") or found.get("gasPrice")),
        quantity(found.get("maxPriorityFeePerGas") or found.get("gasPrice")),
    )
    params: TxParams = {
        "from": address,
        "to": to_checksum_address(found["to"]),
        "value": cast(Any, quantity(found.get("value"))),
        "data": HexBytes(found.get("input") or "0x"),
        "gas": quantity(found["gas"]),
    }
    return old, params
