"""The job's ``/output``: capped in bytes and files, checked, and only then handed back.

Two ways to hold the cap, chosen by :class:`OutputMode`:

``loop`` (the default as root): a fresh ext4 file system in a sparse file, loop-mounted
    ``nosuid,nodev`` and sized to the byte cap plus a little, with one inode per allowed file.
    The kernel enforces the cap: a job that fills it gets ``ENOSPC``. After the run the tree is
    checked and copied into ``output_dir``, and the file system is unmounted and deleted.
``watch`` (no root, or no loop devices): ``output_dir`` itself is mounted, a watchdog thread
    rescans it every 0.25 s and stops the job when it goes over (the Docker executor also sets
    ``RLIMIT_FSIZE`` so a single file cannot outgrow the cap between two scans). The cap can be
    overshot by what the job writes in one interval; the final check still rejects it.

Either way the result's ``output_dir`` holds only regular files and directories within the caps
(symlinks to host files, devices or FIFOs are refused: they must never reach the uploader), or
nothing at all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import TracebackType

from agent.errors import ExecutorError
from agent.executors.base import MiB, Reason

log = logging.getLogger(__name__)

MAX_DEPTH = 64
WATCH_INTERVAL_S = 0.25


class OutputMode(StrEnum):
    AUTO = "auto"  # loop when running as root with loop devices, else watch
    LOOP = "loop"
    WATCH = "watch"


@dataclass(frozen=True, slots=True)
class OutputCheck:
    bytes: int
    files: int
    problem: Reason | None = None
    message: str = ""


def scan(root: Path, max_bytes: int, max_files: int) -> OutputCheck:
    """Walk ``root`` without following links; stop at the first problem.

    Counts the apparent size of regular files (a sparse 1 TB file counts as 1 TB: that is what an
    upload would carry) and every file and directory.
    """
    total = files = 0
    stack: list[tuple[Path, int]] = [(root, 0)]
    while stack:
        directory, depth = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError as exc:
            return OutputCheck(
                total, files, Reason.OUTPUT_INVALID, f"cannot list {directory}: {exc}"
            )
        for entry in entries:
            files += 1
            rel = os.path.relpath(entry.path, root)
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                return OutputCheck(total, files, Reason.OUTPUT_INVALID, f"cannot stat {rel}: {exc}")
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 >= MAX_DEPTH:
                    return OutputCheck(
                        total,
                        files,
                        Reason.OUTPUT_INVALID,
                        f"{rel}: nested deeper than {MAX_DEPTH}",
                    )
                stack.append((Path(entry.path), depth + 1))
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
            else:
                kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
                return OutputCheck(
                    total,
                    files,
                    Reason.OUTPUT_INVALID,
                    f"/output/{rel} is {kind}: only regular files and directories are accepted",
                )
            if total > max_bytes:
                return OutputCheck(
                    total,
                    files,
                    Reason.OUTPUT_TOO_LARGE,
                    f"/output holds more than its cap of {max_bytes} bytes",
                )
            if files > max_files:
                return OutputCheck(
                    total,
                    files,
                    Reason.OUTPUT_TOO_LARGE,
                    f"/output holds more than its cap of {max_files} files and directories",
                )
    return OutputCheck(total, files)


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy a checked tree (regular files and directories only) with plain permissions."""
    dst.mkdir(mode=0o755, exist_ok=True)
    for entry in os.scandir(src):
        target = dst / entry.name
        if entry.is_dir(follow_symlinks=False):
            _copy_tree(Path(entry.path), target)
        elif entry.is_file(follow_symlinks=False):
            shutil.copyfile(entry.path, target, follow_symlinks=False)
            target.chmod(0o644)


def _clear(directory: Path) -> None:
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def _run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ExecutorError(f"`{' '.join(argv)}` failed: {result.stderr.strip() or result.stdout}")


def loop_supported() -> bool:
    """Root, mkfs.ext4, mount and a loop-control device: what the ``loop`` mode needs."""
    return (
        os.geteuid() == 0
        and shutil.which("mkfs.ext4") is not None
        and shutil.which("mount") is not None
        and os.path.exists("/dev/loop-control")
    )


