"""Hardware detection for the provider agent: GPUs, CPU, RAM and free disk.

GPUs are probed in order, and the first probe that finds any wins:

1. :class:`NvmlProbe`, NVML through ``pynvml`` (package ``nvidia-ml-py``); this module is the
   only importer of ``pynvml``, and only inside that class.
2. :class:`NvidiaSmiProbe`, ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits``,
   parsed by the pure :func:`parse_nvidia_smi_csv`.
3. None: the node is CPU-only, and :attr:`HardwareReport.gpu_detection` says why, probe by probe
   (for example ``"nvml: NVML Shared Library Not Found (NVMLError_LibraryNotFound)"``).

CPU, RAM and disk come from ``psutil``. Every GPU carries its tier from
:func:`gridmarket.tiers.classify_gpu` (``guessed=True`` when the model is unknown).

``python -m agent.hardware [--work-dir DIR]`` prints the report as JSON.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, Protocol

import psutil

from agent.errors import AgentError
from gridmarket.cuda import cuda_from_nvml
from gridmarket.tiers import Tier, classify_gpu

__all__ = [
    "DetectedGpuGroup",
    "GpuInfo",
    "GpuProbe",
    "GpuProbeError",
    "HardwareReport",
    "NvidiaSmiProbe",
    "NvmlProbe",
    "RawGpu",
    "default_probes",
    "detect_hardware",
    "parse_cuda_version",
    "parse_nvidia_smi_csv",
]

log = logging.getLogger(__name__)

_MIB = 1024 * 1024
GpuSource = Literal["nvml", "nvidia-smi", "none"]


class GpuProbeError(AgentError, RuntimeError):
    """A GPU probe could not run; the message says why, in words a provider can act on.

    :func:`detect_hardware` never raises it: it records the message and falls back.
    """


@dataclass(frozen=True, slots=True)
class RawGpu:
    """One GPU as a probe reports it, before the tier is attached."""

    index: int
    name: str
    vram_mib: int
    uuid: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    compute_capability: str | None = None


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One detected GPU with its tier."""

    index: int
    name: str
    vram_mib: int
    uuid: str | None
    driver_version: str | None
    cuda_version: str | None
    compute_capability: str | None
    tier: Tier

    @classmethod
    def from_raw(cls, raw: RawGpu) -> GpuInfo:
        """Attach the tier of ``raw``'s model."""
        return cls(
            index=raw.index,
            name=raw.name,
            vram_mib=raw.vram_mib,
            uuid=raw.uuid,
            driver_version=raw.driver_version,
            cuda_version=raw.cuda_version,
            compute_capability=raw.compute_capability,
            tier=classify_gpu(raw.name, raw.vram_mib),
        )

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return {
            "index": self.index,
            "name": self.name,
            "vram_mib": self.vram_mib,
            "uuid": self.uuid,
            "driver_version": self.driver_version,
            "cuda_version": self.cuda_version,
            "compute_capability": self.compute_capability,
            "tier": self.tier.to_dict(),
        }


@dataclass(frozen=True, slots=True)
class DetectedGpuGroup:
    """Identical GPUs this machine has, as detected (not yet validated): the largest group
    becomes the node's offer on the wire, a :class:`gridmarket.wire.GpuGroup`
    (:func:`agent.capacity.node_capacity`)."""

    tier_key: str
    vram_mib: int
    count: int


