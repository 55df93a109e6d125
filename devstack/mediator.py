"""The devnet's mediator as a child process (``python -m mediator run``): the key the
submitters name by default (the deployment lists it), ruling on the integrity of results of the
jobs that name it and re-running disputed deterministic jobs on another provider of the grid
(docs/mediator.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Self

from ._process import ROOT, ManagedProcess, Service

KEY_ENV = "GRIDMARKET_MEDIATOR_KEY"
"""Where ``gridmarket-mediator`` reads its private key (never a command-line argument)."""


class MediatorProcess(Service):
    """``python -m mediator run`` following the devnet's escrow."""

    def __init__(
        self,
        work_dir: Path,
        *,
        rpc_url: str,
        deployment_file: Path,
        ipfs_api: str,
        key_hex: str,
        poll_interval_s: float = 0.2,
        fetch_timeout_s: float = 3.0,
        fetch_attempts: int = 2,
        retry_delay_s: float = 1.0,
        window_margin_s: float = 2.0,
        rerun_poll_s: float = 0.5,
        scheduler_url: str | None = None,
        reveal_retry_s: float = 1.0,
        name: str = "mediator",
    ) -> None:
        self.name = name
        self.log_path = work_dir / f"{name}.log"
        self.state_path = work_dir / f"{name}.db"
        self._log_start = 0
        self._env = dict(os.environ)
        self._env[KEY_ENV] = key_hex
        self._argv = [
            sys.executable,
            "-m",
            "mediator",
            "run",
            "--rpc-url",
            rpc_url,
            "--deployment",
            str(deployment_file),
            "--ipfs-api",
            ipfs_api,
            "--state",
            str(self.state_path),
            "--work-dir",
            str(work_dir / f"{name}-work"),
            "--poll-interval",
            str(poll_interval_s),
            "--fetch-timeout",
            str(fetch_timeout_s),
            # the devnet's challenge window is seconds long (devstack.grid.DEVNET_ESCROW): an
            # output still missing after two 3 s checks a second apart is ruled wrong, at least
            # 2 s before the window closes
            "--fetch-attempts",
            str(fetch_attempts),
            "--retry-delay",
            str(retry_delay_s),
            "--window-margin",
            str(window_margin_s),
            # a re-run on the devnet takes seconds; its result is looked for twice a second
            "--rerun-poll",
            str(rerun_poll_s),
            # a settled spot job's seed is revealed to the grid's scheduler (retried each second
            # while it is down or has not folded the settlement yet)
            "--reveal-retry",
            str(reveal_retry_s),
            *(["--scheduler-url", scheduler_url] if scheduler_url else []),
        ]

    def _ready(self) -> bool:
        """Up once it logged the block it follows from (its state file is open); the log is
        appended to across starts, so only what this start wrote counts."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_start)
                return b"mediator 0x" in f.read()
        except OSError:
            return False

    def start(self, timeout: float = 30.0) -> Self:
        if self._proc is None:
            self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
            proc = ManagedProcess(self.name, self._argv, self.log_path, env=self._env, cwd=ROOT)
            self._launch(proc, self._ready, timeout)
        return self
