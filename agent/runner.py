"""One assignment, start to finish: :class:`JobRunner` turns an :class:`Assignment` into a signed
:class:`ResultReport`.

Steps, each in the job's own work directory (``<work_dir>/jobs/<job>-<attempt>``, always removed
afterwards):

1. fetch the dataset by CID into ``input/`` (verified, capped by the job's ``dataset_max_bytes``
   and this node's ``max_dataset_bytes``); for a WASM job also the module (``module_cid``, a
   single ``.wasm`` file);
2. run it with the executor the spec names, inside the job's limits (memory, CPUs, pids,
   timeout, output cap, GPUs);
3. on success add ``output/`` to IPFS (CIDv1, raw leaves) and sign ``Result(jobId, attempt,
   outputCid)`` with the node's key (EIP-712, what ``JobEscrow.submitResultFor`` checks).

Every outcome is a report; :meth:`JobRunner.run` does not raise. Failures that are not the job's
own map to ``dataset_error`` (the dataset cannot be had or fails its CID), ``workload_error``
(image missing, module invalid, GPU unavailable) and ``agent_error`` (this node failed: the
engine or the IPFS daemon down). While the local IPFS daemon is down the runner waits for it
(fetch: up to ``storage_wait_s``; upload: until the job's deadline) instead of failing the job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from agent.checkpointing import prepare_mount
from agent.client import Backoff
from agent.errors import (
    AgentError,
    DatasetTooLargeError,
    DatasetVerificationError,
    ExecutorError,
    GpuUnavailableError,
    ImageNotFoundError,
    InvalidSpecError,
    StorageError,
    WorkloadError,
)
from agent.executors.base import (
    CheckpointMount,
    ExecutionResult,
    ExecutionSpec,
    Executor,
    Limits,
    MiB,
)
from agent.storage.base import Storage
from agent.storage.probe import IpfsProbe
from gridmarket.checkpoints import CheckpointReport
from gridmarket.eip712 import sign_result
from gridmarket.ethsig import Signer
from gridmarket.wire import (
    MAX_LOG_CHARS,
    Assignment,
    ExecutorKind,
    JobSpec,
    ResultReport,
    RunReason,
)

__all__ = [
    "IpfsProbe",
    "JobRunner",
    "JobStepError",
    "LogSteps",
    "StepReporter",
    "decode_tail",
    "limits_for",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_MESSAGE = 2000  # ResultReport.message


class StepReporter(Protocol):
    """Shows the long steps of a job (dataset download, run, upload) to a person or a log."""

    def step(self, job_id: str, what: str) -> AbstractContextManager[None]: ...


class LogSteps:
    """A :class:`StepReporter` that logs each step's start and its duration."""

    @contextlib.contextmanager
    def step(self, job_id: str, what: str) -> Iterator[None]:
        started = time.monotonic()
        log.info("job %s: %s", _short(job_id), what)
        yield
        log.info("job %s: %s done in %.1f s", _short(job_id), what, time.monotonic() - started)


@dataclass
class JobStepError(Exception):
    """A step failed in a way the report must name (raised and caught inside the runner)."""

    reason: RunReason
    message: str

    def __str__(self) -> str:
        return self.message


def limits_for(spec: JobSpec) -> Limits:
    """The sandbox limits a job's spec asks for (RAM MiB -> bytes, cores -> CPU share ...)."""
    return Limits(
        memory_bytes=spec.resources.ram_mib * MiB,
        cpus=float(spec.resources.cpu_cores),
        pids=spec.limits.pids,
        timeout_s=float(spec.limits.timeout_s),
        output_bytes=spec.limits.output_max_bytes,
        gpus=spec.resources.gpu_count,
        log_bytes=MAX_LOG_CHARS,  # bytes >= characters once decoded: a tail always fits the wire
    )


def decode_tail(data: bytes, limit: int = MAX_LOG_CHARS) -> str:
    """Log bytes as text for people: UTF-8 with replacement characters, the last ``limit``."""
    text = data.decode("utf-8", errors="replace")
    return text[-limit:] if len(text) > limit else text


StorageFactory = Callable[[], AbstractContextManager[Storage]]
ExecutorFactory = Callable[[], Executor]


