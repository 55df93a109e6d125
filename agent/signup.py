"""A node's sign-up, as ``gridmarket-agent register`` does it besides the scheduler's call: the
stake in ETH parsed to wei, the metadata document's CID (added to IPFS when the daemon answers),
``registerProvider`` sent on-chain with the stake, the stakes in listed tokens
(``stake_tokens``, topped up to the configured amounts: :func:`top_up_token_stakes`, which
``run`` calls at start too), and the node file ``status`` reads."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agent.config import AgentConfig
from agent.errors import AgentError, CliError
from gridmarket.amounts import AmountError, parse_units
from gridmarket.cmdline import one_line

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from gridmarket.ethsig import Signer
    from gridmarket.lightchain import LightEscrowClient
    from gridmarket.token import Token
    from gridmarket.wire import RegisterResponse

log = logging.getLogger("agent")

NODE_FILE = "node.json"
"""Written under ``work_dir`` after each registration: what ``status`` needs to find the node."""


def save_node(config: AgentConfig, registration: RegisterResponse, wallet: str) -> None:
    """Remember the node id for ``status`` (no secret: the token is not stored)."""
    path = config.work_dir / NODE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "scheduler_url": config.scheduler_url,
        "node_id": registration.node_id,
        "wallet": wallet,
        "name": config.name,
        "registered_at": time.time(),
    }
    path.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")


def stake_wei(eth: str) -> int:
    """``--stake`` in wei: a bounded decimal amount of ETH (:mod:`gridmarket.amounts`)."""
    try:
        return parse_units(eth, 18, field="--stake", unit="ETH")
    except AmountError as exc:
        raise CliError(str(exc)) from None


def stake_on_chain(config: AgentConfig, account: LocalAccount, wei: int, metadata: bytes) -> str:
    """``registerProvider(metadataCid)`` with ``wei`` staked; the transaction hash."""
    if config.rpc_url is None or config.deployment is None:
        raise CliError(
            "--stake needs the chain: set rpc_url and deployment "
            "(--rpc-url, --deployment or GRIDMARKET_AGENT_RPC_URL / _DEPLOYMENT)"
        )
    cid = metadata_cid(config, metadata)
    from gridmarket.chain import ChainError, Deployment, EscrowClient

    try:
        escrow = EscrowClient.connect(config.rpc_url, Deployment.load(config.deployment))
        sent = escrow.send(account, "registerProvider", cid, value=wei)
    except ChainError as exc:
        raise CliError(f"on-chain registration failed: {one_line(exc)}") from None
    except Exception as exc:  # the RPC node unreachable, and web3's other transport errors
        raise CliError(
            f"on-chain registration failed ({config.rpc_url}): {one_line(exc)}"
        ) from None
    return sent.tx_hash


def metadata_cid(config: AgentConfig, metadata: bytes) -> str:
    """The CID of the node's metadata document (added to IPFS when the daemon answers)."""
    import tempfile

    from gridmarket.cid import path_cid

    with tempfile.TemporaryDirectory(prefix="gridmarket-meta-") as tmp:
        folder = Path(tmp) / "node"
        folder.mkdir()
        (folder / "node.json").write_bytes(metadata)
        try:
            from agent.storage.ipfs import AgentIpfsStore

            with AgentIpfsStore(config.ipfs_api, timeout=30) as storage:
                return storage.add_dir(folder)
        except AgentError as exc:
            log.warning("metadata not added to IPFS (%s); registering its CID anyway", exc)
            return path_cid(folder)


class TokenStakeError(AgentError, ValueError):
    """A stake in a token cannot be made (not registered, not enough of the token, refused)."""


@dataclass(frozen=True)
class TokenStake:
    """One ``stake_tokens`` entry checked against the chain: the stake before and after, and the
    transaction that added the difference (None: it was already at or above the target)."""

    token: Token
    target: int
    before: int
    after: int
    tx_hash: str | None

    def line(self) -> str:
        fmt = self.token.fmt
        if self.tx_hash is None:
            return (
                f"{self.token.symbol} stake {fmt(self.before)} (target {fmt(self.target)}): "
                "nothing to add"
            )
        return (
            f"staked {fmt(self.after - self.before)}: {self.token.symbol} stake "
            f"{fmt(self.before)} -> {fmt(self.after)} (tx {self.tx_hash})"
        )


def top_up_token_stakes(
    escrow: LightEscrowClient,
    account: Signer,
    targets: Mapping[str, int],
    token_of: Callable[[str], Token],
) -> list[TokenStake]:
    """Bring the wallet's stake in each token of ``targets`` (address -> smallest units) up to
    its amount: ``stakeToken`` of the difference, with the wallet's EIP-2612 permit in the same
    transaction (:meth:`LightEscrowClient.stake_token`: no web3, as ``run`` calls this at
    start). A stake already at or above its target is left alone, so calling this again sends
    nothing. The wallet must be registered on-chain and
    hold the difference; :class:`TokenStakeError` says which is missing (stakes made before the
    failure stay made)."""
    from gridmarket.deployment import ChainError

    done: list[TokenStake] = []
    if not targets:
        return done
    registered = bool(escrow.call("providerOf", account.address)[3])
    if not registered:
        raise TokenStakeError(
            f"{account.address} is not registered on-chain: stake ETH first "
            "(gridmarket-agent register --stake ETH), then the tokens"
        )
    for address, target in targets.items():
        token = token_of(address)
        before = int(escrow.call("stakeOf", account.address, address)[0])
        if before >= target:
            done.append(TokenStake(token, target, before, before, None))
            continue
        missing = target - before
        held = escrow.token_balance_of(address, account.address)
        if held < missing:
            raise TokenStakeError(
                f"stake_tokens.{token.symbol}: the wallet holds {token.fmt(held)}, "
                f"{token.fmt(missing)} is needed to bring the stake from {token.fmt(before)} "
                f"to {token.fmt(target)}"
            )
        try:
            sent = escrow.stake_token(account, address, missing)
        except ChainError as exc:
            raise TokenStakeError(
                f"stake_tokens.{token.symbol}: stakeToken failed: {one_line(exc)}"
            ) from None
        after = int(escrow.call("stakeOf", account.address, address)[0])
        done.append(TokenStake(token, target, before, after, sent.tx_hash))
    return done
