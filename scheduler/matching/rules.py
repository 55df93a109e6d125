"""What a match is, without the index: the hard gates, the rank among the nodes that pass, the
size classes both use, the answers (:class:`Match`, :class:`NoMatch` with :class:`WhyNot`), and
:func:`reference_match`, the O(n) definition the engine's index must agree with (tests, bench).
See :mod:`scheduler.matching.engine` for the order of the gates and of the rank."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple, Protocol

from gridmarket.cuda import Version, version_text
from gridmarket.tiers import vram_class
from gridmarket.wire import ExecutorKind

from .models import Gate, JobRequirements

DEFAULT_BAN_BELOW = 0.2
"""Nodes whose reputation score is below this are not matched."""


def size_class(amount: int) -> int:
    """Power-of-two class of a core count or a MiB amount: ``[2**(c-1), 2**c)`` is class c."""
    return amount.bit_length() if amount > 0 else 0


def class_floor(size_cls: int) -> int:
    return 1 << (size_cls - 1) if size_cls > 0 else 0


DISK_CLASSES_GIB: tuple[int, ...] = (
    0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000
)  # fmt: skip
"""Free-disk classes (GiB, 1-2-5 series: disk requests are usually round decimal sizes)."""
DISK_FLOORS_MIB = tuple(g * 1024 for g in DISK_CLASSES_GIB)


def disk_class(mib: int) -> int:
    """Index of the :data:`DISK_CLASSES_GIB` class holding ``mib``."""
    return bisect.bisect_right(DISK_FLOORS_MIB, mib) - 1 if mib > 0 else 0


class NodeLike(Protocol):
    """What gates and ranking read from a node: its capacity and what is free now."""

    @property
    def node_id(self) -> str: ...
    @property
    def region(self) -> str: ...
    @property
    def price(self) -> int: ...
    @property
    def executors(self) -> frozenset[ExecutorKind]: ...
    @property
    def model(self) -> str: ...
    @property
    def vram_mib(self) -> int: ...
    @property
    def speed(self) -> float: ...
    @property
    def reputation(self) -> float: ...
    @property
    def suspended(self) -> bool: ...
    @property
    def free_gpus(self) -> int: ...
    @property
    def free_cores(self) -> int: ...
    @property
    def free_ram_mib(self) -> int: ...
    @property
    def free_disk_mib(self) -> int: ...
    @property
    def free_slots(self) -> int: ...
    @property
    def images(self) -> frozenset[str]: ...
    @property
    def price_floors(self) -> Mapping[str, int]: ...
    @property
    def cuda(self) -> Version | None: ...
    @property
    def compute_capability(self) -> Version | None: ...


@dataclass(frozen=True, slots=True)
class NodeView:
    """A snapshot of one registered node: capacity plus what is free now."""

    node_id: str
    region: str
    price: int
    executors: frozenset[ExecutorKind]
    model: str
    vram_mib: int
    speed: float
    reputation: float
    suspended: bool
    free_gpus: int
    free_cores: int
    free_ram_mib: int
    free_disk_mib: int
    free_slots: int
    jobs: frozenset[str] = frozenset()
    images: frozenset[str] = frozenset()
    price_floors: Mapping[str, int] = field(default_factory=dict)
    cuda: Version | None = None
    compute_capability: Version | None = None


def driver_gate(node: NodeLike, job: JobRequirements) -> Gate | None:
    """The CUDA or compute capability gate ``node`` fails for ``job`` (None: it passes, or the
    job requires neither). A node that did not report the value fails it (unknown)."""
    need = job.min_cuda
    if need is not None and (node.cuda is None or node.cuda < need):
        return Gate.CUDA
    need = job.min_compute_capability
    if need is not None and (node.compute_capability is None or node.compute_capability < need):
        return Gate.COMPUTE_CAPABILITY
    return None


def driver_value(node: NodeLike, gate: Gate) -> str:
    """What ``node`` reports for a driver gate, ``"11.8"`` or ``"unknown"``."""
    value = node.cuda if gate is Gate.CUDA else node.compute_capability
    return "unknown" if value is None else version_text(value)


def floor_for(node: NodeLike, job: JobRequirements) -> int | None:
    """``node``'s price floor in the currency ``job`` is paid in (ETH's, or its floor for the
    job's token); None when it names no floor for that token (it does not take the job)."""
    if job.token is None:
        return node.price
    return node.price_floors.get(job.token)


