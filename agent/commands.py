"""``gridmarket-agent``'s commands (typer); :mod:`agent.cli` is the entry point, and starts the
daemon (``run``) without this module.

    gridmarket-agent init       create (or import) the encrypted wallet keystore
    gridmarket-agent detect     show the detected hardware, its tier and the usable executors
    gridmarket-agent register   sign and send this node's registration (optionally stake on-chain)
    gridmarket-agent run        the daemon: pull jobs, run them sandboxed, report signed results
    gridmarket-agent status     what the scheduler knows about this node
    gridmarket-agent earnings   what the wallet earned, per job and per day; pending; stake
    gridmarket-agent withdraw   send the wallet's escrow balance out (withdraw / withdrawTo)
    gridmarket-agent unstake    take free stake out (request, then --complete after the delay)
    gridmarket-agent finalize   finalize the wallet's results whose challenge window passed

Settings come from ``--config FILE`` (TOML or YAML), ``GRIDMARKET_AGENT_*`` variables and the
flags (:mod:`agent.config`). On a terminal the output is a rich table or live progress; otherwise
plain text and log lines (:mod:`agent.cli_display`); ``register``'s stake and node file are
:mod:`agent.signup`. Errors print one line on stderr and exit with status 1, never a
traceback (``-v`` logs the traceback as well).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from agent.cli import read_password, run_daemon
from agent.cli_display import (
    detect_lines,
    detect_payload,
    gpu_jobs_note,
    print_detect_table,
    setup_logging,
)
from agent.config import AgentConfig, ConfigError, load_config
from agent.errors import AgentError, CliError
from agent.signup import NODE_FILE, save_node, stake_on_chain, stake_wei
from gridmarket.cmdline import command_app, one_line, root_options
from gridmarket.cmdline import friendly as cmdline_friendly
from gridmarket.keystore import KeystoreError

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from gridmarket.chain import EscrowClient
    from gridmarket.deployment import Deployment
    from gridmarket.lightchain import LightEscrowClient
    from gridmarket.token import Token


__all__ = ["app"]

log = logging.getLogger("agent")

app = command_app(
    "gridmarket-agent",
    "GridMarket provider agent: run sandboxed jobs for the marketplace and get paid.",
)


@dataclass
class _Options:
    config: Path | None
    verbose: bool


def _opts(ctx: typer.Context) -> _Options:
    return root_options(ctx, _Options) or _Options(None, False)


# --------------------------------------------------------------------------- plumbing

friendly = cmdline_friendly(lambda: (AgentError, KeystoreError), log)
"""Any failure of a command: one line on stderr, exit status 1 (the traceback with ``-v``)."""


def _config(ctx: typer.Context, **overrides: Any) -> AgentConfig:
    return load_config(_opts(ctx).config, **overrides)


_password = read_password


def _account(config: AgentConfig) -> LocalAccount:
    from gridmarket.keystore import load_account

    return load_account(config.keystore, _password(config))


def _is_terminal() -> bool:
    return sys.stdout.isatty()


# --------------------------------------------------------------------------- root


@app.callback()
def _root(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            envvar="GRIDMARKET_AGENT_CONFIG",
            help="TOML or YAML settings file (keys: the AgentConfig fields)",
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="debug logging")] = False,
) -> None:
    """GridMarket provider agent."""
    ctx.obj = _Options(config, verbose)


# --------------------------------------------------------------------------- init


@app.command()
@friendly
def init(
    ctx: typer.Context,
    keystore: Annotated[
        Path | None, typer.Option(help="where to write the keystore (default from config)")
    ] = None,
    private_key_file: Annotated[
        Path | None,
        typer.Option(help="import the hex private key in this file instead of a new one"),
    ] = None,
    import_key: Annotated[
        bool, typer.Option("--import-key", help="import a private key typed at a prompt")
    ] = False,
    force: Annotated[bool, typer.Option(help="replace an existing keystore")] = False,
) -> None:
    """Create a new wallet key (or import one) into an encrypted keystore (mode 0600)."""
    from gridmarket.keystore import create_keystore

    setup_logging(_opts(ctx).verbose, default=logging.WARNING)
    config = _config(ctx, keystore=keystore)
    if private_key_file is not None and import_key:
        raise CliError("use either --private-key-file or --import-key, not both")
    key: str | None = None
    if private_key_file is not None:
        try:
            key = private_key_file.expanduser().read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise CliError(f"cannot read {private_key_file}: {exc.strerror}") from None
    elif import_key:
        if not sys.stdin.isatty():
            raise CliError("--import-key prompts on a terminal; use --private-key-file instead")
        key = typer.prompt("Private key (hex)", hide_input=True).strip()
    if config.keystore.exists() and not force:
        raise CliError(
            f"{config.keystore} already exists: refusing to overwrite a key (use --force)"
        )
    address = create_keystore(
        config.keystore, _password(config, confirm=True), private_key=key, force=force
    )
    what = "imported" if key is not None else "created"
    typer.echo(f"{what} wallet {address}")
    typer.echo(f"keystore: {config.keystore} (mode 0600)")


# --------------------------------------------------------------------------- detect


@app.command()
@friendly
def detect(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    work_dir: Annotated[
        Path | None, typer.Option(help="where jobs will run (its disk is measured)")
    ] = None,
) -> None:
    """Show the detected GPUs (and their tier), CPU, RAM, disk and usable executors."""
    setup_logging(_opts(ctx).verbose, default=logging.ERROR)
    config = _config(ctx, work_dir=work_dir)
    payload = detect_payload(config)
    if as_json:
        typer.echo(json.dumps(payload, indent=2))
    elif _is_terminal():
        print_detect_table(payload)
    else:
        for key, value in detect_lines(payload):
            typer.echo(f"{key}: {value}")


# --------------------------------------------------------------------------- register


@app.command()
@friendly
def register(
    ctx: typer.Context,
    scheduler_url: Annotated[str | None, typer.Option(help="the scheduler's base URL")] = None,
    region: Annotated[str | None, typer.Option(help="pricing region code, e.g. eu-west")] = None,
    name: Annotated[str | None, typer.Option(help="node name (default: host name)")] = None,
    stake: Annotated[
        str | None,
        typer.Option(help="ETH to stake: also registers the wallet on-chain (registerProvider)"),
    ] = None,
    rpc_url: Annotated[str | None, typer.Option(help="Ethereum JSON-RPC URL (for --stake)")] = None,
    deployment: Annotated[
        Path | None, typer.Option(help="deployment JSON of the escrow (for --stake)")
    ] = None,
) -> None:
    """Sign this node's registration and send it to the scheduler; print the node id. With
    ``stake_tokens`` in the configuration, also bring the wallet's stake in each token up to its
    amount (permit and stakeToken in one transaction each)."""
    from agent.assembly import node_session
    from agent.capacity import node_capacity, usable_executors
    from agent.client import agent_version
    from agent.hardware import detect_hardware

    setup_logging(_opts(ctx).verbose, default=logging.WARNING)
    config = _config(
        ctx,
        scheduler_url=scheduler_url,
        region=region,
        name=name,
        rpc_url=rpc_url,
        deployment=deployment,
    )
    wei = stake_wei(stake) if stake is not None else None
    config.require_region()
    account = _account(config)
    kinds, notes = usable_executors(config)
    for note in notes:
        typer.echo(f"note: {note}", err=True)
    capacity = node_capacity(config, detect_hardware(config.work_dir), kinds)
    if wei is not None:
        metadata = json.dumps(
            {
                "wallet": account.address,
                "name": config.name,
                "capacity": capacity().model_dump(mode="json"),
                "agent_version": agent_version(),
            },
            sort_keys=True,
        ).encode()
        tx = stake_on_chain(config, account, wei, metadata)
        typer.echo(f"registered on-chain with {stake} ETH staked (tx {tx})")
    if config.token_stakes:
        for line in _stake_tokens(config, account):
            typer.echo(line)
    with node_session(config, account, capacity) as client:
        registration = client.register()
    save_node(config, registration, account.address)
    typer.echo(registration.node_id)


# --------------------------------------------------------------------------- run


@app.command()
@friendly
def run(
    ctx: typer.Context,
    scheduler_url: Annotated[str | None, typer.Option(help="the scheduler's base URL")] = None,
    region: Annotated[str | None, typer.Option(help="pricing region code, e.g. eu-west")] = None,
    slots: Annotated[int | None, typer.Option(help="jobs to run at the same time")] = None,
    accept_mediator: Annotated[
        list[str] | None,
        typer.Option(help="accept jobs with this mediator only (repeat for several)"),
    ] = None,
    max_collateral_wei: Annotated[
        int | None, typer.Option(help="refuse jobs locking more collateral than this (wei)")
    ] = None,
    accept_self_mediated: Annotated[
        bool | None,
        typer.Option(
            "--accept-self-mediated/--refuse-self-mediated",
            help="take jobs whose submitter is their own mediator",
        ),
    ] = None,
) -> None:
    """Run the daemon: register, pull jobs, accept them (signed), run them sandboxed, report
    signed results.

    SIGTERM or Ctrl-C stops it cleanly (running jobs finish within stop_grace_s or are handed
    back); a second signal cancels them at once.
    """
    code = run_daemon(
        _opts(ctx).config,
        verbose=_opts(ctx).verbose,
        scheduler_url=scheduler_url,
        region=region,
        slots=slots,
        accepted_mediators=accept_mediator or None,
        max_collateral_wei=max_collateral_wei,
        accept_self_mediated=accept_self_mediated,
    )
    raise typer.Exit(code)


# --------------------------------------------------------------------------- status


@app.command()
@friendly
def status(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    scheduler_url: Annotated[str | None, typer.Option(help="the scheduler's base URL")] = None,
) -> None:
    """Show what the scheduler knows about this node (status, reputation, running jobs)."""
    import httpx

    from gridmarket.wire import API

    setup_logging(_opts(ctx).verbose, default=logging.WARNING)
    config = _config(ctx, scheduler_url=scheduler_url)
    path = config.work_dir / NODE_FILE
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        node_id = str(saved["node_id"])
    except FileNotFoundError:
        raise CliError(
            f"this node has not registered yet ({path} is missing): "
            "run `gridmarket-agent register` or `gridmarket-agent run`"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CliError(f"{path} is unreadable: {one_line(exc)}") from None
    url = config.scheduler_url + API.NODE.format(node_id=node_id)
    try:
        response = httpx.get(url, timeout=config.request_timeout_s)
    except httpx.HTTPError as exc:
        raise CliError(f"the scheduler at {config.scheduler_url} is unreachable: {exc}") from None
    if response.status_code == 404:
        raise CliError(f"the scheduler at {config.scheduler_url} does not know node {node_id}")
    if response.status_code != 200:
        raise CliError(f"the scheduler answered {response.status_code}: {response.text[:200]}")
    node = response.json()
    from agent.hardware import detect_hardware

    note = gpu_jobs_note(config, detect_hardware(config.work_dir))
    if note is not None and isinstance(node, dict):  # what the scheduler cannot know
        node["gpu_jobs"] = f"no GPUs offered: {note}"
    if as_json or not _is_terminal():
        typer.echo(json.dumps(node, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"node {node_id}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in node.items():
        table.add_row(key, value if isinstance(value, str) else json.dumps(value))
    Console().print(table)


# --------------------------------------------------------------------------- chain


Client = TypeVar("Client")


def _escrow(config: AgentConfig) -> EscrowClient:
    from gridmarket.chain import EscrowClient

    return _connect(config, EscrowClient.connect)


def _light_escrow(config: AgentConfig) -> LightEscrowClient:
    """The escrow client the daemon's duties use (no web3): ``finalize``, the token stakes."""
    from gridmarket.lightchain import LightEscrowClient

    return _connect(config, LightEscrowClient.connect)


