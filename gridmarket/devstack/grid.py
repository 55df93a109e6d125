"""The whole grid on one machine: anvil + escrow, the js-ipfs daemon, dockerd (when it can run),
a scheduler replica, the web front end (when installed), and a fleet of real provider agents,
each with its own wallet. Used by ``make demo``, ``make up`` and the end-to-end tests.

Everything binds to 127.0.0.1. Roles are anvil's dev accounts: 0 deployer/owner, 1 operator
(the scheduler's key), 2 treasury, 3-4 submitters, 5-9 providers.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import secrets
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import httpx
import yaml
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

from gridmarket.chain import Deployment, EscrowClient
from gridmarket.deploy import EscrowParams, deploy_escrow
from gridmarket.ipfs import IpfsStore

from ._process import ROOT, ManagedProcess, ServiceError
from .anvil import Anvil, dev_accounts, free_port
from .dockerd import Dockerd
from .images import ensure_busybox_image
from .ipfs import IpfsDaemon
from .scheduler import SchedulerProcess

log = logging.getLogger(__name__)

AGENT_PASSWORD = "gridmarket-devnet"  # noqa: S105 - devnet keystores hold anvil's public dev keys
PROVIDER_STAKE = 10**17
FLEET = [  # (name, region, slots): distinct wallets, dev accounts 5.. (see the module doc)
    ("agent-eu", "eu-west", 1),
    ("agent-us", "us", 1),
    ("agent-in", "in", 1),
    ("agent-br", "br", 1),
    ("agent-jp", "jp", 1),
]


@dataclass
class AgentProcess:
    name: str
    account: LocalAccount
    process: ManagedProcess
    config_path: Path


@dataclass
class Grid:
    """A running grid; :func:`run_grid` builds and tears it down."""

    work: Path
    anvil: Anvil
    w3: Web3
    deployment: Deployment
    deployment_file: Path
    escrow: EscrowClient
    ipfs_daemon: IpfsDaemon
    ipfs: IpfsStore
    dockerd: Dockerd | None
    docker_note: str
    scheduler: SchedulerProcess
    scheduler_settings: dict[str, str]
    frontend: ManagedProcess | None
    frontend_url: str | None
    accounts: list[LocalAccount]
    agents: list[AgentProcess] = field(default_factory=list)

    @property
    def operator(self) -> LocalAccount:
        return self.accounts[1]

    @property
    def treasury(self) -> LocalAccount:
        return self.accounts[2]

    @property
    def submitters(self) -> list[LocalAccount]:
        return self.accounts[3:5]

    @property
    def providers(self) -> list[LocalAccount]:
        return self.accounts[5:10]

    def api(self, path: str) -> Any:
        r = httpx.get(self.scheduler.url + path, timeout=10)
        r.raise_for_status()
        return r.json()

    def describe(self) -> dict[str, Any]:
        """What a person (or `make down`) needs to find the running parts."""
        return {
            "rpc_url": self.anvil.url,
            "chain_id": self.deployment.chain_id,
            "escrow": self.deployment.escrow,
            "deployment_file": str(self.deployment_file),
            "ipfs_api": self.ipfs_daemon.api_addr,
            "docker_host": self.dockerd.host if self.dockerd else None,
            "docker_note": self.docker_note,
            "scheduler_url": self.scheduler.url,
            "frontend_url": self.frontend_url,
            "agents": [a.name for a in self.agents],
        }


def _docker(work: Path) -> tuple[Dockerd | None, str]:
    """dockerd when it can run here (root, docker.io installed), else None and why."""
    if os.geteuid() != 0:
        return None, "dockerd needs root: agents serve WASM jobs only"
    if shutil.which("dockerd") is None:
        return None, "dockerd is not installed (scripts/setup_services.sh): WASM jobs only"
    engine = Dockerd(work / "dockerd")
    try:
        engine.start()
        client = docker.DockerClient(base_url=engine.host)
        try:
            ensure_busybox_image(client)
        finally:
            client.close()
    except ServiceError as exc:
        engine.stop()
        return None, f"dockerd could not start ({str(exc).splitlines()[0]}): WASM jobs only"
    return engine, "dockerd running: agents serve Docker and WASM jobs"


def _frontend(work: Path, env: dict[str, str]) -> tuple[ManagedProcess | None, str | None]:
    if importlib.util.find_spec("frontend_api.app") is None:
        return None, None
    port = free_port()
    proc = ManagedProcess(
        "frontend",
        [sys.executable, "-m", "frontend_api", "--host", "127.0.0.1", "--port", str(port)],
        work / "frontend.log",
        env={**os.environ, **env},
        cwd=ROOT,
    )
    proc.start()
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(url + "/healthz", timeout=1).status_code < 500
        except httpx.HTTPError:
            return False

    proc.wait_ready(ready, 30)
    return proc, url


def start_agent(grid: Grid, index: int, *, name: str, region: str, slots: int = 1) -> AgentProcess:
    """Register provider ``index`` on-chain (staked) and start its agent daemon process."""
    account = grid.providers[index]
    home = grid.work / "agents" / name
    home.mkdir(parents=True, exist_ok=True)
    keystore = home / "keystore.json"
    if not keystore.exists():
        from agent.keystore import create_keystore

        create_keystore(
            keystore,
            AGENT_PASSWORD,
            private_key=bytes(account.key),
            kdf="pbkdf2",
            iterations=1000,
        )
    provider = grid.escrow.call("providerOf", account.address)
    if not provider[3]:
        grid.escrow.send(account, "registerProvider", "bafkreidevnetprovider", value=PROVIDER_STAKE)
    config = {
        "scheduler_url": grid.scheduler.url,
        "ipfs_api": grid.ipfs_daemon.api_addr,
        "keystore": str(keystore),
        "password": AGENT_PASSWORD,
        "name": name,
        "region": region,
        "slots": slots,
        "work_dir": str(home / "work"),
        "cpu_cores": 2,
        "ram_mib": 2048,
        "poll_wait_s": 5,
        "executors": ["docker", "wasm"] if grid.dockerd else ["wasm"],
    }
    if grid.dockerd is not None:
        config["docker_host"] = grid.dockerd.host
    config_path = home / "agent.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=True))
    proc = ManagedProcess(
        f"agent {name}",
        [sys.executable, "-m", "agent.cli", "--config", str(config_path), "run"],
        home / "agent.log",
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=ROOT,
    )
    proc.start()
    agent = AgentProcess(name, account, proc, config_path)
    grid.agents.append(agent)
    return agent


def wait_nodes(grid: Grid, count: int, timeout: float = 60) -> None:
    """Until ``count`` nodes are online at the scheduler."""
    deadline = time.monotonic() + timeout
    online = 0
    while time.monotonic() < deadline:
        online = grid.api("/v1/nodes").get("counts", {}).get("online", 0)
        if online >= count:
            return
        for a in grid.agents:
            if not a.process.running():
                raise ServiceError(f"agent {a.name} exited; log {a.process.log_path}")
        time.sleep(0.2)
    raise ServiceError(f"only {online} of {count} agents came online in {timeout:.0f} s")


@contextlib.contextmanager
def run_grid(
    work: Path,
    *,
    agents: int = 3,
    with_frontend: bool = True,
    scheduler_overrides: dict[str, str] | None = None,
    on_step: Callable[[str], None] = lambda s: None,
) -> Iterator[Grid]:
    """Start everything under ``work`` (logs there too); stop it all when the block ends."""
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    # a new devnet every time: state from an earlier run belongs to another chain (the IPFS
    # repo and dockerd's image store are kept: they only hold content, and start faster)
    for stale in ("agents", "outputs", "scheduler-work"):
        shutil.rmtree(work / stale, ignore_errors=True)
    for db in work.glob("scheduler.db*"):
        db.unlink()
    with contextlib.ExitStack() as stack:
        on_step("anvil devnet")
        anvil = Anvil(log_file=work / "anvil.log")
        stack.enter_context(anvil)
        w3 = Web3(Web3.HTTPProvider(anvil.url))
        accounts = [Account.from_key(k) for k in dev_accounts(10)]
        on_step("deploy JobEscrow")
        params = EscrowParams(
            operator=accounts[1].address, treasury=accounts[2].address, min_duration=60
        )
        deployment = deploy_escrow(w3, accounts[0], params)
        deployment_file = work / "deployment.json"
        deployment.save(deployment_file)
        escrow = EscrowClient(w3, deployment)
        on_step("IPFS daemon (js-ipfs, offline, loopback)")
        ipfs_daemon = IpfsDaemon(work / "ipfs")
        ipfs_daemon.start()
        stack.callback(ipfs_daemon.stop)
        ipfs = IpfsStore(ipfs_daemon.api_addr)
        stack.callback(ipfs.close)
        on_step("dockerd")
        engine, note = _docker(work)
        if engine is not None:
            stack.callback(engine.stop)
        on_step("scheduler")
        settings = {
            "database_url": f"sqlite:///{work / 'scheduler.db'}",
            "rpc_url": anvil.url,
            "deployment_file": str(deployment_file),
            "operator_key": "0x" + bytes(accounts[1].key).hex(),
            "ipfs_api": ipfs_daemon.api_addr,
            "token_secret": secrets.token_hex(32),
            "heartbeat_interval_s": "2",
            "node_timeout_s": "10",
            "lease_ttl_s": "10",
            "chain_poll_s": "0.2",
            "dispatch_tick_s": "0.1",
            "work_dir": str(work / "scheduler-work"),
        }
        settings.update(scheduler_overrides or {})
        scheduler = SchedulerProcess(work, free_port(), settings, log_level="info")
        stack.enter_context(scheduler)
        frontend, frontend_url = None, None
        if with_frontend:
            on_step("web front end")
            frontend, frontend_url = _frontend(
                work,
                {
                    "GRIDMARKET_FRONTEND_SCHEDULER_URL": scheduler.url,
                    "GRIDMARKET_FRONTEND_RPC_URL": anvil.url,
                    "GRIDMARKET_FRONTEND_DEPLOYMENT_FILE": str(deployment_file),
                    "GRIDMARKET_FRONTEND_IPFS_API": ipfs_daemon.api_addr,
                },
            )
            if frontend is not None:
                stack.callback(frontend.stop)
        grid = Grid(
            work=work,
            anvil=anvil,
            w3=w3,
            deployment=deployment,
            deployment_file=deployment_file,
            escrow=escrow,
            ipfs_daemon=ipfs_daemon,
            ipfs=ipfs,
            dockerd=engine,
            docker_note=note,
            scheduler=scheduler,
            scheduler_settings=settings,
            frontend=frontend,
            frontend_url=frontend_url,
            accounts=accounts,
        )

        def stop_agents() -> None:  # all at once: each may be finishing a long-poll
            threads = [
                threading.Thread(target=a.process.stop, kwargs={"timeout": 30}) for a in grid.agents
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        stack.callback(stop_agents)
        for i in range(agents):
            name, region, slots = FLEET[i % len(FLEET)]
            on_step(f"agent {name} ({region})")
            start_agent(grid, i, name=name, region=region, slots=slots)
        if agents:
            wait_nodes(grid, agents)
        yield grid
