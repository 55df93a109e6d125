"""``gridmarket-agent``: the provider's command line, and its lean entry for the daemon.

    gridmarket-agent init       create (or import) the encrypted wallet keystore
    gridmarket-agent detect     show the detected hardware, its tier and the usable executors
    gridmarket-agent register   sign and send this node's registration (optionally stake on-chain)
    gridmarket-agent run        the daemon: pull jobs, run them sandboxed, report signed results
    gridmarket-agent status     what the scheduler knows about this node
    gridmarket-agent earnings   what the wallet earned, per job and per day; pending; stake
    gridmarket-agent withdraw   send the wallet's escrow balance out (withdraw / withdrawTo)
    gridmarket-agent unstake    take free stake out (request, then --complete after the delay)
    gridmarket-agent finalize   finalize the wallet's results whose challenge window passed

:func:`main` (the ``gridmarket-agent`` script, ``python -m agent.cli``) parses ``run`` itself
with argparse and starts the daemon (:func:`run_daemon`) without loading typer, click, rich or
pygments: the daemon stays up for months and each MB it holds counts (docs/agent.md,
"Footprint"). Every other command, and ``--help`` at the top, is the typer app of
:mod:`agent.commands` (``agent.cli.app`` still names it), whose ``run`` is the same
:func:`run_daemon` with the same options (tests/agent/test_cli.py keeps the two in step).

Settings come from ``--config FILE`` (TOML or YAML), ``GRIDMARKET_AGENT_*`` variables and the
flags (:mod:`agent.config`). Errors print one line on stderr and exit with status 1, never a
traceback (``-v`` logs the traceback as well).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.config import AgentConfig, ConfigError, load_config
from agent.errors import AgentError
from gridmarket.cmdline import prompt_password, run_friendly
from gridmarket.keystore import KeystoreError

if TYPE_CHECKING:
    from gridmarket.ethsig import KeyAccount

__all__ = ["main", "read_password", "run_daemon"]

log = logging.getLogger("agent")

PROG = "gridmarket-agent"
CONFIG_ENV = "GRIDMARKET_AGENT_CONFIG"
RUN_HELP = """Run the daemon: register, pull jobs, accept them (signed), run them sandboxed,
report signed results.

SIGTERM or Ctrl-C stops it cleanly (running jobs finish within stop_grace_s or are handed back);
a second signal cancels them at once."""

UNUSED_IMPORTS = ("trio", "httpx._main")
"""Modules the daemon refuses to import (an entry of None in ``sys.modules`` makes ``import``
raise ImportError): httpcore imports trio whenever it is installed (eth-ape's dependencies
install it; 3.4 MB the synchronous daemon never uses), and httpx's ``__init__`` imports its own
command line, ``httpx._main`` (click, rich, pygments: ~5 MB), falling back to a stub ``httpx.main``
when that import fails, as it does where httpx's ``cli`` extra is not installed."""


def main(argv: list[str] | None = None) -> None:
    """``gridmarket-agent``: ``run`` here, any other command through the typer app."""
    args = sys.argv[1:] if argv is None else list(argv)
    if _command(args) == "run":
        raise SystemExit(run_main(args))
    from agent.commands import app

    if argv is None:
        app()
    else:
        app(args=args, prog_name=PROG)


def __getattr__(name: str) -> Any:
    if name == "app":  # the typer app, as before the lean entry (an old console script)
        from agent.commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _command(args: list[str]) -> str | None:
    """The command word after the root options (``--config FILE``, ``-v``), if any."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("--config", "-c"):
            i += 2
        elif arg.startswith("--config=") or arg in ("--verbose", "-v"):
            i += 1
        else:
            return arg
    return None


def run_parser() -> argparse.ArgumentParser:
    """``gridmarket-agent [--config FILE] [-v] run [options]``: the options of the typer
    app's root and ``run`` (:mod:`agent.commands`), same names, same meaning."""
    parser = argparse.ArgumentParser(prog=PROG, description="GridMarket provider agent.")
    parser.add_argument(
        "--config",
        "-c",
        type=Path,
        default=os.environ.get(CONFIG_ENV) or None,
        help=f"TOML or YAML settings file (keys: the AgentConfig fields) [env: {CONFIG_ENV}]",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run",
        help=RUN_HELP.splitlines()[0],
        description=RUN_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--scheduler-url", help="the scheduler's base URL")
    run.add_argument("--region", help="pricing region code, e.g. eu-west")
    run.add_argument("--slots", type=int, help="jobs to run at the same time")
    run.add_argument(
        "--accept-mediator",
        action="append",
        help="accept jobs with this mediator only (repeat for several)",
    )
    run.add_argument(
        "--max-collateral-wei", type=int, help="refuse jobs locking more collateral than this (wei)"
    )
    self_mediated = run.add_mutually_exclusive_group()
    self_mediated.add_argument(
        "--accept-self-mediated",
        dest="accept_self_mediated",
        action="store_const",
        const=True,
        help="take jobs whose submitter is their own mediator",
    )
    self_mediated.add_argument(
        "--refuse-self-mediated",
        dest="accept_self_mediated",
        action="store_const",
        const=False,
        help="refuse them",
    )
    return parser


def run_main(args: list[str]) -> int:
    """``gridmarket-agent ... run ...`` parsed and run; the exit status."""
    ns = run_parser().parse_args(args)
    return run_friendly(
        lambda: run_daemon(
            ns.config,
            verbose=ns.verbose,
            scheduler_url=ns.scheduler_url,
            region=ns.region,
            slots=ns.slots,
            accepted_mediators=ns.accept_mediator or None,
            max_collateral_wei=ns.max_collateral_wei,
            accept_self_mediated=ns.accept_self_mediated,
        ),
        lambda: (AgentError, KeystoreError),
        log,
    )


def read_password(config: AgentConfig, *, confirm: bool = False) -> str:
    """The keystore password: the configuration's, else asked on the terminal."""
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


def run_daemon(config_file: Path | None, *, verbose: bool = False, **overrides: Any) -> int:
    """The daemon (``run``): settings from ``config_file``, the environment and ``overrides``
    (flags left None do not override); its exit status after a clean stop."""
    for name in UNUSED_IMPORTS:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    from agent.assembly import build_agent
    from agent.cli_display import setup_logging
    from agent.signup import save_node
    from gridmarket.keystore import load_signer

    config = load_config(config_file, **overrides)
    steps = None
    if sys.stdout.isatty():  # live progress (rich) for a person watching
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        from agent.cli_display import RichSteps

        console = Console(stderr=True)
        setup_logging(verbose, default=logging.INFO, console=console)
        progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        steps = RichSteps(progress)
    else:
        setup_logging(verbose, default=logging.INFO)
    config.require_region()
    account: KeyAccount = load_signer(config.keystore, read_password(config))
    log.info("wallet %s, scheduler %s", account.address, config.scheduler_url)
    agent = build_agent(
        config,
        account,
        steps=steps,
        on_registered=lambda reg: save_node(config, reg, account.address),
    )
    return agent.run()


if __name__ == "__main__":
    main()
