"""A scheduler replica as a child process (``python -m scheduler``): for the demo, the fleet
simulator, the benches and the end-to-end tests."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Self

import httpx

from ._process import ROOT, ManagedProcess, Service, ServiceError


class SchedulerProcess(Service):
    """``python -m scheduler`` on ``host``:``port`` (127.0.0.1 by default) with
    ``GRIDMARKET_SCHEDULER_*`` settings."""

    def __init__(
        self,
        work_dir: Path,
        port: int,
        settings: Mapping[str, str],
        *,
        name: str = "scheduler",
        log_level: str = "warning",
        host: str = "127.0.0.1",
    ) -> None:
        self.port = port
        self.host = host
        self.name = name
        self.log_path = work_dir / f"{name}.log"
        self._env = dict(os.environ)
        self._env.update({f"GRIDMARKET_SCHEDULER_{k.upper()}": str(v) for k, v in settings.items()})
        self._argv = [
            sys.executable,
            "-m",
            "scheduler",
            "--host",
            host,
            "--port",
            str(port),
            "--log-level",
            log_level,
        ]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _ready(self) -> bool:
        try:
            return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def start(self, timeout: float = 30.0) -> Self:
        if self._proc is None:
            proc = ManagedProcess(self.name, self._argv, self.log_path, env=self._env, cwd=ROOT)
            self._launch(proc, self._ready, timeout)
        return self

    def kill(self) -> None:
        """SIGKILL, no clean shutdown (the fault tests' crash)."""
        pid = self.pid
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError as exc:
                raise ServiceError(f"scheduler pid {pid} is gone") from exc
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.stop(1)
