"""``gridmarket-agent``: the provider's command line (typer).

    gridmarket-agent init       create (or import) the encrypted wallet keystore
    gridmarket-agent detect     show the detected hardware, its tier and the usable executors
    gridmarket-agent register   sign and send this node's registration (optionally stake on-chain)
    gridmarket-agent run        the daemon: pull jobs, run them sandboxed, report signed results
    gridmarket-agent status     what the scheduler knows about this node

Settings come from ``--config FILE`` (TOML or YAML), ``GRIDMARKET_AGENT_*`` variables and the
flags (:mod:`agent.config`). On a terminal the output is a rich table or live progress; otherwise
plain text and log lines. Errors print one line on stderr and exit with status 1, never a
traceback (``-v`` logs the traceback as well).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agent.config import AgentConfig, ConfigError, load_config
from agent.errors import AgentError
from gridmarket.cmdline import command_app, one_line, prompt_password, root_options
from gridmarket.cmdline import friendly as cmdline_friendly
from gridmarket.keystore import KeystoreError

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount
    from rich.console import Console
    from rich.progress import Progress

    from gridmarket.wire import RegisterResponse

__all__ = ["app", "main"]

log = logging.getLogger("agent")

app = command_app(
    "gridmarket-agent",
    "GridMarket provider agent: run sandboxed jobs for the marketplace and get paid.",
)

NODE_FILE = "node.json"
"""Written under ``work_dir`` after each registration: what ``status`` needs to find the node."""


class CliError(AgentError):
    """A problem to report in one line (exit status 1)."""


@dataclass
class _Options:
    config: Path | None
    verbose: bool


def _opts(ctx: typer.Context) -> _Options:
    return root_options(ctx, _Options) or _Options(None, False)


# --------------------------------------------------------------------------- plumbing

friendly = cmdline_friendly(lambda: (AgentError, KeystoreError), log)
"""Any failure of a command: one line on stderr, exit status 1 (the traceback with ``-v``)."""


def _setup_logging(verbose: bool, *, default: int, console: Console | None = None) -> None:
    level = logging.DEBUG if verbose else default
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    handler: logging.Handler
    if console is not None:
        from rich.logging import RichHandler

        handler = RichHandler(
            console=console, show_path=False, rich_tracebacks=False, log_time_format="[%X]"
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("httpx", "httpcore", "urllib3", "docker", "web3", "asyncio"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))


def _config(ctx: typer.Context, **overrides: Any) -> AgentConfig:
    return load_config(_opts(ctx).config, **overrides)


def _password(config: AgentConfig, *, confirm: bool = False) -> str:
    password = config.read_password()
    if password is not None:
        return password
    password = prompt_password(confirm=confirm)
    if password is None:
        raise ConfigError(
            "no keystore password: set GRIDMARKET_AGENT_PASSWORD or password_file "
            "(GRIDMARKET_AGENT_PASSWORD_FILE), or run on a terminal to be asked"
        )
    return password


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

    _setup_logging(_opts(ctx).verbose, default=logging.WARNING)
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


def _detect_payload(config: AgentConfig) -> dict[str, Any]:
    from agent.capacity import usable_executors
    from agent.hardware import detect_hardware

    report = detect_hardware(config.work_dir)
    payload: dict[str, Any] = report.to_dict()
    groups = report.gpu_groups
    payload["node_tier"] = groups[0].tier_key if groups else "cpu"
    payload["tier_guessed"] = any(g.tier.guessed for g in report.gpus)
    try:
        kinds, notes = usable_executors(config)
    except ConfigError as exc:
        kinds, notes = [], [str(exc)]
    payload["executors"] = sorted(str(k) for k in kinds)
    payload["executor_notes"] = notes
    return payload


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
    _setup_logging(_opts(ctx).verbose, default=logging.ERROR)
    config = _config(ctx, work_dir=work_dir)
    payload = _detect_payload(config)
    if as_json:
        typer.echo(json.dumps(payload, indent=2))
    elif _is_terminal():
        _print_detect_table(payload)
    else:
        for key, value in _detect_lines(payload):
            typer.echo(f"{key}: {value}")


def _detect_lines(payload: dict[str, Any]) -> list[tuple[str, str]]:
    lines = []
    for gpu in payload["gpus"]:
        tier = gpu["tier"]
        flag = " (guessed from VRAM)" if tier.get("guessed") else ""
        lines.append(
            (
                f"gpu {gpu['index']}",
                f"{gpu['name']}, {gpu['vram_mib']} MiB, tier {tier['key']}{flag}, "
                f"driver {gpu['driver_version'] or '?'}, CUDA {gpu['cuda_version'] or '?'}, "
                f"compute {gpu['compute_capability'] or '?'}",
            )
        )
    if not payload["gpus"]:
        lines.append(("gpus", "none (CPU-only)"))
    lines += [
        ("gpu detection", payload["gpu_detection"]),
        ("node tier", payload["node_tier"]),
        (
            "cpu",
            f"{payload['cpu_model']} ({payload['cpu_physical_cores']} cores, "
            f"{payload['cpu_logical_cores']} threads)",
        ),
        ("ram", f"{payload['ram_mib']} MiB"),
        ("disk free", f"{payload['disk_free_mib']} MiB under {payload['work_dir']}"),
        ("executors", ", ".join(payload["executors"]) or "none"),
    ]
    lines += [("note", note) for note in payload["executor_notes"]]
    lines.append(("os", f"{payload['os']} {payload['arch']}"))
    return lines


def _print_detect_table(payload: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="GridMarket node", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in _detect_lines(payload):
        table.add_row(key, value)
    Console().print(table)


# --------------------------------------------------------------------------- register


def _save_node(config: AgentConfig, registration: RegisterResponse, wallet: str) -> None:
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


def _wei(eth: str) -> int:
    try:
        value = Decimal(eth) * 10**18
    except InvalidOperation:
        raise CliError(f"--stake {eth!r} is not a number of ETH") from None
    if value < 0 or value != value.to_integral_value():
        raise CliError(f"--stake {eth!r} must be >= 0 with at most 18 decimals")
    return int(value)


def _stake_on_chain(config: AgentConfig, account: LocalAccount, wei: int, metadata: bytes) -> str:
    """``registerProvider(metadataCid)`` with ``wei`` staked; the transaction hash."""
    if config.rpc_url is None or config.deployment is None:
        raise CliError(
            "--stake needs the chain: set rpc_url and deployment "
            "(--rpc-url, --deployment or GRIDMARKET_AGENT_RPC_URL / _DEPLOYMENT)"
        )
    cid = _metadata_cid(config, metadata)
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


def _metadata_cid(config: AgentConfig, metadata: bytes) -> str:
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
    """Sign this node's registration and send it to the scheduler; print the node id."""
    from agent.assembly import node_session
    from agent.capacity import node_capacity, usable_executors
    from agent.client import agent_version
    from agent.hardware import detect_hardware

    _setup_logging(_opts(ctx).verbose, default=logging.WARNING)
    config = _config(
        ctx,
        scheduler_url=scheduler_url,
        region=region,
        name=name,
        rpc_url=rpc_url,
        deployment=deployment,
    )
    wei = _wei(stake) if stake is not None else None
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
        tx = _stake_on_chain(config, account, wei, metadata)
        typer.echo(f"registered on-chain with {stake} ETH staked (tx {tx})")
    with node_session(config, account, capacity) as client:
        registration = client.register()
    _save_node(config, registration, account.address)
    typer.echo(registration.node_id)


