"""The agent daemon against the real scheduler (``python -m scheduler`` as a child process), anvil
with a fresh escrow, the js-ipfs daemon and dockerd: nothing is mocked.

* ``register --stake`` registers the wallet on-chain and with the scheduler; ``status`` reads it;
* the daemon pulls a Docker job and a WASM job, runs them on their datasets, and the scheduler
  verifies and the escrow releases the output CID the bytes hash to;
* SIGTERM on a running job hands it back and exits 0;
* the scheduler dies (SIGKILL) while a job runs and comes back with a new token secret: the
  daemon re-registers, renews the lease and delivers the result it kept.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import httpx
import ipfshttpclient
import pytest
from docker.models.containers import Container
from eth_account.signers.local import LocalAccount

from agent.assembly import build_agent, executor_owner
from agent.config import AgentConfig, load_config
from agent.daemon import Agent
from agent.executors.docker import LABEL, OWNER_LABEL
from agent.storage.ipfs import AgentIpfsStore
from devstack.anvil import free_port
from devstack.dockerd import Dockerd
from devstack.ipfs import IpfsDaemon
from devstack.scheduler import SchedulerProcess
from gridmarket.chain import Deployment, EscrowClient
from gridmarket.cid import path_cid
from gridmarket.deploy import EscrowParams, deploy_escrow
from gridmarket.escrow import Status
from gridmarket.keystore import create_keystore
from gridmarket.wire import API, ExecutorKind, JobSpec
from tests.agent import wat
from tests.conftest import Devnet

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "daemon-test"


@dataclass
class Stack:
    """One fresh grid: escrow, scheduler process, and the provider's agent settings."""

    tmp: Path
    devnet: Devnet
    escrow: EscrowClient
    deployment_file: Path
    scheduler: SchedulerProcess
    scheduler_settings: dict[str, str]
    provider: LocalAccount
    agent_env: dict[str, str]
    ipfs: ipfshttpclient.Client

    @property
    def url(self) -> str:
        return self.scheduler.url

    def config(self, **overrides: Any) -> AgentConfig:
        values: dict[str, Any] = {
            k.removeprefix("GRIDMARKET_AGENT_").lower(): v for k, v in self.agent_env.items()
        }
        values.update(overrides)
        return load_config(None, **values)

    def restart_scheduler(self, **settings: str) -> None:
        self.scheduler_settings.update(settings)
        self.scheduler = SchedulerProcess(
            self.tmp, self.scheduler.port, self.scheduler_settings, name=secrets.token_hex(3)
        ).start()

    def submit(self, spec: JobSpec, bounty: int = 10**16, ttl: int = 3600) -> str:
        spec_cid = self.ipfs.add_bytes(spec.to_bytes())
        now = max(int(time.time()), int(self.escrow.w3.eth.get_block("latest")["timestamp"]))
        # paid at once on the scheduler's check: these tests are about the agent, and this
        # shared chain's challenge window (the production default, an hour) never passes here
        submitter = self.devnet.submitters[0]
        terms = self.escrow.default_terms(bounty, submitter.address, on_verify=True)
        state, _ = self.escrow.create_job(
            submitter, os.urandom(32), spec_cid, now + ttl, bounty, terms
        )
        return "0x" + state.job_id.hex()

    def job(self, job_id: str) -> dict[str, Any]:
        response = httpx.get(self.url + API.JOB.format(job_id=job_id), timeout=10)
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data

    def wait_job(self, job_id: str, states: set[str], timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                last = self.job(job_id)
            except httpx.HTTPError:
                pass
            else:
                if last.get("state") in states:
                    return last
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} not {states} after {timeout} s: {last}")


