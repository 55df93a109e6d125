"""A checkpointing job's ``/checkpoint`` on the agent's side: copy it while the job runs, add the
copy to the node's IPFS, sign it and report it; and fetch the checkpoint a resumed attempt starts
from (docs/agent.md, "Checkpoints"; the wire: :mod:`gridmarket.checkpoints`).

The executor mounts the directory and calls :meth:`Checkpointer.take` with its live path every
``interval_s`` from a ticker thread, and once more (``final``) when the run ended, whatever the
outcome (a run stopped early gets SIGTERM first, then the grace, then SIGKILL). Each take:

1. skips when nothing changed since the last copy (same names, sizes and modification times) or
   the directory is empty;
2. copies the tree into a staging directory: regular files and directories only (links, devices
   and names ending in ``.tmp`` are left out), at most the policy's ``max_bytes`` and
   :data:`MAX_FILES` entries: the job may be writing while we copy, so a job writes each file
   under a temporary name and renames it (a rename is atomic: the copy sees the old file or the
   new one) and ``progress.json`` last;
3. reads ``progress.json`` from the copy (bounded, forgiving: :func:`parse_progress`);
4. adds the copy to IPFS, signs ``Checkpoint(jobId, attempt, seq, cid, size)`` and hands the
   report to ``post`` (the daemon posts it to the scheduler); the checkpoint before the
   previous one is unpinned, so a long job keeps at most two on the provider's disk.

A take never raises: a checkpoint that cannot be made is logged and the job runs on. The
checkpoint itself is the job's data, hostile to the node that resumes it: it is fetched by CID
(checked), within ``max_bytes``, into the job's sandboxed mount, like any dataset.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agent.errors import DatasetTooLargeError, DatasetVerificationError, StorageError
from agent.executors.base import CheckpointMount
from agent.storage.base import Storage
from gridmarket.checkpoints import (
    PROGRESS_FILE,
    CheckpointRef,
    CheckpointReport,
    Progress,
    parse_progress,
    sign_checkpoint,
)
from gridmarket.ethsig import Signer
from gridmarket.wire import Assignment

__all__ = [
    "MAX_FILES",
    "CheckpointError",
    "CheckpointTooLargeError",
    "Checkpointer",
    "copy_tree",
    "fetch_resume",
    "prepare_mount",
]

log = logging.getLogger(__name__)

MAX_FILES = 10_000
"""Files and directories in one checkpoint."""
SKIPPED_SUFFIX = ".tmp"
"""Names ending so are a job's half-written files: not copied."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (too large, not a directory)."""


class CheckpointTooLargeError(CheckpointError):
    """The directory holds more than the policy allows."""


def copy_tree(src: Path, dest: Path, max_bytes: int, max_files: int = MAX_FILES) -> tuple[int, int]:
    """Copy ``src`` into the empty or absent ``dest``: regular files and directories only (links,
    devices, sockets and ``*.tmp`` left out; a file that vanishes meanwhile is skipped). Returns
    (bytes, entries); :class:`CheckpointTooLargeError` past the caps (``dest`` is then partial:
    the caller removes it)."""
    dest.mkdir(parents=True, exist_ok=True)
    total = entries = 0
    for root, dirs, files in os.walk(src, followlinks=False):
        rel = Path(root).relative_to(src)
        keep_dirs = []
        for name in sorted(dirs):
            path = Path(root) / name
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISDIR(path.lstat().st_mode):
                    keep_dirs.append(name)
                    (dest / rel / name).mkdir(exist_ok=True)
                    entries += 1
        dirs[:] = keep_dirs
        for name in sorted(files):
            if name.endswith(SKIPPED_SUFFIX):
                continue
            path = Path(root) / name
            try:
                info = path.lstat()
                if not stat.S_ISREG(info.st_mode):
                    continue
                entries += 1
                if entries > max_files:
                    raise CheckpointTooLargeError(
                        f"the checkpoint holds more than {max_files} files and directories"
                    )
                total += _copy_file(path, dest / rel / name, max_bytes - total)
            except FileNotFoundError:
                continue
    return total, entries


