"""One real grid for the front end's tests, started once per session: a fresh escrow on the
session's anvil, the js-ipfs daemon, ``python -m scheduler``, ``python -m frontend_api`` and a
provider's agent (``python -m agent.cli run``, WASM executor) with its wallet registered and
staked on-chain. Nothing is mocked; the API, CLI and browser tests all use this stack.

Accounts (anvil dev accounts of the ``devnet`` fixture): submitters[0] is the API and CLI tests'
submitter (a local key), submitters[1] the browser's wallet (anvil signs for it), providers[3]
the agent's wallet, providers[4] a provider the tests drive by hand (its acceptance signed with
:func:`gridmarket.eip712.sign_acceptance`, assigned by the operator's key, its result submitted
by hand), the mediator (account 10) is listed at deployment and rules by hand; its public key is
the deployment's ``mediator_pubkey`` (spot jobs' seeds are sealed to it).

The escrow's challenge window is short (:data:`CHALLENGE_WINDOW_S`) so that a test can see it
close without moving the shared chain's clock.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from eth_account.signers.local import LocalAccount

from devstack._process import ROOT, ManagedProcess, ServiceError
from devstack.anvil import free_port
from devstack.images import publish_busybox
from devstack.ipfs import IpfsDaemon
from devstack.registry import Registry
from devstack.scheduler import SchedulerProcess
from gridmarket.chain import Deployment, EscrowClient, Sent
from gridmarket.deploy import EscrowParams, deploy_escrow, list_token
from gridmarket.eip712 import sign_acceptance
from gridmarket.escrow import JobState
from gridmarket.spot import public_key_of
from tests.agent import wat
from tests.conftest import Devnet

AGENT_PASSWORD = "frontend-agent"
CHALLENGE_WINDOW_S = 40
"""The test escrow's challenge window: long enough to dispute by hand, short enough to wait out."""
MANUAL_STAKE = 5 * 10**17


@dataclass
class FrontendStack:
    """The running grid and how to reach each part."""

    tmp: Path
    devnet: Devnet
    escrow: EscrowClient
    deployment_file: Path
    ipfs_api: str
    ipfs_url: str
    scheduler: SchedulerProcess
    frontend: ManagedProcess
    frontend_url: str
    agent: ManagedProcess
    provider: LocalAccount
    wasm_module: Path

    @property
    def submitter(self) -> LocalAccount:
        """The API and CLI tests' submitter (signs locally)."""
        return self.devnet.submitters[0]

    @property
    def browser_account(self) -> LocalAccount:
        """The browser wallet's account (anvil signs eth_sendTransaction for it)."""
        return self.devnet.submitters[1]

    @property
    def manual_provider(self) -> LocalAccount:
        """A registered, staked provider no agent runs for: the tests act for it by hand."""
        return self.devnet.providers[4]

    @property
    def mediator(self) -> LocalAccount:
        """The mediator listed at deployment (dev account 10)."""
        return self.devnet.mediator

    def client(self) -> EscrowClient:
        """A fresh escrow client (no cached nonces: the scheduler sends with the operator)."""
        return EscrowClient(self.escrow.w3, self.escrow.deployment)

    def chain_job(self, job_id: str) -> JobState:
        return self.escrow.job_state(bytes.fromhex(job_id[2:]))

    def assign_by_hand(
        self, job_id: str, provider: LocalAccount | None = None, hold_for: int = 0
    ) -> JobState:
        """The provider signs its acceptance of the job's terms and of ``hold_for`` seconds
        (zero: the operator may take it back after the reassign delay); the operator assigns
        it (a seat: ``assign(groupId, seat, ...)``)."""
        provider = provider or self.manual_provider
        escrow = self.client()
        state = self.chain_job(job_id)
        signature = sign_acceptance(
            provider,
            escrow.deployment.chain_id,
            escrow.address,
            state.job_id,
            state.job.attempt + 1,
            state.job,
            hold_for,
        )
        state, _ = escrow.assign(self.devnet.operator, state, provider.address, hold_for, signature)
        return state

    def submit_by_hand(self, job_id: str, output_cid: str) -> JobState:
        """The assigned provider submits ``output_cid`` itself (Submitted: the window opens)."""
        state = self.chain_job(job_id)
        provider = next(a for a in self.devnet.providers if a.address == state.job.provider)
        state, _ = self.client().call_job(provider, "submitResult", state, output_cid)
        return state

    def rule_by_hand(self, job_id: str, upheld: bool) -> tuple[JobState, Sent]:
        """The job's mediator rules on its pending (or disputed) result."""
        return self.client().rule(self.mediator, self.chain_job(job_id), upheld)

    def mine(self) -> None:
        """One empty block now (anvil mines on demand): the chain's clock catches up."""
        self.escrow.w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(self.frontend_url + path, timeout=30, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.post(self.frontend_url + path, timeout=60, **kwargs)

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.get(f"/api/jobs/{job_id}")
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data

    def wait_job(self, job_id: str, states: set[str], timeout: float = 90) -> dict[str, Any]:
        """Poll the front end until the job's (scheduler or chain) state is in ``states``."""
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            response = self.get(f"/api/jobs/{job_id}")
            if response.status_code == 200:
                last = response.json()
                if last.get("state") in states or last.get("chain_status") in states:
                    return last
            time.sleep(0.3)
        raise AssertionError(
            f"job {job_id} not in {states} after {timeout} s: {last}\n"
            f"agent log:\n{_tail(self.agent.log_path)}\n"
            f"scheduler log:\n{_tail(self.scheduler.log_path)}"
        )

    def wait_chain(self, job_id: str, status: str, timeout: float = 20) -> dict[str, Any]:
        """The job's view once the front end's index has seen it reach on-chain ``status``
        (the index refreshes at most every ``index_min_interval_s``)."""
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            response = self.get(f"/api/jobs/{job_id}")
            if response.status_code == 200:
                last = response.json()
                if last.get("chain_status") == status:
                    return last
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} not {status} on-chain after {timeout} s: {last}")


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_http(url: str, proc: ManagedProcess, timeout: float = 30) -> None:
    def ready() -> bool:
        try:
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    proc.wait_ready(ready, timeout)