@pytest.fixture
def stack(
    tmp_path: Path,
    devnet: Devnet,
    ipfs_daemon: IpfsDaemon,
    ipfs_client: ipfshttpclient.Client,
    dockerd: Dockerd,
    test_image: str,
) -> Iterator[Stack]:
    params = EscrowParams(
        operator=devnet.operator.address,
        treasury=devnet.treasury.address,
        mediator=devnet.mediator.address,
    )
    deployment: Deployment = deploy_escrow(devnet.w3, devnet.owner, params)
    deployment_file = tmp_path / "deployment.json"
    deployment.save(deployment_file)
    settings = {
        "database_url": f"sqlite:///{tmp_path / 'scheduler.db'}",
        "rpc_url": devnet.url,
        "deployment_file": str(deployment_file),
        "operator_key": "0x" + bytes(devnet.operator.key).hex(),
        "ipfs_api": ipfs_daemon.api_addr,
        "token_secret": secrets.token_hex(32),
        "heartbeat_interval_s": "1.0",
        "node_timeout_s": "30",
        "lease_ttl_s": "30",
        "long_poll_max_s": "5",
        "sweep_interval_s": "0.2",
        "chain_poll_s": "0.1",
        "dispatch_tick_s": "0.05",
        "verify_timeout_s": "10",
        "work_dir": str(tmp_path / "sched-work"),
    }
    scheduler = SchedulerProcess(tmp_path, free_port(), settings).start()
    provider = devnet.providers[0]
    keystore = tmp_path / "keystore.json"
    create_keystore(keystore, PASSWORD, private_key=bytes(provider.key), iterations=2**10)
    agent_env = {
        "GRIDMARKET_AGENT_SCHEDULER_URL": scheduler.url,
        "GRIDMARKET_AGENT_IPFS_API": ipfs_daemon.api_addr,
        "GRIDMARKET_AGENT_DOCKER_HOST": dockerd.host,
        "GRIDMARKET_AGENT_KEYSTORE": str(keystore),
        "GRIDMARKET_AGENT_PASSWORD": PASSWORD,
        "GRIDMARKET_AGENT_REGION": "us",
        "GRIDMARKET_AGENT_NAME": "agent-test",
        "GRIDMARKET_AGENT_WORK_DIR": str(tmp_path / "agent-work"),
        "GRIDMARKET_AGENT_POLL_WAIT_S": "2",
        "GRIDMARKET_AGENT_BACKOFF_CAP_S": "2",
        "GRIDMARKET_AGENT_RPC_URL": devnet.url,
        "GRIDMARKET_AGENT_DEPLOYMENT": str(deployment_file),
    }
    stack = Stack(
        tmp_path,
        devnet,
        EscrowClient(devnet.w3, deployment),
        deployment_file,
        scheduler,
        settings,
        provider,
        agent_env,
        ipfs_client,
    )
    try:
        yield stack
    finally:
        stack.scheduler.stop()


def agent_cli(stack: Stack, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRIDMARKET_AGENT_")}
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**base, **stack.agent_env, **env},
        timeout=120,
        check=False,
    )


def start_agent(config: AgentConfig, account: LocalAccount) -> tuple[Agent, threading.Thread]:
    agent = build_agent(config, account)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(agent.run(install_signals=False)))
    thread.start()
    assert agent.ready.wait(30), "the agent did not register"
    return agent, thread


def dataset(storage: AgentIpfsStore, tmp: Path) -> str:
    folder = tmp / f"dataset-{secrets.token_hex(3)}"
    folder.mkdir()
    (folder / "data.txt").write_text("hello gridmarket\n")
    return storage.add_dir(folder)


def expected_cid(tmp: Path, files: dict[str, bytes]) -> str:
    folder = tmp / f"expected-{secrets.token_hex(3)}" / "output"
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return path_cid(folder)


def docker_job(image: str, script: str, **fields: Any) -> JobSpec:
    command = ["/bin/sh", "-c", script]
    return JobSpec(executor=ExecutorKind.DOCKER, image=image, command=command, **fields)


# --------------------------------------------------------------------------- tests


def test_register_stake_status_and_serve_docker_and_wasm_jobs(
    stack: Stack, storage: AgentIpfsStore, test_image: str, tmp_path: Path
) -> None:
    # register: on-chain (registerProvider + stake) and with the scheduler
    done = agent_cli(stack, "register", "--stake", "0.05")
    assert done.returncode == 0, done.stderr
    node_id = done.stdout.strip().splitlines()[-1]
    assert node_id.startswith("n-") and "registered on-chain with 0.05 ETH" in done.stdout
    entry = stack.escrow.call("providerOf", stack.provider.address)
    assert entry[0] == 5 * 10**16 and entry[3] is True  # stake, registered
    status = agent_cli(stack, "status", "--json")
    assert status.returncode == 0, status.stderr
    node = json.loads(status.stdout)
    assert node["node_id"] == node_id and node["status"] == "online"
    assert node["capacity"]["executors"] == ["docker", "wasm"]

    data_cid = dataset(storage, tmp_path)
    module = wat.build(wat.UPPERCASE, tmp_path / "upper.wasm")
    module_cid = stack.ipfs.add(str(module), cid_version=1, raw_leaves=True)["Hash"]
    docker_id = stack.submit(
        docker_job(
            test_image, "tr a-z A-Z < /input/data.txt > /output/upper.txt", dataset_cid=data_cid
        )
    )
    wasm_id = stack.submit(
        JobSpec(executor=ExecutorKind.WASM, module_cid=module_cid, dataset_cid=data_cid)
    )

    config = stack.config(slots=2)
    account = stack.provider
    agent, thread = start_agent(config, account)
    try:
        want = expected_cid(tmp_path, {"upper.txt": b"HELLO GRIDMARKET\n"})
        for job_id in (docker_id, wasm_id):
            job = stack.wait_job(job_id, {"released"}, timeout=90)
            assert job["output_cid"] == want, job
            state = stack.escrow.job_state(bytes.fromhex(job_id[2:]))
            assert state.status is Status.RELEASED and state.output_cid == want
            assert state.job.provider == account.address
        assert agent.completed == 2
    finally:
        agent.stop()
        thread.join(60)
    assert not thread.is_alive()
    assert not any((config.work_dir / "jobs").iterdir())  # every job dir removed


