"""What this node can offer: which executors can run here (probed at start) and the capacity
it registers with (hardware, configuration, free disk measured at each heartbeat)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from agent.config import AgentConfig, ConfigError
from gridmarket.wire import ExecutorKind, GpuGroup, NodeCapacityIn

if TYPE_CHECKING:
    from agent.hardware import HardwareReport

__all__ = ["DEFAULT_DOCKER_HOST", "node_capacity", "usable_executors"]

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


def _docker_problem(config: AgentConfig) -> str | None:
    """Why the Docker engine cannot be used, or None. A plain ``GET /_ping`` over httpx (the
    docker SDK and ``requests`` cost ~6 MB of RSS: they load only when a Docker job runs)."""
    import httpx

    host = config.docker_host or DEFAULT_DOCKER_HOST
    parts = urlsplit(host)
    if parts.scheme == "ssh":
        return _docker_sdk_problem(host)
    transport: httpx.HTTPTransport | None = None
    if parts.scheme == "unix":
        transport = httpx.HTTPTransport(uds=parts.path)
        url = "http://docker/_ping"
    else:
        scheme = "https" if parts.scheme == "https" else "http"
        url = f"{scheme}://{parts.netloc}/_ping"
    try:
        with httpx.Client(transport=transport, timeout=5, verify=False) as client:  # noqa: S501
            response = client.get(url)
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


def _wasm_problem() -> str | None:
    import importlib.util

    if importlib.util.find_spec("wasmtime") is None:  # pragma: no cover - a dependency
        return "the wasmtime package is not installed"
    return None


def node_capacity(
    config: AgentConfig, report: HardwareReport, executors: list[ExecutorKind]
) -> Callable[[], NodeCapacityIn]:
    """What this node offers, as a function: free disk is measured again at each call.

    One GPU model per node (the wire's rule): the largest group of identical GPUs is offered.
    """
    gpu: GpuGroup | None = None
    if report.gpu_groups:
        group = report.gpu_groups[0]
        name = next((g.name for g in report.gpus if g.tier.key == group.tier_key), "")
        gpu = GpuGroup(
            model=group.tier_key, name=name[:128], vram_mib=group.vram_mib, count=group.count
        )
        if len(report.gpu_groups) > 1:
            log.warning(
                "this machine has several GPU models; offering only %d x %s",
                group.count,
                group.tier_key,
            )
    region = config.require_region()
    cores = config.cpu_cores or report.cpu_logical_cores
    ram = config.ram_mib or report.ram_mib

    def capacity() -> NodeCapacityIn:
        return NodeCapacityIn(
            gpu=gpu,
            cpu_cores=cores,
            ram_mib=ram,
            disk_mib=_free_disk_mib(config.work_dir),
            region=region,
            price_floor_wei_per_hour=config.price_floor_wei_per_hour,
            executors=list(executors),
            slots=config.slots,
        )

    capacity()  # validate now: a bad value is a configuration error, not a registration one
    return capacity


def _free_disk_mib(path: Path) -> int:
    import psutil

    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return int(psutil.disk_usage(str(path)).free) // (1024 * 1024)


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
