"""A job whose image is on a registry nobody should connect to (issue 32, items 4 and 5), on the
real scheduler (uvicorn on loopback, a fresh escrow on the session's anvil, the js-ipfs daemon)
and a real agent's runner on the session's dockerd:

* the scheduler refuses it at spec intake (``invalid``, the reason naming the registry and why);
* a scheduler that lets it through (one that lists the registry) offers it once: the agent, whose
  own policy refuses the registry, sends it nothing and reports the job's fault; the job fails at
  once, no other node is offered it, and the node's reputation is unchanged.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from eth_account.signers.local import LocalAccount

from agent.executors.docker import DockerExecutor, PullPolicy
from agent.runner import JobRunner
from agent.storage.ipfs import AgentIpfsStore
from gridmarket.chain import EscrowClient
from gridmarket.ipfs import IpfsStore
from gridmarket.registry_policy import RegistryPolicy
from gridmarket.wire import API, Assignment, ExecutorKind, JobSpec
from tests.probe import Probe

from ..conftest import Devnet
from .harness import Provider, Server, fresh_escrow, register_on_chain, scheduler, submit_job


@pytest.fixture
def probe() -> Iterator[Probe]:
    with Probe("127.0.0.2") as p:  # a second loopback address: a service on the provider's host
        yield p


@pytest.fixture
def ipfs(ipfs_daemon: Any) -> Iterator[IpfsStore]:
    store = IpfsStore(ipfs_daemon.api_addr)
    yield store
    store.close()


@pytest.fixture
def escrow(devnet: Devnet) -> EscrowClient:
    _, client = fresh_escrow(devnet)
    for p in devnet.providers[:3]:
        register_on_chain(client, p, stake=5 * 10**17)
    return client


def spec(image: str) -> JobSpec:
    return JobSpec.model_validate(
        {"executor": "docker", "image": image, "command": ["true"], "max_attempts": 3}
    )


def node_view(server: Server, node_id: str) -> dict[str, Any]:
    r = server.get(API.NODE.format(node_id=node_id))
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def agent_runner(
    account: LocalAccount,
    ipfs_api: str,
    client: docker.DockerClient,
    work: Path,
    allow: tuple[str, ...] = ("public",),
) -> JobRunner:
    """A provider's runner as the agent builds it, its ``pull_registries`` ``allow`` (the
    default: public registries only)."""
    pull = PullPolicy(state_file=work / "pulled.json", registries=RegistryPolicy(allow))
    return JobRunner(
        account,
        storage=lambda: AgentIpfsStore(ipfs_api, resolve_timeout=2),
        executors={ExecutorKind.DOCKER: lambda: DockerExecutor(client, pull=pull)},
        work_dir=work / "jobs",
    )


def closed_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def test_the_scheduler_refuses_the_image_at_intake(
    tmp_path: Path,
    devnet: Devnet,
    ipfs_daemon: Any,
    ipfs: IpfsStore,
    escrow: EscrowClient,
    probe: Probe,
) -> None:
    with scheduler(tmp_path, escrow.deployment, devnet, ipfs_daemon.api_addr) as server:
        node = Provider(devnet.providers[0], server, name="n0")
        assert node.register().status_code == 200
        for image, why in [
            (probe.image(), "127.0.0.2 is a loopback address"),
            ("169.254.169.254/x@sha256:" + "e" * 64, "169.254.169.254 is a cloud metadata"),
            ("10.0.0.1:5000/x@sha256:" + "e" * 64, "10.0.0.1 is a private address"),
        ]:
            job_id = submit_job(escrow, ipfs, devnet.submitters[0], spec(image))
            job = server.wait_job(job_id, {"invalid"}, timeout=15)
            registry = image.split("/", 1)[0]
            assert f"registry {registry} is refused: {why}" in job["reason"], job["reason"]
            assert "image_registries" in job["reason"] and "cancel" in job["reason"]
        assert node.next_job(wait_s=1.0).status_code == 204
    assert probe.connections == []


@pytest.mark.parametrize("case", ["refused by the agent", "nothing listens"])
def test_an_unpullable_image_fails_the_job_once_and_spares_the_node(
    case: str,
    tmp_path: Path,
    devnet: Devnet,
    ipfs_daemon: Any,
    ipfs: IpfsStore,
    escrow: EscrowClient,
    probe: Probe,
    docker_client: docker.DockerClient,
    test_image: str,
) -> None:
    if case == "refused by the agent":  # the default policy refuses the probe's loopback
        registry, allow, why = probe.registry, ("public",), "127.0.0.2 is a loopback"
    else:  # listed by the agent too, but a closed port: it fails the same on every node
        registry = f"127.0.0.2:{closed_port('127.0.0.2')}"
        allow, why = ("public", registry), f"registry {registry} unreachable"
    image = f"{registry}/gridmarket/probe@sha256:" + "e" * 64
    with scheduler(
        tmp_path,
        escrow.deployment,
        devnet,
        ipfs_daemon.api_addr,
        image_registries=["public", registry],  # this scheduler lets it through
    ) as server:
        nodes = [Provider(devnet.providers[i], server, name=f"n{i}") for i in range(3)]
        for node in nodes:
            assert node.register().status_code == 200
        before = {n.node_id: node_view(server, n.node_id)["reputation"] for n in nodes}
        job_id = submit_job(escrow, ipfs, devnet.submitters[0], spec(image))
        first, others = nodes[0], nodes[1:]
        offer = first.take()
        assert offer["job_id"] == job_id
        runner = agent_runner(first.account, ipfs_daemon.api_addr, docker_client, tmp_path, allow)
        started = time.monotonic()
        report = runner.run(Assignment.model_validate(offer))
        assert time.monotonic() - started < 10
        assert report.reason.value == "workload_error", report
        r = first.report(job_id, report.model_dump(mode="json"))
        assert r.status_code in (200, 202), r.text
        job = server.wait_job(job_id, {"failed"}, timeout=10)
        assert "workload_error" in job["reason"] and why in job["reason"], job["reason"]
        assert len(job["attempts"]) == 1
        for node in others:  # not offered again: it fails the same way everywhere
            assert node.next_job(wait_s=1.5).status_code == 204
        for node in nodes:
            view = node_view(server, node.node_id)
            assert view["reputation"] == before[node.node_id]
            assert view["jobs_failed"] == 0
    assert probe.connections == []  # neither the agent nor its dockerd sent it anything
