"""A child process with a log file, a readiness probe and a clean stop (:class:`ManagedProcess`),
and the base of every service manager of the dev stack (:class:`Service`)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
"""The repository root (node_modules/, tools/, .cache/ live there)."""


class ServiceError(RuntimeError):
    """A local service could not be started or stopped; the message names its log file."""


def log_tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file, for error messages."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


class ManagedProcess:
    """One long-running child in its own session (process group), logging to a file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(self.argv)}\n".encode())
            out.flush()
            try:
                self._proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    cwd=self.cwd,
                    start_new_session=True,  # its own process group: stop() reaches helpers too
                )
            except OSError as exc:
                raise ServiceError(f"cannot run {self.argv[0]} for {self.name}: {exc}") from exc
        log.info("%s started (pid %d), log %s", self.name, self._proc.pid, self.log_path)

    def wait_ready(self, probe: Callable[[], bool], timeout: float) -> float:
        """Poll ``probe`` until it returns True; return the seconds it took.

        Raises ServiceError, after stopping the process, when it exits or times out.
        """
        started = time.monotonic()
        deadline = started + timeout
        delay = 0.05
        while True:
            if self._proc is None or self._proc.poll() is not None:
                code = self._proc.returncode if self._proc else None
                raise ServiceError(
                    f"{self.name} exited with code {code} before it was ready; "
                    f"log {self.log_path}:\n{log_tail(self.log_path)}"
                )
            try:
                if probe():
                    return time.monotonic() - started
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise ServiceError(
                    f"{self.name} was not ready after {timeout:.0f} s; "
                    f"log {self.log_path}:\n{log_tail(self.log_path)}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the process group, then SIGKILL it if it is still there after ``timeout``."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0f s: SIGKILL", self.name, timeout)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        # Helpers left in the group (the leader exited first) get the same treatment.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        log.info("%s stopped (exit code %s)", self.name, proc.returncode)


class Service:
    """A local service run as one :class:`ManagedProcess`; a context manager (``start`` on
    entry, ``stop`` on exit). Subclasses build the process and its readiness probe in ``start``
    and hand them to :meth:`_launch`; a stopped service can be started again."""

    _proc: ManagedProcess | None = None

    @property
    def pid(self) -> int | None:
        """The process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.running()

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after ``stop_timeout``); a no-op when stopped."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.stop(self.stop_timeout)

    stop_timeout: float = 15.0

    def _launch(
        self,
        proc: ManagedProcess,
        probe: Callable[[], bool],
        timeout: float,
        started: Callable[[int], object] | None = None,
    ) -> None:
        """Start ``proc`` (``started`` gets its pid), wait until ``probe`` says it is ready; on
        failure :meth:`stop` (which also clears what the subclass set up) and re-raise."""
        self._proc = proc
        try:
            proc.start()
            if started is not None and proc.pid is not None:
                started(proc.pid)
            proc.wait_ready(probe, timeout)
        except ServiceError:
            self.stop()
            raise

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def clear_stale_pidfile(pidfile: Path, what: str) -> None:
    """Remove ``pidfile`` when the process it names is gone; ServiceError when it still runs
    (``what`` names it in the message: ``"a dockerd (pid 12) already uses ..."``)."""
    if not pidfile.exists():
        return
    try:
        pid = int(pidfile.read_text().strip() or 0)
    except ValueError:
        pid = 0
    if pid and pid_alive(pid):
        raise ServiceError(
            f"{what} (pid {pid}) already uses {pidfile}: stop it (kill {pid}) or use another "
            "work dir"
        )
    pidfile.unlink()


def pid_alive(pid: int) -> bool:
    """True when ``pid`` runs; a zombie (exited, never reaped by its new parent) is not alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        # /proc/<pid>/stat: "pid (comm) S ...": the state follows the last ')'
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")
