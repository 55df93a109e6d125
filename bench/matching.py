"""Matching latency and fit: the indexed engine against the seeds' naive scan.

    .venv/bin/python bench/matching.py [--sizes 1000,10000,100000] [--matches 5000] [--seed 7]
                                       [--pattern waiting|registry|both]

Two patterns, each against the published allocator's scan in the same run:

**waiting** (the production path, ``scheduler/dispatch.py``): the engine holds only the nodes
parked in a long poll. A node's poll is ``add_node`` (with the capacity it has free), a match
is ``match(job, explain=False)`` (as a dispatch round asks) then ``remove_node`` of the winner
(its poll is answered; the dispatcher removes it). Each timed cycle is one job arriving: match,
remove the winner, and the winner's next poll (``add_node``, same capacity): the waiting set
stays at 1k/10k/100k nodes. The peer's cycle over the same waiting set: scan every waiting
node (+10 VRAM fits, +5 cores fit, first highest wins), remove the winner, add it back (a
dict, so the removal and the add are O(1): only the scan is the peer's).

**registry** (the older figure, an easier path than production's): a fixed registry of all
nodes, half of the capacity claimed, then ``match`` + ``claim`` + ``release``.

For each fleet size it builds a fleet with a realistic tier mix (RTX 4090/3090/4070/3060 and
CPU-only rigs, plus datacenter cards), claims background jobs until about half of the capacity
is busy, then times ``match`` on a realistic job mix (``time.perf_counter_ns``; each matched job
is claimed and released again so the state stays steady; misses, with their "why not"
explanation, are timed too). It also times 50 jobs that offer 1 wei (every node too dear): a
miss with its why-not report, and with ``explain=False``.

The baseline is the seeds' published algorithm: scan every idle node, score it +10 if its VRAM
fits and +5 if its cores fit, first highest score wins.

Fit is measured on a sample of jobs against an O(n) brute force over the same state:
* over-provisioned: share of GPU jobs (that some node could take) placed on a node whose VRAM
  class (gridmarket.tiers.VRAM_CLASSES_GIB) is above the smallest VRAM class among the nodes
  that pass every gate;
* invalid: share of jobs placed on a node that fails a hard gate (the naive scan only looks at
  VRAM and cores), or not placed although a node could take them;
* agrees: the engine's choice equals scheduler.matching.reference_match's.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from gridmarket.tiers import REGIONS, TIERS, vram_class
from gridmarket.wire import ExecutorKind
from scheduler.matching import (
    DEFAULT_BAN_BELOW,
    GpuSpec,
    JobRequirements,
    Match,
    MatchingEngine,
    NodeCapacity,
    NodeView,
    first_failed_gate,
    reference_match,
)
from scheduler.matching.engine import disk_class

GIB = 1024
BASE_RATE = 10**14  # wei per GPU-hour at multiplier 1.0

# weight, tier key, GPUs, reported VRAM MiB, core choices, RAM GiB choices, slots per node
FLEET_MIX: tuple[tuple[float, str, int, int, tuple[int, ...], tuple[int, ...], int], ...] = (
    (20, "rtx-4090", 1, 24564, (8, 12, 16, 24), (32, 64), 1),
    (18, "rtx-3090", 1, 24576, (8, 12, 16), (32, 64), 1),
    (14, "rtx-4070", 1, 12282, (6, 8, 12), (16, 32), 1),
    (16, "rtx-3060", 1, 12288, (4, 6, 8), (16, 32), 1),
    (15, "cpu", 0, 0, (4, 8, 16, 32, 64), (8, 16, 32, 64, 128), 2),
    (2, "rtx-4090", 2, 24564, (16, 24, 32), (64, 128), 2),
    (1, "rtx-3090", 2, 24576, (16, 24), (64, 128), 2),
    (2, "a100-80gb", 1, 81920, (16, 32), (128, 256), 1),
    (1, "a100-80gb", 8, 81920, (128, 256), (1024, 2048), 8),
    (2, "a100-40gb", 1, 40960, (16, 32), (128,), 1),
    (1, "h100-sxm", 8, 81559, (192, 224), (2048,), 8),
    (1, "h100-pcie", 1, 81559, (32,), (256,), 1),
    (2, "l40s", 1, 46068, (16, 32), (128, 256), 1),
    (2, "l4", 1, 23034, (8, 16), (64,), 1),
    (1.5, "t4", 1, 15360, (4, 8, 16), (16, 32, 64), 1),
    (1.5, "a10", 1, 23028, (8, 16, 30), (64, 128), 1),
    (0.5, "v100", 4, 32768, (32, 48), (256,), 4),
    (0.5, "h200", 8, 143771, (224,), (2048,), 8),
)
REGION_WEIGHTS = {
    "us": 30,
    "eu-west": 20,
    "eu-east": 10,
    "uk": 5,
    "ca": 5,
    "jp": 5,
    "kr": 4,
    "sg": 5,
    "au": 3,
    "br": 5,
    "in": 8,
}

# weight, name, executor, GPUs, min VRAM MiB, models, cores, RAM MiB, disk MiB, price x base
JOB_MIX: tuple[
    tuple[float, str, ExecutorKind, int, int, frozenset[str] | None, int, int, int, float], ...
] = (
    (15, "cpu-small", ExecutorKind.DOCKER, 0, 0, None, 2, 4 * GIB, 5 * GIB, 1.2),
    (5, "cpu-large", ExecutorKind.DOCKER, 0, 0, None, 16, 48 * GIB, 50 * GIB, 1.5),
    (5, "wasm", ExecutorKind.WASM, 0, 0, None, 1, 512, 1 * GIB, 1.0),
    (20, "infer-8g", ExecutorKind.DOCKER, 1, 8 * GIB, None, 4, 12 * GIB, 20 * GIB, 3.0),
    (15, "infer-11g", ExecutorKind.DOCKER, 1, 11 * GIB, None, 4, 12 * GIB, 20 * GIB, 3.0),
    (15, "llm-20g", ExecutorKind.DOCKER, 1, 20 * GIB, None, 8, 24 * GIB, 60 * GIB, 4.0),
    (6, "train-40g", ExecutorKind.DOCKER, 1, 38 * GIB, None, 8, 48 * GIB, 100 * GIB, 8.0),
    (4, "multi-2x22g", ExecutorKind.DOCKER, 2, 22 * GIB, None, 12, 48 * GIB, 100 * GIB, 4.0),
    (2, "multi-8x78g", ExecutorKind.DOCKER, 8, 78 * GIB, None, 64, 512 * GIB, 500 * GIB, 12.0),
    (
        5,
        "pinned-4090",
        ExecutorKind.DOCKER,
        1,
        20 * GIB,
        frozenset({"rtx-4090"}),
        4,
        16 * GIB,
        20 * GIB,
        4.0,
    ),
)


def build_fleet(n: int, rng: random.Random) -> list[NodeCapacity]:
    """``n`` nodes drawn from FLEET_MIX, regions and executors."""
    weights = [m[0] for m in FLEET_MIX]
    regions, region_w = list(REGION_WEIGHTS), list(REGION_WEIGHTS.values())
    executor_sets = (
        frozenset({ExecutorKind.DOCKER, ExecutorKind.WASM}),
        frozenset({ExecutorKind.DOCKER}),
        frozenset({ExecutorKind.WASM}),
    )
    nodes = []
    for i in range(n):
        _, key, count, vram, cores, ram_gib, slots = rng.choices(FLEET_MIX, weights)[0]
        region = rng.choices(regions, region_w)[0]
        tier = TIERS[key]
        floor = BASE_RATE * tier.price_multiplier * REGIONS[region].multiplier
        nodes.append(
            NodeCapacity(
                node_id=f"node-{i:06d}",
                region=region,
                price_floor_wei_per_hour=int(floor * rng.uniform(0.8, 1.25)),
                cpu_cores=rng.choice(cores),
                ram_mib=int(rng.choice(ram_gib) * GIB * rng.uniform(0.97, 0.99)),
                disk_mib=rng.randrange(100, 2000) * GIB,
                gpu=None if count == 0 else GpuSpec.from_tier(tier, vram_mib=vram, count=count),
                executors=rng.choices(executor_sets, (85, 12, 3))[0],
                slots=slots if count == 0 else max(1, count * slots // count),
                reputation=min(1.0, rng.betavariate(8, 2)),
                suspended=rng.random() < 0.01,
            )
        )
    return nodes


def build_jobs(
    n: int, rng: random.Random, node_ids: Sequence[str], tag: str
) -> list[JobRequirements]:
    """``n`` jobs drawn from JOB_MIX; 10% pinned to a region, 5% excluding a few nodes."""
    weights = [m[0] for m in JOB_MIX]
    regions, region_w = list(REGION_WEIGHTS), list(REGION_WEIGHTS.values())
    jobs = []
    for i in range(n):
        _, name, executor, g, vram, models, cores, ram, disk, price = rng.choices(JOB_MIX, weights)[
            0
        ]
        excluded = frozenset(rng.sample(node_ids, 3)) if rng.random() < 0.05 else frozenset()
        jobs.append(
            JobRequirements(
                job_id=f"{tag}-{i}-{name}",
                executor=executor,
                gpu_count=g,
                min_vram_mib=vram,
                gpu_models=models,
                cpu_cores=cores,
                ram_mib=ram,
                disk_mib=disk,
                region=rng.choices(regions, region_w)[0] if rng.random() < 0.10 else None,
                max_price_wei_per_hour=int(BASE_RATE * price * rng.uniform(0.7, 1.3)),
                excluded_node_ids=excluded,
            )
        )
    return jobs


def naive_match(idle: Iterable[tuple[str, int, int]], job: JobRequirements) -> str | None:
    """The seeds' algorithm: +10 if VRAM fits, +5 if cores fit, first highest wins."""
    best_score, chosen = -1, None
    need_vram, need_cores = job.min_vram_mib, job.cpu_cores
    for node_id, vram, cores in idle:
        s = (10 if vram >= need_vram else 0) + (5 if cores >= need_cores else 0)
        if s > best_score:
            best_score, chosen = s, node_id
    return chosen