@pytest.fixture(scope="session")
def frontend_stack(
    tmp_path_factory: pytest.TempPathFactory,
    devnet: Devnet,
    ipfs_daemon: IpfsDaemon,
    docker_client: docker.DockerClient,
) -> Iterator[FrontendStack]:
    tmp = tmp_path_factory.mktemp("frontend-stack")
    # the registry the front end advertises: `gridmarket submit` pins image tags to digests there
    registry = Registry(tmp / "registry").start()
    publish_busybox(docker_client, registry.host)
    params = EscrowParams(
        operator=devnet.operator.address,
        treasury=devnet.treasury.address,
        min_duration=1,  # lets the refund test reach a deadline in seconds
        challenge_window=CHALLENGE_WINDOW_S,
        mediator=devnet.mediator.address,
    )
    deployment: Deployment = deploy_escrow(devnet.w3, devnet.owner, params)
    # the session's TestUSD, listed on this escrow too: jobs can be paid in tUSD
    deployment = list_token(devnet.w3, devnet.owner, deployment, devnet.token)
    # the listed mediator's public key, as a devnet's deployment record carries it: the front
    # end and the CLI seal a spot job's seed to it (checked against the mediator's address)
    deployment.params["mediator_pubkey"] = "0x" + public_key_of(bytes(devnet.mediator.key)).hex()
    deployment_file = tmp / "deployment.json"
    deployment.save(deployment_file)
    escrow = EscrowClient(devnet.w3, deployment)

    provider = devnet.providers[3]
    escrow.send(provider, "registerProvider", "bafkreifrontendprovider", value=5 * 10**16)
    manual = devnet.providers[4]
    escrow.send(manual, "registerProvider", "bafkreifrontendmanual", value=MANUAL_STAKE)

    scheduler = SchedulerProcess(
        tmp,
        free_port(),
        {
            "database_url": f"sqlite:///{tmp / 'scheduler.db'}",
            "rpc_url": devnet.url,
            "deployment_file": str(deployment_file),
            "operator_key": "0x" + bytes(devnet.operator.key).hex(),
            "ipfs_api": ipfs_daemon.api_addr,
            "token_secret": secrets.token_hex(32),
            "heartbeat_interval_s": "1.0",
            "long_poll_max_s": "5",
            "sweep_interval_s": "0.2",
            "chain_poll_s": "0.1",
            "dispatch_tick_s": "0.05",
            "verify_timeout_s": "10",
            "work_dir": str(tmp / "sched-work"),
            # the stack's registry is on loopback: accepted only because it is listed
            "image_registries": json.dumps(["public", registry.host]),
        },
    )
    scheduler.start()

    port = free_port()
    frontend_url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDMARKET_")}
    env.update(
        {
            "GRIDMARKET_FRONTEND_SCHEDULER_URL": scheduler.url,
            "GRIDMARKET_FRONTEND_RPC_URL": devnet.url,
            "GRIDMARKET_FRONTEND_DEPLOYMENT_FILE": str(deployment_file),
            "GRIDMARKET_FRONTEND_IPFS_API": ipfs_daemon.api_addr,
            "GRIDMARKET_FRONTEND_STREAM_POLL_S": "0.3",
            "GRIDMARKET_FRONTEND_INDEX_MIN_INTERVAL_S": "0.2",
            "GRIDMARKET_FRONTEND_REGISTRY": registry.host,
        }
    )
    frontend = ManagedProcess(
        "frontend",
        [sys.executable, "-m", "frontend_api", "--port", str(port), "--log-level", "warning"],
        tmp / "frontend.log",
        env=env,
        cwd=ROOT,
    )
    frontend.start()

    from gridmarket.keystore import create_keystore  # the provider's tool, used as a provider would

    keystore = tmp / "agent-keystore.json"
    create_keystore(keystore, AGENT_PASSWORD, private_key=bytes(provider.key), iterations=2**10)
    agent_env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDMARKET_")}
    agent_env.update(
        {
            "GRIDMARKET_AGENT_SCHEDULER_URL": scheduler.url,
            "GRIDMARKET_AGENT_IPFS_API": ipfs_daemon.api_addr,
            "GRIDMARKET_AGENT_KEYSTORE": str(keystore),
            "GRIDMARKET_AGENT_PASSWORD": AGENT_PASSWORD,
            "GRIDMARKET_AGENT_REGION": "eu-west",
            "GRIDMARKET_AGENT_NAME": "frontend-test-node",
            "GRIDMARKET_AGENT_EXECUTORS": '["wasm"]',
            "GRIDMARKET_AGENT_WORK_DIR": str(tmp / "agent-work"),
            "GRIDMARKET_AGENT_POLL_WAIT_S": "2",
            "GRIDMARKET_AGENT_BACKOFF_CAP_S": "2",
            "GRIDMARKET_AGENT_SLOTS": "2",
        }
    )
    agent = ManagedProcess(
        "agent",
        [sys.executable, "-m", "agent.cli", "run"],
        tmp / "agent.log",
        env=agent_env,
        cwd=ROOT,
    )
    stack = FrontendStack(
        tmp=tmp,
        devnet=devnet,
        escrow=escrow,
        deployment_file=deployment_file,
        ipfs_api=ipfs_daemon.api_addr,
        ipfs_url=ipfs_daemon.api_url,
        scheduler=scheduler,
        frontend=frontend,
        frontend_url=frontend_url,
        agent=agent,
        provider=provider,
        wasm_module=wat.build(wat.UPPERCASE, tmp / "uppercase.wasm"),
    )
    try:
        try:
            _wait_http(frontend_url + "/healthz", frontend)
        except ServiceError as exc:
            pytest.fail(f"the front end did not start: {exc}", pytrace=False)
        agent.start()
        _wait_for_node(stack)
        yield stack
    finally:
        agent.stop()
        frontend.stop()
        scheduler.stop()
        registry.stop()


