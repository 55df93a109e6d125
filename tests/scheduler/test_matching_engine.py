"""The matching engine: each gate, best fit, tie-breaks, claims, and why a job waits."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from scheduler.matching import (
    ClaimError,
    DuplicateNodeError,
    ExecutorKind,
    Gate,
    JobRequirements,
    Match,
    MatchingEngine,
    NodeCapacity,
    NoMatch,
    UnknownJobError,
    UnknownNodeError,
    first_failed_gate,
    reference_match,
)

from .factories import GIB, job, node


def engine_with(*nodes: NodeCapacity, ban_below: float = 0.2) -> MatchingEngine:
    engine = MatchingEngine(ban_below=ban_below)
    for capacity in nodes:
        engine.add_node(capacity)
    return engine


def chosen(engine: MatchingEngine, requirements: JobRequirements) -> str:
    found = engine.match(requirements)
    assert isinstance(found, Match), found
    return found.node_id


def why(engine: MatchingEngine, requirements: JobRequirements) -> Gate | None:
    found = engine.match(requirements)
    assert isinstance(found, NoMatch) and found.why is not None, found
    return found.why.top_gate


# --------------------------------------------------------------------------- gates
# Each case: a node that fails exactly one gate for the default job, the gate, and a node that
# differs only in that respect and passes.
GATE_CASES: list[tuple[Gate, dict[str, Any], dict[str, Any]]] = [
    (Gate.REPUTATION, {"reputation": 0.1}, {}),
    (Gate.REPUTATION, {"suspended": True}, {}),
    (Gate.EXECUTOR, {"executors": frozenset({ExecutorKind.WASM})}, {}),
    (Gate.REGION, {"region": "eu-west"}, {"region": "us"}),
    (Gate.GPU_COUNT, {"model": None}, {}),
    (Gate.CPU_CORES, {"cpu_cores": 2}, {}),
    (Gate.RAM, {"ram_mib": 4 * GIB}, {}),
    (Gate.PRICE, {"price_floor_wei_per_hour": 1001}, {"price_floor_wei_per_hour": 1000}),
    (Gate.DISK, {"disk_mib": 5 * GIB}, {}),
]


@pytest.mark.parametrize(("gate", "failing", "passing"), GATE_CASES, ids=lambda v: str(v))
def test_each_gate(gate: Gate, failing: dict[str, Any], passing: dict[str, Any]) -> None:
    requirements = job(region="us") if gate is Gate.REGION else job()
    bad = node("bad", **failing)
    engine = engine_with(bad)
    assert first_failed_gate(engine.node("bad"), requirements, ban_below=0.2) is gate
    assert why(engine, requirements) is gate
    good = node("good", **passing)
    assert chosen(engine_with(bad, good), requirements) == "good"


def test_gate_vram_per_gpu() -> None:
    small = node("small", "rtx-3060")
    assert why(engine_with(small), job(min_vram_mib=16 * GIB)) is Gate.VRAM
    # exact MiB, not the class: a 4090 reports 24564 MiB, less than 24 GiB
    assert why(engine_with(node("a", "rtx-4090")), job(min_vram_mib=24 * GIB)) is Gate.VRAM
    assert chosen(engine_with(node("a", "rtx-4090")), job(min_vram_mib=24564)) == "a"


def test_gate_gpu_count() -> None:
    one = node("one", "rtx-4090", count=1)
    two = node("two", "rtx-4090", count=2, slots=2)
    assert why(engine_with(one), job(gpu_count=2)) is Gate.GPU_COUNT
    assert chosen(engine_with(one, two), job(gpu_count=2)) == "two"


def test_gate_gpu_model_only_when_asked() -> None:
    engine = engine_with(node("n3090", "rtx-3090"))
    assert why(engine, job(gpu_models=frozenset({"rtx-4090"}))) is Gate.GPU_MODEL
    assert chosen(engine, job(gpu_models=frozenset({"rtx-4090", "rtx-3090"}))) == "n3090"
    assert chosen(engine, job()) == "n3090"


def test_gate_region_only_when_asked() -> None:
    engine = engine_with(node("eu", region="eu-west"))
    assert chosen(engine, job()) == "eu"
    assert chosen(engine, job(region="eu-west")) == "eu"
    assert why(engine, job(region="us")) is Gate.REGION


def test_gate_excluded_for_this_job_only() -> None:
    engine = engine_with(node("a"))
    assert why(engine, job(excluded_node_ids=frozenset({"a"}))) is Gate.EXCLUDED
    assert chosen(engine, job()) == "a"


def test_gate_free_slot() -> None:
    engine = engine_with(node("a"))
    engine.claim(job("first"), "a")
    assert why(engine, job("second")) is Gate.SLOTS
    engine.release("first")
    assert chosen(engine, job("second")) == "a"


def test_price_equal_to_offer_passes() -> None:
    engine = engine_with(node("a", price_floor_wei_per_hour=1000))
    assert chosen(engine, job(max_price_wei_per_hour=1000)) == "a"


def test_cpu_job_can_use_a_gpu_node_but_prefers_a_cpu_node() -> None:
    gpu_node = node("a-gpu", "rtx-4090", price_floor_wei_per_hour=10)
    assert chosen(engine_with(gpu_node), job(gpu_count=0)) == "a-gpu"
    cpu_node = node("z-cpu", None, price_floor_wei_per_hour=500)
    assert chosen(engine_with(gpu_node, cpu_node), job(gpu_count=0)) == "z-cpu"


def test_gpu_job_never_goes_to_a_cpu_node() -> None:
    assert why(engine_with(node("cpu", None)), job()) is Gate.GPU_COUNT


# --------------------------------------------------------------------------- best fit
def test_best_fit_over_first_fit_on_vram() -> None:
    engine = engine_with(
        node("a-4090", "rtx-4090", price_floor_wei_per_hour=50),  # first, cheaper, faster
        node("b-3060", "rtx-3060", price_floor_wei_per_hour=200),
    )
    # an 8 GiB job fits a 12 GiB card: the 24 GiB card stays free for jobs that need it
    assert chosen(engine, job(min_vram_mib=8 * GIB)) == "b-3060"
    assert chosen(engine, job(min_vram_mib=16 * GIB)) == "a-4090"


def test_best_fit_prefers_a_single_gpu_node_for_a_single_gpu_job() -> None:
    engine = engine_with(
        node("a-eight", "h100-sxm", count=8, slots=8, price_floor_wei_per_hour=10),
        node("b-one", "a100-80gb", count=1),
    )
    assert chosen(engine, job(min_vram_mib=70 * GIB)) == "b-one"


def test_best_fit_on_cores_and_ram() -> None:
    engine = engine_with(
        node("a-big", cpu_cores=64, ram_mib=256 * GIB, price_floor_wei_per_hour=10),
        node("b-small", cpu_cores=8, ram_mib=16 * GIB),
    )
    assert chosen(engine, job(cpu_cores=4, ram_mib=8 * GIB)) == "b-small"
    assert chosen(engine, job(cpu_cores=32, ram_mib=8 * GIB)) == "a-big"


def test_same_fit_faster_tier_first() -> None:
    engine = engine_with(node("a-3090", "rtx-3090"), node("b-4090", "rtx-4090"))
    assert chosen(engine, job(min_vram_mib=20 * GIB)) == "b-4090"


def test_same_fit_and_tier_cheaper_first_then_reputation_then_id() -> None:
    engine = engine_with(
        node("c", price_floor_wei_per_hour=90, reputation=0.5),
        node("a", price_floor_wei_per_hour=100, reputation=0.99),
        node("b", price_floor_wei_per_hour=90, reputation=0.7),
        node("d", price_floor_wei_per_hour=90, reputation=0.7),
    )
    assert chosen(engine, job()) == "b"  # cheapest, then best reputation, then smallest id
    engine.claim(job("x"), "b")
    assert chosen(engine, job()) == "d"
    engine.claim(job("y"), "d")
    assert chosen(engine, job()) == "c"


def test_ties_do_not_depend_on_insertion_order() -> None:
    capacities = [node(f"n{i}", price_floor_wei_per_hour=100) for i in range(20)]
    for seed in range(5):
        random.Random(seed).shuffle(capacities)
        assert chosen(engine_with(*capacities), job()) == "n0"


def test_rank_is_reported() -> None:
    found = engine_with(node("a", "rtx-4090")).match(job(min_vram_mib=23 * GIB))
    assert isinstance(found, Match)
    assert found.rank.spare_gpus == 0 and found.rank.vram_class_excess == 0
    assert found.rank.neg_speed == -100 and found.rank.node_id == "a"


# --------------------------------------------------------------------------- claims
def test_multi_slot_node_takes_jobs_while_resources_last() -> None:
    engine = engine_with(node("big", "a100-80gb", count=4, slots=3, cpu_cores=16))
    engine.claim(job("j1", gpu_count=2, cpu_cores=4), "big")
    assert engine.node("big").free_gpus == 2
    assert chosen(engine, job("j2", gpu_count=2, cpu_cores=4)) == "big"
    engine.claim(job("j2", gpu_count=2, cpu_cores=4), "big")
    assert why(engine, job("j3", gpu_count=1)) is Gate.GPU_COUNT
    assert chosen(engine, job("j3", gpu_count=0)) == "big"  # a slot and cores remain
    engine.claim(job("j3", gpu_count=0, cpu_cores=4), "big")
    assert why(engine, job("j4", gpu_count=0)) is Gate.SLOTS
    assert engine.release("j1") == "big"
    assert engine.node("big").free_gpus == 2 and engine.node("big").free_slots == 1
    assert engine.node("big").jobs == {"j2", "j3"}


def test_claim_checks_the_gates_and_the_job() -> None:
    engine = engine_with(node("a"), node("cheap-cpu", None))
    with pytest.raises(ClaimError, match="gpu_count"):
        engine.claim(job("j"), "cheap-cpu")
    engine.claim(job("j"), "a")
    with pytest.raises(ClaimError, match="already on node a"):
        engine.claim(job("j", gpu_count=0), "cheap-cpu")
    with pytest.raises(UnknownNodeError):
        engine.claim(job("k"), "nope")
    with pytest.raises(UnknownJobError):
        engine.release("k")
    assert engine.node_of("j") == "a"


def test_match_and_claim() -> None:
    engine = engine_with(node("a"))
    first = engine.match_and_claim(job("j1"))
    assert isinstance(first, Match) and engine.node_of("j1") == "a"
    assert isinstance(engine.match_and_claim(job("j2")), NoMatch)


def test_registry_errors() -> None:
    engine = engine_with(node("a"))
    with pytest.raises(DuplicateNodeError):
        engine.add_node(node("a"))
    with pytest.raises(UnknownNodeError):
        engine.update_node(node("b"))
    with pytest.raises(UnknownNodeError):
        engine.remove_node("b")
    with pytest.raises(KeyError):  # UnknownNodeError is a KeyError
        engine.node("b")
    assert len(engine) == 1 and "a" in engine


def test_update_node_reindexes_and_keeps_claims() -> None:
    engine = engine_with(
        node("a", price_floor_wei_per_hour=100), node("b", price_floor_wei_per_hour=200)
    )
    assert chosen(engine, job()) == "a"
    engine.update_node(node("a", price_floor_wei_per_hour=300))
    assert chosen(engine, job()) == "b"
    engine.update_node(node("b", suspended=True))
    assert chosen(engine, job()) == "a"
    engine.claim(job("held"), "a")
    engine.update_node(node("a", price_floor_wei_per_hour=50, slots=2))
    assert engine.node("a").jobs == {"held"}
    assert chosen(engine, job("next", gpu_count=0)) == "a"


def test_remove_node_returns_its_jobs() -> None:
    engine = engine_with(node("a", slots=2, count=2))
    engine.claim(job("j1"), "a")
    engine.claim(job("j2"), "a")
    assert engine.remove_node("a") == {"j1", "j2"}
    with pytest.raises(UnknownJobError):
        engine.node_of("j1")
    assert engine.stats()["claims"] == 0 and len(engine) == 0


def test_ban_line_is_configurable() -> None:
    shaky = node("a", reputation=0.4)
    assert chosen(engine_with(shaky), job()) == "a"
    assert why(engine_with(shaky, ban_below=0.5), job()) is Gate.REPUTATION


# --------------------------------------------------------------------------- why not
def test_why_not_counts_each_node_under_its_first_failed_gate() -> None:
    engine = engine_with(
        node("wasm-only", executors=frozenset({ExecutorKind.WASM})),
        node("small-1", "rtx-3060"),
        node("small-2", "rtx-3060"),
        node("small-3", "rtx-3060", price_floor_wei_per_hour=10_000),  # VRAM comes first
        node("dear", "rtx-4090", price_floor_wei_per_hour=10_000),
        node("banned", "rtx-4090", reputation=0.0),
    )
    found = engine.match(job("big", min_vram_mib=20 * GIB))
    assert isinstance(found, NoMatch) and found.why is not None
    counts = {gate: n for gate, n in found.why.eliminated.items() if n}
    assert counts == {Gate.REPUTATION: 1, Gate.EXECUTOR: 1, Gate.VRAM: 3, Gate.PRICE: 1}
    assert found.why.top_gate is Gate.VRAM
    assert found.why.total_nodes == 6 and found.why.eligible == 0
    assert "vram eliminates the most (3 of 6)" in found.why.message()
    assert engine.match(job("big", min_vram_mib=20 * GIB), explain=False) == NoMatch("big", None)


def test_why_not_with_no_nodes_and_explain_with_eligible_nodes() -> None:
    empty = MatchingEngine().match(job())
    assert isinstance(empty, NoMatch) and empty.why is not None
    assert empty.why.top_gate is None and empty.why.message() == "no node is registered"
    engine = engine_with(node("a"), node("b"), node("c", None))
    report = engine.explain(job())
    assert report.eligible == 2 and report.eliminated[Gate.GPU_COUNT] == 1
    assert report.message() == "2 of 3 nodes can take the job now"


def test_job_validation() -> None:
    with pytest.raises(ValueError, match="gpu_count"):
        JobRequirements(job_id="j", min_vram_mib=1024)
    with pytest.raises(ValueError, match="cpu_cores"):
        job(cpu_cores=0)
    with pytest.raises(ValueError, match="reputation"):
        node("a", reputation=1.5)
    with pytest.raises(ValueError, match="executor"):
        node("a", executors=frozenset())
    assert replace(job(), region="us").region == "us"


def test_best_across_buckets_of_equal_fit() -> None:
    # same fit, in different index buckets (disk class, region): the cheapest wins wherever
    engine = engine_with(node("a", disk_mib=50 * GIB, price_floor_wei_per_hour=200))
    assert chosen(engine, job()) == "a"  # the job's shape is now cached
    engine.add_node(node("b", disk_mib=700 * GIB, price_floor_wei_per_hour=100))
    engine.add_node(node("c", disk_mib=20 * GIB, region="in", price_floor_wei_per_hour=150))
    assert chosen(engine, job()) == "b"
    engine.claim(job("on-b"), "b")
    assert chosen(engine, job()) == "c"
    assert chosen(engine, job(region="us")) == "a"


def test_exact_amounts_inside_the_jobs_own_class() -> None:
    engine = engine_with(
        node("a-8", cpu_cores=8, price_floor_wei_per_hour=10),
        node("b-12", cpu_cores=12, price_floor_wei_per_hour=20),
    )
    assert chosen(engine, job(cpu_cores=8)) == "a-8"
    assert chosen(engine, job(cpu_cores=10)) == "b-12"  # both in class 8-15; only b has 10
    engine = engine_with(node("a", disk_mib=300 * GIB), node("b", disk_mib=450 * GIB))
    assert chosen(engine, job(disk_mib=400 * GIB)) == "b"  # class 200-500 GiB
    assert why(engine, job(disk_mib=460 * GIB)) is Gate.DISK


# --------------------------------------------------------------------------- long-lived index


def moving(step: int, node_id: str = "mover") -> NodeCapacity:
    """A node whose free resources move to another bucket at each step (35 distinct ones), with
    at most 16 cores."""
    return node(node_id, cpu_cores=2 ** (step % 5), ram_mib=GIB * 2 ** (step % 7 + 1))


@pytest.mark.parametrize("compact_after", [8, 10**9])
def test_empty_buckets_are_dropped_as_nodes_move(compact_after: int) -> None:
    engine = MatchingEngine(compact_after=compact_after)
    engine.add_node(node("still", cpu_cores=64, ram_mib=256 * GIB))
    engine.add_node(moving(0))
    live = engine.stats()["buckets"]  # 2 nodes x 2 executors x (region, pooled)
    assert live == 8 and engine.stats()["empty_buckets"] == 0
    for step in range(1, 200):
        engine.update_node(moving(step))
        stats = engine.stats()
        assert stats["buckets"] - stats["empty_buckets"] == live
        big = job(f"j{step}", cpu_cores=32)  # only "still" has that many
        assert chosen(engine, big) == "still"
        small = job(f"k{step}", cpu_cores=1, ram_mib=GIB)
        assert chosen(engine, small) == reference_match(engine.nodes(), small)
    if compact_after == 8:  # bounded: at most compact_after empty ones at any time
        assert engine.stats()["empty_buckets"] <= 8
    else:  # never compacted: every bucket the mover passed through is still there
        assert engine.stats()["empty_buckets"] >= 30 * 4
    empty = engine.stats()["empty_buckets"]
    assert engine.compact() == empty
    assert engine.stats()["buckets"] == live and engine.stats()["empty_buckets"] == 0
    assert chosen(engine, job("after", cpu_cores=32)) == "still"