def _connect(config: AgentConfig, connect: Callable[[str, Deployment], Client]) -> Client:
    from gridmarket.deployment import ChainError, Deployment

    if config.rpc_url is None or config.deployment is None:
        raise CliError(
            "this needs the chain: set rpc_url and deployment "
            "(--rpc-url, --deployment or GRIDMARKET_AGENT_RPC_URL / _DEPLOYMENT)"
        )
    try:
        return connect(config.rpc_url, Deployment.load(config.deployment))
    except ChainError as exc:
        raise CliError(one_line(exc)) from None
    except Exception as exc:  # the RPC node unreachable
        raise CliError(f"the chain at {config.rpc_url} does not answer: {one_line(exc)}") from None


def _stake_tokens(config: AgentConfig, account: LocalAccount) -> list[str]:
    """``stake_tokens`` topped up on-chain (register's step); one line per token."""
    from agent.signup import TokenStakeError, top_up_token_stakes

    if config.rpc_url is None:
        raise CliError(
            "stake_tokens needs the chain: set rpc_url (--rpc-url or GRIDMARKET_AGENT_RPC_URL)"
        )
    escrow = _light_escrow(config)
    with _chain_errors("staking tokens"):
        try:
            done = top_up_token_stakes(escrow, account, config.token_stakes, config.token)
        except TokenStakeError as exc:
            raise CliError(str(exc)) from None
    return [stake.line() for stake in done]


