"""The matching engine: hard gates, then best fit, over an index of idle capacity. No I/O.

**Gates** (:class:`~scheduler.matching.models.Gate`, checked in that order): reputation (not
suspended, score at or above the ban line), a free slot, executor, region (when the job asks),
free GPU count, GPU model (when the job asks), VRAM per GPU, the driver's CUDA version and the
GPUs' compute capability (when the job asks; a node that did not report them fails), free
cores, free RAM, price (node floor <= job's offer), free disk, and not excluded for this job.
The driver gates are not in the index's key: the walk checks them node by node, like exclusion,
and a job requiring them is explained node by node, like a token job.

**Rank** among the nodes that pass (smaller is better, compared in this order):
:func:`rank_key` = over-provisioning first (spare GPUs, then VRAM class, core class and RAM
class above what the job asked for; classes are powers of two for cores and MiB of RAM and the
standard sizes of :data:`gridmarket.tiers.VRAM_CLASSES_GIB` for VRAM), then faster GPU tier,
then, when the job names an image, a node that has it cached (no pull; a preference, never a
gate), then lower price floor, then higher reputation, then node id (deterministic ties).

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

**Tokens.** The key's last part is a currency: ``None`` for the buckets sorted by the ETH floor
(every indexed node is in them), a token address for the buckets of the nodes that name a floor
in that token (``NodeCapacity.price_floors``), sorted by that floor. A job's shape carries the
token it is paid in (``JobRequirements.token``), so an ETH job only ever sees ETH buckets (the
same buckets, cache and walk as before tokens existed) and a token job only its token's buckets:
the same walk, the price gate and rank reading the floor in its token. Explaining a token job's
miss scans the nodes that take its token (they are also kept by token); a node of the job's
executor without a floor in it fails the ``token`` gate.

**Images.** The indexed nodes that have an image cached are also kept by image. When the best
node of the first group lacks the job's image, the engine looks in that group for the best node
that has it: through the image's holders when they are fewer than the group's nodes (each is
gated and must share the group's rank prefix), else by walking the group's buckets for their
first passing holder. A job without an image (WASM), or whose best node has it, costs one set
lookup more.

:func:`reference_match` is the O(n) definition the index must agree with (tests, bench).

The gates, the rank and the answers live in :mod:`scheduler.matching.rules`, the index's
buckets and shapes in :mod:`scheduler.matching.index`; both are re-exported here.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Iterator
from types import MappingProxyType

from gridmarket.wire import ExecutorKind

from .index import (
    BANNED,
    FULL,
    INDEXED,
    NEW,
    Bucket,
    BucketKey,
    Candidates,
    Entry,
    IndexedNode,
    Shape,
    price_of,
)
from .models import (
    ClaimError,
    DuplicateNodeError,
    Gate,
    JobRequirements,
    NodeCapacity,
    UnknownJobError,
    UnknownNodeError,
)
from .rules import (
    DEFAULT_BAN_BELOW,
    DISK_CLASSES_GIB,
    DISK_FLOORS_MIB,
    Match,
    NodeLike,
    NodeView,
    NoMatch,
    RankKey,
    WhyNot,
    class_floor,
    disk_class,
    driver_gate,
    explain_nodes,
    first_failed_gate,
    floor_for,
    rank_key,
    reference_match,
    size_class,
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
        self._nodes: dict[str, IndexedNode] = {}
        self._claims: dict[str, IndexedNode] = {}  # job id -> node
        self._buckets: dict[BucketKey, Bucket] = {}
        # buckets by (currency, executor): currency None for the ETH floor, else a token
        self._regional: dict[tuple[str | None, ExecutorKind], list[Bucket]] = {}
        self._pooled: dict[tuple[str | None, ExecutorKind], list[Bucket]] = {}
        self._shapes: OrderedDict[Shape, Candidates] = OrderedDict()
        self._holders: dict[str, set[IndexedNode]] = {}  # image -> indexed nodes that have it
        self._takers: dict[str, set[IndexedNode]] = {}  # token -> indexed nodes with a floor in it
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
        node = IndexedNode(capacity)
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

    def _node(self, node_id: str) -> IndexedNode:
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
        driver = job.min_cuda is not None or job.min_compute_capability is not None
        shape = Shape.of(job)
        # a bucket in the job's own class needs exact comparisons, unless the job asks for
        # exactly the class floor (then every node of the class has enough)
        jc = shape.cclass if cores > class_floor(shape.cclass) else -1
        jr = shape.rclass if ram > class_floor(shape.rclass) else -1
        jd = shape.dclass if disk > DISK_FLOORS_MIB[shape.dclass] else -1
        for group in self._candidates(shape).groups:
            best: Entry | None = None
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
                        or (driver and driver_gate(node, job) is not None)
                    ):
                        continue
                    if best is None or entry < best:
                        best = entry
                    break
            if best is not None:
                image = job.image
                if image is not None and image not in best[3].images:
                    best = self._best_holder(group, job, image, best)
                return Match(job.job_id, best[2], rank_key(best[3], job))
        return NoMatch(job.job_id, self.explain(job) if explain else None)

    def _explain_by_node(self, job: JobRequirements, token: str | None) -> WhyNot:
        """:meth:`explain` node by node: for a job paid in ``token``, a node of the job's
        executor without a floor in it fails the token gate and the nodes with one are gated
        one by one; for a job requiring a CUDA version or compute capability (None), every
        indexed node of its executor is (the driver gates are not in the buckets' key)."""
        counts = dict.fromkeys(Gate, 0)
        counts[Gate.REPUTATION] = self._n_banned
        counts[Gate.SLOTS] = self._n_full
        counts[Gate.EXECUTOR] = self._n_indexed - self._n_by_executor[job.executor]
        pool = self._nodes.values() if token is None else self._takers.get(token, ())
        nodes = [n for n in pool if n.state == INDEXED and job.executor in n.executors]
        if token is not None:
            counts[Gate.TOKEN] = self._n_by_executor[job.executor] - len(nodes)
        total = len(self._nodes)
        return explain_nodes(job, nodes, counts, total=total, ban_below=self.ban_below)

    def _best_holder(
        self, group: list[Bucket], job: JobRequirements, image: str, best: Entry
    ) -> Entry:
        """The best node of ``group`` (the first group with a passing node; ``best`` is its best
        node, which lacks ``image``) that has ``image`` cached, else ``best``."""
        holders = self._holders.get(image)
        if not holders:
            return best
        found: Entry | None = None
        if len(holders) <= sum(len(b.entries) for b in group):
            prefix = rank_key(best[3], job)[:5]
            for node in holders:
                if first_failed_gate(node, job, ban_below=self.ban_below) is not None:
                    continue
                if rank_key(node, job)[:5] != prefix:  # fits worse (a later group)
                    continue
                price = floor_for(node, job)
                assert price is not None  # it passed the token gate
                entry: Entry = (price, -node.reputation, node.node_id, node)
                if found is None or entry < found:
                    found = entry
            return best if found is None else found
        cores, ram, disk, excluded = job.cpu_cores, job.ram_mib, job.disk_mib, job.excluded_node_ids
        max_price, min_vram = job.max_price_wei_per_hour, job.min_vram_mib
        for bucket in group:
            if bucket.vram_mib < min_vram:
                continue
            for entry in bucket.entries:
                if entry[0] > max_price:
                    break
                node = entry[3]
                if (
                    image not in node.images
                    or node.free_cores < cores
                    or node.free_ram_mib < ram
                    or node.free_disk_mib < disk
                    or (excluded and node.node_id in excluded)
                    or driver_gate(node, job) is not None
                ):
                    continue
                if found is None or entry < found:
                    found = entry
                break
        return best if found is None else found

    def explain(self, job: JobRequirements) -> WhyNot:
        """Count, per gate, the nodes that fail it first for ``job``.

        Costs one pass over the buckets, plus a pass over the nodes of the buckets where the
        job's exact cores or RAM decide; elsewhere prices are counted by bisection. A job
        paid in a token: one pass over the nodes with a floor in it.
        """
        if job.token is not None or job.min_cuda or job.min_compute_capability:
            return self._explain_by_node(job, job.token)
        counts = dict.fromkeys(Gate, 0)
        counts[Gate.REPUTATION] = self._n_banned
        counts[Gate.SLOTS] = self._n_full
        counts[Gate.EXECUTOR] = self._n_indexed - self._n_by_executor[job.executor]
        shape = Shape.of(job)
        g, cores, ram, disk = job.gpu_count, job.cpu_cores, job.ram_mib, job.disk_mib
        max_price, excluded = job.max_price_wei_per_hour, job.excluded_node_ids
        # in the job's own class, exact amounts decide, unless the job asks the class floor
        exact_c = cores > class_floor(shape.cclass)
        exact_r = ram > class_floor(shape.rclass)
        exact_d = disk > DISK_FLOORS_MIB[shape.dclass]
        n_cores = n_ram = n_price = n_disk = n_excluded = eligible = 0
        for bucket in self._regional.get((None, job.executor), ()):
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
                    k = bisect.bisect_right(entries, max_price, key=price_of)
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
    def _candidates(self, shape: Shape) -> Candidates:
        found = self._shapes.get(shape)
        if found is not None:
            return found
        found = Candidates()
        pool = self._pooled if shape.region is None else self._regional
        admitted = [b for b in pool.get((shape.token, shape.executor), ()) if shape.admits(b)]
        admitted.sort(key=lambda b: (shape.order(b), b.model, b.dclass))
        for bucket in admitted:
            found.add(shape.order(bucket), bucket)
        self._shapes[shape] = found
        if len(self._shapes) > self._max_shapes:
            self._shapes.popitem(last=False)
        return found

    def _bucket(self, key: BucketKey) -> Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = Bucket(key)
            self._n_empty += 1
            pool = self._pooled if bucket.region is None else self._regional
            pool.setdefault((bucket.token, bucket.executor), []).append(bucket)
            for shape, candidates in self._shapes.items():
                if shape.admits(bucket):
                    candidates.add(shape.order(bucket), bucket)
        return bucket

    def _index(self, node: IndexedNode) -> None:
        if node.suspended or node.reputation < self.ban_below:
            node.state = BANNED
            self._n_banned += 1
            return
        if node.free_slots <= 0:
            node.state = FULL
            self._n_full += 1
            return
        node.state = INDEXED
        self._n_indexed += 1
        for image in node.images:
            self._holders.setdefault(image, set()).add(node)
        cclass, rclass = size_class(node.free_cores), size_class(node.free_ram_mib)
        dclass = disk_class(node.free_disk_mib)
        entry: Entry = (node.price, -node.reputation, node.node_id, node)
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
                    None,  # the ETH floor
                )
                bucket = self._bucket(key)
                if not bucket.entries:
                    self._n_empty -= 1
                bisect.insort(bucket.entries, entry)
                node.entries.append((bucket, entry))
        if node.price_floors:  # and in each token's buckets at its floor in the token
            self._index_tokens(node, cclass, rclass, dclass)

    def _index_tokens(self, node: IndexedNode, cclass: int, rclass: int, dclass: int) -> None:
        for token, price in node.price_floors.items():
            self._takers.setdefault(token, set()).add(node)
            entry: Entry = (price, -node.reputation, node.node_id, node)
            for executor in node.executors:
                for region in (node.region, None):
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
                        token,
                    )
                    bucket = self._bucket(key)
                    if not bucket.entries:
                        self._n_empty -= 1
                    bisect.insort(bucket.entries, entry)
                    node.entries.append((bucket, entry))

    def _deindex(self, node: IndexedNode) -> None:
        if node.state == BANNED:
            self._n_banned -= 1
        elif node.state == FULL:
            self._n_full -= 1
        elif node.state == INDEXED:
            self._n_indexed -= 1
            for image in node.images:
                holders = self._holders.get(image)
                if holders is not None:
                    holders.discard(node)
                    if not holders:
                        del self._holders[image]
            for token in node.price_floors or ():
                takers = self._takers.get(token)
                if takers is not None:
                    takers.discard(node)
                    if not takers:
                        del self._takers[token]
            for bucket, entry in node.entries:
                entries = bucket.entries
                i = bisect.bisect_left(entries, entry)
                assert entries[i] is entry
                del entries[i]
                if not entries:
                    self._n_empty += 1
                if bucket.region is not None and bucket.token is None:  # once per executor
                    self._n_by_executor[bucket.executor] -= 1
            node.entries.clear()
        node.state = NEW
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
            "images": len(self._holders),
            "tokens": len(self._takers),
        }
