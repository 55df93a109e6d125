"""The agent pulls only from registries its provider allows (issue 32, items 4 and 5), on the
session's real dockerd and js-ipfs daemon: a job naming a registry on loopback (or a name that
resolves there) gets no request to it, from the agent or from dockerd, and fails as the job's
own fault; an allowed registry is reached; a public registry a provider's list leaves out is the
node's choice."""

from __future__ import annotations

import json
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from eth_account import Account

from agent.config import ConfigError, load_config
from agent.errors import ImageNotFoundError
from agent.executors import ExecutionSpec
from agent.executors.docker import DockerExecutor, ImagePullError, PullPolicy
from agent.runner import JobRunner
from agent.storage.ipfs import AgentIpfsStore
from devstack.ipfs import IpfsDaemon
from gridmarket.cid import bytes_cid
from gridmarket.registry_policy import RegistryPolicy
from gridmarket.wire import Assignment, ExecutorKind, JobSpec, JobTerms, RunReason
from scheduler.lifecycle import Fault, fault_of
from tests.probe import Probe

NODE_REFUSES = "this node does not run"


@pytest.fixture(params=["127.0.0.1", "127.0.0.2"])  # a spec cannot name [v6] hosts (wire.py)
def probe(request: pytest.FixtureRequest) -> Iterator[Probe]:
    with Probe(request.param) as p:
        yield p


def executor(client: docker.DockerClient, tmp_path: Path, *allow: str) -> DockerExecutor:
    registries = RegistryPolicy(allow or ("public",), "pull_registries")
    policy = PullPolicy(state_file=tmp_path / "pulled.json", registries=registries)
    return DockerExecutor(client, pull=policy)


def job(image: str) -> ExecutionSpec:
    return ExecutionSpec(image=image, command=("true",))


def test_a_forbidden_registry_gets_nothing_and_it_is_the_job_s_fault(
    probe: Probe, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    with pytest.raises(ImagePullError, match="loopback") as info:
        executor(docker_client, tmp_path).run(job(probe.image()), None, tmp_path / "out")
    message = str(info.value)
    assert probe.registry in message and "pull_registries" in message
    assert NODE_REFUSES not in message
    assert fault_of(RunReason.WORKLOAD_ERROR, message) is Fault.JOB
    assert probe.connections == []  # neither the agent nor dockerd connected


def test_a_name_that_resolves_to_loopback_is_refused_after_dns(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    name = socket.gethostname().lower()  # /etc/hosts: this machine, on loopback (or its LAN)
    with Probe("127.0.0.1") as probe:
        image = f"{name}:{probe.port}/gridmarket/probe@sha256:" + "e" * 64
        with pytest.raises(ImagePullError, match=f"{name} resolves to ") as info:
            executor(docker_client, tmp_path).run(job(image), None, tmp_path / "out")
        assert NODE_REFUSES not in str(info.value)
        assert probe.connections == []


def test_a_registry_that_does_not_resolve_is_the_job_s_fault(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    image = "no-such-registry.invalid:5000/x@sha256:" + "e" * 64
    with pytest.raises(ImagePullError, match="does not resolve") as info:
        executor(docker_client, tmp_path).run(job(image), None, tmp_path / "out")
    assert fault_of(RunReason.WORKLOAD_ERROR, str(info.value)) is Fault.JOB


def test_an_allowed_registry_is_reached_and_a_missing_manifest_is_the_job_s_fault(
    probe: Probe, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    ex = executor(docker_client, tmp_path, "public", probe.registry)
    with pytest.raises(ImagePullError, match="not in registry") as info:
        ex.run(job(probe.image()), None, tmp_path / "out")
    assert fault_of(RunReason.WORKLOAD_ERROR, str(info.value)) is Fault.JOB
    assert (
        len(probe.connections) == 1
        and b"GET /v2/gridmarket/probe/manifests/sha256:" in (probe.connections[0])
    )


def test_a_public_registry_left_out_of_a_provider_s_list_is_the_node_s_choice(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    ex = executor(docker_client, tmp_path, "registry.example.org")  # no "public"
    image = "93.184.216.34:5000/x@sha256:" + "e" * 64
    with pytest.raises(ImagePullError, match=f"{NODE_REFUSES} images from 93.184.216.34:5000"):
        ex.run(job(image), None, tmp_path / "out")
    assert fault_of(RunReason.WORKLOAD_ERROR, f"{NODE_REFUSES} images from x") is Fault.NODE


def test_the_runner_reports_a_forbidden_registry_as_a_workload_error(
    ipfs_daemon: IpfsDaemon, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    account = Account.from_key("0x" + "08" * 32)
    runner = JobRunner(
        account,
        storage=lambda: AgentIpfsStore(ipfs_daemon.api_addr, resolve_timeout=2),
        executors={ExecutorKind.DOCKER: lambda: executor(docker_client, tmp_path)},
        work_dir=tmp_path / "work",
    )
    with Probe("127.0.0.2") as probe:
        spec = JobSpec.model_validate(
            {"executor": "docker", "image": probe.image(), "command": ["true"]}
        )
        now = time.time()
        assignment = Assignment(
            job_id="0x" + secrets.token_hex(32),
            attempt=1,
            spec_cid=bytes_cid(spec.to_bytes()),
            spec=spec,
            bounty_wei=10**16,
            deadline=int(now) + 3600,
            lease_expires_at=now + 30,
            chain_id=31337,
            escrow=account.address,
            terms=JobTerms(
                bounty_wei=10**16,
                fee_bps=250,
                deadline=int(now) + 3600,
                collateral_wei=10**16,
                mediator="0x" + "0a" * 20,
                flags=0,
                operator="0x" + "01" * 20,
                hold_for=900,
            ),
        )
        report = runner.run(assignment)
        assert report.reason is RunReason.WORKLOAD_ERROR, report
        assert "loopback" in report.message and probe.registry in report.message
        assert fault_of(report.reason, report.message) is Fault.JOB
        assert probe.connections == []
    assert issubclass(ImagePullError, ImageNotFoundError)


def test_the_config_key_and_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_config(None).pull_registries == ["public"]
    monkeypatch.setenv("GRIDMARKET_AGENT_PULL_REGISTRIES", json.dumps(["127.0.0.1:5000"]))
    assert load_config(None).pull_registries == ["127.0.0.1:5000"]
    with pytest.raises(ConfigError, match="pull_registries: not host"):
        load_config(None, pull_registries=["public", "http://x/y"])
