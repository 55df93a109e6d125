"""Types of the matching engine: what a node offers and what a job needs. No I/O.

Units: memory and disk in MiB; prices in wei **per GPU-hour** (a CPU-only job counts as one
unit, so for it the same numbers read "per job-hour"). A node's price floor and a job's offered
price are both in that unit, so the price gate is a plain comparison. A job paid in an ERC-20
token (escrow v4) offers its price in that token's smallest units per GPU-hour, and is compared
with the node's floor for that token (``NodeCapacity.price_floors``); a node without one does
not take the job (the ``token`` gate).

A node's GPUs are one model: a machine with mixed cards registers one node per model (the agent
groups them, see ``agent.hardware.HardwareReport.gpu_groups``), each with its share of cores,
RAM and disk.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gridmarket.cuda import Version
from gridmarket.tiers import CPU_ONLY, Tier
from gridmarket.wire import ExecutorKind

__all__ = [
    "ClaimError",
    "DuplicateNodeError",
    "Gate",
    "GpuSpec",
    "JobRequirements",
    "MatchingError",
    "NodeCapacity",
    "UnknownJobError",
    "UnknownNodeError",
]


class MatchingError(Exception):
    """Root of the matching engine's errors."""


class UnknownNodeError(MatchingError, KeyError):
    """No node with that id is registered."""


class UnknownJobError(MatchingError, KeyError):
    """No claim with that job id is held."""


class DuplicateNodeError(MatchingError, ValueError):
    """A node with that id is already registered."""


class ClaimError(MatchingError, ValueError):
    """The node cannot take the job (a gate fails, or the job is already placed)."""


class Gate(StrEnum):
    """Hard gates, in the order a node is checked (the first that fails is its reason)."""

    REPUTATION = "reputation"  # suspended, or score below the ban line
    SLOTS = "slots"  # no free job slot
    EXECUTOR = "executor"
    TOKEN = "token"  # noqa: S105 (a gate's name) the job is paid in a token the node names no floor for
    REGION = "region"
    GPU_COUNT = "gpu_count"  # fewer free GPUs than asked
    GPU_MODEL = "gpu_model"  # model not in the job's allowed list
    VRAM = "vram"  # per-GPU VRAM below the job's minimum
    CUDA = "cuda"  # the driver's CUDA version below the job's minimum, or unknown
    COMPUTE_CAPABILITY = "compute_capability"  # below the job's minimum, or unknown
    CPU_CORES = "cpu_cores"
    RAM = "ram"
    PRICE = "price"  # node's floor (in the job's currency) above the job's offered price
    DISK = "disk"
    EXCLUDED = "excluded"  # the job must not go back to this node


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """The GPUs of a node: ``count`` cards of one model (tier key) with ``vram_mib`` each.

    ``speed`` is the tier's relative speed (:attr:`gridmarket.tiers.Tier.speed`); it is carried
    here so that guessed tiers rank with the numbers they were given. ``cuda`` is the highest
    CUDA version the node's driver supports and ``compute_capability`` the lowest of its GPUs,
    ``(major, minor)``; None when the node did not say (an old agent, or NVML could not tell):
    such a node is not matched to a job that requires them.
    """

    model: str
    vram_mib: int
    count: int
    speed: float
    cuda: Version | None = None
    compute_capability: Version | None = None

    def __post_init__(self) -> None:
        _check(bool(self.model), "GPU model must not be empty")
        _check(self.vram_mib > 0, "GPU vram_mib must be positive")
        _check(self.count > 0, "GPU count must be positive")
        _check(self.speed >= 0, "GPU speed must not be negative")

    @classmethod
    def from_tier(cls, tier: Tier, *, vram_mib: int, count: int) -> GpuSpec:
        """GPUs of ``tier`` with the VRAM the node reported."""
        return cls(model=tier.key, vram_mib=vram_mib, count=count, speed=tier.speed)


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """What a registered node offers in total (the engine tracks what is free).

    ``slots`` caps concurrent jobs; ``reputation`` is a score in [0, 1]
    (:func:`scheduler.matching.reputation.score`); ``suspended`` takes the node out of matching
    whatever its score (the reputation exclusion rule, or an operator). ``images`` are the
    pinned image references the node has cached: a preference in the rank, never a gate.
    ``price_floors`` are its floors for jobs paid in ERC-20 tokens (checksummed token address ->
    the token's smallest units per GPU-hour); it takes ETH jobs at ``price_floor_wei_per_hour``
    and token jobs only in the tokens named here.
    """

    node_id: str
    region: str
    price_floor_wei_per_hour: int
    cpu_cores: int
    ram_mib: int
    disk_mib: int
    gpu: GpuSpec | None = None
    executors: frozenset[ExecutorKind] = frozenset({ExecutorKind.DOCKER})
    slots: int = 1
    reputation: float = 0.5
    suspended: bool = False
    images: frozenset[str] = frozenset()
    price_floors: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check(bool(self.node_id), "node_id must not be empty")
        _check(all(v >= 0 for v in self.price_floors.values()), "floors must not be negative")
        _check(bool(self.region), "region must not be empty")
        _check(self.price_floor_wei_per_hour >= 0, "price floor must not be negative")
        _check(self.cpu_cores > 0, "cpu_cores must be positive")
        _check(self.ram_mib > 0, "ram_mib must be positive")
        _check(self.disk_mib >= 0, "disk_mib must not be negative")
        _check(bool(self.executors), "a node must offer at least one executor")
        _check(self.slots > 0, "slots must be positive")
        _check(0.0 <= self.reputation <= 1.0, "reputation must be within [0, 1]")

    @property
    def gpu_count(self) -> int:
        return 0 if self.gpu is None else self.gpu.count

    @property
    def gpu_model(self) -> str:
        """Tier key of the GPUs, ``"cpu"`` for a CPU-only node."""
        return CPU_ONLY.key if self.gpu is None else self.gpu.model

    @property
    def vram_mib(self) -> int:
        """VRAM per GPU (0 for a CPU-only node)."""
        return 0 if self.gpu is None else self.gpu.vram_mib

    @property
    def speed(self) -> float:
        return CPU_ONLY.speed if self.gpu is None else self.gpu.speed

    @property
    def cuda(self) -> Version | None:
        return None if self.gpu is None else self.gpu.cuda

    @property
    def compute_capability(self) -> Version | None:
        return None if self.gpu is None else self.gpu.compute_capability