def test_start_removes_this_agents_leftover_containers_only(
    stack: Stack, docker_client: docker.DockerClient, test_image: str
) -> None:
    """A crashed run's containers (labelled with this agent's owner) go at start; another
    agent's on the same engine, and containers that are not the agent's, stay."""
    stack.escrow.send(stack.provider, "registerProvider", "bafkreiagenttest", value=10**17)
    config = stack.config()

    def container(labels: dict[str, str]) -> Container:
        return docker_client.containers.run(
            test_image, ["sleep", "300"], detach=True, network_mode="none", labels=labels
        )

    own = container({LABEL: "docker", OWNER_LABEL: executor_owner(config, stack.provider)})
    others = [
        container({LABEL: "docker", OWNER_LABEL: f"{stack.devnet.providers[1].address}/b"}),
        container({}),
    ]
    try:
        own.reload()
        assert own.status == "running"  # a live leftover: removed by force
        agent, thread = start_agent(config, stack.provider)
        agent.stop()
        thread.join(60)
        left = {c.id for c in docker_client.containers.list(all=True)}
        assert own.id not in left
        assert all(c.id in left for c in others)
    finally:
        for c in [own, *others]:
            with contextlib.suppress(docker.errors.NotFound):
                c.remove(force=True)


def test_sigterm_hands_back_the_running_job_and_exits_zero(stack: Stack, test_image: str) -> None:
    stack.escrow.send(stack.provider, "registerProvider", "bafkreiagenttest", value=10**17)
    log_file = stack.tmp / "agent.log"
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRIDMARKET_AGENT_")}
    env = {**base, **stack.agent_env, "GRIDMARKET_AGENT_STOP_GRACE_S": "1"}
    with log_file.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "run"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        job_id = stack.submit(docker_job(test_image, "sleep 120"))
        job = stack.wait_job(job_id, {"leased"}, timeout=60)
        time.sleep(2)  # the container is running
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log_file.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log_file.read_text()
    assert "handed back" in text and "stopped" in text and "Traceback" not in text, text
    job = stack.wait_job(job_id, {"queued", "leased"}, timeout=10)
    assert job["attempts"][0]["outcome"] == "handed_back", job


def test_result_survives_a_scheduler_crash(
    stack: Stack, test_image: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent")
    stack.escrow.send(stack.provider, "registerProvider", "bafkreiagenttest", value=10**17)
    agent, thread = start_agent(stack.config(), stack.provider)
    try:
        job_id = stack.submit(docker_job(test_image, "sleep 4; echo survived > /output/out.txt"))
        stack.wait_job(job_id, {"leased"}, timeout=60)
        deadline = time.monotonic() + 60  # accepted and running (the lease alone is an offer:
        while job_id not in agent.running:  # killed before the acceptance, nothing would run)
            assert time.monotonic() < deadline, "the agent never started the job"
            time.sleep(0.05)
        stack.scheduler.kill()  # mid-run: the result cannot be delivered
        time.sleep(6)  # the job finishes meanwhile; its report is retried with backoff
        assert job_id in agent.running  # kept, still in the heartbeat's running list
        # back with a new token secret: the old token is refused (401), the agent registers again
        stack.restart_scheduler(token_secret=secrets.token_hex(32))
        job = stack.wait_job(job_id, {"released"}, timeout=90)
        assert job["output_cid"] == expected_cid(tmp_path, {"out.txt": b"survived\n"})
        assert [a["outcome"] for a in job["attempts"]] == ["success"]  # the one attempt
    finally:
        agent.stop()
        thread.join(60)
    log = caplog.text
    assert "failed" in log and "retrying" in log  # the report waited for the scheduler
    assert "token refused" in log and "registering again" in log  # new secret: 401, re-register


def test_submit_on_chain_from_the_nodes_own_wallet(
    stack: Stack, storage: AgentIpfsStore, test_image: str, tmp_path: Path
) -> None:
    """``submit_on_chain``: the node sends ``submitResult`` itself; the scheduler still verifies
    the output and releases the pay (no relayed signature needed)."""
    stack.escrow.send(stack.provider, "registerProvider", "bafkreiprovidermeta", value=5 * 10**16)
    job_id = stack.submit(docker_job(test_image, "echo on-chain > /output/o.txt"))
    config = stack.config(submit_on_chain=True)
    agent, thread = start_agent(config, stack.provider)
    try:
        job = stack.wait_job(job_id, {"released"}, timeout=90)
    finally:
        agent.stop()
        thread.join(60)
    want = expected_cid(tmp_path, {"o.txt": b"on-chain\n"})
    assert job["output_cid"] == want
    assert job["result"] is not None and job["result"]["exit_code"] == 0  # the report was kept
    submitted = [
        e
        for e in stack.escrow.events(stack.escrow.deployment.block)
        if e.name == "ResultSubmitted" and "0x" + bytes(e.args["jobId"]).hex() == job_id
    ]
    assert len(submitted) == 1
    tx = stack.escrow.w3.eth.get_transaction(submitted[0].tx_hash)
    assert tx["from"] == stack.provider.address  # sent by the node, not relayed
    state = stack.escrow.job_state(bytes.fromhex(job_id[2:]))
    assert state.status is Status.RELEASED and state.output_cid == want