class JobRunner:
    """Runs assignments for one node (thread-safe: the daemon runs several at once)."""

    def __init__(
        self,
        account: Signer,
        *,
        storage: StorageFactory,
        executors: Mapping[ExecutorKind, ExecutorFactory],
        work_dir: Path,
        max_dataset_bytes: int | None = None,
        max_module_bytes: int = 256 * MiB,
        storage_alive: Callable[[], bool] | None = None,
        storage_wait_s: float = 60.0,
        steps: StepReporter | None = None,
        backoff: Callable[[], Backoff] = Backoff,
        remove_leftovers: Callable[[], int] | None = None,
    ) -> None:
        """``storage`` opens the content store for one job; ``executors`` build an executor per
        kind on first use (so a WASM-only node never imports the docker SDK). ``storage_alive``
        says whether the store's daemon answers at all: it tells "IPFS is down" (wait, then
        ``agent_error``) from "this dataset cannot be had" (``dataset_error``).
        ``remove_leftovers`` removes what a crashed run left in an executor's engine (the Docker
        executor's containers) and says how many; :meth:`clean_leftovers` calls it."""
        self.account = account
        self._storage = storage
        self._factories = dict(executors)
        self._executors: dict[ExecutorKind, Executor] = {}
        self._lock = threading.Lock()
        self.jobs_dir = work_dir / "jobs"
        self.max_dataset_bytes = max_dataset_bytes
        self.max_module_bytes = max_module_bytes
        self._alive = storage_alive or (lambda: True)
        self.storage_wait_s = storage_wait_s
        self.steps: StepReporter = steps or LogSteps()
        self._backoff = backoff
        self._remove_leftovers = remove_leftovers

    @property
    def kinds(self) -> frozenset[ExecutorKind]:
        """The executors this runner can use."""
        return frozenset(self._factories)

    # ------------------------------------------------------------------ public

    def clean_leftovers(self) -> int:
        """At start: remove what a crashed run left, its executors' leftovers (containers:
        ``remove_leftovers``) and then its job directories (unmounting a stale ``/output``);
        returns how many job directories."""
        if self._remove_leftovers is not None:
            containers = self._remove_leftovers()
            if containers:
                log.info("removed %d containers left by a previous run", containers)
        if not self.jobs_dir.is_dir():
            return 0
        removed = 0
        for entry in self.jobs_dir.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                _remove_job_dir(entry)
                removed += 1
        return removed

    def run(
        self,
        assignment: Assignment,
        cancel: threading.Event | None = None,
        *,
        on_output: Callable[[str, bytes], None] | None = None,
        on_checkpoint: Callable[[CheckpointReport], None] | None = None,
        on_note: Callable[[str], None] | None = None,
    ) -> ResultReport:
        """Run ``assignment`` to a report; setting ``cancel`` stops it (``cancelled``).
        ``on_output`` gets the job's stdout/stderr as it is written (live logs);
        ``on_checkpoint`` each checkpoint a checkpointing job's run made (to report it);
        ``on_note`` the agent's own lines for the job's live log."""
        cancel = cancel or threading.Event()
        started = time.monotonic()
        job_dir = self.jobs_dir / f"{assignment.job_id[2:18]}-{assignment.attempt}"
        try:
            if job_dir.exists():
                _remove_job_dir(job_dir)
            job_dir.mkdir(parents=True, mode=0o755)
            hooks = _Hooks(on_output, on_checkpoint, on_note)
            return self._run(assignment, job_dir, cancel, started, hooks)
        except JobStepError as failure:
            log.info("job %s: %s (%s)", _short(assignment.job_id), failure.reason, failure)
            return _report(assignment, failure.reason, failure.message, started)
        except Exception as exc:  # a bug or an unforeseen host failure: report, keep serving
            log.exception("job %s: the agent failed", _short(assignment.job_id))
            return _report(
                assignment, RunReason.AGENT_ERROR, f"the agent failed: {_line(exc)}", started
            )
        finally:
            _remove_job_dir(job_dir)

    # ------------------------------------------------------------------ steps

    def _run(
        self,
        assignment: Assignment,
        job_dir: Path,
        cancel: threading.Event,
        started: float,
        hooks: _Hooks,
    ) -> ResultReport:
        spec = assignment.spec
        job_id = assignment.job_id
        executor = self._executor(spec.executor)
        with self._storage() as storage:
            input_dir: Path | None = None
            module: Path | None = None
            if spec.dataset_cid is not None:
                input_dir = job_dir / "input"
                with self.steps.step(job_id, f"downloading dataset {spec.dataset_cid}"):
                    self._fetch_dataset(storage, spec, input_dir, cancel)
            if spec.module_cid is not None:
                with self.steps.step(job_id, f"downloading module {spec.module_cid}"):
                    module = self._fetch_module(
                        storage, spec.module_cid, job_dir / "module", cancel
                    )
            checkpoint = self._checkpoint_mount(assignment, storage, job_dir, cancel, hooks)
            _check_cancel(cancel)
            exec_spec = ExecutionSpec(
                image=spec.image,
                module=module,
                command=tuple(spec.command),
                env=dict(spec.env),
                limits=limits_for(spec),
                on_output=hooks.output,
                checkpoint=checkpoint,
            )
            with self.steps.step(job_id, f"running ({spec.executor})"):
                result = self._execute(executor, exec_spec, input_dir, job_dir / "output", cancel)
            if not result.ok:
                return _from_result(assignment, result, None, None)
            deadline = _deadline_monotonic(assignment)
            with self.steps.step(job_id, f"uploading {result.output_bytes} bytes of output"):
                try:
                    cid = self._with_storage(
                        lambda: storage.add_dir(result.output_dir), "upload", deadline, cancel
                    )
                except StorageError as exc:
                    raise JobStepError(
                        RunReason.AGENT_ERROR, f"output upload failed: {_line(exc)}"
                    ) from exc
        signature = sign_result(
            self.account,
            assignment.chain_id,
            assignment.escrow,
            bytes.fromhex(job_id[2:]),
            assignment.attempt,
            cid,
        )
        log.info("job %s: succeeded, output %s", _short(job_id), cid)
        return _from_result(assignment, result, cid, "0x" + signature.hex())

    def _executor(self, kind: ExecutorKind) -> Executor:
        factory = self._factories.get(kind)
        if factory is None:
            raise JobStepError(RunReason.WORKLOAD_ERROR, f"this node does not run {kind} jobs")
        with self._lock:
            executor = self._executors.get(kind)
            if executor is None:
                try:
                    executor = factory()
                except Exception as exc:  # e.g. the Docker engine went away
                    raise JobStepError(
                        RunReason.AGENT_ERROR, f"the {kind} executor is unavailable: {_line(exc)}"
                    ) from exc
                self._executors[kind] = executor
        return executor

    def _checkpoint_mount(
        self,
        assignment: Assignment,
        storage: Storage,
        job_dir: Path,
        cancel: threading.Event,
        hooks: _Hooks,
    ) -> CheckpointMount | None:
        """A checkpointing job's /checkpoint (:func:`agent.checkpointing.prepare_mount`); the
        seed is fetched like a dataset (waiting out an IPFS outage up to ``storage_wait_s``)."""
        if assignment.spec.checkpoint is None:
            return None
        deadline = time.monotonic() + self.storage_wait_s

        def fetch(fn: Callable[[], int]) -> int:
            try:
                return self._with_storage(fn, "checkpoint", deadline, cancel)
            except JobStepError as exc:
                _check_cancel(cancel)
                raise StorageError(exc.message) from exc

        with self.steps.step(assignment.job_id, "preparing /checkpoint"):
            return prepare_mount(
                assignment,
                self.account,
                storage,
                job_dir,
                fetch=fetch,
                post=hooks.checkpoint,
                note=hooks.note,
            )

    def _fetch_dataset(
        self, storage: Storage, spec: JobSpec, dest: Path, cancel: threading.Event
    ) -> None:
        cid = spec.dataset_cid
        assert cid is not None
        cap = spec.limits.dataset_max_bytes
        if self.max_dataset_bytes is not None:
            cap = min(cap, self.max_dataset_bytes)
        deadline = time.monotonic() + self.storage_wait_s
        try:
            self._with_storage(
                lambda: storage.fetch(spec.dataset_cid or "", dest, cap),
                "dataset",
                deadline,
                cancel,
            )
        except (DatasetTooLargeError, DatasetVerificationError, StorageError) as exc:
            raise JobStepError(RunReason.DATASET_ERROR, _line(exc)) from exc
        dest.chmod(0o755)  # the job's non-root user must be able to list /input

    def _fetch_module(
        self, storage: Storage, cid: str, dest: Path, cancel: threading.Event
    ) -> Path:
        deadline = time.monotonic() + self.storage_wait_s
        try:
            path = self._with_storage(
                lambda: storage.fetch(cid, dest, self.max_module_bytes), "module", deadline, cancel
            )
        except StorageError as exc:  # too large, fails its CID, cannot be found
            raise JobStepError(RunReason.WORKLOAD_ERROR, f"WASM module: {_line(exc)}") from exc
        if not path.is_file():
            raise JobStepError(
                RunReason.WORKLOAD_ERROR,
                f"module_cid {cid} is a directory: it must name a single .wasm file",
            )
        return path

    def _with_storage(
        self, fn: Callable[[], T], what: str, deadline: float, cancel: threading.Event
    ) -> T:
        """Run a storage call; while the IPFS daemon itself is down, wait for it (backoff)
        until ``deadline``, then fail with ``agent_error``. Other storage errors propagate."""
        backoff = self._backoff()
        while True:
            _check_cancel(cancel)
            try:
                return fn()
            except (DatasetTooLargeError, DatasetVerificationError):
                raise
            except StorageError as exc:
                if self._alive():
                    raise
                delay = backoff.next_delay()
                if time.monotonic() + delay > deadline:
                    raise JobStepError(
                        RunReason.AGENT_ERROR, f"the IPFS daemon is down ({what}): {_line(exc)}"
                    ) from exc
                log.warning("IPFS daemon down during %s (%s); retrying in %.1f s", what, exc, delay)
                if cancel.wait(delay):
                    _check_cancel(cancel)

    def _execute(
        self,
        executor: Executor,
        spec: ExecutionSpec,
        input_dir: Path | None,
        output_dir: Path,
        cancel: threading.Event,
    ) -> ExecutionResult:
        try:
            return executor.run(spec, input_dir, output_dir, cancel=cancel)
        except (ImageNotFoundError, WorkloadError, GpuUnavailableError, InvalidSpecError) as exc:
            raise JobStepError(RunReason.WORKLOAD_ERROR, _line(exc)) from exc
        except (ExecutorError, AgentError) as exc:
            raise JobStepError(RunReason.AGENT_ERROR, _line(exc)) from exc


