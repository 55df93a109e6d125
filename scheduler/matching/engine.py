"""The matching engine: hard gates, then best fit, over an index of idle capacity. No I/O.

**Gates** (:class:`~scheduler.matching.models.Gate`, checked in that order): reputation (not
suspended, score at or above the ban line), a free slot, executor, region (when the job asks),
free GPU count, GPU model (when the job asks), VRAM per GPU, free cores, free RAM, price (node
floor <= job's offer), free disk, and not excluded for this job.

**Rank** among the nodes that pass (smaller is better, compared in this order):
:func:`rank_key` = over-provisioning first (spare GPUs, then VRAM class, core class and RAM
class above what the job asked for; classes are powers of two for cores and MiB of RAM and the
standard sizes of :data:`gridmarket.tiers.VRAM_CLASSES_GIB` for VRAM), then faster GPU tier,
then lower price floor, then higher reputation, then node id (deterministic ties).

**Index.** Every idle node (not suspended or banned, at least one free slot) sits, once per
executor it offers, in a bucket keyed by ``(executor, region, free GPUs, VRAM per GPU, model,
speed, core class, RAM class, disk class)``: everything in the rank before the price, plus the
free disk's class. Each node is also in a pooled bucket with the same key but no region, which
serves the jobs that do not ask for one. Each bucket keeps its nodes sorted by ``(price floor,
-reputation, node id)``, the rest of the rank. For a job shape (executor, region, GPU count,
VRAM class, models, core, RAM and disk classes) the engine caches the buckets that can hold a
match, grouped and sorted by their rank prefix (see docs/matching.md). A match walks the groups
in order; in each bucket the first node is the best one unless a gate the key cannot decide
fails (cores, RAM or disk in the job's own class, where the exact amount is compared;
exclusion), and the price gate stops a bucket at its first node that is too dear. The first
group with a passing node holds the answer. Claims and releases move one node between buckets
(``bisect`` on short lists).

:func:`reference_match` is the O(n) definition the index must agree with (tests, bench).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple, Protocol

from gridmarket.tiers import vram_class
from gridmarket.wire import ExecutorKind

from .models import (
    ClaimError,
    DuplicateNodeError,
    Gate,
    JobRequirements,
    NodeCapacity,
    UnknownJobError,
    UnknownNodeError,
)

__all__ = [
    "DEFAULT_BAN_BELOW",
    "DISK_CLASSES_GIB",
    "Match",
    "MatchingEngine",
    "NoMatch",
    "NodeLike",
    "NodeView",
    "RankKey",
    "WhyNot",
    "disk_class",
    "first_failed_gate",
    "rank_key",
    "reference_match",
    "size_class",
]

DEFAULT_BAN_BELOW = 0.2
"""Nodes whose reputation score is below this are not matched."""


def size_class(amount: int) -> int:
    """Power-of-two class of a core count or a MiB amount: ``[2**(c-1), 2**c)`` is class c."""
    return amount.bit_length() if amount > 0 else 0


def _class_floor(size_cls: int) -> int:
    return 1 << (size_cls - 1) if size_cls > 0 else 0


DISK_CLASSES_GIB: tuple[int, ...] = (
    0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000
)  # fmt: skip
"""Free-disk classes (GiB, 1-2-5 series: disk requests are usually round decimal sizes)."""
_DISK_FLOORS_MIB = tuple(g * 1024 for g in DISK_CLASSES_GIB)


def disk_class(mib: int) -> int:
    """Index of the :data:`DISK_CLASSES_GIB` class holding ``mib``."""
    return bisect.bisect_right(_DISK_FLOORS_MIB, mib) - 1 if mib > 0 else 0


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


def first_failed_gate(node: NodeLike, job: JobRequirements, *, ban_below: float) -> Gate | None:
    """The first gate ``node`` fails for ``job`` (``None``: the node can take the job now)."""
    g = job.gpu_count
    if node.suspended or node.reputation < ban_below:
        return Gate.REPUTATION
    if node.free_slots <= 0:
        return Gate.SLOTS
    if job.executor not in node.executors:
        return Gate.EXECUTOR
    if job.region is not None and node.region != job.region:
        return Gate.REGION
    if node.free_gpus < g:
        return Gate.GPU_COUNT
    if g and job.gpu_models is not None and node.model not in job.gpu_models:
        return Gate.GPU_MODEL
    if g and node.vram_mib < job.min_vram_mib:
        return Gate.VRAM
    if node.free_cores < job.cpu_cores:
        return Gate.CPU_CORES
    if node.free_ram_mib < job.ram_mib:
        return Gate.RAM
    if node.price > job.max_price_wei_per_hour:
        return Gate.PRICE
    if node.free_disk_mib < job.disk_mib:
        return Gate.DISK
    if node.node_id in job.excluded_node_ids:
        return Gate.EXCLUDED
    return None


class RankKey(NamedTuple):
    """Why a node ranks where it does; smaller is better, compared field by field."""

    spare_gpus: int
    vram_class_excess: int
    core_class_excess: int
    ram_class_excess: int
    neg_speed: float
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
        node.price,
        -node.reputation,
        node.node_id,
    )


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
    no node is registered at all.
    """

    job_id: str
    total_nodes: int
    eligible: int
    eliminated: Mapping[Gate, int]

    @property
    def top_gate(self) -> Gate | None:
        counts = [(n, -i, g) for i, (g, n) in enumerate(self.eliminated.items()) if n]
        return max(counts)[2] if counts else None

    def message(self) -> str:
        """One line a submitter can act on."""
        if self.total_nodes == 0:
            return "no node is registered"
        if self.eligible:
            return f"{self.eligible} of {self.total_nodes} nodes can take the job now"
        parts = ", ".join(f"{g.value}: {n}" for g, n in self.eliminated.items() if n)
        top = self.top_gate
        assert top is not None
        return (
            f"waiting: no node passes every gate; {top.value} eliminates the most "
            f"({self.eliminated[top]} of {self.total_nodes}); {parts}"
        )


