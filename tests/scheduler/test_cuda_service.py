"""CUDA requirements through the scheduler (uvicorn, anvil, the js-ipfs daemon, SQLite): a node's
signed registration carries what its driver reported and the node view shows it; a job requiring
a newer CUDA than any node reports waits, and its reason names the requirement and the nodes'
values (``unknown`` for a node that did not report); once the node reports enough, it gets the
job."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gridmarket.chain import EscrowClient
from gridmarket.ipfs import IpfsStore
from gridmarket.wire import API, GpuGroup, JobSpec, NodeCapacityIn

from ..conftest import Devnet
from .harness import CPU_CAP, Provider, Server, fresh_escrow, register_on_chain, scheduler
from .harness import submit_job as fund

SPEC = JobSpec.model_validate(
    {
        "executor": "docker",
        "image": "busybox:1",
        "command": ["true"],
        "resources": {"gpu_count": 1, "min_cuda": "12.2", "min_compute_capability": "8.0"},
    }
)


def gpu_cap(**facts: str) -> NodeCapacityIn:
    gpu = GpuGroup(model="rtx-4090", name="NVIDIA GeForce RTX 4090", vram_mib=24564, count=1)
    return CPU_CAP.model_copy(update={"gpu": gpu.model_copy(update=facts)})


@pytest.fixture
def grid(
    tmp_path: Path, devnet: Devnet, ipfs_daemon: Any
) -> Iterator[tuple[Server, EscrowClient, IpfsStore]]:
    deployment, client = fresh_escrow(devnet)
    register_on_chain(client, devnet.providers[0])
    register_on_chain(client, devnet.providers[1])
    store = IpfsStore(ipfs_daemon.api_addr)
    with scheduler(
        tmp_path, deployment, devnet, ipfs_daemon.api_addr,
        database_url=f"sqlite:///{tmp_path / 'scheduler.db'}",
    ) as s:  # fmt: skip
        yield s, client, store
    store.close()


def wait_reason(server: Server, job_id: str, words: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        job = server.get(API.JOB.format(job_id=job_id)).json()
        reason = str(job.get("reason") or "")
        if job.get("state") == "queued" and words in reason:
            return reason
        assert time.monotonic() < deadline, job
        time.sleep(0.2)


def test_a_job_waits_for_a_node_with_the_cuda_it_requires(
    grid: tuple[Server, EscrowClient, IpfsStore], devnet: Devnet
) -> None:
    server, client, ipfs = grid
    old = Provider(devnet.providers[0], server, name="old", capacity=gpu_cap(
        driver_version="520.61.05", cuda_version="11.8", compute_capability="8.9"
    ))  # fmt: skip
    legacy = Provider(devnet.providers[1], server, name="legacy", capacity=gpu_cap())
    assert old.register().status_code == 200 and legacy.register().status_code == 200
    view = server.get(API.NODE.format(node_id=old.node_id)).json()
    assert view["capacity"]["gpu"]["cuda_version"] == "11.8"
    assert view["capacity"]["gpu"]["compute_capability"] == "8.9"
    assert view["capacity"]["gpu"]["driver_version"] == "520.61.05"

    job_id = fund(client, ipfs, devnet.submitters[0], SPEC)
    with ThreadPoolExecutor(2) as pool:  # both wait for a job at once: neither gets this one
        polls = [pool.submit(n.next_job, wait_s=8) for n in (old, legacy)]
        reason = wait_reason(server, job_id, "nodes report 11.8 (1), unknown (1)")
        assert [p.result().status_code for p in polls] == [204, 204]
    assert "cuda eliminates the most (2 of 2)" in reason
    assert "the job requires CUDA >= 12.2; nodes report 11.8 (1), unknown (1)" in reason

    # the old node's driver is upgraded: it registers again with what NVML now says
    old.capacity = gpu_cap(driver_version="550.54", cuda_version="12.4", compute_capability="8.9")
    assert old.register().status_code == 200
    offer = old.next_job(wait_s=20)
    assert offer.status_code == 200, offer.text
    assert offer.json()["job_id"] == job_id