def _wait_for_node(stack: FrontendStack, timeout: float = 60) -> None:
    """Until the agent's node is online at the scheduler."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not stack.agent.running():
            break
        try:
            nodes = httpx.get(stack.scheduler.url + "/v1/nodes", timeout=5).json()["nodes"]
        except httpx.HTTPError:
            nodes = []
        if any(n["status"] == "online" for n in nodes):
            return
        time.sleep(0.3)
    pytest.fail(f"the agent did not come online:\n{_tail(stack.agent.log_path)}", pytrace=False)


@pytest.fixture
def stack(frontend_stack: FrontendStack) -> FrontendStack:
    return frontend_stack


def wasm_spec(module_cid: str, dataset_cid: str | None = None, **fields: Any) -> dict[str, Any]:
    """A small WASM job spec (the agent of the stack serves WASM only)."""
    spec: dict[str, Any] = {
        "name": "uppercase",
        "executor": "wasm",
        "module_cid": module_cid,
        "resources": {"cpu_cores": 1, "ram_mib": 128, "disk_mib": 16},
        "limits": {"timeout_s": 60},
    }
    if dataset_cid:
        spec["dataset_cid"] = dataset_cid
    spec.update(fields)
    return spec


def unrunnable_spec(**fields: Any) -> dict[str, Any]:
    """A Docker job: the stack's agent serves WASM only, so it stays queued (Funded on-chain)."""
    spec: dict[str, Any] = {
        "name": "waits",
        "executor": "docker",
        "image": "busybox:latest",
        "command": ["true"],
        "limits": {"timeout_s": 60},
    }
    spec.update(fields)
    return spec
