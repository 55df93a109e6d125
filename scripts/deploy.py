"""Deploy JobEscrow with Ape and write the deployment file the services read.

    ape run deploy --network ethereum:local:foundry            # local anvil, Ape test accounts
    ape run deploy --network ethereum:sepolia:node \\
        --account deployer --operator 0xOPERATOR --treasury 0xTREASURY

The contract comes from Ape's compile (``ape compile``, the same artifacts the tests use); the
transaction is signed by an Ape account: on a local network Ape's test account 0 unless
``--account`` says otherwise, on any other network the imported account named by ``--account``
or ``$GRIDMARKET_DEPLOY_ACCOUNT`` (``ape accounts import <alias>``; Ape asks for its passphrase,
or reads ``$APE_ACCOUNTS_<alias>_PASSPHRASE``). Public networks are reached through the RPC URLs
in ape-config.yaml (``$GRIDMARKET_SEPOLIA_RPC_URL``, ``$GRIDMARKET_BASE_SEPOLIA_RPC_URL``).
Step by step: docs/operator.md.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import click
from ape import Contract, accounts, chain, project
from ape.cli import ConnectedProviderCommand, network_option
from eth_utils.address import to_checksum_address

from gridmarket.chain import Deployment
from gridmarket.deploy import EscrowParams, explorer_lines
from gridmarket.token import ERC20_ABI

_D = EscrowParams(operator="", treasury="")


def _token_arg(text: str) -> tuple[str, int | None]:
    address, _, least = text.partition(":")
    try:
        return to_checksum_address(address), (int(least) if least else None)
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: {exc}", param_hint="--token") from None


def _account(alias: str | None, local: bool) -> Any:
    if alias:
        if local and alias.startswith("TEST::"):
            return accounts.test_accounts[int(alias.removeprefix("TEST::"))]
        try:
            return accounts.load(alias)
        except Exception as exc:
            raise click.UsageError(
                f"no Ape account {alias!r} ({exc}): import one with `ape accounts import {alias}`"
            ) from None
    if local:
        return accounts.test_accounts[0]
    raise click.UsageError(
        "a public network needs the deployer's Ape account: --account ALIAS or "
        "$GRIDMARKET_DEPLOY_ACCOUNT (import it with `ape accounts import ALIAS`)"
    )


@click.command(cls=ConnectedProviderCommand, help=__doc__.split("\n")[0])
@network_option()
@click.option("--account", "alias", envvar="GRIDMARKET_DEPLOY_ACCOUNT", help="Ape account alias")
@click.option("--operator", help="the scheduler's address (local default: test account 1)")
@click.option("--treasury", help="where platform fees are credited (local default: account 2)")
@click.option("--out", type=click.Path(path_type=Path), help="deployment file to write")
@click.option(
    "--yes",
    is_flag=True,
    help="sign without asking (the account's passphrase from $APE_ACCOUNTS_<alias>_PASSPHRASE)",
)
@click.option("--fee-bps", type=int, default=_D.fee_bps, show_default=True)
@click.option("--min-bounty-wei", type=int, default=_D.min_bounty, show_default=True)
@click.option("--min-duration", type=int, default=_D.min_duration, show_default=True)
@click.option("--max-duration", type=int, default=_D.max_duration, show_default=True)
@click.option("--challenge-window", type=int, default=_D.challenge_window, show_default=True)
@click.option("--min-stake-wei", type=int, default=_D.min_stake, show_default=True)
@click.option("--unstake-delay", type=int, default=_D.unstake_delay, show_default=True)
@click.option("--min-collateral-bps", type=int, default=_D.min_collateral_bps, show_default=True)
@click.option("--dispute-deposit-wei", type=int, default=_D.dispute_deposit, show_default=True)
@click.option("--mediation-window", type=int, default=_D.mediation_window, show_default=True)
@click.option("--reassign-delay", type=int, default=_D.reassign_delay, show_default=True)
@click.option("--mediator", default=None, help="a mediator to list at deployment")
@click.option(
    "--token",
    "tokens",
    multiple=True,
    metavar="ADDRESS[:MIN_BOUNTY]",
    help="an ERC-20 to allow for bounties (repeatable), with the smallest bounty in its units "
    "(default: a hundredth of a whole token)",
)
@click.option(
    "--test-token",
    is_flag=True,
    help="also deploy TestUSD (6 decimals, permit; the deployer mints) and list it: devnets only",
)
def cli(
    network: Any,
    alias: str | None,
    operator: str | None,
    treasury: str | None,
    out: Path | None,
    yes: bool,
    fee_bps: int,
    min_bounty_wei: int,
    min_duration: int,
    max_duration: int,
    challenge_window: int,
    min_stake_wei: int,
    unstake_delay: int,
    min_collateral_bps: int,
    dispute_deposit_wei: int,
    mediation_window: int,
    reassign_delay: int,
    mediator: str | None,
    tokens: tuple[str, ...],
    test_token: bool,
) -> None:
    provider = chain.provider
    net = provider.network
    local = net.name == "local"
    deployer = _account(alias, local)
    if yes and hasattr(deployer, "set_autosign"):  # keyfile accounts ask before signing
        deployer.set_autosign(True)
    if local:
        operator = operator or accounts.test_accounts[1].address
        treasury = treasury or accounts.test_accounts[2].address
    if not operator or not treasury:
        raise click.UsageError("--operator and --treasury are required on a public network")
    params = EscrowParams(
        operator=operator,
        treasury=treasury,
        fee_bps=fee_bps,
        min_bounty=min_bounty_wei,
        min_duration=min_duration,
        max_duration=max_duration,
        challenge_window=challenge_window,
        min_stake=min_stake_wei,
        unstake_delay=unstake_delay,
        min_collateral_bps=min_collateral_bps,
        dispute_deposit=dispute_deposit_wei,
        mediation_window=mediation_window,
        reassign_delay=reassign_delay,
        mediator=mediator,
    )
    chain_id = int(provider.chain_id)
    click.echo(
        f"deploying JobEscrow to {net.ecosystem.name}:{net.name}:{provider.name} "
        f"(chain {chain_id}) from {deployer.address}"
    )
    contract = project.JobEscrow.deploy(params.as_tuple(), sender=deployer)
    receipt = provider.get_receipt(contract.txn_hash)
    abi = [a.model_dump(mode="json", by_alias=True) for a in project.JobEscrow.contract_type.abi]
    deployment = Deployment(
        chain_id=chain_id,
        escrow=str(contract.address),
        abi=abi,
        block=int(receipt.block_number),
        params=asdict(params),
        # a public RPC URL often carries an API key: only a local devnet's is written down
        rpc_url=provider.http_uri if local else None,
    )
    listed: dict[str, Any] = {}
    to_list = [_token_arg(t) for t in tokens]
    if test_token:
        usd = project.TestUSD.deploy(sender=deployer)
        click.echo(f"TestUSD at {usd.address} (tx {usd.txn_hash})")
        to_list.append((str(usd.address), None))
    for address, least in to_list:
        erc20 = Contract(address, abi=ERC20_ABI)
        symbol, decimals = str(erc20.symbol()), int(erc20.decimals())
        least = least if least is not None else max(1, 10**decimals // 100)
        tx = contract.setToken(address, least, sender=deployer)
        listed[symbol] = {"address": address, "decimals": decimals, "minBounty": least}
        click.echo(
            f"listed {symbol} ({address}, {decimals} decimals, min bounty {least}) tx {tx.txn_hash}"
        )
    deployment = replace(deployment, tokens=listed)
    path = out or Path("deployments") / f"{'local' if local else net.name}.json"
    deployment.save(path)
    click.echo(
        f"JobEscrow at {deployment.escrow} (chain {chain_id}, block {deployment.block}, "
        f"tx {contract.txn_hash}, gas {receipt.gas_used}) -> {path}"
    )
    if not local:  # a local devnet has no explorer, whatever its chain id
        for line in explorer_lines(chain_id, deployment.escrow, contract.txn_hash):
            click.echo(line)