# --------------------------------------------------------------------------- helpers


@dataclass(frozen=True, slots=True)
class _Hooks:
    """Where a run's live output, checkpoints and the agent's notes go."""

    output: Callable[[str, bytes], None] | None = None
    checkpoint: Callable[[CheckpointReport], None] | None = None
    note: Callable[[str], None] | None = None


def _check_cancel(cancel: threading.Event) -> None:
    if cancel.is_set():
        raise JobStepError(RunReason.CANCELLED, "cancelled by the agent")


def _deadline_monotonic(assignment: Assignment) -> float:
    """The job's on-chain deadline on the monotonic clock (results after it are refused)."""
    return time.monotonic() + max(0.0, assignment.deadline - time.time())


def _from_result(
    assignment: Assignment, result: ExecutionResult, cid: str | None, signature: str | None
) -> ResultReport:
    return ResultReport(
        attempt=assignment.attempt,
        reason=RunReason(result.reason.value),
        message=result.message[:MAX_MESSAGE],
        exit_code=result.exit_code,
        duration_s=max(0.0, result.duration_s),
        output_cid=cid,
        output_bytes=result.output_bytes if cid is not None else 0,
        signature=signature,
        stdout_tail=decode_tail(result.stdout),
        stderr_tail=decode_tail(result.stderr),
    )


def _report(
    assignment: Assignment, reason: RunReason, message: str, started: float
) -> ResultReport:
    return ResultReport(
        attempt=assignment.attempt,
        reason=reason,
        message=message[:MAX_MESSAGE],
        exit_code=None,
        duration_s=time.monotonic() - started,
        output_cid=None,
        output_bytes=0,
        signature=None,
        stdout_tail="",
        stderr_tail="",
    )


def _remove_job_dir(job_dir: Path) -> None:
    """Delete a job directory; first unmount a loop-mounted /output a crash left behind."""
    if not job_dir.exists():
        return
    for mnt in job_dir.glob(".*.fs/mnt"):
        if os.path.ismount(mnt):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)
    shutil.rmtree(job_dir, ignore_errors=True)
    if job_dir.exists():
        log.error("could not remove job directory %s", job_dir)


def _short(job_id: str) -> str:
    return job_id[:10]


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