class OutputArea:
    """The capped /output of one run. ``mount_source`` is what the executor mounts at /output.

    Use as a context manager; call :meth:`finish` after the job stopped to get the checked result.
    """

    def __init__(
        self,
        output_dir: Path,
        max_bytes: int,
        max_files: int,
        *,
        mode: OutputMode = OutputMode.AUTO,
        owner: tuple[int, int] | None = None,
    ) -> None:
        self.output_dir = output_dir.resolve()
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.owner = owner
        self._auto = mode is OutputMode.AUTO
        if mode is OutputMode.AUTO:
            mode = OutputMode.LOOP if loop_supported() else OutputMode.WATCH
        self.mode = mode
        self._fs_dir = self.output_dir.parent / f".{self.output_dir.name}.fs"
        self._mounted = False
        self._watchdog: threading.Thread | None = None
        self._stop_watch = threading.Event()
        self.exceeded: OutputCheck | None = None  # set by the watchdog

    @property
    def mount_source(self) -> Path:
        return self._fs_dir / "mnt" if self.mode is OutputMode.LOOP else self.output_dir

    # ------------------------------------------------------------------ set-up

    def __enter__(self) -> OutputArea:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if any(self.output_dir.iterdir()):
            raise ExecutorError(f"output dir {self.output_dir} is not empty")
        if self.mode is OutputMode.LOOP:
            try:
                self._make_loop_fs()
            except Exception as exc:
                self._teardown()
                if not self._auto:
                    raise
                log.warning("no loop-mounted /output (%s): falling back to the watchdog", exc)
                self.mode = OutputMode.WATCH
        target = self.mount_source
        if self.owner is not None and os.geteuid() == 0:
            os.chown(target, *self.owner)
            target.chmod(0o755)
        elif self.owner is not None:
            target.chmod(0o777)  # not root: let the job's user write
        return self

    def _make_loop_fs(self) -> None:
        self._fs_dir.mkdir(mode=0o700, exist_ok=True)
        image, mnt = self._fs_dir / "fs.img", self._fs_dir / "mnt"
        mnt.mkdir(exist_ok=True)
        inodes = self.max_files + 16  # root, lost+found and the reserved ones
        size = self.max_bytes + self.max_bytes // 32 + inodes * 256 + 8 * MiB
        with image.open("wb") as f:
            f.truncate(size)  # sparse: disk is used only as the job writes
        _run(
            "mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-m", "0", "-N", str(inodes),
            "-E", "nodiscard,lazy_itable_init=1", "-L", "gm-output", str(image),
        )  # fmt: skip
        _run("mount", "-o", "loop,nosuid,nodev", str(image), str(mnt))
        self._mounted = True
        (mnt / "lost+found").rmdir()  # mkfs's; the job must see an empty /output

    # ------------------------------------------------------------------ watchdog

    def watch(self, on_exceeded: Callable[[], None]) -> None:
        """In ``watch`` mode, poll the tree and call ``on_exceeded`` once when over a cap."""
        if self.mode is not OutputMode.WATCH:
            return

        def loop() -> None:
            while not self._stop_watch.wait(WATCH_INTERVAL_S):
                check = scan(self.output_dir, self.max_bytes, self.max_files)
                if check.problem is Reason.OUTPUT_TOO_LARGE:
                    self.exceeded = check
                    log.info("output over its cap (%s): stopping the job", check.message)
                    on_exceeded()
                    return

        self._watchdog = threading.Thread(target=loop, name="output-watchdog", daemon=True)
        self._watchdog.start()

    def stop_watching(self) -> None:
        """Stop the watchdog (the job has stopped); :meth:`finish` also does it."""
        self._stop_watchdog()

    def _stop_watchdog(self) -> None:
        self._stop_watch.set()
        if self._watchdog is not None:
            self._watchdog.join()
            self._watchdog = None

    # ------------------------------------------------------------------ result

    def finish(self) -> OutputCheck:
        """Check the output; keep it in ``output_dir`` when it passes, else leave that empty."""
        self._stop_watchdog()
        check = scan(self.mount_source, self.max_bytes, self.max_files)
        if check.problem is None and self.exceeded is not None:
            check = self.exceeded  # over the cap while running: the job was stopped for it
        if self.mode is OutputMode.LOOP:
            if check.problem is None:
                _copy_tree(self.mount_source, self.output_dir)
            self._teardown()
        elif check.problem is not None:
            _clear(self.output_dir)
        return check

    def _teardown(self) -> None:
        if self._mounted:
            mnt = self._fs_dir / "mnt"
            result = subprocess.run(["umount", str(mnt)], capture_output=True, check=False)
            if result.returncode != 0:
                log.warning("umount %s failed (%s): lazy unmount", mnt, result.stderr.strip())
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)
            self._mounted = False
        shutil.rmtree(self._fs_dir, ignore_errors=True)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop_watchdog()
        self._teardown()