@contextlib.contextmanager
def _chain_errors(what: str) -> Iterator[None]:
    """A chain failure inside the block becomes one CliError line."""
    from gridmarket.chain import ChainError

    try:
        yield
    except (CliError, ConfigError, KeystoreError):
        raise
    except ChainError as exc:
        raise CliError(f"{what} failed: {one_line(exc)}") from None
    except Exception as exc:  # transport errors (web3's, httpx's)
        raise CliError(f"{what} failed (is the chain reachable?): {one_line(exc)}") from None


RpcUrl = Annotated[str | None, typer.Option(help="Ethereum JSON-RPC URL")]
DeploymentFile = Annotated[Path | None, typer.Option(help="deployment JSON of the escrow")]
TokenName = Annotated[
    str | None,
    typer.Option(help="the currency: ETH (default), a listed token's symbol, or an address"),
]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON (wei as strings)")]


def _currency(escrow: EscrowClient, token: str | None) -> Token:
    """``--token`` as the escrow lists it (ETH without one); a CliError naming what is wrong."""
    from agent.earnings import token_named
    from gridmarket.token import ETH_TOKEN

    with _chain_errors("reading the token"):
        try:
            return token_named(escrow, token) if token is not None else ETH_TOKEN
        except ValueError as exc:
            raise CliError(f"--token {exc}") from None


