"""What a node offers while its running jobs hold part of it (``dispatch.free_capacity``)."""

from __future__ import annotations

from typing import Any

from gridmarket.wire import JobSpec, NodeCapacityIn
from scheduler.dispatch import free_capacity
from scheduler.matching.reputation import ReputationState
from scheduler.store import NodeRow

CAP = NodeCapacityIn(
    cpu_cores=4, ram_mib=8192, disk_mib=100_000, region="us", executors=["docker"], slots=4
)


def node(slots: int = 4) -> NodeRow:
    return NodeRow(
        node_id="n-1",
        wallet="0x" + "11" * 20,
        name="n",
        capacity=CAP.model_copy(update={"slots": slots}),
        tier="cpu",
        region="us",
        slots=slots,
        running=0,
        status="online",
        agent_version="test",
        registered_at=0.0,
        last_seen=0.0,
        reputation=ReputationState(),
        jobs_done=0,
        jobs_failed=0,
        suspended=False,
    )


def spec(cores: int, ram_mib: int) -> JobSpec:
    doc: dict[str, Any] = {
        "executor": "docker",
        "image": "busybox:1",
        "command": ["true"],
        "resources": {"cpu_cores": cores, "ram_mib": ram_mib},
    }
    return JobSpec.model_validate(doc)


def offer(running: list[JobSpec], slots: int = 4) -> Any:
    return free_capacity(node(slots), running, now=0.0, reputation=1.0, banned=False)


def test_free_capacity_is_what_running_jobs_leave() -> None:
    cap = offer([spec(1, 1024), spec(2, 2048)])
    assert cap is not None
    assert (cap.cpu_cores, cap.ram_mib, cap.slots) == (1, 8192 - 3072, 2)


def test_a_node_whose_cores_are_all_taken_offers_nothing() -> None:
    # before: free cores were floored at 1, so a full node still took 1-core jobs
    assert offer([spec(2, 1024), spec(2, 1024)]) is None


def test_a_node_whose_ram_is_all_taken_offers_nothing() -> None:
    assert offer([spec(1, 8192)]) is None


def test_a_node_whose_slots_are_all_taken_offers_nothing() -> None:
    assert offer([spec(1, 512)], slots=1) is None