def first_failed_gate(node: NodeLike, job: JobRequirements, *, ban_below: float) -> Gate | None:
    """The first gate ``node`` fails for ``job`` (``None``: the node can take the job now)."""
    g = job.gpu_count
    if node.suspended or node.reputation < ban_below:
        return Gate.REPUTATION
    if node.free_slots <= 0:
        return Gate.SLOTS
    if job.executor not in node.executors:
        return Gate.EXECUTOR
    floor = node.price if job.token is None else node.price_floors.get(job.token)
    if floor is None:
        return Gate.TOKEN
    if job.region is not None and node.region != job.region:
        return Gate.REGION
    if node.free_gpus < g:
        return Gate.GPU_COUNT
    if g and job.gpu_models is not None and node.model not in job.gpu_models:
        return Gate.GPU_MODEL
    if g and node.vram_mib < job.min_vram_mib:
        return Gate.VRAM
    if g and (job.min_cuda or job.min_compute_capability):
        gate = driver_gate(node, job)
        if gate is not None:
            return gate
    if node.free_cores < job.cpu_cores:
        return Gate.CPU_CORES
    if node.free_ram_mib < job.ram_mib:
        return Gate.RAM
    if floor > job.max_price_wei_per_hour:
        return Gate.PRICE
    if node.free_disk_mib < job.disk_mib:
        return Gate.DISK
    if node.node_id in job.excluded_node_ids:
        return Gate.EXCLUDED
    return None


class RankKey(NamedTuple):
    """Why a node ranks where it does; smaller is better, compared field by field.

    ``pull`` is 1 when the job names an image the node has not cached (it would pull it), else
    0: among nodes that fit equally well and are as fast, one with the image comes first."""

    spare_gpus: int
    vram_class_excess: int
    core_class_excess: int
    ram_class_excess: int
    neg_speed: float
    pull: int
    price: int
    neg_reputation: float
    node_id: str


def rank_key(node: NodeLike, job: JobRequirements) -> RankKey:
    """Best-fit rank of a node that passes every gate for ``job``."""
    return RankKey(
        node.free_gpus - job.gpu_count,
        vram_class(node.vram_mib) - vram_class(job.min_vram_mib),
        size_class(node.free_cores) - size_class(job.cpu_cores),
        size_class(node.free_ram_mib) - size_class(job.ram_mib),
        -node.speed,
        needs_pull(node, job),
        node.price if job.token is None else node.price_floors.get(job.token, 0),
        -node.reputation,
        node.node_id,
    )


def needs_pull(node: NodeLike, job: JobRequirements) -> int:
    """1 when ``job`` names an image ``node`` has not cached, else 0 (the rank's ``pull``)."""
    return 0 if job.image is None or job.image in node.images else 1


def reference_match(
    nodes: Iterable[NodeLike], job: JobRequirements, *, ban_below: float = DEFAULT_BAN_BELOW
) -> str | None:
    """O(n) definition of the match: the best-ranked node that passes every gate."""
    best: RankKey | None = None
    for node in nodes:
        if first_failed_gate(node, job, ban_below=ban_below) is None:
            key = rank_key(node, job)
            if best is None or key < best:
                best = key
    return None if best is None else best.node_id


@dataclass(frozen=True, slots=True)
class Match:
    """The node chosen for a job, with the rank that chose it."""

    job_id: str
    node_id: str
    rank: RankKey


