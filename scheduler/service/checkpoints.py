"""The checkpoint keeper: the newest checkpoint of each job copied to the scheduler's own IPFS
node, so that the next attempt can resume from it after the node that made it (and that
node's IPFS daemon) is gone; docs/scheduler.md, "Checkpoints".

It runs with the verifier (the *verify* duty: one replica does it, the one whose IPFS node
fetches outputs). Each pass takes, per job, only its newest report not yet kept (older ones are
superseded and given up: they would be unpinned at once), and copies it in a small pool of
workers: :meth:`gridmarket.ipfs.IpfsStore.fetch` within the job's ``max_bytes`` and
:attr:`CheckpointSettings.checkpoint_keep_timeout_s` (it checks the bytes against the CID), then
:meth:`~gridmarket.ipfs.IpfsStore.add_dir` on the scheduler's node, which must build the same
CID and pins it. A checkpoint that is too large, not a directory or does not hash to its CID is
given up at once; one the node cannot reach is tried again, backing off, up to
:data:`MAX_TRIES` times (the tries are counted in memory: a restarted keeper starts again).
Then ``keep_error`` says why. One bad checkpoint holds up no other: each has its own worker
and time limit.

Pins the scheduler no longer needs are dropped: the job's older kept checkpoints once a newer
one is kept, and all of a job's once it has been settled (released, refunded, failed, invalid,
expired) for :attr:`CheckpointSettings.checkpoint_retention_s` (7 days by default: the
submitter may still fetch the last state of a job that did not finish). A CID another kept
checkpoint still holds (the same bytes) stays pinned.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gridmarket.ipfs import ContentTooLargeError, ContentVerificationError, IpfsStore
from scheduler.settings import Settings
from scheduler.store import NotFoundError, Store

from .loops import ThreadClients, line

__all__ = ["MAX_TRIES", "CheckpointKeeper", "CheckpointSettings"]

log = logging.getLogger(__name__)

MAX_TRIES = 4
"""Tries of a checkpoint the scheduler's node cannot fetch (5, 10, 20 s apart) before it is
given up."""
BACKOFF_S = 5.0
RELEASE_EVERY_S = 30.0


class CheckpointSettings(BaseSettings):
    """The keeper's settings (env prefix ``GRIDMARKET_SCHEDULER_``, like :class:`Settings`)."""

    model_config = SettingsConfigDict(env_prefix="GRIDMARKET_SCHEDULER_", extra="ignore")

    checkpoint_retention_s: float = Field(
        7 * 86400.0,
        ge=0,
        description="how long a settled job's checkpoints stay pinned on the scheduler's IPFS "
        "node (released, refunded, failed, invalid, expired: counted from when it got there)",
    )
    checkpoint_keep_timeout_s: float = Field(
        600.0, gt=0, description="the longest one checkpoint's fetch may take"
    )
    checkpoint_keep_workers: int = Field(4, ge=1, le=64, description="checkpoints fetched at once")