@dataclass(frozen=True, slots=True)
class JobRequirements:
    """What a job needs from one node. Resources are per node; VRAM is per GPU.

    ``gpu_models`` (tier keys) restricts the GPU model when set; ``region`` restricts the
    region when set. ``max_price_wei_per_hour`` is what the job offers per GPU-hour (per
    job-hour when ``gpu_count`` is 0). ``excluded_node_ids`` are nodes the job must not go to
    (for example the node that lost its lease). ``image`` is the Docker job's pinned image:
    among nodes that fit equally well, one that has it cached ranks first (no pull).
    ``token`` is the (checksummed) address of the ERC-20 the job is paid in, ``None`` for ETH;
    for a token job ``max_price_wei_per_hour`` is in that token's smallest units and only nodes
    with a floor for it can take the job. ``min_cuda`` and ``min_compute_capability``
    (``(major, minor)``, GPU jobs only) are met only by nodes that report at least those.
    """

    job_id: str
    executor: ExecutorKind = ExecutorKind.DOCKER
    gpu_count: int = 0
    min_vram_mib: int = 0
    gpu_models: frozenset[str] | None = None
    cpu_cores: int = 1
    ram_mib: int = 1024
    disk_mib: int = 0
    region: str | None = None
    max_price_wei_per_hour: int = 0
    excluded_node_ids: frozenset[str] = field(default_factory=frozenset)
    image: str | None = None
    token: str | None = None
    min_cuda: Version | None = None
    min_compute_capability: Version | None = None

    def __post_init__(self) -> None:
        _check(bool(self.job_id), "job_id must not be empty")
        _check(self.gpu_count >= 0, "gpu_count must not be negative")
        _check(self.min_vram_mib >= 0, "min_vram_mib must not be negative")
        _check(
            self.gpu_count > 0 or (self.min_vram_mib == 0 and not self.gpu_models),
            "min_vram_mib and gpu_models need gpu_count > 0",
        )
        _check(
            self.gpu_count > 0 or (self.min_cuda is None and self.min_compute_capability is None),
            "min_cuda and min_compute_capability need gpu_count > 0",
        )
        _check(self.gpu_models is None or bool(self.gpu_models), "gpu_models must not be empty")
        _check(self.cpu_cores > 0, "cpu_cores must be positive")
        _check(self.ram_mib > 0, "ram_mib must be positive")
        _check(self.disk_mib >= 0, "disk_mib must not be negative")
        _check(self.max_price_wei_per_hour >= 0, "max price must not be negative")