def _copy_file(src: Path, dest: Path, budget: int) -> int:
    copied = 0
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as reader, dest.open("wb") as writer:
        while chunk := reader.read(1024 * 1024):
            copied += len(chunk)
            if copied > budget:
                raise CheckpointTooLargeError("the checkpoint holds more than its cap of bytes")
            writer.write(chunk)
    return copied


def _fingerprint(path: Path) -> tuple[tuple[str, int, int], ...]:
    """Names, sizes and modification times: what tells a changed directory (cheap)."""
    seen: list[tuple[str, int, int]] = []
    for root, dirs, files in os.walk(path, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(SKIPPED_SUFFIX):
                continue
            with contextlib.suppress(FileNotFoundError):
                info = (Path(root) / name).lstat()
                seen.append((f"{root}/{name}", info.st_size, info.st_mtime_ns))
        if len(seen) > MAX_FILES:
            break
    return tuple(seen)


class Checkpointer:
    """Takes one attempt's checkpoints (thread-safe: the ticker and the final take)."""

    def __init__(
        self,
        assignment: Assignment,
        account: Signer,
        storage: Storage,
        post: Callable[[CheckpointReport], None],
        staging: Path,
        *,
        note: Callable[[str], None] | None = None,
    ) -> None:
        """``post`` sends a report (it may raise: logged); ``staging`` is a directory of the
        job's own where copies are made; ``note`` shows a line in the job's live log."""
        policy = assignment.spec.checkpoint
        if policy is None:
            raise ValueError("the job has no checkpoint policy")
        self.assignment = assignment
        self.max_bytes = policy.max_bytes
        self.account = account
        self.storage = storage
        self.post = post
        self.staging = staging
        self.note = note or (lambda _line: None)
        self.seq = 0
        self.taken: list[str] = []  # CIDs of this attempt, oldest first (the last two pinned)
        self.last_progress: Progress | None = None
        self._last: tuple[tuple[str, int, int], ...] | None = None
        self._lock = threading.Lock()

    def take(self, live: Path, final: bool = False) -> CheckpointReport | None:
        """Copy, add, sign and post the checkpoint in ``live`` if it changed; the report, or
        None when there was nothing new or it failed (logged; never raises)."""
        with self._lock:
            try:
                return self._take(live, final)
            except Exception as exc:  # the job runs on; the next interval tries again
                log.warning("job %s: checkpoint failed: %s", self.assignment.job_id[:10], exc)
                self.note(f"[checkpoint not taken: {_line(exc)}]\n")
                return None

    def _take(self, live: Path, final: bool) -> CheckpointReport | None:
        fingerprint = _fingerprint(live)
        if not fingerprint or fingerprint == self._last:
            return None
        copy = self.staging / f"copy-{self.seq + 1}"
        shutil.rmtree(copy, ignore_errors=True)
        try:
            size, files = copy_tree(live, copy, self.max_bytes)
            progress = self._progress(copy)
            cid = self.storage.add_dir(copy)
        finally:
            shutil.rmtree(copy, ignore_errors=True)
        self._last = fingerprint
        self.seq += 1
        a = self.assignment
        signature = sign_checkpoint(
            self.account, a.chain_id, a.escrow, bytes.fromhex(a.job_id[2:]), a.attempt,
            self.seq, cid, size,
        )  # fmt: skip
        report = CheckpointReport(
            attempt=a.attempt,
            seq=self.seq,
            cid=cid,
            size=size,
            files=files,
            progress=progress,
            final=final,
            taken_at=time.time(),
            signature="0x" + signature.hex(),
        )
        self.last_progress = progress or self.last_progress
        self.taken.append(cid)
        step = f", step {progress.step}" if progress is not None else ""
        log.info("job %s: checkpoint %d %s (%d bytes%s)", a.job_id[:10], self.seq, cid, size, step)
        try:
            self.post(report)
        except Exception as exc:  # the scheduler is away: the next checkpoint supersedes it
            log.warning("job %s: checkpoint %d not reported: %s", a.job_id[:10], self.seq, exc)
        self._unpin_old()
        return report

    def _progress(self, copy: Path) -> Progress | None:
        path = copy / PROGRESS_FILE
        if not path.is_file():
            return None
        with path.open("rb") as f:
            data = f.read(4097)
        progress, problem = parse_progress(data)
        if problem is not None:
            self.note(f"[progress ignored: {problem}]\n")
        return progress

    def _unpin_old(self) -> None:
        unpin = getattr(self.storage, "unpin", None)
        while len(self.taken) > 2 and unpin is not None:
            old = self.taken.pop(0)
            if old in self.taken:
                continue
            try:
                unpin(old)
            except Exception as exc:  # a pin left behind costs disk, not correctness
                log.debug("unpin %s failed: %s", old, exc)


def fetch_resume(storage: Storage, ref: CheckpointRef, dest: Path, max_bytes: int) -> int:
    """Fetch the checkpoint ``ref`` into ``dest`` (created; checked against its CID, at most
    ``min(ref.size, max_bytes)`` bytes); returns its size. Raises the storage's errors."""
    cap = min(max_bytes, ref.size) if ref.size else max_bytes
    dest.mkdir(parents=True, exist_ok=True)
    try:
        got = storage.fetch(ref.cid, dest, max(cap, 1))
    except DatasetTooLargeError:
        raise CheckpointTooLargeError(
            f"checkpoint {ref.cid} holds more than the {cap} bytes it should"
        ) from None
    if got.resolve() != dest.resolve():  # a single file: checkpoints are directories
        shutil.rmtree(dest, ignore_errors=True)
        raise CheckpointError(f"checkpoint {ref.cid} is a file, not a directory")
    return sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())