def _echo(done: Any, as_json: bool) -> None:
    """A command's outcome: its ``to_json()`` with --json, else its ``lines()``."""
    if as_json:
        typer.echo(json.dumps(done.to_json(), indent=2))
    else:
        for line in done.lines():
            typer.echo(line)


@app.command()
@friendly
def earnings(
    ctx: typer.Context,
    as_json: AsJson = False,
    wallet: Annotated[
        str | None, typer.Option(help="the provider's address (default: the keystore's)")
    ] = None,
    rpc_url: RpcUrl = None,
    deployment: DeploymentFile = None,
) -> None:
    """What the wallet earned (per job, per day), pending results, stake and balance, in ETH and
    in each listed token."""
    from agent.earnings import earnings as read_earnings
    from gridmarket.keystore import keystore_address
    from gridmarket.wire import checksum

    setup_logging(_opts(ctx).verbose, default=logging.WARNING)
    config = _config(ctx, rpc_url=rpc_url, deployment=deployment)
    escrow = _escrow(config)
    if wallet is None:
        address = keystore_address(config.keystore)
    else:
        try:
            address = checksum(wallet)
        except ValueError as exc:
            raise CliError(f"--wallet: {exc}") from None
    with _chain_errors("reading the chain"):
        report = read_earnings(escrow, address)
    _echo(report, as_json)