@dataclass(frozen=True, slots=True)
class NoMatch:
    """No node can take the job now; ``why`` says which gates stand in the way.

    ``why`` is ``None`` when the match was asked with ``explain=False``.
    """

    job_id: str
    why: WhyNot | None


# --------------------------------------------------------------------------- internals
_Entry = tuple[int, float, str, "_Node"]  # (price, -reputation, node id, node)
_BANNED, _FULL, _INDEXED, _NEW = 0, 1, 2, 3


class _Node:
    """Mutable state of one registered node (attributes match :class:`NodeLike`)."""

    __slots__ = (
        "capacity",
        "claims",
        "entries",
        "executors",
        "free_cores",
        "free_disk_mib",
        "free_gpus",
        "free_ram_mib",
        "free_slots",
        "model",
        "node_id",
        "price",
        "region",
        "reputation",
        "speed",
        "state",
        "suspended",
        "vram_mib",
    )

    def __init__(self, capacity: NodeCapacity) -> None:
        self.claims: dict[str, JobRequirements] = {}
        self.entries: list[tuple[_Bucket, _Entry]] = []
        self.state = _NEW
        self.set_capacity(capacity)

    def set_capacity(self, capacity: NodeCapacity) -> None:
        self.capacity = capacity
        self.node_id = capacity.node_id
        self.region = capacity.region
        self.price = capacity.price_floor_wei_per_hour
        self.executors = capacity.executors
        self.model = capacity.gpu_model
        self.vram_mib = capacity.vram_mib
        self.speed = capacity.speed
        self.reputation = capacity.reputation
        self.suspended = capacity.suspended
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
        )


_BucketKey = tuple[ExecutorKind, str | None, int, int, str, float, int, int, int]


