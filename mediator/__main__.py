"""gridmarket-mediator: rule on the results of the jobs that name this mediator (integrity, and a
re-run on another provider for a disputed deterministic job or a drawn spot check).

    GRIDMARKET_MEDIATOR_KEY=0x... gridmarket-mediator run --rpc-url URL --deployment FILE \\
        --ipfs-api MULTIADDR --state FILE

The key is the mediator's own (never the operator's: it refuses to start with it). See
docs/mediator.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from gridmarket.chain import ChainError
from mediator.service import Mediator, MediatorConfig, MediatorError
from mediator.state import StateError

KEY_ENV = "GRIDMARKET_MEDIATOR_KEY"


def parser() -> argparse.ArgumentParser:
    defaults = MediatorConfig()
    p = argparse.ArgumentParser(prog="gridmarket-mediator", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="follow the escrow and rule until interrupted")
    run.add_argument("--rpc-url", required=True, help="JSON-RPC endpoint of the chain")
    run.add_argument("--deployment", type=Path, required=True, help="the deployment file")
    run.add_argument(
        "--ipfs-api", required=True, help="Kubo RPC API multiaddr, e.g. /ip4/127.0.0.1/tcp/5001"
    )
    run.add_argument("--state", type=Path, required=True, help="the mediator's SQLite file")
    run.add_argument("--work-dir", type=Path, default=None, help="where outputs are fetched")
    run.add_argument("--fetch-timeout", type=float, default=defaults.fetch_timeout_s)
    run.add_argument("--fetch-attempts", type=int, default=defaults.fetch_attempts)
    run.add_argument("--retry-delay", type=float, default=defaults.retry_delay_s)
    run.add_argument("--max-output-bytes", type=int, default=defaults.max_output_bytes)
    run.add_argument("--window-margin", type=float, default=defaults.window_margin_s)
    run.add_argument("--poll-interval", type=float, default=defaults.poll_interval_s)
    run.add_argument("--confirmations", type=int, default=defaults.confirmations)
    run.add_argument(
        "--no-rerun",
        action="store_true",
        help="rule on disputes by integrity alone (never fund a re-run)",
    )
    run.add_argument(
        "--rerun-min",
        type=float,
        default=defaults.rerun_min_s,
        help="seconds that must be left in the mediation window to fund a re-run",
    )
    run.add_argument(
        "--rerun-poll",
        type=float,
        default=defaults.rerun_poll_s,
        help="seconds between looks at a re-run's state",
    )
    run.add_argument(
        "--rerun-max-bounty-wei",
        type=int,
        default=None,
        help="the most one re-run of an ETH job may cost (default: the disputed job's "
        "bounty, no cap)",
    )
    run.add_argument(
        "--rerun-max-bounty-token",
        type=int,
        default=None,
        help="the most one re-run of a job paid in a token may cost, in that token's smallest "
        "units (the re-run is paid in the job's token from the mediator's balance of it; "
        "default: no cap)",
    )
    run.add_argument(
        "--scheduler-url",
        default=None,
        help="the scheduler a settled spot job's seed is revealed to (POST /v1/jobs/{id}/spot); "
        "default: seeds stay in the state file",
    )
    run.add_argument(
        "--reveal-retry",
        type=float,
        default=defaults.reveal_retry_s,
        help="seconds before a reveal the scheduler could not take is posted again",
    )
    run.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    key = os.environ.get(KEY_ENV)
    if not key:
        print(f"error: set {KEY_ENV} to the mediator's private key", file=sys.stderr)
        return 2
    try:
        config = MediatorConfig(
            fetch_timeout_s=args.fetch_timeout,
            fetch_attempts=args.fetch_attempts,
            retry_delay_s=args.retry_delay,
            max_output_bytes=args.max_output_bytes,
            window_margin_s=args.window_margin,
            poll_interval_s=args.poll_interval,
            confirmations=args.confirmations,
            work_dir=args.work_dir,
            rerun=not args.no_rerun,
            rerun_min_s=args.rerun_min,
            rerun_poll_s=args.rerun_poll,
            rerun_max_bounty_wei=args.rerun_max_bounty_wei,
            rerun_max_bounty_token=args.rerun_max_bounty_token,
            scheduler_url=args.scheduler_url,
            reveal_retry_s=args.reveal_retry,
        )
        mediator = Mediator.connect(
            args.rpc_url, args.deployment, key, args.ipfs_api, args.state, config
        )
    except (ChainError, MediatorError, StateError, ValueError, OSError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        mediator.run_forever(stop)
    finally:
        mediator.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
