"""The engine's index of idle capacity: a node's mutable state (:class:`IndexedNode`), the
buckets of idle nodes sorted by ``(price, -reputation, node id)`` (:class:`Bucket`), a job's
shape (:class:`Shape`: which buckets can hold its match, in what order) and the buckets cached
for a shape (:class:`Candidates`). Internal to :class:`~scheduler.matching.engine.MatchingEngine`,
which keeps them consistent (see its docstring, "Index")."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import NamedTuple

from gridmarket.tiers import vram_class
from gridmarket.wire import ExecutorKind

from .models import JobRequirements, NodeCapacity
from .rules import NodeView, disk_class, size_class

Entry = tuple[int, float, str, "IndexedNode"]  # (price, -reputation, node id, node)
BANNED, FULL, INDEXED, NEW = 0, 1, 2, 3


class IndexedNode:
    """Mutable state of one registered node (attributes match :class:`NodeLike`)."""

    __slots__ = (
        "capacity",
        "claims",
        "compute_capability",
        "cuda",
        "entries",
        "executors",
        "free_cores",
        "free_disk_mib",
        "free_gpus",
        "free_ram_mib",
        "free_slots",
        "images",
        "model",
        "node_id",
        "price",
        "price_floors",
        "region",
        "reputation",
        "speed",
        "state",
        "suspended",
        "vram_mib",
    )

    def __init__(self, capacity: NodeCapacity) -> None:
        self.claims: dict[str, JobRequirements] = {}
        self.entries: list[tuple[Bucket, Entry]] = []
        self.state = NEW
        self.set_capacity(capacity)

    def set_capacity(self, capacity: NodeCapacity) -> None:
        self.capacity = capacity
        self.node_id = capacity.node_id
        self.region = capacity.region
        self.price = capacity.price_floor_wei_per_hour
        self.price_floors = capacity.price_floors
        self.executors = capacity.executors
        self.model = capacity.gpu_model
        self.vram_mib = capacity.vram_mib
        self.speed = capacity.speed
        self.reputation = capacity.reputation
        self.suspended = capacity.suspended
        self.images = capacity.images
        self.cuda = capacity.cuda
        self.compute_capability = capacity.compute_capability
        self.recount()

    def recount(self) -> None:
        cap, claims = self.capacity, self.claims.values()
        self.free_gpus = max(0, cap.gpu_count - sum(j.gpu_count for j in claims))
        self.free_cores = max(0, cap.cpu_cores - sum(j.cpu_cores for j in claims))
        self.free_ram_mib = max(0, cap.ram_mib - sum(j.ram_mib for j in claims))
        self.free_disk_mib = max(0, cap.disk_mib - sum(j.disk_mib for j in claims))
        self.free_slots = max(0, cap.slots - len(self.claims))

    def view(self) -> NodeView:
        return NodeView(
            node_id=self.node_id,
            region=self.region,
            price=self.price,
            executors=self.executors,
            model=self.model,
            vram_mib=self.vram_mib,
            speed=self.speed,
            reputation=self.reputation,
            suspended=self.suspended,
            free_gpus=self.free_gpus,
            free_cores=self.free_cores,
            free_ram_mib=self.free_ram_mib,
            free_disk_mib=self.free_disk_mib,
            free_slots=self.free_slots,
            jobs=frozenset(self.claims),
            images=self.images,
            price_floors=self.price_floors,
            cuda=self.cuda,
            compute_capability=self.compute_capability,
        )


BucketKey = tuple[ExecutorKind, str | None, int, int, str, float, int, int, int, str | None]
"""(executor, region or None, free GPUs, VRAM per GPU, model, speed, core class, RAM class, disk
class, token or None): the last is the currency its entries' prices are in (None: ETH)."""


class Bucket:
    """Idle nodes with one bucket key, sorted by ``(price, -reputation, node id)``.

    ``region`` is ``None`` in the pooled buckets that serve jobs without a region. ``token`` is
    the currency of the prices (None: the ETH floor; else the nodes' floor in that token, and
    only nodes with one are in the bucket).
    """

    __slots__ = (
        "cclass",
        "dclass",
        "entries",
        "executor",
        "free_gpus",
        "model",
        "rclass",
        "region",
        "speed",
        "token",
        "vclass",
        "vram_mib",
    )

    def __init__(self, key: BucketKey) -> None:
        (
            self.executor,
            self.region,
            self.free_gpus,
            self.vram_mib,
            self.model,
            self.speed,
            self.cclass,
            self.rclass,
            self.dclass,
            self.token,
        ) = key
        self.vclass = vram_class(self.vram_mib)
        self.entries: list[Entry] = []


class Shape(NamedTuple):
    """The part of a job that decides which buckets can hold its match, and in what order."""

    executor: ExecutorKind
    region: str | None
    gpu_count: int
    vclass: int
    models: frozenset[str] | None
    cclass: int
    rclass: int
    dclass: int
    token: str | None = None

    @classmethod
    def of(cls, job: JobRequirements) -> Shape:
        g = job.gpu_count
        return cls(
            job.executor,
            job.region,
            g,
            vram_class(job.min_vram_mib) if g else 0,
            job.gpu_models if g else None,
            size_class(job.cpu_cores),
            size_class(job.ram_mib),
            disk_class(job.disk_mib),
            job.token,
        )

    def admits(self, b: Bucket) -> bool:
        """Can bucket ``b`` hold a match for a job of this shape (bucket-level gates)?"""
        if b.executor != self.executor or b.free_gpus < self.gpu_count or b.token != self.token:
            return False
        if b.region != self.region:  # pooled buckets (None) serve jobs without a region
            return False
        if self.gpu_count and (
            b.vclass < self.vclass or (self.models is not None and b.model not in self.models)
        ):
            return False
        return b.cclass >= self.cclass and b.rclass >= self.rclass and b.dclass >= self.dclass

    def order(self, b: Bucket) -> tuple[int, int, int, int, float]:
        """The rank prefix every node of ``b`` shares for this shape."""
        return (
            b.free_gpus - self.gpu_count,
            b.vclass - self.vclass,
            b.cclass - self.cclass,
            b.rclass - self.rclass,
            -b.speed,
        )


@dataclass(slots=True)
class Candidates:
    """Buckets that can hold a match for one shape, grouped by rank prefix, best first."""

    orders: list[tuple[int, int, int, int, float]] = field(default_factory=list)
    groups: list[list[Bucket]] = field(default_factory=list)

    def add(self, order: tuple[int, int, int, int, float], bucket: Bucket) -> None:
        i = bisect.bisect_left(self.orders, order)
        if i < len(self.orders) and self.orders[i] == order:
            self.groups[i].append(bucket)
        else:
            self.orders.insert(i, order)
            self.groups.insert(i, [bucket])


def price_of(entry: Entry) -> int:
    return entry[0]
