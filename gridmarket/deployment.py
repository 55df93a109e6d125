"""A deployment file (where the escrow is, its ABI, parameters and listed tokens) and the error
of the chain layer, with no web3 import: a process that only reads a deployment (an agent
resolving its token settings, a CLI) does not pay for web3 (~18 MB of RSS, docs/agent.md).
:mod:`gridmarket.chain` re-exports both."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gridmarket.ethsig import to_checksum_address

__all__ = ["ChainError", "Deployment"]


class ChainError(RuntimeError):
    """A chain call failed; ``reason`` is the decoded custom error when the contract reverted."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Deployment:
    """What the other components need to find and read the escrow (written by the deploy step)."""

    chain_id: int
    escrow: str
    abi: list[dict[str, Any]]
    block: int
    params: dict[str, Any] = field(default_factory=dict)
    rpc_url: str | None = None
    tokens: dict[str, Any] = field(default_factory=dict)
    """ERC-20 tokens listed for bounties: symbol -> {"address", "decimals"} (gridmarket.token)."""

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {
            "chainId": self.chain_id,
            "rpcUrl": self.rpc_url,
            "contracts": {
                "JobEscrow": {"address": self.escrow, "block": self.block, "abi": self.abi}
            },
            "params": self.params,
            "tokens": self.tokens,
        }
        path.write_text(json.dumps(body, indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> Deployment:
        try:
            body = json.loads(path.read_text())
            escrow = body["contracts"]["JobEscrow"]
            return cls(
                chain_id=int(body["chainId"]),
                escrow=to_checksum_address(escrow["address"]),
                abi=escrow["abi"],
                block=int(escrow["block"]),
                params=dict(body.get("params", {})),
                rpc_url=body.get("rpcUrl"),
                tokens=dict(body.get("tokens") or {}),
            )
        except FileNotFoundError:
            raise ChainError(
                f"deployment file {path} not found: deploy the contracts first"
            ) from None
        except (KeyError, ValueError, TypeError) as exc:
            raise ChainError(f"deployment file {path} is malformed: {exc!r}") from exc
