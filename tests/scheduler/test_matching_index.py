"""The index agrees with the O(n) definition under any sequence of registry changes.

A hypothesis state machine adds, updates and removes nodes and claims and releases jobs on a
MatchingEngine; after every step, for a few jobs, the engine's match must be the node that
``reference_match`` (gates + rank over every node) picks, and its "why not" counts must be
the first failed gate of every node. Small value domains make ties, shared buckets and class
boundaries frequent. Nodes draw ERC-20 price floors and jobs a token to be paid in (escrow v4),
so the currency buckets and the token gate are checked the same way.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gridmarket.tiers import TIERS
from scheduler.matching import (
    ExecutorKind,
    GpuSpec,
    JobRequirements,
    Match,
    MatchingEngine,
    NodeCapacity,
    first_failed_gate,
    reference_match,
)

GIB = 1024
NODE_IDS = [f"n{i:02d}" for i in range(14)]
REGIONS = ["us", "eu-west", "in"]
GPU_CHOICES = [
    None,
    ("rtx-3060", 12288),
    ("rtx-4070", 12282),
    ("rtx-4090", 24564),
    ("rtx-3090", 24576),
    ("a100-80gb", 81920),
]
TUSD = "0x" + "7a" * 20
EURC = "0x" + "e0" * 20
FLOOR_CHOICES = [{}, {}, {TUSD: 100}, {TUSD: 150, EURC: 40}, {EURC: 100}, {TUSD: 300}]
"""Token floors (escrow v4): a token job goes only to the nodes with a floor in its token."""
EXECUTOR_SETS = [
    frozenset({ExecutorKind.DOCKER}),
    frozenset({ExecutorKind.WASM}),
    frozenset({ExecutorKind.DOCKER, ExecutorKind.WASM}),
]


@st.composite
def capacities(draw: st.DrawFn, node_id: str) -> NodeCapacity:
    gpu_choice = draw(st.sampled_from(GPU_CHOICES))
    gpu = None
    if gpu_choice is not None:
        model, vram = gpu_choice
        gpu = GpuSpec.from_tier(TIERS[model], vram_mib=vram, count=draw(st.sampled_from([1, 2, 4])))
        gpu = replace(  # what its driver reported (None: an agent that did not say)
            gpu,
            cuda=draw(st.sampled_from([None, (11, 8), (12, 2), (12, 4), (12, 4)])),
            compute_capability=draw(st.sampled_from([None, (7, 5), (8, 6), (8, 9), (8, 9)])),
        )
    return NodeCapacity(
        node_id=node_id,
        region=draw(st.sampled_from(REGIONS)),
        price_floor_wei_per_hour=draw(st.sampled_from([50, 100, 100, 150, 300])),
        cpu_cores=draw(st.sampled_from([2, 4, 6, 8, 12, 16])),
        ram_mib=draw(st.sampled_from([8 * GIB - 300, 8 * GIB, 16 * GIB - 200, 24 * GIB, 64 * GIB])),
        disk_mib=draw(st.sampled_from([0, 15 * GIB, 20 * GIB, 60 * GIB, 100 * GIB, 700 * GIB])),
        gpu=gpu,
        executors=draw(st.sampled_from(EXECUTOR_SETS)),
        slots=draw(st.sampled_from([1, 1, 2, 3])),
        reputation=draw(st.sampled_from([0.1, 0.5, 0.5, 0.8, 0.9])),
        suspended=draw(st.integers(0, 9)) == 0,
        price_floors=draw(st.sampled_from(FLOOR_CHOICES)),
    )


@st.composite
def jobs(draw: st.DrawFn) -> JobRequirements:
    g = draw(st.sampled_from([0, 0, 1, 1, 2, 4]))
    return JobRequirements(
        job_id=f"j{draw(st.integers(0, 10_000))}",
        executor=draw(
            st.sampled_from([ExecutorKind.DOCKER, ExecutorKind.DOCKER, ExecutorKind.WASM])
        ),
        gpu_count=g,
        min_vram_mib=draw(st.sampled_from([0, 8 * GIB, 12 * GIB, 12285, 20 * GIB, 24570]))
        if g
        else 0,
        gpu_models=(
            draw(
                st.sampled_from(
                    [None, None, frozenset({"rtx-4090"}), frozenset({"rtx-3060", "a100-80gb"})]
                )
            )
            if g
            else None
        ),
        cpu_cores=draw(st.sampled_from([1, 2, 3, 4, 5, 8, 12])),
        ram_mib=draw(st.sampled_from([512, 4 * GIB, 8 * GIB, 10 * GIB, 16 * GIB, 20 * GIB])),
        disk_mib=draw(st.sampled_from([0, 10 * GIB, 17 * GIB, 20 * GIB, 50 * GIB, 600 * GIB])),
        region=draw(st.sampled_from([None, None, *REGIONS])),
        max_price_wei_per_hour=draw(st.sampled_from([40, 100, 149, 150, 1000])),
        excluded_node_ids=frozenset(draw(st.lists(st.sampled_from(NODE_IDS), max_size=2))),
        token=draw(st.sampled_from([None, None, TUSD, EURC])),
        min_cuda=draw(st.sampled_from([None, None, (12, 2), (12, 3)])) if g else None,
        min_compute_capability=draw(st.sampled_from([None, None, (8, 0), (8, 9)])) if g else None,
    )


class IndexAgreesWithBruteForce(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.engine = MatchingEngine(ban_below=0.2)
        self.claims: dict[str, str] = {}
        self.counter = 0

    @rule(data=st.data(), node_id=st.sampled_from(NODE_IDS))
    def add_or_update(self, data: st.DataObject, node_id: str) -> None:
        capacity = data.draw(capacities(node_id))
        if node_id in self.engine:
            self.engine.update_node(capacity)
        else:
            self.engine.add_node(capacity)

    @rule(node_id=st.sampled_from(NODE_IDS))
    def remove(self, node_id: str) -> None:
        if node_id in self.engine:
            held = self.engine.remove_node(node_id)
            assert held == {j for j, n in self.claims.items() if n == node_id}
            for job_id in held:
                del self.claims[job_id]

    @rule(requirements=jobs())
    def claim_best(self, requirements: JobRequirements) -> None:
        self.counter += 1
        requirements = replace(requirements, job_id=f"claim-{self.counter}")
        found = self.engine.match_and_claim(requirements)
        if isinstance(found, Match):
            self.claims[requirements.job_id] = found.node_id

    @precondition(lambda self: bool(self.claims))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.claims)))
        assert self.engine.release(job_id) == self.claims.pop(job_id)

    @rule(requirements=st.lists(jobs(), min_size=1, max_size=4))
    def match_agrees(self, requirements: list[JobRequirements]) -> None:
        views = list(self.engine.nodes())
        for job in requirements:
            found = self.engine.match(job)
            expected = reference_match(views, job, ban_below=0.2)
            assert (found.node_id if isinstance(found, Match) else None) == expected
            report = self.engine.explain(job)
            gates = Counter(first_failed_gate(v, job, ban_below=0.2) for v in views)
            assert report.eligible == gates.pop(None, 0)
            assert {g: n for g, n in report.eliminated.items() if n} == dict(gates)
            assert report.total_nodes == len(views)

    @invariant()
    def free_capacity_is_consistent(self) -> None:
        for view in self.engine.nodes():
            assert view.free_slots >= 0 and view.free_gpus >= 0
            assert view.jobs == {j for j, n in self.claims.items() if n == view.node_id}


IndexAgreesWithBruteForce.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestIndexAgreesWithBruteForce = IndexAgreesWithBruteForce.TestCase
