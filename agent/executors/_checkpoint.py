"""A checkpointing job's ``/checkpoint`` inside the Docker executor: the capped area, its seed
(the checkpoint the attempt resumes from) and the ticker that copies it while the job runs.

The area is an :class:`~agent.executors._output.OutputArea` (the same caps and modes as
``/output``: a loop-mounted file system of its own as root, else a watched directory), never
copied out at the end: :class:`~agent.executors.base.CheckpointMount`'s ``take`` reads the live
directory (:mod:`agent.checkpointing`), every ``interval_s`` on the ticker thread and once more,
``final``, when the run has ended (any outcome).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path
from types import TracebackType

from agent.executors._output import OutputArea, OutputMode
from agent.executors.base import CheckpointMount

__all__ = ["CheckpointArea"]

log = logging.getLogger(__name__)


class CheckpointArea:
    """Context manager: the area's live path is :attr:`path` (mount it at /checkpoint)."""

    def __init__(
        self,
        mount: CheckpointMount,
        work_dir: Path,
        *,
        mode: OutputMode,
        owner: tuple[int, int],
    ) -> None:
        self.mount = mount
        self.area = OutputArea(work_dir, mount.max_bytes, mount.max_files, mode=mode, owner=owner)
        self.owner = owner
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    @property
    def path(self) -> Path:
        return self.area.mount_source

    @property
    def watched(self) -> bool:
        return self.area.mode is OutputMode.WATCH

    def __enter__(self) -> CheckpointArea:
        self.area.__enter__()
        try:
            if self.mount.seed is not None:
                self._seed(self.mount.seed)
        except BaseException:
            self.area.__exit__(None, None, None)
            raise
        return self

    def _seed(self, seed: Path) -> None:
        """The resumed checkpoint's files, owned by the job's user (fetched and checked by the
        runner: regular files and directories only)."""
        shutil.copytree(seed, self.path, symlinks=False, dirs_exist_ok=True)
        if os.geteuid() == 0:
            for root, dirs, files in os.walk(self.path):
                for name in dirs + files:
                    os.chown(os.path.join(root, name), *self.owner, follow_symlinks=False)
        else:
            for root, dirs, _files in os.walk(self.path):
                for name in dirs:
                    os.chmod(os.path.join(root, name), 0o777)  # noqa: S103 - the job's user

    def start_ticker(self) -> None:
        """Copy the live directory every ``interval_s`` until :meth:`stop_ticker`."""

        def loop() -> None:
            while not self._stop.wait(self.mount.interval_s):
                try:
                    self.mount.take(self.path, False)
                except Exception as exc:  # take() logs its own; never stop the job for it
                    log.warning("checkpoint ticker: %s", exc)

        self._ticker = threading.Thread(target=loop, name="checkpoint-ticker", daemon=True)
        self._ticker.start()

    def stop_ticker(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None

    def take_final(self) -> None:
        """The last copy, after the job stopped (the ticker is stopped first)."""
        self.stop_ticker()
        try:
            self.mount.take(self.path, True)
        except Exception as exc:
            log.warning("final checkpoint: %s", exc)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_ticker()
        self.area.__exit__(exc_type, exc, tb)