class CheckpointKeeper:
    """One pass at a time (:meth:`once`, run by :func:`scheduler.service.loops.run_loop`)."""

    max_tries = MAX_TRIES
    backoff_s = BACKOFF_S

    def __init__(
        self,
        store: Store,
        ipfs: IpfsStore,
        settings: Settings,
        count: Callable[[str], None] = lambda _name: None,
        wake: Callable[[], None] = lambda: None,
        options: CheckpointSettings | None = None,
    ) -> None:
        self.store = store
        self.ipfs = ipfs
        self.options = options or CheckpointSettings()
        self.work_dir = Path(settings.work_dir) / "checkpoints"
        self.count = count
        self.wake = wake
        self.workers = self.options.checkpoint_keep_workers
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="keep")
        self._clients = ThreadClients(ipfs)
        self._lock = threading.Lock()
        self._in_flight: set[int] = set()
        self._tries: dict[int, tuple[int, float]] = {}  # row id -> (misses, next try)
        self._released_at = 0.0
        self._release_lock = threading.Lock()

    def once(self) -> int:
        """Hand the newest unkept checkpoints to the pool, and every
        :data:`RELEASE_EVERY_S` unpin what is no longer needed; the rows decided."""
        did = 0
        now = time.monotonic()
        if now - self._released_at >= RELEASE_EVERY_S:
            self._released_at = now
            did += self.release()
        with self._lock:
            busy = set(self._in_flight)
            waiting = {i for i, (_, at) in self._tries.items() if at > now}
        free = self.workers - len(busy)
        if free <= 0:
            return did
        for row in self.store.checkpoints_to_keep(free, skip=busy | waiting):
            with self._lock:
                self._in_flight.add(row["id"])
            self._pool.submit(self._work, row)
        return did  # fetches wait on IPFS: a finished one wakes the next pass

    def idle(self) -> bool:
        with self._lock:
            return not self._in_flight

    def close(self) -> None:
        """Stop the pool without waiting for fetches in flight (a large checkpoint may take
        minutes; its row stays pending and the next keeper fetches it again)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._clients.close()

    # ------------------------------------------------------------------ keep

    def _work(self, row: dict[str, Any]) -> None:
        row_id, cid = row["id"], row["cid"]
        try:
            why = self._keep(row)
            if why is None:
                self.store.checkpoint_kept(row_id)
                with self._lock:
                    self._tries.pop(row_id, None)
                self.count("checkpoints_kept")
                log.info("kept checkpoint %s of job %s", cid, row["job_id"])
                self.release()
            elif why:
                self.store.checkpoint_not_kept(row_id, why)
                with self._lock:
                    self._tries.pop(row_id, None)
                self.count("checkpoints_not_kept")
                log.warning("checkpoint %s of job %s not kept: %s", cid, row["job_id"], why)
        except Exception:  # the store is down: the row stays pending, a later pass tries again
            log.exception("keeping checkpoint %s of job %s failed", cid, row["job_id"])
        finally:
            with self._lock:
                self._in_flight.discard(row_id)
            self.wake()

    def _keep(self, row: dict[str, Any]) -> str | None:
        """None when ``row``'s checkpoint is now pinned here, else why not ('' when it is
        tried again later)."""
        try:
            job = self.store.job(row["job_id"])
        except NotFoundError:
            return "its job is not known here"
        policy = job.spec.checkpoint if job.spec is not None else None
        if policy is None:
            return "its job has no checkpoint policy"
        if row["size"] > policy.max_bytes:
            return f"{row['size']} bytes is over the job's max_bytes ({policy.max_bytes})"
        tmp = self.work_dir / f"{row['id']}-{secrets.token_hex(4)}"
        client = self._clients.get()
        try:
            try:
                got = client.fetch(
                    row["cid"],
                    tmp,
                    max_bytes=policy.max_bytes,
                    timeout_s=self.options.checkpoint_keep_timeout_s,
                )
            except (ContentTooLargeError, ContentVerificationError) as exc:
                return f"{line(exc)}"
            except Exception as exc:  # unreachable, timed out, the daemon failed: try again
                return self._missed(row["id"], f"{line(exc)}")
            if got != tmp:
                return "it is a single file, not a directory"
            try:
                root = client.add_dir(tmp)
            except Exception as exc:
                return self._missed(row["id"], f"adding it to the scheduler's node: {line(exc)}")
            if root != row["cid"]:
                return f"the scheduler's node built {root} from its bytes, not {row['cid']}"
            return None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _missed(self, row_id: int, why: str) -> str:
        """Count a failed try of ``row_id``: '' when it is tried again later, else ``why``."""
        with self._lock:
            misses, _ = self._tries.get(row_id, (0, 0.0))
            misses += 1
            if misses >= self.max_tries:
                self._tries.pop(row_id, None)
                return f"{why} (gave up after {misses} tries)"
            self._tries[row_id] = (misses, time.monotonic() + self.backoff_s * 2 ** (misses - 1))
            if len(self._tries) > 100_000:  # bounded: the oldest entries go
                for key in list(self._tries)[:1000]:
                    del self._tries[key]
        self.count("checkpoint_keep_retried")
        return ""

    # ------------------------------------------------------------------ release

    def release(self) -> int:
        """Unpin the kept checkpoints no longer needed (superseded, or of a job settled longer
        ago than the retention); the rows released."""
        cutoff = time.time() - self.options.checkpoint_retention_s
        done = 0
        with self._release_lock:  # one at a time: each asks whether another row holds its CID
            client = self._clients.get()
            for row_id, cid in self.store.checkpoints_to_release(cutoff):
                try:
                    if not self.store.cid_pinned_by_others(cid, [row_id]):
                        client.unpin(cid)
                except Exception as exc:  # the daemon failed: the next release tries again
                    log.warning("unpinning checkpoint %s failed: %s", cid, line(exc))
                    continue
                self.store.checkpoints_unpinned([row_id])
                done += 1
        if done:
            self.count("checkpoints_unpinned")
        return done