# --------------------------------------------------------------------------- run


class RichSteps:
    """Live spinners for the long steps of running jobs; the display runs only while a step
    does (an idle agent refreshes nothing)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self._lock = threading.Lock()
        self._active = 0

    @contextlib.contextmanager
    def step(self, job_id: str, what: str) -> Iterator[None]:
        with self._lock:
            if self._active == 0:
                self.progress.start()
            self._active += 1
            task = self.progress.add_task(f"job {job_id[:10]}: {what}", total=None)
        started = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self.progress.remove_task(task)
                self._active -= 1
                if self._active == 0:
                    self.progress.stop()
            log.info("job %s: %s (%.1f s)", job_id[:10], what, time.monotonic() - started)


@app.command()
@friendly
def run(
    ctx: typer.Context,
    scheduler_url: Annotated[str | None, typer.Option(help="the scheduler's base URL")] = None,
    region: Annotated[str | None, typer.Option(help="pricing region code, e.g. eu-west")] = None,
    slots: Annotated[int | None, typer.Option(help="jobs to run at the same time")] = None,
) -> None:
    """Run the daemon: register, pull jobs, run them sandboxed, report signed results.

    SIGTERM or Ctrl-C stops it cleanly (running jobs finish within stop_grace_s or are handed
    back); a second signal cancels them at once.
    """
    # httpcore imports trio whenever it is installed (eth-ape's dependencies install it): 3.4 MB
    # of RSS the daemon never uses (it is synchronous). Refuse the import in this process only.
    sys.modules.setdefault("trio", None)  # type: ignore[arg-type]
    from agent.assembly import build_agent

    config = _config(ctx, scheduler_url=scheduler_url, region=region, slots=slots)
    steps = None
    if _is_terminal():
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        _setup_logging(_opts(ctx).verbose, default=logging.INFO, console=console)
        progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        steps = RichSteps(progress)
    else:
        _setup_logging(_opts(ctx).verbose, default=logging.INFO)
    config.require_region()
    account = _account(config)
    log.info("wallet %s, scheduler %s", account.address, config.scheduler_url)
    agent = build_agent(
        config,
        account,
        steps=steps,
        on_registered=lambda reg: _save_node(config, reg, account.address),
    )
    raise typer.Exit(agent.run())


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

    _setup_logging(_opts(ctx).verbose, default=logging.WARNING)
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


def main() -> None:
    """Entry point for ``python -m agent.cli``."""
    app()


if __name__ == "__main__":
    main()