def prepare_mount(
    assignment: Assignment,
    account: Signer,
    storage: Storage,
    job_dir: Path,
    *,
    fetch: Callable[[Callable[[], int]], int],
    post: Callable[[CheckpointReport], None] | None = None,
    note: Callable[[str], None] | None = None,
) -> CheckpointMount:
    """The executor's :class:`CheckpointMount` for a checkpointing job: seeded with the
    checkpoint the assignment resumes from (``fetch`` runs :func:`fetch_resume` with the
    runner's patience for IPFS), copied by a :class:`Checkpointer` that ``post`` s each report.
    A checkpoint that cannot be had (gone, too large, not a directory) is said in the job's log
    (``note``) and the job starts from the beginning: a lost checkpoint costs the work since
    the start, never the job."""
    policy = assignment.spec.checkpoint
    if policy is None:
        raise ValueError("the job has no checkpoint policy")
    say = note or (lambda _line: None)
    seed: Path | None = None
    ref = assignment.resume
    if ref is not None and assignment.spec.comparable:
        # a comparable job's result may be re-run from scratch by the mediator (a dispute, a
        # spot check): resumed from a checkpoint someone else made, an honest run could differ
        # from that re-run and be slashed for the other node's checkpoint
        say(f"[not resuming from checkpoint {ref.cid}: this job's result can be re-run from "
            "the beginning by the mediator, so it starts from the beginning]")  # fmt: skip
        ref = None
    if ref is not None:
        dest = job_dir / "resume"
        try:
            fetch(lambda: fetch_resume(storage, ref, dest, policy.max_bytes))
            seed = dest
        except (StorageError, DatasetVerificationError, CheckpointError) as exc:
            log.warning("job %s: checkpoint: %s", assignment.job_id[:10], exc)
            say(f"[checkpoint {ref.cid} could not be fetched ({_line(exc)}): "
                "starting from the beginning]")  # fmt: skip
        if seed is not None:
            step = f", step {ref.progress.step}" if ref.progress is not None else ""
            say(f"[resuming from checkpoint {ref.cid} (attempt {ref.attempt}{step})]")
    staging = job_dir / "checkpoint-staging"
    staging.mkdir(mode=0o700, parents=True, exist_ok=True)
    checkpointer = Checkpointer(
        assignment, account, storage, post or (lambda _report: None), staging, note=say
    )
    return CheckpointMount(
        max_bytes=policy.max_bytes,
        interval_s=float(policy.interval_s),
        take=checkpointer.take,
        seed=seed,
    )


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
