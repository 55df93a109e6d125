"""What every executor takes and gives back: an :class:`ExecutionSpec`, an :class:`ExecutionResult`.

An executor runs one untrusted workload with the job's input mounted read-only at ``/input`` and an
empty, size-capped directory at ``/output``, inside the limits of :class:`Limits`. It raises only
when it cannot start the job (:mod:`agent.errors`); anything the job does once started (exit code,
timeout, memory, output cap) comes back as a result whose ``reason`` says what happened.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from agent.errors import InvalidSpecError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

LABEL = "org.gridmarket.executor"
"""The label on every container an executor starts."""
OWNER_LABEL = "org.gridmarket.owner"
"""Which agent started a container (several may share one engine): wallet and node name."""


class Reason(StrEnum):
    """Why a run ended. Only ``SUCCEEDED`` is a success."""

    SUCCEEDED = "succeeded"
    EXIT_CODE = "exit_code"  # the job exited with a non-zero status
    TIMEOUT = "timeout"  # wall-clock limit (or the WASM fuel budget) reached: killed
    OUT_OF_MEMORY = "out_of_memory"  # killed by the memory limit (or WASM memory refused)
    OUTPUT_TOO_LARGE = "output_too_large"  # /output went over its byte or file-count cap
    OUTPUT_INVALID = "output_invalid"  # /output holds symlinks, devices, ... : not uploadable
    TRAPPED = "trapped"  # WASM trap (unreachable, out-of-bounds access, stack overflow)
    CANCELLED = "cancelled"  # the agent cancelled the run (shutdown)


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits of one run; every field is enforced by both executors where it applies."""

    memory_bytes: int = 512 * MiB
    cpus: float = 1.0  # Docker only: CPU share (WASM runs on one thread)
    pids: int = 256  # Docker only: processes and threads in the container
    timeout_s: float = 600.0  # wall clock, start to exit
    output_bytes: int = 1 * GiB  # total size of the regular files under /output
    output_files: int = 10_000  # files and directories under /output
    log_bytes: int = 1 * MiB  # kept tail of stdout, and of stderr
    gpus: int = 0  # Docker only: GPUs requested from the engine (NVIDIA runtime)
    tmp_bytes: int = 64 * MiB  # Docker only: the writable /tmp (a tmpfs, counts as memory)
    fuel: int | None = None  # WASM only: instruction budget; None: the timeout alone

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "pids", "output_bytes", "output_files", "log_bytes"):
            if getattr(self, name) <= 0:
                raise InvalidSpecError(f"limit {name} must be positive, not {getattr(self, name)}")
        if self.cpus <= 0 or self.timeout_s <= 0:
            raise InvalidSpecError(
                f"cpus ({self.cpus}) and timeout_s ({self.timeout_s}) must be > 0"
            )
        if self.gpus < 0 or self.tmp_bytes < 0 or (self.fuel is not None and self.fuel <= 0):
            raise InvalidSpecError("gpus and tmp_bytes must be >= 0, fuel > 0 when given")


@dataclass(frozen=True, slots=True)
class CheckpointMount:
    """A checkpointing job's ``/checkpoint`` (:mod:`agent.checkpointing`): a writable directory
    capped at ``max_bytes``, holding ``seed``'s content when the job starts (the checkpoint it
    resumes from), copied by ``take(live_dir, final)``: every ``interval_s`` from a ticker thread
    while the job runs, and once with ``final=True`` after the run ended (any outcome).
    A run stopped early (time limit, cancel) gets SIGTERM and ``grace_s`` before SIGKILL, so the
    job can save its state."""

    max_bytes: int
    interval_s: float
    take: Callable[[Path, bool], object] = field(compare=False)
    seed: Path | None = None
    max_files: int = 10_000
    grace_s: float = 10.0


@dataclass(frozen=True, slots=True)
class ExecutionSpec:
    """One workload: a Docker image (``image``) or a WASM module file (``module``), not both.

    ``command`` is the argv: for Docker it replaces the image's CMD (its ENTRYPOINT stays); for WASM
    it follows the program name in ``argv``. A WASM module's ``entrypoint`` is the exported function
    to call (WASI commands export ``_start``).
    """

    image: str | None = None
    module: Path | None = None
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    entrypoint: str = "_start"
    # called with ("stdout" | "stderr", bytes) as the job writes, from the executor's reader
    # (live logs, agent.logship); must not block. Its failures are ignored.
    on_output: Callable[[str, bytes], None] | None = field(default=None, compare=False)
    checkpoint: CheckpointMount | None = None  # Docker only: a checkpointing job's /checkpoint

    def __post_init__(self) -> None:
        if (self.image is None) == (self.module is None):
            raise InvalidSpecError("an ExecutionSpec needs exactly one of image or module")
        if isinstance(self.command, str):
            raise InvalidSpecError("command is an argv tuple, not a string")
        for key, value in self.env.items():
            if not key or "=" in key or "\0" in key or "\0" in value:
                raise InvalidSpecError(f"bad environment variable {key!r}")


@dataclass(frozen=True, slots=True)
class ExecutionResult:
    """How a run ended, its log tails, and where its (checked) output is."""

    reason: Reason
    message: str  # one line a person can act on
    exit_code: int | None  # None when the job never returned one (WASM trap, kill before exit)
    duration_s: float
    output_dir: Path  # holds the output only when it passed the checks (else it is empty)
    output_bytes: int = 0
    output_files: int = 0
    stdout: bytes = b""  # the last Limits.log_bytes bytes
    stderr: bytes = b""
    logs_truncated: bool = False
    timed_out: bool = False
    oom_killed: bool = False

    @property
    def ok(self) -> bool:
        return self.reason is Reason.SUCCEEDED


class Executor(Protocol):
    """Runs one workload to completion; implementations are named for their technology."""

    name: str

    def run(
        self,
        spec: ExecutionSpec,
        input_dir: Path | None,
        output_dir: Path,
        *,
        cancel: threading.Event | None = None,
    ) -> ExecutionResult:
        """Run ``spec`` with ``input_dir`` at /input (read-only) and ``output_dir`` at /output.

        ``output_dir`` must be empty or absent. Setting ``cancel`` stops the run (``CANCELLED``).

        Raises:
            agent.errors.ExecutorError: the job could not be started (bad spec, missing image,
                no GPU); nothing ran.
        """
        ...


class TailBuffer:
    """Keeps the last ``cap`` bytes written to it and counts everything it was given."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.total = 0
        self._buf = bytearray()

    def write(self, data: bytes) -> None:
        self.total += len(data)
        self._buf += data[-self.cap :]
        if len(self._buf) > self.cap:
            del self._buf[: len(self._buf) - self.cap]

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def value(self) -> bytes:
        return bytes(self._buf)