@app.command()
@friendly
def withdraw(
    ctx: typer.Context,
    to: Annotated[
        str | None, typer.Option(help="send to this address (withdrawTo) instead of the wallet")
    ] = None,
    token: TokenName = None,
    as_json: AsJson = False,
    rpc_url: RpcUrl = None,
    deployment: DeploymentFile = None,
) -> None:
    """Send the wallet's whole escrow balance in ETH or --token (payouts, unstaked stake) to it
    or to --to."""
    from agent.earnings import NothingToWithdrawError
    from agent.earnings import withdraw as send_withdrawal
    from gridmarket.wire import checksum

    setup_logging(_opts(ctx).verbose, default=logging.WARNING)
    config = _config(ctx, rpc_url=rpc_url, deployment=deployment)
    escrow = _escrow(config)
    try:
        target = checksum(to) if to is not None else None
    except ValueError as exc:
        raise CliError(f"--to: {exc}") from None
    currency = _currency(escrow, token)
    account = _account(config)
    with _chain_errors("withdraw"):
        try:
            done = send_withdrawal(escrow, account, target, currency)
        except NothingToWithdrawError as exc:
            raise CliError(str(exc)) from None
    _echo(done, as_json)


@app.command()
@friendly
def unstake(
    ctx: typer.Context,
    amount: Annotated[
        str | None,
        typer.Argument(
            help="how much free stake to take out, in the currency's units (0.5, 10), or 'all'",
            show_default=False,
            metavar="AMOUNT",
        ),
    ] = None,
    complete: Annotated[
        bool,
        typer.Option(
            "--complete",
            help="after the delay, move the pending unstake to the withdrawable balance",
        ),
    ] = False,
    token: TokenName = None,
    as_json: AsJson = False,
    rpc_url: RpcUrl = None,
    deployment: DeploymentFile = None,
) -> None:
    """Take free stake (not locked by jobs) out of the ETH or --token stake: ``unstake AMOUNT``
    requests it (requestUnstake: out of the stake at once); after the escrow's unstakeDelay,
    ``unstake --complete`` moves it to the withdrawable balance (completeUnstake), which
    ``withdraw`` sends out."""
    from agent.earnings import (
        UnstakeCompletion,
        UnstakeError,
        UnstakeRequest,
        complete_unstake,
        request_unstake,
    )

    setup_logging(_opts(ctx).verbose, default=logging.WARNING)
    if complete and amount is not None:
        raise CliError("give either AMOUNT (request an unstake) or --complete, not both")
    if not complete and amount is None:
        raise CliError(
            "give AMOUNT to unstake (e.g. `gridmarket-agent unstake 0.5`, or 'all'), "
            "or --complete to finish a pending unstake"
        )
    config = _config(ctx, rpc_url=rpc_url, deployment=deployment)
    escrow = _escrow(config)
    currency = _currency(escrow, token)
    account = _account(config)
    done: UnstakeRequest | UnstakeCompletion
    with _chain_errors("unstake"):
        try:
            if amount is None:
                done = complete_unstake(escrow, account, currency)
            else:
                done = request_unstake(escrow, account, amount, currency)
                for warning in done.warnings():
                    typer.echo(warning, err=True)
        except UnstakeError as exc:
            raise CliError(str(exc)) from None
    _echo(done, as_json)


@app.command()
@friendly
def finalize(
    ctx: typer.Context,
    rpc_url: RpcUrl = None,
    deployment: DeploymentFile = None,
) -> None:
    """Finalize the wallet's results whose challenge window passed (the daemon does this every
    finalize_interval_s); print one transaction hash per job paid."""
    from agent.onchain import Finalizer

    setup_logging(_opts(ctx).verbose, default=logging.INFO)
    config = _config(ctx, rpc_url=rpc_url, deployment=deployment)
    escrow = _light_escrow(config)
    account = _account(config)
    with _chain_errors("finalize"):
        sent = Finalizer(escrow, account).run_once()
    for tx in sent:
        typer.echo(tx)
    if not sent:
        typer.echo("nothing to finalize", err=True)