@dataclass(frozen=True, slots=True)
class HardwareReport:
    """What this machine can offer. Frozen; :meth:`to_json` for the wire or a terminal."""

    gpus: tuple[GpuInfo, ...]
    gpu_source: GpuSource
    gpu_detection: str
    cpu_physical_cores: int
    cpu_logical_cores: int
    cpu_model: str
    ram_mib: int
    work_dir: str
    disk_free_mib: int
    os: str
    arch: str

    @property
    def gpu_groups(self) -> tuple[DetectedGpuGroup, ...]:
        """GPUs grouped by (tier, VRAM), largest group first."""
        counts = Counter((g.tier.key, g.vram_mib) for g in self.gpus)
        groups = [DetectedGpuGroup(key, vram, n) for (key, vram), n in counts.items()]
        return tuple(sorted(groups, key=lambda g: (-g.count, -g.vram_mib, g.tier_key)))

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return {
            "gpus": [g.to_dict() for g in self.gpus],
            "gpu_source": self.gpu_source,
            "gpu_detection": self.gpu_detection,
            "cpu_physical_cores": self.cpu_physical_cores,
            "cpu_logical_cores": self.cpu_logical_cores,
            "cpu_model": self.cpu_model,
            "ram_mib": self.ram_mib,
            "work_dir": self.work_dir,
            "disk_free_mib": self.disk_free_mib,
            "os": self.os,
            "arch": self.arch,
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        """The report as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)


class GpuProbe(Protocol):
    """Lists the GPUs of this machine, or raises :class:`GpuProbeError` saying why it cannot."""

    @property
    def source(self) -> GpuSource: ...

    def probe(self) -> list[RawGpu]: ...


# --------------------------------------------------------------------------- NVML
def _text(value: object) -> str:
    """NVML returns ``bytes`` in old bindings and ``str`` in new ones."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _nvml_library_loads() -> bool:
    """Whether the NVML library loads as pynvml loads it on Linux (``libnvidia-ml.so.1``)."""
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


class NvmlProbe:
    """GPUs through NVML (``pynvml``): the same library ``nvidia-smi`` uses, without a process.

    Per GPU: name, VRAM, UUID and compute capability (``nvmlDeviceGetCudaComputeCapability``);
    for the host: the driver version (``nvmlSystemGetDriverVersion``) and the highest CUDA
    version the driver supports (``nvmlSystemGetCudaDriverVersion_v2``, ``12040`` -> ``"12.4"``).
    A value NVML will not give (``NotSupported``) is None: unknown to matching.

    ``binding``: the NVML binding to call instead of importing ``pynvml`` (a stand-in with
    pynvml's functions and ``NVMLError``, for machines without the driver); None: ``pynvml``.
    """

    source: GpuSource = "nvml"

    def __init__(self, binding: Any | None = None) -> None:
        self._binding = binding

    def probe(self) -> list[RawGpu]:
        if self._binding is not None:
            return self._probe(self._binding)
        if sys.platform.startswith("linux") and not _nvml_library_loads():
            # pynvml would fail the same way in nvmlInit; not importing it saves the idle
            # daemon of a host without an NVIDIA driver ~2 MB of RSS (docs/agent.md).
            raise GpuProbeError("NVML Shared Library Not Found (NVMLError_LibraryNotFound)")
        try:
            import pynvml  # the only NVML importer in the code base
        except ImportError as exc:
            raise GpuProbeError(f"nvidia-ml-py is not installed ({exc})") from exc
        return self._probe(pynvml)

    def _probe(self, pynvml: Any) -> list[RawGpu]:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GpuProbeError(f"{exc} ({type(exc).__name__})") from exc
        try:
            return self._read(pynvml)
        except pynvml.NVMLError as exc:
            raise GpuProbeError(f"NVML query failed: {exc} ({type(exc).__name__})") from exc
        finally:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                log.debug("nvmlShutdown failed", exc_info=True)

    @staticmethod
    def _read(nvml: Any) -> list[RawGpu]:
        def optional(call: Callable[[], object]) -> object | None:
            try:
                return call()
            except nvml.NVMLError:  # NotSupported on some boards, vGPUs and old drivers
                return None

        driver = optional(nvml.nvmlSystemGetDriverVersion)
        cuda = optional(nvml.nvmlSystemGetCudaDriverVersion_v2)
        gpus = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = optional(partial(nvml.nvmlDeviceGetUUID, handle))
            capability = optional(partial(nvml.nvmlDeviceGetCudaComputeCapability, handle))
            cc: str | None = None
            if isinstance(capability, tuple) and len(capability) == 2:
                cc = f"{int(capability[0])}.{int(capability[1])}"
            gpus.append(
                RawGpu(
                    index=index,
                    name=_text(nvml.nvmlDeviceGetName(handle)).strip(),
                    vram_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // _MIB,
                    uuid=None if uuid is None else _text(uuid),
                    driver_version=None if driver is None else _text(driver),
                    cuda_version=cuda_from_nvml(cuda) if isinstance(cuda, int) else None,
                    compute_capability=cc,
                )
            )
        return gpus


# --------------------------------------------------------------------------- nvidia-smi
QUERY_FIELDS = ("index", "name", "memory.total", "uuid", "driver_version", "compute_cap")
"""Fields asked of ``nvidia-smi --query-gpu``; drivers before 510 lack ``compute_cap``."""

_MISSING = frozenset({"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]"})


def _field(value: str) -> str | None:
    value = value.strip()
    return None if value.lower() in _MISSING else value


def parse_nvidia_smi_csv(
    text: str, fields: Sequence[str] = QUERY_FIELDS, *, cuda_version: str | None = None
) -> list[RawGpu]:
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`` output.

    ``fields`` must name the columns in the order they were asked, and include ``name`` and
    ``memory.total``. Memory is in MiB (``nounits``; a trailing ``MiB`` is accepted too).
    ``[N/A]`` and ``[Not Supported]`` become ``None``. Raises ``ValueError`` on a malformed line.
    """
    columns = list(fields)
    if "name" not in columns or "memory.total" not in columns:
        raise ValueError("fields must include name and memory.total")
    gpus: list[RawGpu] = []
    rows = csv.reader(line for line in text.splitlines() if line.strip())
    for number, row in enumerate(rows):
        if len(row) != len(columns):
            raise ValueError(f"line {number + 1}: {len(row)} values for {len(columns)} fields")
        values = dict(zip(columns, (_field(v) for v in row), strict=True))
        memory = values["memory.total"]
        if values["name"] is None or memory is None:
            raise ValueError(f"line {number + 1}: no name or memory.total")
        raw_index = values.get("index")
        try:
            vram_mib = int(float(re.sub(r"\s*mib$", "", memory, flags=re.IGNORECASE)))
            index = number if raw_index is None else int(raw_index)
        except ValueError as exc:
            raise ValueError(f"line {number + 1}: {exc}") from None
        gpus.append(
            RawGpu(
                index=index,
                name=values["name"],
                vram_mib=vram_mib,
                uuid=values.get("uuid"),
                driver_version=values.get("driver_version"),
                cuda_version=cuda_version,
                compute_capability=values.get("compute_cap"),
            )
        )
    return gpus


_CUDA_BANNER = re.compile(r"CUDA Version:\s*(\d+\.\d+)")


def parse_cuda_version(banner: str) -> str | None:
    """The ``CUDA Version: 12.4`` of plain ``nvidia-smi`` output (``None`` if absent)."""
    found = _CUDA_BANNER.search(banner)
    return found.group(1) if found else None


CommandRunner = Callable[[Sequence[str]], str]
"""Runs a command and returns its stdout; raises :class:`GpuProbeError` when it fails."""


def run_command(argv: Sequence[str], *, timeout_s: float = 15.0) -> str:
    """Default :data:`CommandRunner`: a subprocess with a timeout, stdout as text."""
    if shutil.which(argv[0]) is None:
        raise GpuProbeError(f"{argv[0]} not found on PATH")
    try:
        done = subprocess.run(  # argv is fixed by the caller, never a shell string
            list(argv), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GpuProbeError(f"{argv[0]} could not run: {exc}") from exc
    if done.returncode != 0:
        message = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[0]
        raise GpuProbeError(f"{argv[0]} exited with {done.returncode}: {message}")
    return done.stdout


class NvidiaSmiProbe:
    """GPUs through the ``nvidia-smi`` CLI, for hosts where the NVML binding cannot load."""

    source: GpuSource = "nvidia-smi"

    def __init__(self, binary: str = "nvidia-smi", runner: CommandRunner = run_command) -> None:
        self._binary = binary
        self._run = runner

    def _query(self, fields: Sequence[str]) -> str:
        return self._run(
            [self._binary, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
        )

    def probe(self) -> list[RawGpu]:
        fields: Sequence[str] = QUERY_FIELDS
        try:
            text = self._query(fields)
        except GpuProbeError as exc:
            if "compute_cap" not in str(exc):
                raise
            fields = tuple(f for f in QUERY_FIELDS if f != "compute_cap")  # driver < 510
            text = self._query(fields)
        try:
            cuda = parse_cuda_version(self._run([self._binary]))
        except GpuProbeError:
            cuda = None
        try:
            return parse_nvidia_smi_csv(text, fields, cuda_version=cuda)
        except ValueError as exc:
            raise GpuProbeError(f"unexpected nvidia-smi output: {exc}") from exc


# --------------------------------------------------------------------------- host
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing ancestor (the disk a work dir will be created on)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _probe_gpus(probes: Sequence[GpuProbe]) -> tuple[list[RawGpu], GpuSource, str]:
    notes: list[str] = []
    for probe in probes:
        try:
            found = probe.probe()
        except GpuProbeError as exc:
            notes.append(f"{probe.source}: {exc}")
            continue
        if found:
            notes.append(f"{probe.source}: {len(found)} GPU{'s' if len(found) != 1 else ''}")
            return found, probe.source, "; ".join(notes)
        notes.append(f"{probe.source}: no GPU found")
    if not probes:
        notes.append("no GPU probe configured")
    notes.append("reporting CPU-only")
    return [], "none", "; ".join(notes)


def default_probes() -> tuple[GpuProbe, ...]:
    """NVML first, then ``nvidia-smi``."""
    return (NvmlProbe(), NvidiaSmiProbe())


def detect_hardware(
    work_dir: str | os.PathLike[str] = ".", probes: Sequence[GpuProbe] | None = None
) -> HardwareReport:
    """Detect this machine's GPUs, CPU, RAM and the free disk under ``work_dir``.

    ``probes`` defaults to NVML then ``nvidia-smi``. If ``work_dir`` does not exist yet, the
    free space of its nearest existing ancestor is reported.
    """
    chosen = default_probes() if probes is None else tuple(probes)
    raw, source, note = _probe_gpus(chosen)
    log.info("GPU detection: %s", note)
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or logical
    disk_path = _existing(Path(work_dir))
    return HardwareReport(
        gpus=tuple(GpuInfo.from_raw(g) for g in raw),
        gpu_source=source,
        gpu_detection=note,
        cpu_physical_cores=int(physical),
        cpu_logical_cores=int(logical),
        cpu_model=_cpu_model(),
        ram_mib=int(psutil.virtual_memory().total) // _MIB,
        work_dir=str(Path(work_dir).absolute()),
        disk_free_mib=int(psutil.disk_usage(str(disk_path)).free) // _MIB,
        os=platform.system().lower(),
        arch=platform.machine().lower(),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agent.hardware``: print this machine's report as JSON."""
    parser = argparse.ArgumentParser(prog="python -m agent.hardware", description=__doc__)
    parser.add_argument("--work-dir", default=".", help="where jobs will run (for free disk)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log the detection steps")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    print(detect_hardware(args.work_dir).to_json())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
