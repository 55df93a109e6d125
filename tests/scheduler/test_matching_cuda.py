"""The CUDA and compute capability gates (issue 29, 6): a job requiring ``min_cuda`` or
``min_compute_capability`` matches only nodes that report at least those; a node that did not
report them (an old agent) is unknown and not matched; the explanation names the requirement
and what the nodes report. The index's walk and the O(n) reference must agree."""

from __future__ import annotations

import dataclasses

import pytest

from gridmarket.wire import GpuGroup, JobSpec, NodeCapacityIn
from scheduler.dispatch import free_capacity
from scheduler.matching import Gate, Match, MatchingEngine, NoMatch, reference_match
from scheduler.matching.reputation import ReputationState
from scheduler.store import NodeRow

from .factories import gpus, job, node

TOKEN = "0x" + "ab" * 20


def driver_node(
    node_id: str, cuda: tuple[int, int] | None, cc: tuple[int, int] | None = (8, 9), **kw: object
):  # type: ignore[no-untyped-def]
    gpu = dataclasses.replace(gpus("rtx-4090"), cuda=cuda, compute_capability=cc)
    return node(node_id, gpu=gpu, **kw)


def engine_of(*nodes: object) -> MatchingEngine:
    engine = MatchingEngine()
    for n in nodes:
        engine.add_node(n)  # type: ignore[arg-type]
    return engine


def test_a_job_needing_cuda_12_2_is_not_matched_to_a_node_with_11_8() -> None:
    engine = engine_of(driver_node("old", (11, 8)))
    found = engine.match(job(min_cuda=(12, 2)))
    assert isinstance(found, NoMatch) and found.why is not None
    assert found.why.eliminated[Gate.CUDA] == 1 and found.why.eligible == 0
    message = found.why.message()
    assert "cuda eliminates the most (1 of 1)" in message
    assert "the job requires CUDA >= 12.2; nodes report 11.8 (1)" in message


def test_a_job_needing_cuda_12_2_is_matched_to_a_node_with_12_4() -> None:
    # the 11.8 node is cheaper and would rank first: the walk must skip it, not stop
    engine = engine_of(
        driver_node("old", (11, 8), price_floor_wei_per_hour=1),
        driver_node("new", (12, 4), price_floor_wei_per_hour=500),
    )
    want = job(min_cuda=(12, 2))
    found = engine.match(want)
    assert isinstance(found, Match) and found.node_id == "new"
    assert reference_match(engine.nodes(), want) == "new"
    assert engine.explain(want).eligible == 1
    # without the requirement the cheaper node wins, as before
    assert engine.match(job()).node_id == "old"  # type: ignore[union-attr]


def test_a_node_that_did_not_report_is_not_matched_to_a_requiring_job() -> None:
    engine = engine_of(driver_node("legacy", None, None), node("plain"))
    found = engine.match(job(min_cuda=(12, 0)))
    assert isinstance(found, NoMatch) and found.why is not None
    assert found.why.eliminated[Gate.CUDA] == 2
    assert "nodes report unknown (2)" in found.why.message()
    # a job that requires neither still goes to it
    assert isinstance(engine.match(job()), Match)


def test_compute_capability_gate_and_its_reason() -> None:
    engine = engine_of(
        driver_node("turing", (12, 4), (7, 5), price_floor_wei_per_hour=1),
        driver_node("ampere", (12, 4), (8, 6), price_floor_wei_per_hour=900),
    )
    assert engine.match(job(min_compute_capability=(8, 0))).node_id == "ampere"  # type: ignore[union-attr]
    found = engine.match(job(min_compute_capability=(9, 0)))
    assert isinstance(found, NoMatch) and found.why is not None
    assert found.why.eliminated[Gate.COMPUTE_CAPABILITY] == 2
    assert (
        "the job requires compute capability >= 9.0; nodes report 7.5 (1), 8.6 (1)"
        in found.why.message()
    )


def test_minor_versions_compare_as_numbers() -> None:
    engine = engine_of(driver_node("n", (12, 10)))
    assert isinstance(engine.match(job(min_cuda=(12, 9))), Match)
    assert isinstance(engine.match(job(min_cuda=(12, 11))), NoMatch)


def test_driver_gates_come_after_vram_and_before_cores() -> None:
    engine = engine_of(driver_node("small", (11, 0), cpu_cores=1))
    why = engine.explain(job(min_cuda=(12, 0), min_vram_mib=48 * 1024))
    assert why.eliminated[Gate.VRAM] == 1 and why.eliminated[Gate.CUDA] == 0
    why = engine.explain(job(min_cuda=(12, 0)))
    assert why.eliminated[Gate.CUDA] == 1 and why.eliminated[Gate.CPU_CORES] == 0


def test_a_token_job_with_a_cuda_requirement() -> None:
    engine = engine_of(
        driver_node("old", (11, 8), price_floors={TOKEN: 5}),
        driver_node("new", (12, 4), price_floors={TOKEN: 5}),
        driver_node("eth-only", (12, 4)),
    )
    want = job(min_cuda=(12, 2), token=TOKEN)
    assert engine.match(want).node_id == "new"  # type: ignore[union-attr]
    engine.claim(want, "new")
    why = engine.explain(dataclasses.replace(want, job_id="j2"))
    assert why.eliminated[Gate.TOKEN] == 1 and why.eliminated[Gate.CUDA] == 1
    assert "nodes report 11.8 (1)" in why.message()


def test_a_cpu_job_cannot_carry_driver_requirements() -> None:
    with pytest.raises(ValueError, match="need gpu_count > 0"):
        job(gpu_count=0, min_cuda=(12, 0))


def test_dispatch_carries_what_the_node_reported() -> None:
    reported = GpuGroup(
        model="rtx-4090", vram_mib=24564, count=2, cuda_version="12.4", compute_capability="8.9"
    )
    cap = NodeCapacityIn(
        gpu=reported, cpu_cores=8, ram_mib=8192, disk_mib=10_000, region="us", executors=["docker"]
    )
    row = NodeRow(
        node_id="n-1", wallet="0x" + "11" * 20, name="n", capacity=cap, tier="rtx-4090",
        region="us", slots=1, running=0, status="online", agent_version="t", registered_at=0.0,
        last_seen=0.0, reputation=ReputationState(), jobs_done=0, jobs_failed=0, suspended=False,
    )  # fmt: skip
    free = free_capacity(row, [], now=0.0, reputation=1.0, banned=False)
    assert free is not None and free.cuda == (12, 4) and free.compute_capability == (8, 9)
    legacy = row.capacity.model_copy(
        update={"gpu": GpuGroup(model="rtx-4090", vram_mib=24564, count=2)}
    )
    free = free_capacity(
        dataclasses.replace(row, capacity=legacy), [], now=0.0, reputation=1.0, banned=False
    )
    assert free is not None and free.cuda is None and free.compute_capability is None


def test_spec_requirements_read_as_engine_versions() -> None:
    spec = JobSpec.model_validate(
        {
            "executor": "docker",
            "image": "busybox",
            "resources": {"gpu_count": 1, "min_cuda": "12.2", "min_compute_capability": "8.0"},
        }
    )
    assert spec.resources.min_cuda == "12.2"
    from gridmarket.cuda import as_version

    assert as_version(spec.resources.min_cuda) == (12, 2)
    assert as_version(spec.resources.min_compute_capability) == (8, 0)
