"""A scheduler replica as a child process (``python -m scheduler``): for the demo, the fleet
simulator, the benches and the end-to-end tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import httpx

from ._process import ROOT, ManagedProcess, ServiceError


class SchedulerProcess:
    """``python -m scheduler`` on 127.0.0.1:``port`` with ``GRIDMARKET_SCHEDULER_*`` settings."""

    def __init__(
        self,
        work_dir: Path,
        port: int,
        settings: Mapping[str, str],
        *,
        name: str = "scheduler",
        log_level: str = "warning",
    ) -> None:
        self.port = port
        env = dict(os.environ)
        env.update({f"GRIDMARKET_SCHEDULER_{k.upper()}": str(v) for k, v in settings.items()})
        self._proc = ManagedProcess(
            name,
            [
                sys.executable,
                "-m",
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                log_level,
            ],
            work_dir / f"{name}.log",
            env=env,
            cwd=ROOT,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self._proc.log_path

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def running(self) -> bool:
        return self._proc.running()

    def _ready(self) -> bool:
        try:
            return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def start(self, timeout: float = 30.0) -> SchedulerProcess:
        self._proc.start()
        self._proc.wait_ready(self._ready, timeout)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        self._proc.stop(timeout)

    def kill(self) -> None:
        """SIGKILL, no clean shutdown (the fault tests' crash)."""
        import signal

        pid = self._proc.pid
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError as exc:
                raise ServiceError(f"scheduler pid {pid} is gone") from exc
        self._proc.stop(1)

    def __enter__(self) -> SchedulerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
