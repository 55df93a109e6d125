"""Run a job in a locked-down Docker container (the Docker SDK against ``DOCKER_HOST``).

The sandbox, from the outside in: no network (``network_mode=none``), a read-only root file
system, a non-root user (65534 ``nobody``), every capability dropped, ``no-new-privileges``,
memory with no swap, CPU share, process count, open files and no core dumps capped, a small
``noexec`` tmpfs at ``/tmp``, the input bind-mounted read-only at ``/input``, a size-capped
``/output`` (:mod:`agent.executors._output`), stdout and stderr kept as capped in-memory tails
(no log files), GPUs only when asked for, a hard wall-clock timeout, and the container always
removed afterwards.

The environment is fixed, so that a deterministic job (``JobSpec.deterministic``, its image
pinned by digest) gives the same output on every node and a mediator's re-run can judge it
(docs/mediator.md): no network, hostname ``job``, no domain name, ``SOURCE_DATE_EPOCH``, ``TZ``
and the locale set (:data:`FIXED_ENV`; the job's own ``env`` may override them, and it is the
same on every node), and the same user, limits and mounts everywhere.

Images: one already in the engine runs as is. One that is not is pulled only when the job names
it by digest (``host[:port]/name@sha256:<hex>``) from a registry the :class:`PullPolicy` allows,
within its size cap and time limit, and checked against that digest; pulled images are kept in a
cache with a size budget (least recently used evicted first). :mod:`agent.executors._pull` has
the details, and whose fault each refusal is. ``PullPolicy(enabled=False)`` gives back the old
behaviour: nothing is pulled.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker.models.containers import Container
from docker.types import DeviceRequest, LogConfig, Mount, Ulimit

from agent.errors import (
    ExecutorError,
    GpuUnavailableError,
    ImageNotFoundError,
    InvalidSpecError,
)
from agent.executors._checkpoint import CheckpointArea
from agent.executors._output import OutputArea, OutputCheck, OutputMode
from agent.executors._pull import (
    ImagePuller,
    ImagePullError,
    ImagePullUnavailableError,
    PullPolicy,
)
from agent.executors.base import (
    LABEL,
    OWNER_LABEL,
    ExecutionResult,
    ExecutionSpec,
    Reason,
    TailBuffer,
)
from gridmarket.checkpoints import CHECKPOINT_PATH, ENV_DIR, ENV_INTERVAL

log = logging.getLogger(__name__)

__all__ = [
    "FIXED_ENV",
    "LABEL",
    "OWNER_LABEL",
    "DockerExecutor",
    "ImagePullError",
    "ImagePullUnavailableError",
    "PullPolicy",
]

FIXED_ENV: dict[str, str] = {
    "SOURCE_DATE_EPOCH": "315532800",  # 1980-01-01T00:00:00Z: the earliest a zip can hold
    "TZ": "UTC",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONHASHSEED": "0",
}
"""Set in every container before the job's own ``env`` (which wins): what a reproducible
build needs to give the same bytes on every node."""

_WAIT_SLICE_S = 1.0  # wait() in slices so cancellation and the watchdog are noticed quickly


class DockerExecutor:
    """Runs :class:`ExecutionSpec` with an ``image`` as a sandboxed container."""

    name = "docker"

    def __init__(
        self,
        client: docker.DockerClient | None = None,
        *,
        docker_host: str | None = None,
        user: str = "65534:65534",
        output_mode: OutputMode = OutputMode.AUTO,
        owner: str = "",
        pull: PullPolicy | None = None,
    ) -> None:
        """``client`` or ``docker_host`` (``unix:///path``) picks the engine, else DOCKER_HOST.
        ``owner`` labels this agent's containers (:func:`agent.assembly.executor_owner`);
        ``pull`` says which images may be pulled, within which caps (default: :class:`PullPolicy`
        defaults, by digest only)."""
        if client is None:
            client = docker.DockerClient(base_url=docker_host) if docker_host else docker.from_env()
        self.client = client
        uid, _, gid = user.partition(":")
        if not (uid.isdigit() and gid.isdigit()):
            raise InvalidSpecError(f"user must be numeric 'uid:gid', not {user!r}")
        if uid == "0":
            raise InvalidSpecError("jobs never run as root (uid 0)")
        self.user = user
        self._owner = (int(uid), int(gid))
        self.output_mode = output_mode
        self.owner = owner
        self.images = ImagePuller(client, pull)

    def cached_images(self) -> list[str]:
        """The images this node can run without pulling, by digest reference (sorted): for the
        capacity advert, so that matching prefers nodes that already have a job's image."""
        return self.images.cached_images()

    # ------------------------------------------------------------------ public

    def remove_leftovers(self) -> int:
        """Remove the containers a previous run of this agent (same ``owner``) left behind (a
        crash, a SIGKILL); returns how many. Other agents' containers on the engine stay."""
        removed = 0
        labels = [LABEL, f"{OWNER_LABEL}={self.owner}"]
        for container in self.client.containers.list(all=True, filters={"label": labels}):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True, v=True)
                removed += 1
        return removed

    def run(
        self,
        spec: ExecutionSpec,
        input_dir: Path | None,
        output_dir: Path,
        *,
        cancel: threading.Event | None = None,
    ) -> ExecutionResult:
        if spec.image is None:
            raise InvalidSpecError("the Docker executor runs images; this spec has a WASM module")
        if input_dir is not None and not input_dir.is_dir():
            raise InvalidSpecError(f"input dir {input_dir} does not exist")
        self.images.acquire(spec.image, cancel)  # pulls it when allowed; in use until released
        try:
            limits = spec.limits
            with contextlib.ExitStack() as stack:
                area = stack.enter_context(
                    OutputArea(
                        output_dir,
                        limits.output_bytes,
                        limits.output_files,
                        mode=self.output_mode,
                        owner=self._owner,
                    )
                )
                ckpt = None
                if spec.checkpoint is not None:
                    ckpt = stack.enter_context(
                        CheckpointArea(
                            spec.checkpoint,
                            output_dir.parent / f"{output_dir.name}-checkpoint",
                            mode=self.output_mode,
                            owner=self._owner,
                        )
                    )
                container = self._create(spec, input_dir, area, ckpt)
                try:
                    outcome = self._execute(container, spec, area, cancel, ckpt)
                finally:
                    self._remove(container)  # before the output is checked and unmounted
                check = area.finish()
                if ckpt is not None and ckpt.area.exceeded is not None:
                    check = OutputCheck(
                        0,
                        0,
                        Reason.OUTPUT_TOO_LARGE,
                        ckpt.area.exceeded.message.replace("/output", CHECKPOINT_PATH),
                    )
                if ckpt is not None:
                    ckpt.take_final()  # the state the run ended with: the next attempt's start
        finally:
            self.images.release(spec.image)
        reason, message = _verdict(spec, outcome, check)
        log.info("container %s: %s (%s) in %.2f s", outcome.id, reason, message, outcome.duration)
        return ExecutionResult(
            reason=reason,
            message=message,
            exit_code=None if (outcome.timed_out or outcome.cancelled) else outcome.exit_code,
            duration_s=outcome.duration,
            output_dir=area.output_dir,
            output_bytes=check.bytes if check.problem is None else 0,
            output_files=check.files if check.problem is None else 0,
            stdout=outcome.logs.stdout.value(),
            stderr=outcome.logs.stderr.value(),
            logs_truncated=outcome.logs.stdout.truncated or outcome.logs.stderr.truncated,
            timed_out=outcome.timed_out,
            oom_killed=outcome.oom_killed,
        )

    # ------------------------------------------------------------------ steps

    def _create(
        self,
        spec: ExecutionSpec,
        input_dir: Path | None,
        area: OutputArea,
        ckpt: CheckpointArea | None = None,
    ) -> Container:
        limits = spec.limits
        mounts = [Mount("/output", str(area.mount_source), type="bind", read_only=False)]
        if input_dir is not None:
            mounts.append(Mount("/input", str(input_dir.resolve()), type="bind", read_only=True))
        env = {**FIXED_ENV, **spec.env}
        if ckpt is not None and spec.checkpoint is not None:
            mounts.append(Mount(CHECKPOINT_PATH, str(ckpt.path), type="bind", read_only=False))
            env[ENV_DIR] = CHECKPOINT_PATH
            env[ENV_INTERVAL] = f"{spec.checkpoint.interval_s:g}"
        ulimits = [
            Ulimit(name="core", soft=0, hard=0),
            Ulimit(name="nofile", soft=4096, hard=4096),
        ]
        if area.mode is OutputMode.WATCH:
            # No single file may outgrow the cap between two watchdog scans.
            fsize = limits.output_bytes + 1  # one byte over: the final check then names the cap
            ulimits.append(Ulimit(name="fsize", soft=fsize, hard=fsize))
        kwargs: dict[str, Any] = {
            "image": spec.image,
            "command": list(spec.command) or None,
            "environment": env,
            "user": self.user,
            "hostname": "job",
            "domainname": "",
            "labels": {LABEL: self.name, OWNER_LABEL: self.owner},
            "network_disabled": True,
            "network_mode": "none",
            "read_only": True,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "ipc_mode": "private",
            "mem_limit": limits.memory_bytes,
            "memswap_limit": limits.memory_bytes,  # equal: no swap
            "oom_score_adj": 1000,  # under host memory pressure, jobs die before the agent
            "nano_cpus": int(limits.cpus * 1e9),
            "pids_limit": limits.pids,
            "ulimits": ulimits,
            "tmpfs": {"/tmp": f"rw,nosuid,nodev,noexec,size={limits.tmp_bytes},mode=1777"},  # noqa: S108
            "mounts": mounts,
            # No log files in dockerd: stdout/stderr are streamed to capped in-memory tails
            # (_LogPump), so gigabytes of output cost the disk nothing.
            "log_config": LogConfig(type=LogConfig.types.NONE),
        }
        if limits.gpus:
            kwargs["device_requests"] = [DeviceRequest(count=limits.gpus, capabilities=[["gpu"]])]
        try:
            return self.client.containers.create(**kwargs)
        except docker.errors.ImageNotFound as exc:
            raise ImageNotFoundError(f"image {spec.image!r} disappeared: {exc}") from exc
        except docker.errors.APIError as exc:
            raise ExecutorError(
                f"the Docker engine refused the container: {exc.explanation}"
            ) from exc

    def _execute(
        self,
        container: Container,
        spec: ExecutionSpec,
        area: OutputArea,
        cancel: threading.Event | None,
        ckpt: CheckpointArea | None = None,
    ) -> _Outcome:
        limits = spec.limits
        # attached before start: nothing is missed
        pump = _LogPump(container, limits.log_bytes, spec.on_output)
        try:
            container.start()
        except docker.errors.APIError as exc:
            text = str(exc.explanation or exc)
            if limits.gpus and ("device driver" in text or "gpu" in text.lower()):
                raise GpuUnavailableError(
                    f"the job asks for {limits.gpus} GPU(s) and the engine cannot provide them "
                    f"({text}); GPU jobs need an NVIDIA GPU and the NVIDIA container toolkit"
                ) from exc
            raise ExecutorError(f"the container did not start: {text}") from exc
        started = time.monotonic()
        area.watch(lambda: _kill(container))
        grace = 0.0
        if ckpt is not None and spec.checkpoint is not None:
            ckpt.area.watch(lambda: _kill(container))
            ckpt.start_ticker()
            grace = spec.checkpoint.grace_s
        try:
            timed_out, cancelled = _wait(container, limits.timeout_s, cancel, grace)
        finally:
            if ckpt is not None:
                ckpt.stop_ticker()
                ckpt.area.stop_watching()
        duration = time.monotonic() - started
        area.stop_watching()
        container.reload()
        state = container.attrs.get("State", {})
        pump.join(timeout=10)
        return _Outcome(
            id=container.short_id,
            exit_code=int(state.get("ExitCode", -1)),
            oom_killed=bool(state.get("OOMKilled")),
            timed_out=timed_out,
            cancelled=cancelled,
            duration=duration,
            logs=pump,
        )

    def _remove(self, container: Container) -> None:
        try:
            container.remove(force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:  # never silent: a leak is a bug
            log.error("could not remove container %s: %s", container.short_id, exc)


@dataclass(frozen=True, slots=True)
class _Outcome:
    id: str
    exit_code: int
    oom_killed: bool
    timed_out: bool
    cancelled: bool
    duration: float
    logs: _LogPump


class _LogPump(threading.Thread):
    """Reads the container's attached stdout/stderr into two capped tails until it exits.

    Attach with ``logs=False``: with the ``none`` log driver, ``logs=True`` makes dockerd answer
    with an error text in the stream and the job's output is never read (the job then blocks).
    """

    def __init__(
        self, container: Container, cap: int, sink: Callable[[str, bytes], None] | None = None
    ) -> None:
        super().__init__(name=f"logs-{container.short_id}", daemon=True)
        self.stdout = TailBuffer(cap)
        self.stderr = TailBuffer(cap)
        self._sink = sink  # live logs (agent.logship): fed as the job writes
        self._stream = container.attach(
            stdout=True, stderr=True, stream=True, logs=False, demux=True
        )
        self.start()

    def run(self) -> None:
        try:
            for out, err in self._stream:
                if out:
                    self.stdout.write(out)
                    self._feed("stdout", out)
                if err:
                    self.stderr.write(err)
                    self._feed("stderr", err)
        except Exception as exc:  # the stream dies with the container: keep what we have
            log.debug("log stream ended: %s", exc)

    def _feed(self, stream: str, data: bytes) -> None:
        if self._sink is not None:
            try:
                self._sink(stream, data)
            except Exception as exc:  # live logs are best effort: the tails are kept
                log.debug("live log sink failed: %s", exc)


def _kill(container: Container) -> None:
    with contextlib.suppress(docker.errors.APIError):  # 409: it already stopped
        container.kill()


def _wait(
    container: Container, timeout_s: float, cancel: threading.Event | None, grace_s: float = 0.0
) -> tuple[bool, bool]:
    """Block until the container exits; kill it at the deadline or on cancel (with
    ``grace_s``: SIGTERM first, SIGKILL when it has not exited ``grace_s`` later).

    Returns (timed_out, cancelled).
    """
    deadline = time.monotonic() + timeout_s
    timed_out = cancelled = False
    while True:
        if cancel is not None and cancel.is_set():
            cancelled = True
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        try:
            container.wait(timeout=min(remaining, _WAIT_SLICE_S))
            return False, False
        except requests.exceptions.RequestException:
            continue  # a slice ran out (the SDK reports read timeouts as request errors)
    if grace_s > 0:
        with contextlib.suppress(docker.errors.APIError):
            container.kill(signal="SIGTERM")
        with contextlib.suppress(requests.exceptions.RequestException):
            container.wait(timeout=grace_s)
    _kill(container)
    with contextlib.suppress(requests.exceptions.RequestException):
        container.wait(timeout=30)
    return timed_out, cancelled


def _verdict(spec: ExecutionSpec, outcome: _Outcome, check: OutputCheck) -> tuple[Reason, str]:
    limits = spec.limits
    if outcome.cancelled:
        return Reason.CANCELLED, "cancelled by the agent"
    if outcome.timed_out:
        return Reason.TIMEOUT, f"killed at the time limit of {limits.timeout_s:g} s"
    if check.problem is Reason.OUTPUT_TOO_LARGE:
        return Reason.OUTPUT_TOO_LARGE, check.message
    if outcome.oom_killed and outcome.exit_code != 0:
        return Reason.OUT_OF_MEMORY, f"killed at the memory limit of {limits.memory_bytes} bytes"
    if outcome.exit_code != 0:
        return Reason.EXIT_CODE, f"exited with code {outcome.exit_code}"
    if check.problem is not None:
        return check.problem, check.message
    return Reason.SUCCEEDED, f"exited with code 0; {check.bytes} bytes of output"