class _Bucket:
    """Idle nodes with one bucket key, sorted by ``(price, -reputation, node id)``.

    ``region`` is ``None`` in the pooled buckets that serve jobs without a region.
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
        "vclass",
        "vram_mib",
    )

    def __init__(self, key: _BucketKey) -> None:
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
        ) = key
        self.vclass = vram_class(self.vram_mib)
        self.entries: list[_Entry] = []


class _Shape(NamedTuple):
    """The part of a job that decides which buckets can hold its match, and in what order."""

    executor: ExecutorKind
    region: str | None
    gpu_count: int
    vclass: int
    models: frozenset[str] | None
    cclass: int
    rclass: int
    dclass: int

    @classmethod
    def of(cls, job: JobRequirements) -> _Shape:
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
        )

    def admits(self, b: _Bucket) -> bool:
        """Can bucket ``b`` hold a match for a job of this shape (bucket-level gates)?"""
        if b.executor != self.executor or b.free_gpus < self.gpu_count:
            return False
        if b.region != self.region:  # pooled buckets (None) serve jobs without a region
            return False
        if self.gpu_count and (
            b.vclass < self.vclass or (self.models is not None and b.model not in self.models)
        ):
            return False
        return b.cclass >= self.cclass and b.rclass >= self.rclass and b.dclass >= self.dclass

    def order(self, b: _Bucket) -> tuple[int, int, int, int, float]:
        """The rank prefix every node of ``b`` shares for this shape."""
        return (
            b.free_gpus - self.gpu_count,
            b.vclass - self.vclass,
            b.cclass - self.cclass,
            b.rclass - self.rclass,
            -b.speed,
        )


@dataclass(slots=True)
class _Candidates:
    """Buckets that can hold a match for one shape, grouped by rank prefix, best first."""

    orders: list[tuple[int, int, int, int, float]] = field(default_factory=list)
    groups: list[list[_Bucket]] = field(default_factory=list)

    def add(self, order: tuple[int, int, int, int, float], bucket: _Bucket) -> None:
        i = bisect.bisect_left(self.orders, order)
        if i < len(self.orders) and self.orders[i] == order:
            self.groups[i].append(bucket)
        else:
            self.orders.insert(i, order)
            self.groups.insert(i, [bucket])


def _price_of(entry: _Entry) -> int:
    return entry[0]


class MatchingEngine:
    """In-memory index of node capacity; answers "which node for this job?" in microseconds.

    Not thread-safe: one owner (the scheduler's matching task) calls it. ``match`` only reads;
    ``claim``/``release`` record placements so the free capacity stays true. A node with
    several slots takes several jobs while it has free resources for them.
    """

    def __init__(
        self,
        *,
        ban_below: float = DEFAULT_BAN_BELOW,
        max_shapes: int = 4096,
        compact_after: int = 1024,
    ) -> None:
        """``compact_after``: empty buckets (nodes moved on, left) are dropped, with the shape
        cache, once there are more than this many and they are over half of all buckets, so
        a long-lived engine does not accumulate them; the cost is amortised over the moves
        that emptied them."""
        self.ban_below = ban_below
        self._max_shapes = max_shapes
        self._compact_after = compact_after
        self._n_empty = 0  # buckets with no entries (created empty, or emptied)
        self._nodes: dict[str, _Node] = {}
        self._claims: dict[str, _Node] = {}  # job id -> node
        self._buckets: dict[_BucketKey, _Bucket] = {}
        self._regional: dict[ExecutorKind, list[_Bucket]] = {e: [] for e in ExecutorKind}
        self._pooled: dict[ExecutorKind, list[_Bucket]] = {e: [] for e in ExecutorKind}
        self._shapes: OrderedDict[_Shape, _Candidates] = OrderedDict()
        self._n_banned = 0
        self._n_full = 0
        self._n_indexed = 0
        self._n_by_executor: dict[ExecutorKind, int] = dict.fromkeys(ExecutorKind, 0)

    # ----------------------------------------------------------------- registry
    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def add_node(self, capacity: NodeCapacity) -> None:
        """Register a node (:class:`DuplicateNodeError` if its id is taken)."""
        if capacity.node_id in self._nodes:
            raise DuplicateNodeError(capacity.node_id)
        node = _Node(capacity)
        self._nodes[node.node_id] = node
        self._index(node)

    def update_node(self, capacity: NodeCapacity) -> None:
        """Replace a node's capacity (price, reputation, ...); its claims stay."""
        node = self._node(capacity.node_id)
        self._deindex(node)
        node.set_capacity(capacity)
        self._index(node)

    def remove_node(self, node_id: str) -> frozenset[str]:
        """Forget a node; returns the ids of the jobs it held (to requeue)."""
        node = self._node(node_id)
        self._deindex(node)
        del self._nodes[node_id]
        for job_id in node.claims:
            del self._claims[job_id]
        return frozenset(node.claims)

    def node(self, node_id: str) -> NodeView:
        """Snapshot of one node."""
        return self._node(node_id).view()

    def nodes(self) -> Iterator[NodeView]:
        """Snapshots of every registered node."""
        return (n.view() for n in self._nodes.values())

    def node_of(self, job_id: str) -> str:
        """The node holding a claimed job."""
        try:
            return self._claims[job_id].node_id
        except KeyError:
            raise UnknownJobError(job_id) from None

    def _node(self, node_id: str) -> _Node:
        try:
            return self._nodes[node_id]
        except KeyError:
            raise UnknownNodeError(node_id) from None

    # ----------------------------------------------------------------- busy / free
    def claim(self, job: JobRequirements, node_id: str) -> None:
        """Record that ``node_id`` runs ``job`` (:class:`ClaimError` if a gate fails)."""
        node = self._node(node_id)
        if job.job_id in self._claims:
            raise ClaimError(f"job {job.job_id} is already on node {self.node_of(job.job_id)}")
        gate = first_failed_gate(node, job, ban_below=self.ban_below)
        if gate is not None:
            raise ClaimError(f"node {node_id} cannot take job {job.job_id}: {gate.value} gate")
        self._deindex(node)
        node.claims[job.job_id] = job
        node.recount()
        self._claims[job.job_id] = node
        self._index(node)

    def release(self, job_id: str) -> str:
        """Free what ``job_id`` held; returns the node id."""
        try:
            node = self._claims.pop(job_id)
        except KeyError:
            raise UnknownJobError(job_id) from None
        self._deindex(node)
        del node.claims[job_id]
        node.recount()
        self._index(node)
        return node.node_id

    def match_and_claim(self, job: JobRequirements, *, explain: bool = True) -> Match | NoMatch:
        """:meth:`match`, then :meth:`claim` the chosen node."""
        found = self.match(job, explain=explain)
        if isinstance(found, Match):
            self.claim(job, found.node_id)
        return found

    # ----------------------------------------------------------------- matching
    def match(self, job: JobRequirements, *, explain: bool = True) -> Match | NoMatch:
        """The best node for ``job`` now, or why there is none. Reads only.

        A miss costs one pass over the buckets to say why (:meth:`explain`, milliseconds at
        100,000 nodes); a caller retrying a job that is already waiting can skip it with
        ``explain=False``.
        """
        max_price = job.max_price_wei_per_hour
        min_vram = job.min_vram_mib
        cores, ram, disk = job.cpu_cores, job.ram_mib, job.disk_mib
        excluded = job.excluded_node_ids
        shape = _Shape.of(job)
        # a bucket in the job's own class needs exact comparisons, unless the job asks for
        # exactly the class floor (then every node of the class has enough)
        jc = shape.cclass if cores > _class_floor(shape.cclass) else -1
        jr = shape.rclass if ram > _class_floor(shape.rclass) else -1
        jd = shape.dclass if disk > _DISK_FLOORS_MIB[shape.dclass] else -1
        for group in self._candidates(shape).groups:
            best: _Entry | None = None
            for bucket in group:
                entries = bucket.entries
                if not entries or entries[0][0] > max_price or bucket.vram_mib < min_vram:
                    continue
                exact_cores = bucket.cclass == jc
                exact_ram = bucket.rclass == jr
                exact_disk = bucket.dclass == jd
                for entry in entries:
                    if entry[0] > max_price:
                        break
                    node = entry[3]
                    if (
                        (exact_cores and node.free_cores < cores)
                        or (exact_ram and node.free_ram_mib < ram)
                        or (exact_disk and node.free_disk_mib < disk)
                        or (excluded and node.node_id in excluded)
                    ):
                        continue
                    if best is None or entry < best:
                        best = entry
                    break
            if best is not None:
                return Match(job.job_id, best[2], rank_key(best[3], job))
        return NoMatch(job.job_id, self.explain(job) if explain else None)

    def explain(self, job: JobRequirements) -> WhyNot:
        """Count, per gate, the nodes that fail it first for ``job``.

        Costs one pass over the buckets, plus a pass over the nodes of the buckets where the
        job's exact cores or RAM decide; elsewhere prices are counted by bisection.
        """
        counts = dict.fromkeys(Gate, 0)
        counts[Gate.REPUTATION] = self._n_banned
        counts[Gate.SLOTS] = self._n_full
        counts[Gate.EXECUTOR] = self._n_indexed - self._n_by_executor[job.executor]
        shape = _Shape.of(job)
        g, cores, ram, disk = job.gpu_count, job.cpu_cores, job.ram_mib, job.disk_mib
        max_price, excluded = job.max_price_wei_per_hour, job.excluded_node_ids
        # in the job's own class, exact amounts decide, unless the job asks the class floor
        exact_c = cores > _class_floor(shape.cclass)
        exact_r = ram > _class_floor(shape.rclass)
        exact_d = disk > _DISK_FLOORS_MIB[shape.dclass]
        n_cores = n_ram = n_price = n_disk = n_excluded = eligible = 0
        for bucket in self._regional[job.executor]:
            entries = bucket.entries
            if not entries:
                continue
            if job.region is not None and bucket.region != job.region:
                counts[Gate.REGION] += len(entries)
            elif bucket.free_gpus < g:
                counts[Gate.GPU_COUNT] += len(entries)
            elif g and job.gpu_models is not None and bucket.model not in job.gpu_models:
                counts[Gate.GPU_MODEL] += len(entries)
            elif g and bucket.vram_mib < job.min_vram_mib:
                counts[Gate.VRAM] += len(entries)
            elif bucket.cclass < shape.cclass:
                n_cores += len(entries)
            else:
                cores_fit = bucket.cclass > shape.cclass or not exact_c
                ram_fit = bucket.rclass > shape.rclass or (
                    bucket.rclass == shape.rclass and not exact_r
                )
                if cores_fit and bucket.rclass < shape.rclass:
                    n_ram += len(entries)
                    continue
                passing = entries
                if cores_fit and ram_fit:  # count prices by bisection
                    k = bisect.bisect_right(entries, max_price, key=_price_of)
                    n_price += len(entries) - k
                    if bucket.dclass < shape.dclass:
                        n_disk += k
                        continue
                    disk_fit = bucket.dclass > shape.dclass or not exact_d
                    if disk_fit and not excluded:
                        eligible += k
                        continue
                    passing = entries[:k]
                for price, _, node_id, node in passing:  # the rest node by node
                    if node.free_cores < cores:
                        n_cores += 1
                    elif node.free_ram_mib < ram:
                        n_ram += 1
                    elif price > max_price:
                        n_price += 1
                    elif node.free_disk_mib < disk:
                        n_disk += 1
                    elif node_id in excluded:
                        n_excluded += 1
                    else:
                        eligible += 1
        counts[Gate.CPU_CORES] = n_cores
        counts[Gate.RAM] = n_ram
        counts[Gate.PRICE] = n_price
        counts[Gate.DISK] = n_disk
        counts[Gate.EXCLUDED] = n_excluded
        return WhyNot(job.job_id, len(self._nodes), eligible, MappingProxyType(counts))

    # ----------------------------------------------------------------- index
    def _candidates(self, shape: _Shape) -> _Candidates:
        found = self._shapes.get(shape)
        if found is not None:
            return found
        found = _Candidates()
        pool = self._pooled if shape.region is None else self._regional
        admitted = [b for b in pool[shape.executor] if shape.admits(b)]
        admitted.sort(key=lambda b: (shape.order(b), b.model, b.dclass))
        for bucket in admitted:
            found.add(shape.order(bucket), bucket)
        self._shapes[shape] = found
        if len(self._shapes) > self._max_shapes:
            self._shapes.popitem(last=False)
        return found

    def _bucket(self, key: _BucketKey) -> _Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(key)
            self._n_empty += 1
            pool = self._pooled if bucket.region is None else self._regional
            pool[bucket.executor].append(bucket)
            for shape, candidates in self._shapes.items():
                if shape.admits(bucket):
                    candidates.add(shape.order(bucket), bucket)
        return bucket

    def _index(self, node: _Node) -> None:
        if node.suspended or node.reputation < self.ban_below:
            node.state = _BANNED
            self._n_banned += 1
            return
        if node.free_slots <= 0:
            node.state = _FULL
            self._n_full += 1
            return
        node.state = _INDEXED
        self._n_indexed += 1
        entry: _Entry = (node.price, -node.reputation, node.node_id, node)
        cclass, rclass = size_class(node.free_cores), size_class(node.free_ram_mib)
        dclass = disk_class(node.free_disk_mib)
        for executor in node.executors:
            self._n_by_executor[executor] += 1
            for region in (node.region, None):  # its region's bucket and the pooled one
                key = (
                    executor,
                    region,
                    node.free_gpus,
                    node.vram_mib,
                    node.model,
                    node.speed,
                    cclass,
                    rclass,
                    dclass,
                )
                bucket = self._bucket(key)
                if not bucket.entries:
                    self._n_empty -= 1
                bisect.insort(bucket.entries, entry)
                node.entries.append((bucket, entry))

    def _deindex(self, node: _Node) -> None:
        if node.state == _BANNED:
            self._n_banned -= 1
        elif node.state == _FULL:
            self._n_full -= 1
        elif node.state == _INDEXED:
            self._n_indexed -= 1
            for bucket, entry in node.entries:
                entries = bucket.entries
                i = bisect.bisect_left(entries, entry)
                assert entries[i] is entry
                del entries[i]
                if not entries:
                    self._n_empty += 1
                if bucket.region is not None:
                    self._n_by_executor[bucket.executor] -= 1
            node.entries.clear()
        node.state = _NEW
        if self._n_empty > self._compact_after and 2 * self._n_empty > len(self._buckets):
            self.compact()

    def compact(self) -> int:
        """Drop empty buckets and the shape cache; returns how many buckets were dropped.

        Runs by itself as buckets empty (``compact_after``); callable at any time."""
        empty = [key for key, b in self._buckets.items() if not b.entries]
        for key in empty:
            del self._buckets[key]
        for pool in (self._regional, self._pooled):
            for executor, buckets in pool.items():
                pool[executor] = [b for b in buckets if b.entries]
        self._shapes.clear()
        self._n_empty = 0
        return len(empty)

    def stats(self) -> dict[str, int]:
        """Sizes of the index, for metrics."""
        return {
            "nodes": len(self._nodes),
            "indexed": self._n_indexed,
            "full": self._n_full,
            "banned": self._n_banned,
            "claims": len(self._claims),
            "buckets": len(self._buckets),
            "empty_buckets": self._n_empty,
            "cached_shapes": len(self._shapes),
        }
