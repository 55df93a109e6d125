"""Deploy JobEscrow to any JSON-RPC chain and write the deployment file.

The operator's way is ``ape run deploy --network ...`` (scripts/deploy.py, an Ape account, docs/
operator.md); this module is the library the devnet, the tests and the benchmarks deploy with, and
a key-from-the-environment CLI. Both deploy Ape's compile output (gridmarket/build.py).

    gridmarket-deploy --rpc-url http://127.0.0.1:8545 --out deployments/local.json \
        --operator 0x... --treasury 0x...            # key from $GRIDMARKET_DEPLOYER_KEY

The deployment file holds the chain id, the address, the deploy block and the ABI; the scheduler,
agent, frontend and CLIs read nothing else to find the contract.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

from gridmarket.build import load_artifacts
from gridmarket.chain import ChainError, Deployment
from gridmarket.token import TokenClient


@dataclass(frozen=True)
class EscrowParams:
    """Constructor parameters of JobEscrow (see its NatSpec)."""

    operator: str
    treasury: str
    fee_bps: int = 250
    min_bounty: int = 10**15  # 0.001 ETH
    min_duration: int = 60
    max_duration: int = 30 * 24 * 3600
    challenge_window: int = 3600
    min_stake: int = 10**16  # 0.01 ETH
    unstake_delay: int = 7 * 24 * 3600
    min_collateral_bps: int = 10_000  # a provider risks at least what it can earn
    dispute_deposit: int = 10**15  # 0.001 ETH: the floor of an ETH dispute's deposit (its bounty)
    mediation_window: int = 3 * 24 * 3600
    reassign_delay: int = 600
    mediator: str | None = None  # listed at deployment (None: no mediator listed yet)

    def as_tuple(self) -> tuple[Any, ...]:
        return (
            Web3.to_checksum_address(self.operator),
            Web3.to_checksum_address(self.treasury),
            self.fee_bps,
            self.min_bounty,
            self.min_duration,
            self.max_duration,
            self.challenge_window,
            self.min_stake,
            self.unstake_delay,
            self.min_collateral_bps,
            self.dispute_deposit,
            self.mediation_window,
            self.reassign_delay,
            Web3.to_checksum_address(self.mediator or "0x" + "00" * 20),
        )


# Block explorers of the public chains this project documents (docs/operator.md).
EXPLORERS: dict[int, tuple[str, str]] = {
    11155111: ("Sepolia", "https://sepolia.etherscan.io"),
    84532: ("Base Sepolia", "https://sepolia.basescan.org"),
    1: ("Ethereum", "https://etherscan.io"),
    8453: ("Base", "https://basescan.org"),
}


def explorer_lines(chain_id: int, address: str, tx_hash: str | None) -> list[str]:
    """Lines linking the contract (and its deploy transaction) on the chain's explorer; none for
    a chain without a known explorer (a local devnet)."""
    known = EXPLORERS.get(chain_id)
    if known is None:
        return []
    name, base = known
    lines = [f"{name} explorer: {base}/address/{address}"]
    if tx_hash:
        lines.append(f"deploy transaction: {base}/tx/{tx_hash}")
    return lines


def deploy_escrow(w3: Web3, deployer: LocalAccount, params: EscrowParams) -> Deployment:
    """Deploy JobEscrow from ``deployer`` and return its deployment record."""
    artifact = load_artifacts()["JobEscrow"]
    factory = w3.eth.contract(abi=artifact.abi, bytecode=artifact.bytecode)
    tx = factory.constructor(params.as_tuple()).build_transaction(
        {
            "from": deployer.address,
            "nonce": w3.eth.get_transaction_count(deployer.address, "pending"),
            "chainId": w3.eth.chain_id,
        }
    )
    signed = deployer.sign_transaction(cast(Any, tx))
    receipt = w3.eth.wait_for_transaction_receipt(
        w3.eth.send_raw_transaction(signed.raw_transaction)
    )
    if receipt["status"] != 1 or not receipt["contractAddress"]:
        raise ChainError(f"deployment reverted (tx {receipt['transactionHash'].hex()})")
    return Deployment(
        chain_id=w3.eth.chain_id,
        escrow=str(receipt["contractAddress"]),
        abi=artifact.abi,
        block=int(receipt["blockNumber"]),
        params=asdict(params),
    )


def _send_and_wait(w3: Web3, account: LocalAccount, tx: dict[str, Any]) -> Any:
    signed = account.sign_transaction(cast(Any, tx))
    receipt = w3.eth.wait_for_transaction_receipt(
        w3.eth.send_raw_transaction(signed.raw_transaction)
    )
    if receipt["status"] != 1:
        raise ChainError(f"transaction reverted (tx {receipt['transactionHash'].hex()})")
    return receipt


def deploy_test_token(w3: Web3, deployer: LocalAccount) -> str:
    """Deploy TestUSD (6 decimals, EIP-2612 permit; the deployer may mint): the devnet's
    stablecoin. Returns its address."""
    artifact = load_artifacts()["TestUSD"]
    factory = w3.eth.contract(abi=artifact.abi, bytecode=artifact.bytecode)
    tx = factory.constructor().build_transaction(
        {
            "from": deployer.address,
            "nonce": w3.eth.get_transaction_count(deployer.address, "pending"),
            "chainId": w3.eth.chain_id,
        }
    )
    receipt = _send_and_wait(w3, deployer, cast(dict[str, Any], tx))
    if not receipt["contractAddress"]:
        raise ChainError("TestUSD deployment created no contract")
    return str(receipt["contractAddress"])


def list_token(
    w3: Web3,
    owner: LocalAccount,
    deployment: Deployment,
    token: str,
    min_bounty: int | None = None,
) -> Deployment:
    """Allow ``token`` for bounties with the smallest bounty ``min_bounty`` in its units
    (default: a hundredth of a whole token) (``setToken``, the escrow owner's call) and return
    the deployment with it in ``tokens`` (symbol, decimals and the minimum)."""
    escrow = w3.eth.contract(address=cast(Any, deployment.escrow), abi=deployment.abi)
    address = Web3.to_checksum_address(token)
    erc20 = TokenClient(w3, address).contract.functions
    symbol = str(erc20.symbol().call())
    decimals = int(erc20.decimals().call())
    least = min_bounty if min_bounty is not None else max(1, 10**decimals // 100)
    tx = escrow.functions.setToken(address, least).build_transaction(
        {
            "from": owner.address,
            "nonce": w3.eth.get_transaction_count(owner.address, "pending"),
            "chainId": w3.eth.chain_id,
        }
    )
    _send_and_wait(w3, owner, cast(dict[str, Any], tx))
    entry = {"address": address, "decimals": decimals, "minBounty": least}
    return replace(deployment, tokens={**deployment.tokens, symbol: entry})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gridmarket-deploy", description=__doc__.split("\n")[0])
    p.add_argument("--rpc-url", required=True, help="JSON-RPC endpoint of the target chain")
    p.add_argument("--out", type=Path, required=True, help="deployment file to write")
    p.add_argument("--operator", required=True, help="the scheduler's address")
    p.add_argument("--treasury", required=True, help="where platform fees are credited")
    p.add_argument("--fee-bps", type=int, default=EscrowParams.fee_bps)
    p.add_argument("--min-bounty-wei", type=int, default=EscrowParams.min_bounty)
    p.add_argument("--min-duration", type=int, default=EscrowParams.min_duration)
    p.add_argument("--max-duration", type=int, default=EscrowParams.max_duration)
    p.add_argument("--challenge-window", type=int, default=EscrowParams.challenge_window)
    p.add_argument("--min-stake-wei", type=int, default=EscrowParams.min_stake)
    p.add_argument("--unstake-delay", type=int, default=EscrowParams.unstake_delay)
    p.add_argument("--min-collateral-bps", type=int, default=EscrowParams.min_collateral_bps)
    p.add_argument("--dispute-deposit-wei", type=int, default=EscrowParams.dispute_deposit)
    p.add_argument("--mediation-window", type=int, default=EscrowParams.mediation_window)
    p.add_argument("--reassign-delay", type=int, default=EscrowParams.reassign_delay)
    p.add_argument("--mediator", default=None, help="a mediator to list at deployment")
    args = p.parse_args(argv)
    key = os.environ.get("GRIDMARKET_DEPLOYER_KEY")
    if not key:
        print("error: set GRIDMARKET_DEPLOYER_KEY to the deployer's private key", file=sys.stderr)
        return 2
    w3 = Web3(Web3.HTTPProvider(args.rpc_url))
    params = EscrowParams(
        operator=args.operator,
        treasury=args.treasury,
        fee_bps=args.fee_bps,
        min_bounty=args.min_bounty_wei,
        min_duration=args.min_duration,
        max_duration=args.max_duration,
        challenge_window=args.challenge_window,
        min_stake=args.min_stake_wei,
        unstake_delay=args.unstake_delay,
        min_collateral_bps=args.min_collateral_bps,
        dispute_deposit=args.dispute_deposit_wei,
        mediation_window=args.mediation_window,
        reassign_delay=args.reassign_delay,
        mediator=args.mediator,
    )
    deployment = deploy_escrow(w3, Account.from_key(key), params)
    deployment = Deployment(**{**asdict(deployment), "rpc_url": args.rpc_url})
    deployment.save(args.out)
    print(
        f"JobEscrow at {deployment.escrow} (chain {deployment.chain_id}, block "
        f"{deployment.block}) -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