@dataclass(frozen=True, slots=True)
class WhyNot:
    """Why no node can take a job now: each node counted once, under the first gate it fails.

    ``top_gate`` is the gate that eliminated the most nodes (ties: earlier gate), ``None`` when
    no node is registered at all. ``token``: the ERC-20 the job is paid in (None: ETH).
    ``reported``: for the ``cuda`` and ``compute_capability`` gates, what the job requires and
    what the nodes they eliminated report, value -> count (``"unknown"``: not reported).
    """

    job_id: str
    total_nodes: int
    eligible: int
    eliminated: Mapping[Gate, int]
    token: str | None = None
    reported: Mapping[Gate, tuple[str, Mapping[str, int]]] = field(default_factory=dict)

    def _driver_notes(self) -> str:
        notes = []
        for gate, (need, values) in self.reported.items():
            what = "CUDA" if gate is Gate.CUDA else "compute capability"
            seen = ", ".join(f"{v} ({n})" for v, n in sorted(values.items()))
            notes.append(f"the job requires {what} >= {need}; nodes report {seen}")
        return "".join(f"; {note}" for note in notes)

    @property
    def top_gate(self) -> Gate | None:
        counts = [(n, -i, g) for i, (g, n) in enumerate(self.eliminated.items()) if n]
        return max(counts)[2] if counts else None

    def message(self, symbols: Mapping[str, str] | None = None) -> str:
        """One line a submitter can act on. ``symbols``: token address -> symbol, to name the
        job's token (else it is named by its address)."""
        if self.total_nodes == 0:
            return "no node is registered"
        if self.eligible:
            return f"{self.eligible} of {self.total_nodes} nodes can take the job now"
        parts = ", ".join(f"{g.value}: {n}" for g, n in self.eliminated.items() if n)
        top = self.top_gate
        assert top is not None
        if top is Gate.TOKEN and self.token is not None:
            symbol = (symbols or {}).get(self.token, self.token)
            return (
                f"waiting: no node takes {symbol}: {self.eliminated[top]} of "
                f"{self.total_nodes} name no {symbol} price floor (the job is paid in {symbol}); "
                f"{parts}{self._driver_notes()}"
            )
        return (
            f"waiting: no node passes every gate; {top.value} eliminates the most "
            f"({self.eliminated[top]} of {self.total_nodes}); {parts}{self._driver_notes()}"
        )


def explain_nodes(
    job: JobRequirements,
    nodes: Iterable[NodeLike],
    counts: dict[Gate, int],
    *,
    total: int,
    ban_below: float,
) -> WhyNot:
    """:class:`WhyNot` for ``job`` by gating ``nodes`` one by one, adding to ``counts`` (what
    the caller counted already); what the nodes failing the driver gates report is kept."""
    eligible = 0
    seen: dict[Gate, Counter[str]] = {}
    for node in nodes:
        gate = first_failed_gate(node, job, ban_below=ban_below)
        if gate is None:
            eligible += 1
            continue
        counts[gate] += 1
        if gate is Gate.CUDA or gate is Gate.COMPUTE_CAPABILITY:
            seen.setdefault(gate, Counter())[driver_value(node, gate)] += 1
    reported: dict[Gate, tuple[str, Mapping[str, int]]] = {}
    for gate, values in seen.items():
        need = job.min_cuda if gate is Gate.CUDA else job.min_compute_capability
        assert need is not None
        reported[gate] = (version_text(need), MappingProxyType(dict(values)))
    return WhyNot(
        job.job_id, total, eligible, MappingProxyType(counts), job.token, MappingProxyType(reported)
    )


@dataclass(frozen=True, slots=True)
class NoMatch:
    """No node can take the job now; ``why`` says which gates stand in the way.

    ``why`` is ``None`` when the match was asked with ``explain=False``.
    """

    job_id: str
    why: WhyNot | None
