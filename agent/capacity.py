"""What this node can offer: which executors can run here (probed at start) and the capacity
it registers with (hardware, configuration and price floors, ETH's and per token, free disk
measured at each registration, and the images its Docker engine has cached, sent again with
each heartbeat)."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from agent.config import AgentConfig, ConfigError
from gridmarket.cuda import CC_MAJOR_MAX, CUDA_MAJOR_MAX, parse_version, version_text
from gridmarket.wire import (
    MAX_ADVERTISED_IMAGES,
    PINNED_IMAGE_PATTERN,
    ExecutorKind,
    GpuGroup,
    NodeCapacityIn,
)

if TYPE_CHECKING:
    import httpx

    from agent.hardware import HardwareReport

__all__ = [
    "DEFAULT_DOCKER_HOST",
    "CachedImages",
    "CapacitySource",
    "engine_client",
    "gpu_offer",
    "node_capacity",
    "nvidia_runtime_problem",
    "pinned_images",
    "remove_leftover_containers",
    "usable_executors",
]

log = logging.getLogger(__name__)


def usable_executors(config: AgentConfig) -> tuple[list[ExecutorKind], list[str]]:
    """The executors this node can serve now, and a note per one it cannot.

    ``config.executors`` unset means "Docker if its engine answers, and WASM". Docker is
    probed with a ping (5 s timeout); WASM needs only the ``wasmtime`` package. Raises
    :class:`ConfigError` when nothing is left to serve.
    """
    wanted = config.executors or [ExecutorKind.DOCKER, ExecutorKind.WASM]
    kinds: list[ExecutorKind] = []
    notes: list[str] = []
    for kind in wanted:
        problem = _docker_problem(config) if kind is ExecutorKind.DOCKER else _wasm_problem()
        if problem is None:
            kinds.append(kind)
        else:
            notes.append(f"{kind} unavailable: {problem}")
    if not kinds:
        raise ConfigError("no executor can run here: " + "; ".join(notes))
    return kinds, notes


DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"


def engine_client(host: str, timeout_s: float) -> tuple[httpx.Client, str]:
    """An httpx client for the Docker engine at ``host`` (``unix://``, ``tcp://``, ``http(s)://``;
    not ``ssh://``, the docker SDK's) and the base URL of its API. What the daemon asks the
    engine outside a job (ping, image list, leftover containers) goes this way: the docker SDK
    and ``requests`` cost ~7 MB of RSS, and load only when a Docker job runs."""
    import httpx

    parts = urlsplit(host)
    transport: httpx.HTTPTransport | None = None
    if parts.scheme == "unix":
        # verify=False: no TLS on a socket, and a transport's default (certifi's CA bundle,
        # parsed anew for each client: 35 ms of CPU per heartbeat) is for nothing
        transport = httpx.HTTPTransport(uds=parts.path, verify=False)
        base = "http://docker"
    else:
        scheme = "https" if parts.scheme == "https" else "http"
        base = f"{scheme}://{parts.netloc}"
    client = httpx.Client(transport=transport, timeout=timeout_s, verify=False)  # noqa: S501
    return client, base


def remove_leftover_containers(host: str, labels: list[str]) -> int:
    """Remove (forced, with their anonymous volumes) the containers on the engine at ``host``
    (not ``ssh://``) that carry all of ``labels`` (``key`` or ``key=value``); how many. What
    :meth:`agent.executors.docker.DockerExecutor.remove_leftovers` does with the docker SDK, over
    httpx (:func:`engine_client`). A container already gone is not counted; any other failure
    raises (httpx.HTTPError)."""
    import json

    client, base = engine_client(host, timeout_s=60)
    with client:
        listing = client.get(
            f"{base}/containers/json", params={"all": "1", "filters": json.dumps({"label": labels})}
        )
        listing.raise_for_status()
        removed = 0
        for container in listing.json():
            gone = client.delete(
                f"{base}/containers/{container['Id']}", params={"force": "1", "v": "1"}
            )
            if gone.status_code == 404:
                continue
            gone.raise_for_status()
            removed += 1
    return removed


def _docker_problem(config: AgentConfig) -> str | None:
    """Why the Docker engine cannot be used, or None. A plain ``GET /_ping`` over httpx
    (:func:`engine_client`)."""
    import httpx

    host = config.docker_host or DEFAULT_DOCKER_HOST
    if urlsplit(host).scheme == "ssh":
        return _docker_sdk_problem(host)
    try:
        client, base = engine_client(host, timeout_s=5)
        with client:
            response = client.get(f"{base}/_ping")
    except httpx.HTTPError as exc:
        return f"no Docker engine answers at {host} ({_root_cause(exc)})"
    if response.status_code != 200:
        return f"the Docker engine at {host} answered {response.status_code} to a ping"
    return None


def _docker_sdk_problem(host: str) -> str | None:
    try:
        import docker

        client = docker.DockerClient(base_url=host, timeout=5)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # docker's, paramiko's and OS errors alike
        return f"no Docker engine answers at {host} ({_root_cause(exc)})"
    return None


def _root_cause(exc: BaseException) -> str:
    """The innermost cause of a wrapped error, in a few words."""
    seen = exc
    for _ in range(20):  # chains are short; never loop on a cyclic one
        inner = seen.__cause__ or seen.__context__
        if inner is None:
            break
        seen = next((a for a in inner.args if isinstance(a, OSError)), inner)
    if isinstance(seen, OSError) and seen.strerror:
        return seen.strerror
    return _line(seen)


def nvidia_runtime_problem(docker_host: str | None) -> str | None:
    """Why the Docker engine at ``docker_host`` cannot run GPU jobs, or None: its ``GET /info``
    must list an ``nvidia`` runtime among its ``Runtimes`` (the NVIDIA Container Toolkit,
    registered with ``nvidia-ctk runtime configure --runtime=docker``). Asked once, at start."""
    host = docker_host or DEFAULT_DOCKER_HOST
    try:
        info = _engine_info(host)
    except Exception as exc:  # httpx's, docker's and OS errors alike
        return f"the Docker engine at {host} did not say its runtimes ({_root_cause(exc)})"
    runtimes = info.get("Runtimes") if isinstance(info, dict) else None
    names = sorted(runtimes) if isinstance(runtimes, dict) else []
    if "nvidia" in names:
        return None
    return (
        f"the Docker engine at {host} has no NVIDIA runtime (its runtimes: "
        f"{', '.join(names) or 'none'}): GPU jobs cannot run here; install the NVIDIA Container "
        "Toolkit, run `nvidia-ctk runtime configure --runtime=docker` and restart dockerd"
    )


def _engine_info(host: str) -> Any:
    if urlsplit(host).scheme == "ssh":
        import docker

        sdk = docker.DockerClient(base_url=host, timeout=10)
        try:
            return sdk.info()
        finally:
            sdk.close()
    client, base = engine_client(host, timeout_s=10)
    with client:
        response = client.get(f"{base}/info")
        response.raise_for_status()
        return response.json()


def gpu_offer(
    config: AgentConfig,
    report: HardwareReport,
    executors: list[ExecutorKind],
    runtime_problem: Callable[[str | None], str | None] = nvidia_runtime_problem,
) -> tuple[GpuGroup | None, str | None]:
    """The GPUs this node offers (the largest group of identical GPUs, with the driver
    version, the driver's CUDA version and the group's lowest compute capability as NVML
    reported them; None where unknown) and, when it offers none though it has GPUs, why: GPU
    jobs are Docker jobs, so a node without Docker or without the NVIDIA runtime in its engine
    (:func:`nvidia_runtime_problem`) offers no GPUs rather than take GPU jobs it would fail."""
    if not report.gpu_groups:
        return None, None
    if ExecutorKind.DOCKER not in executors:
        return None, "GPU jobs are Docker jobs and this node does not serve Docker jobs"
    problem = runtime_problem(config.docker_host)
    if problem is not None:
        return None, problem
    group = report.gpu_groups[0]
    members = [
        g for g in report.gpus if (g.tier.key, g.vram_mib) == (group.tier_key, group.vram_mib)
    ]
    if len(report.gpu_groups) > 1:
        log.warning(
            "this machine has several GPU models; offering only %d x %s",
            group.count,
            group.tier_key,
        )
    drivers = {g.driver_version for g in members}
    driver = drivers.pop() if len(drivers) == 1 else None
    return (
        GpuGroup(
            model=group.tier_key,
            name=members[0].name[:128],
            vram_mib=group.vram_mib,
            count=group.count,
            driver_version=None if driver is None else driver[:32],
            cuda_version=_lowest([g.cuda_version for g in members], CUDA_MAJOR_MAX),
            compute_capability=_lowest([g.compute_capability for g in members], CC_MAJOR_MAX),
        ),
        None,
    )


def _lowest(values: list[str | None], major_max: int) -> str | None:
    """The lowest of ``values`` (``"major.minor"``), None when any is unknown or malformed."""
    try:
        parsed = [parse_version(v or "", major_max=major_max) for v in values]
    except ValueError:
        return None
    return version_text(min(parsed)) if parsed else None


def _wasm_problem() -> str | None:
    import importlib.util

    if importlib.util.find_spec("wasmtime") is None:  # pragma: no cover - a dependency
        return "the wasmtime package is not installed"
    return None


_PINNED = re.compile(PINNED_IMAGE_PATTERN)


def pinned_images(listing: Any, limit: int = MAX_ADVERTISED_IMAGES) -> list[str]:
    """The pinned references (``host[:port]/name@sha256:<hex>``, the wire's form) in a Docker
    ``GET /images/json`` answer, newest image first, at most ``limit``. Anything else in it (tag
    only images, malformed entries, references too long for the wire) is left out."""
    if not isinstance(listing, list):
        return []
    images = [i for i in listing if isinstance(i, dict)]
    images.sort(key=_created)
    refs: list[str] = []
    seen: set[str] = set()
    for image in reversed(images):
        digests = image.get("RepoDigests")
        if not isinstance(digests, list):
            continue
        for ref in digests:
            if isinstance(ref, str) and len(ref) <= 255 and _PINNED.match(ref) and ref not in seen:
                seen.add(ref)
                refs.append(ref)
                if len(refs) >= limit:
                    return refs
    return refs


def _created(image: dict[Any, Any]) -> int:
    created = image.get("Created")
    return created if isinstance(created, int) else 0


class CachedImages:
    """The images this node's Docker engine has, by pinned reference: what it advertises so that
    matching prefers it for jobs naming them (no pull).

    One ``GET /images/json`` on the engine (httpx over its socket, like the ping; the docker SDK
    for an ``ssh://`` host), at most once per ``refresh_s``; :func:`pinned_images` picks the
    references. An engine that does not answer keeps the last list (a warning, once per outage).
    """

    def __init__(self, docker_host: str | None, refresh_s: float = 1.0) -> None:
        self.host = docker_host or DEFAULT_DOCKER_HOST
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._images: list[str] = []
        self._at = -float("inf")
        self._failing = False

    def __call__(self) -> list[str]:
        with self._lock:
            if time.monotonic() - self._at < self.refresh_s:
                return list(self._images)
            try:
                listing = self._list()
            except Exception as exc:  # httpx's, docker's and OS errors alike
                if not self._failing:
                    log.warning("cannot list the engine's images at %s: %s", self.host, exc)
                self._failing = True
            else:
                self._failing = False
                self._images = pinned_images(listing)
            self._at = time.monotonic()
            return list(self._images)

    def _list(self) -> Any:
        if urlsplit(self.host).scheme == "ssh":
            import docker

            sdk = docker.DockerClient(base_url=self.host, timeout=10)
            try:
                return sdk.api.images()
            finally:
                sdk.close()
        client, base = engine_client(self.host, timeout_s=10)
        with client:
            response = client.get(f"{base}/images/json")
            response.raise_for_status()
            return response.json()


class CapacitySource:
    """What this node offers, as a function: free disk is measured again at each call, and the
    cached images listed again (:class:`CachedImages`). :meth:`images` is the heartbeat's list
    (None when this node serves no Docker jobs)."""

    def __init__(
        self, build: Callable[[list[str]], NodeCapacityIn], images: CachedImages | None
    ) -> None:
        self._build = build
        self._images = images

    def __call__(self) -> NodeCapacityIn:
        return self._build(self._images() if self._images is not None else [])

    def images(self) -> list[str] | None:
        return self._images() if self._images is not None else None


def node_capacity(
    config: AgentConfig,
    report: HardwareReport,
    executors: list[ExecutorKind],
    *,
    images: CachedImages | None = None,
) -> CapacitySource:
    """What this node offers, as a function: free disk is measured again at each call.

    Its price floors: ``price_floor_wei_per_hour`` for ETH jobs, and ``price_floors`` (token
    address -> the token's smallest units per hour) for the listed tokens it takes.
    One GPU model per node (the wire's rule): the largest group of identical GPUs is offered
    (:func:`gpu_offer`; none, with a warning, when GPU jobs cannot run here).
    A node serving Docker jobs advertises the images its engine has (``images``, default a
    :class:`CachedImages` on ``config.docker_host``).
    """
    gpu, problem = gpu_offer(config, report, executors)
    if problem is not None:
        log.warning("offering no GPUs: %s", problem)
    region = config.require_region()
    cores = config.cpu_cores or report.cpu_logical_cores
    ram = config.ram_mib or report.ram_mib

    def build(cached: list[str]) -> NodeCapacityIn:
        return NodeCapacityIn(
            gpu=gpu,
            cpu_cores=cores,
            ram_mib=ram,
            disk_mib=_free_disk_mib(config.work_dir),
            region=region,
            price_floor_wei_per_hour=config.price_floor_wei_per_hour,
            price_floors=config.token_floors,
            executors=list(executors),
            slots=config.slots,
            images=cached,
        )

    build([])  # validate now: a bad value is a configuration error, not a registration one
    if images is None and ExecutorKind.DOCKER in executors:
        images = CachedImages(config.docker_host)
    return CapacitySource(build, images)


def _free_disk_mib(path: Path) -> int:
    import psutil

    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return int(psutil.disk_usage(str(path)).free) // (1024 * 1024)


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