def shape_of(job: JobRequirements) -> tuple[object, ...]:
    """What the engine caches candidates by (see scheduler.matching.index.Shape)."""
    return (
        job.executor,
        job.region,
        job.gpu_count,
        vram_class(job.min_vram_mib),
        job.gpu_models,
        job.cpu_cores.bit_length(),
        job.ram_mib.bit_length(),
        disk_class(job.disk_mib),
    )


def percentile(samples: Sequence[int], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000.0


@dataclass
class Fit:
    gpu_jobs: int = 0
    overprovisioned: int = 0
    jobs: int = 0
    invalid: int = 0
    agrees: int = 0

    def rate(self, part: int, whole: int) -> str:
        return f"{100.0 * part / whole:.1f}%" if whole else "n/a"


def fit_of(
    chosen: str | None,
    job: JobRequirements,
    views: dict[str, NodeView],
    feasible: list[NodeView],
    fit: Fit,
) -> None:
    fit.jobs += 1
    if chosen is None:
        fit.invalid += bool(feasible)
        return
    node = views[chosen]
    if first_failed_gate(node, job, ban_below=DEFAULT_BAN_BELOW) is not None:
        fit.invalid += 1
        return
    if job.gpu_count and feasible:
        fit.gpu_jobs += 1
        smallest = min(vram_class(v.vram_mib) for v in feasible)
        fit.overprovisioned += vram_class(node.vram_mib) > smallest


def run_size(n: int, matches: int, baseline_matches: int, sample: int, seed: int) -> dict[str, str]:
    rng = random.Random(seed + n)
    t_build = time.perf_counter()
    engine = MatchingEngine()
    fleet = build_fleet(n, rng)
    for capacity in fleet:
        engine.add_node(capacity)
    ids = [c.node_id for c in fleet]
    background = build_jobs(n, rng, ids, "bg")
    for job in background[: n // 2]:
        engine.match_and_claim(job)
    jobs = build_jobs(matches, rng, ids, "job")
    build_s = time.perf_counter() - t_build
    gc.collect()
    gc.freeze()  # the registry is long-lived: keep it out of the collector's generations

    # A running scheduler has its shape cache warm: one untimed pass over the jobs, timing
    # only the first match of each new job shape (it builds that shape's candidate list).
    cold_ns: list[int] = []
    seen: set[tuple[object, ...]] = set()
    for job in jobs:
        t0 = time.perf_counter_ns()
        engine.match(job)
        elapsed = time.perf_counter_ns() - t0
        shape = shape_of(job)
        if shape not in seen:
            seen.add(shape)
            cold_ns.append(elapsed)
    latencies, misses = [], 0
    claim_ns: list[int] = []
    for job in jobs:
        t0 = time.perf_counter_ns()
        found = engine.match(job)
        t1 = time.perf_counter_ns()
        latencies.append(t1 - t0)
        if isinstance(found, Match):
            engine.claim(job, found.node_id)
            engine.release(job.job_id)
            claim_ns.append(time.perf_counter_ns() - t1)
        else:
            misses += 1

    # Jobs nobody will take (offering 1 wei): a miss, with and without its why-not report.
    broke = [dataclasses.replace(job, max_price_wei_per_hour=1) for job in jobs[:50]]
    miss_ns, quiet_miss_ns = [], []
    for job in broke:
        t0 = time.perf_counter_ns()
        engine.match(job)
        t1 = time.perf_counter_ns()
        engine.match(job, explain=False)
        quiet_miss_ns.append(time.perf_counter_ns() - t1)
        miss_ns.append(t1 - t0)

    views = {v.node_id: v for v in engine.nodes()}
    idle = [(v.node_id, v.vram_mib, v.free_cores) for v in views.values() if v.free_slots > 0]
    naive_ns = []
    for job in jobs[:baseline_matches]:
        t0 = time.perf_counter_ns()
        naive_match(idle, job)
        naive_ns.append(time.perf_counter_ns() - t0)

    engine_fit, naive_fit = Fit(), Fit()
    for job in jobs[:sample]:
        feasible = [
            v
            for v in views.values()
            if first_failed_gate(v, job, ban_below=DEFAULT_BAN_BELOW) is None
        ]
        found = engine.match(job)
        engine_choice = found.node_id if isinstance(found, Match) else None
        engine_fit.agrees += engine_choice == reference_match(feasible, job)
        fit_of(engine_choice, job, views, feasible, engine_fit)
        fit_of(naive_match(idle, job), job, views, feasible, naive_fit)
    gc.unfreeze()

    e50, e99 = percentile(latencies, 0.50), percentile(latencies, 0.99)
    n50, n99 = percentile(naive_ns, 0.50), percentile(naive_ns, 0.99)
    stats = engine.stats()
    return {
        "nodes": f"{n:,}",
        "idle": f"{len(idle):,}",
        "buckets": f"{stats['buckets']:,}",
        "engine p50/p99 us": f"{e50:.1f} / {e99:.1f}",
        "engine max us": f"{max(latencies) / 1000:.0f}",
        "misses": f"{misses}/{len(jobs)}",
        "new-shape match p50/max us": (
            f"{percentile(cold_ns, 0.5):.0f} / {max(cold_ns) / 1000:.0f} (n={len(cold_ns)})"
        ),
        "miss: why-not / explain=False p50 us": (
            f"{percentile(miss_ns, 0.5):,.0f} / {percentile(quiet_miss_ns, 0.5):,.0f}"
        ),
        "claim+release p50 us": f"{statistics.median(claim_ns) / 1000:.1f}",
        "naive p50/p99 us": f"{n50:,.0f} / {n99:,.0f} (n={len(naive_ns)})",
        "speed-up p50/p99": f"{n50 / e50:,.0f}x / {n99 / e99:,.0f}x",
        "over-prov engine/naive": (
            f"{engine_fit.rate(engine_fit.overprovisioned, engine_fit.gpu_jobs)} / "
            f"{naive_fit.rate(naive_fit.overprovisioned, naive_fit.gpu_jobs)}"
        ),
        "invalid engine/naive": (
            f"{engine_fit.rate(engine_fit.invalid, engine_fit.jobs)} / "
            f"{naive_fit.rate(naive_fit.invalid, naive_fit.jobs)}"
        ),
        "agrees w/ brute force": f"{engine_fit.agrees}/{engine_fit.jobs}",
        "setup s": f"{build_s:.1f}",
    }


def run_waiting(n: int, cycles: int, baseline_cycles: int, seed: int) -> dict[str, str]:
    """The waiting-nodes pattern at ``n`` waiting nodes (see the module doc)."""
    rng = random.Random(seed + n)
    fleet = build_fleet(n, rng)
    ids = [c.node_id for c in fleet]
    jobs = build_jobs(cycles, rng, ids, "wait")
    by_id = {c.node_id: c for c in fleet}
    engine = MatchingEngine()
    t0 = time.perf_counter()
    for capacity in fleet:
        engine.add_node(capacity)
    fill_s = time.perf_counter() - t0
    gc.collect()
    gc.freeze()
    # a running scheduler has its shape cache warm: one untimed pass over the jobs (adding and
    # removing nodes leaves the cache as it is; only a new job shape builds a candidate list)
    for job in jobs:
        engine.match(job, explain=False)
    cycle_ns: list[int] = []
    match_ns: list[int] = []
    remove_ns: list[int] = []
    add_ns: list[int] = []
    misses = 0
    for job in jobs:
        t0 = time.perf_counter_ns()
        found = engine.match(job, explain=False)
        t1 = time.perf_counter_ns()
        match_ns.append(t1 - t0)
        if not isinstance(found, Match):
            misses += 1
            cycle_ns.append(t1 - t0)
            continue
        engine.remove_node(found.node_id)
        t2 = time.perf_counter_ns()
        engine.add_node(by_id[found.node_id])
        t3 = time.perf_counter_ns()
        remove_ns.append(t2 - t1)
        add_ns.append(t3 - t2)
        cycle_ns.append(t3 - t0)
    gc.unfreeze()
    waiting = {c.node_id: (c.node_id, c.gpu.vram_mib if c.gpu else 0, c.cpu_cores) for c in fleet}
    naive_ns = []
    for job in jobs[:baseline_cycles]:
        t0 = time.perf_counter_ns()
        chosen = naive_match(waiting.values(), job)
        if chosen is not None:
            entry = waiting.pop(chosen)
            waiting[chosen] = entry
        naive_ns.append(time.perf_counter_ns() - t0)
    e50, e99 = percentile(cycle_ns, 0.50), percentile(cycle_ns, 0.99)
    n50, n99 = percentile(naive_ns, 0.50), percentile(naive_ns, 0.99)
    return {
        "nodes": f"{n:,}",
        "waiting nodes (add_node each)": f"{len(engine):,} in {fill_s:.1f} s",
        "cycle p50/p99 us (match+remove+add)": f"{e50:.1f} / {e99:.1f}",
        "cycle max us": f"{max(cycle_ns) / 1000:.0f}",
        "match p50/p99 us": (f"{percentile(match_ns, 0.5):.1f} / {percentile(match_ns, 0.99):.1f}"),
        "remove_node p50/p99 us": (
            f"{percentile(remove_ns, 0.5):.1f} / {percentile(remove_ns, 0.99):.1f}"
        ),
        "add_node p50/p99 us": f"{percentile(add_ns, 0.5):.1f} / {percentile(add_ns, 0.99):.1f}",
        "misses": f"{misses}/{len(jobs)}",
        "peer scan cycle p50/p99 us": f"{n50:,.0f} / {n99:,.0f} (n={len(naive_ns)})",
        "speed-up p50/p99": f"{n50 / e50:,.0f}x / {n99 / e99:,.0f}x",
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--matches", type=int, default=5000, help="timed engine matches per size")
    parser.add_argument("--baseline-matches", type=int, default=0, help="0: sized to ~3 s/size")
    parser.add_argument("--sample", type=int, default=0, help="fit sample; 0: sized by fleet")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--pattern", choices=["waiting", "registry", "both"], default="both")
    args = parser.parse_args(argv)
    console = Console(width=140)
    started = time.perf_counter()
    load0 = os.getloadavg()[0]
    if args.pattern in ("waiting", "both"):
        wrows = []
        for n in (int(s) for s in args.sizes.split(",")):
            baseline = args.baseline_matches or min(args.matches, max(100, 30_000_000 // n // 10))
            wrows.append(run_waiting(n, args.matches, baseline, args.seed))
        wtable = Table(
            title="Waiting nodes (production): add_node per poll, remove_node per match, "
            "against the published scan (microseconds)"
        )
        wtable.add_column("measure")
        for row in wrows:
            wtable.add_column(row["nodes"] + " waiting", justify="right")
        for measure in wrows[0]:
            if measure != "nodes":
                wtable.add_row(measure, *(row[measure] for row in wrows))
        console.print(wtable)
        mark = " (PROVISIONAL: load > 1)" if max(load0, os.getloadavg()[0]) > 1 else ""
        console.print(f"load before/after: {load0:.2f} / {os.getloadavg()[0]:.2f}{mark}")
        if args.pattern == "waiting":
            return 0
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        baseline = args.baseline_matches or min(args.matches, max(100, 30_000_000 // n // 10))
        sample = args.sample or min(args.matches, max(100, 20_000_000 // n))
        console.print(
            f"[dim]{n:,} nodes: {args.matches} matches, baseline {baseline}, fit sample {sample}[/]"
        )
        rows.append(run_size(n, args.matches, baseline, sample, args.seed))
    table = Table(
        title="Registry (older, easier path): indexed engine vs naive scan (one match, us)"
    )
    table.add_column("measure")
    for row in rows:
        table.add_column(row["nodes"] + " nodes", justify="right")
    for measure in rows[0]:
        if measure != "nodes":
            table.add_row(measure, *(row[measure] for row in rows))
    console.print(table)
    console.print(
        "over-prov: share of GPU jobs placed on a node whose VRAM class is above the smallest "
        "VRAM class among the nodes that pass every gate (fit sample).\n"
        "invalid: share of jobs placed on a node failing a hard gate, or left unplaced although "
        "a node could take them. Engine latency includes misses (with their why-not).\n"
        f"Python {sys.version.split()[0]}, total {time.perf_counter() - started:.0f} s, "
        f"load before/after {load0:.2f} / {os.getloadavg()[0]:.2f}"
        + (" (PROVISIONAL: load > 1)" if max(load0, os.getloadavg()[0]) > 1 else "")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
