"""The whole grid on one machine (:class:`LocalGrid`): anvil + escrow, the js-ipfs daemon,
dockerd (when it can run), a scheduler replica, the web front end (when installed), and a fleet
of real provider agents, each with its own wallet. Used by ``make demo``, ``make up`` and the
end-to-end tests.

Everything binds to 127.0.0.1, unless ``run_grid(bind_host=...)`` names another address of this
host (a bridge's, :mod:`devstack.netns`): then the scheduler, the IPFS nodes' swarm and the
registry (HTTPS, self-signed; dockerd told it is insecure) listen there, for agents in other
network namespaces; anvil, the IPFS APIs and the front end stay on loopback. Every party refuses
image registries on such addresses unless they are listed, so the grid lists its registry by
``host:port`` (:func:`registry_allowance`): the agents' ``pull_registries``, the scheduler's and
the front end's ``image_registries``.

Roles are anvil's dev accounts: 0 deployer/owner, 1 operator (the scheduler's key), 2 treasury,
3-4 submitters, 5-9 providers, 10 the mediator. TestUSD (tUSD) is listed for bounties and minted
to 3..10; every agent takes tUSD jobs (a floor and a tUSD stake: :func:`agent_token_settings`).

Fault injection for the end-to-end tests (tests/e2e), all keeping addresses and state so that
the other parts only see an outage: :meth:`LocalGrid.kill_agent` and
:meth:`LocalGrid.restart_agent`, :meth:`LocalGrid.restart_scheduler` (same database, port and
token secret), :meth:`LocalGrid.stop_ipfs` and :meth:`LocalGrid.start_ipfs` (same repo and API
port), :meth:`LocalGrid.stop_chain` and :meth:`LocalGrid.start_chain` (anvil's state file, same
port), and :func:`start_replica` (another scheduler on the same settings, for PostgreSQL).

Length: about 720 lines, over the 500 the project aims for: the grid, its process starters
and its fault injection, to be split (issue 30's open work).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
import httpx
import yaml
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

from gridmarket import spot
from gridmarket.chain import Deployment, EscrowClient
from gridmarket.deploy import EscrowParams, deploy_escrow, deploy_test_token, list_token
from gridmarket.escrow import ZERO_ADDRESS
from gridmarket.holds import margin_of
from gridmarket.ipfs import IpfsStore
from gridmarket.token import TokenClient, by_address, tokens_of

from ._process import ROOT, ManagedProcess, ServiceError
from .anvil import Anvil, DevRoles, dev_accounts, free_port
from .dockerd import Dockerd
from .images import BUSYBOX_IMAGE, ensure_busybox_image, publish_busybox, publish_python_image
from .ipfs import IpfsDaemon, IpfsSwarm
from .mediator import MediatorProcess
from .registry import Registry
from .registry import free_port as free_host_port
from .scheduler import SchedulerProcess
from .torch_image import publish_torch_image

if TYPE_CHECKING:
    from gridmarket.lightchain import LightEscrowClient

log = logging.getLogger(__name__)

AGENT_PASSWORD = "gridmarket-devnet"  # noqa: S105 - devnet keystores hold anvil's public dev keys
PROVIDER_STAKE = 10**17
DEVNET_TOKEN_GRANT = 100_000 * 10**6
"""TestUSD minted to each dev submitter and provider, and to the mediator (100,000 tUSD)."""
AGENT_TUSD_FLOOR = "0.10"
"""Every devnet agent's floor for tUSD jobs, per hour: far under what the demo's 2 tUSD job
(scripts/demo.py, a WASM spec with a 60 s timeout) pays, 120 tUSD an hour, and under what a
2 tUSD job pays even with a 20-hour timeout, so the floor never keeps a devnet job waiting."""
AGENT_TUSD_STAKE = "1000"
"""tUSD every devnet agent keeps staked (the collateral of its tUSD jobs)."""
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

    @property
    def node_id(self) -> str:
        """The scheduler's id for this node (``scheduler.store.repo.node_id_for``)."""
        from scheduler.store.repo import node_id_for

        return node_id_for(self.account.address, self.name)

    @property
    def log_path(self) -> Path:
        return self.process.log_path


SUBMITTER_IPFS, SCHEDULER_IPFS, MEDIATOR_IPFS, FRONTEND_IPFS = (
    "submitter",
    "scheduler",
    "mediator",
    "frontend",
)
"""Names of the parties' IPFS nodes in ``LocalGrid.ipfs_swarm`` (agents: their own names)."""


@dataclass
class LocalGrid(DevRoles):
    """A running grid; :func:`run_grid` builds and tears it down."""

    work: Path
    anvil: Anvil
    w3: Web3
    deployment: Deployment
    deployment_file: Path
    escrow: EscrowClient
    ipfs_swarm: IpfsSwarm
    """One js-ipfs node per party on a loopback swarm (full mesh): ``submitter`` (``ipfs``),
    ``scheduler`` (its replicas too), ``mediator``, ``frontend`` and one per agent, named after
    it. Content moves between them by bitswap; none shares another's blockstore."""
    ipfs: IpfsStore
    """The submitter's node (tests and the demo add specs and inputs here)."""
    dockerd: Dockerd | None
    docker_note: str
    registry: Registry | None
    busybox_image: str
    """What Docker jobs name: the pinned reference in the devnet's registry (or the local tag
    when no dockerd runs, and so no Docker job either)."""
    scheduler: SchedulerProcess
    scheduler_settings: dict[str, str]
    mediator_process: MediatorProcess
    frontend: ManagedProcess | None
    frontend_url: str | None
    accounts: list[LocalAccount]
    agents: list[AgentProcess] = field(default_factory=list)
    replicas: list[SchedulerProcess] = field(default_factory=list)
    """Scheduler replicas started by :func:`start_replica` (stopped with the grid)."""
    test_token: str = ZERO_ADDRESS
    """TestUSD's address (symbol tUSD, 6 decimals, EIP-2612 permit), listed for bounties; each
    dev submitter and provider, and the mediator, is minted :data:`DEVNET_TOKEN_GRANT` of it."""
    python_image: str | None = None
    """The Python data job's image (python3 + numpy) pinned in the devnet's registry; None when
    no dockerd runs or its .debs are not cached (scripts/setup_services.sh)."""
    torch_image: str | None = None
    """The training example's image (python3 + PyTorch, devstack/torch_image.py) pinned in the
    devnet's registry, once :meth:`publish_torch` pushed it (on demand: it is ~600 MB)."""

    def publish_torch(self) -> str:
        """Build (if needed) and push the PyTorch image to the devnet's registry; its pinned
        reference (the agents pull it by digest; the layers stay in the shared engine)."""
        if self.torch_image is not None:
            return self.torch_image
        if self.dockerd is None or self.registry is None:
            raise ServiceError(f"no Docker jobs on this grid: {self.docker_note}")
        client = docker.DockerClient(base_url=self.dockerd.host)
        try:
            ref = publish_torch_image(client, self.registry.host)
            client.images.remove(ref)
        finally:
            client.close()
        self.torch_image = ref
        return ref

    @property
    def ipfs_daemon(self) -> IpfsDaemon:
        """The submitter's IPFS node (what ``ipfs`` talks to)."""
        return self.ipfs_swarm[SUBMITTER_IPFS]

    @property
    def registries(self) -> list[str]:
        """The registries the grid's agents pull from, its scheduler and front end accept:
        public ones, and the devnet's registry by its ``host:port`` (on loopback or a bridge
        address, which every party refuses unless it is listed)."""
        return registry_allowance(self.registry)

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
            "ipfs_nodes": {d.name: d.api_addr for d in self.ipfs_swarm},
            "docker_host": self.dockerd.host if self.dockerd else None,
            "docker_note": self.docker_note,
            "registry": self.registry.host if self.registry else None,
            "busybox_image": self.busybox_image,
            "python_image": self.python_image,
            "torch_image": self.torch_image,
            "scheduler_url": self.scheduler.url,
            "mediator": self.accounts[10].address,
            "mediator_log": str(self.mediator_process.log_path),
            "frontend_url": self.frontend_url,
            "agents": [a.name for a in self.agents],
        }

    # ------------------------------------------------------------------ faults (tests/e2e)
    def agent(self, name: str) -> AgentProcess:
        """The agent called ``name``; LookupError naming the known ones otherwise."""
        for a in self.agents:
            if a.name == name:
                return a
        raise LookupError(f"no agent {name!r}; agents: {[a.name for a in self.agents]}")

    def kill_agent(self, agent: AgentProcess) -> None:
        """SIGKILL the agent's process group: no hand-back, no goodbye (a crashed host).

        Its running container, if any, is not in that group and runs on in dockerd."""
        pid = agent.process.pid
        if pid is None or not agent.process.running():
            raise ServiceError(f"agent {agent.name} is not running")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        agent.process.stop(5)  # reaps it

    def restart_agent(self, agent: AgentProcess) -> None:
        """Start the agent again with its wallet, name and configuration (same node id)."""
        if agent.process.running():
            raise ServiceError(f"agent {agent.name} is still running")
        agent.process.start()

    def restart_scheduler(self, timeout: float = 30.0) -> SchedulerProcess:
        """Start the scheduler again on the same port, database and token secret (after
        ``grid.scheduler.kill()`` or ``.stop()``); returns the new process."""
        if self.scheduler.running():
            raise ServiceError("the scheduler is still running: kill() or stop() it first")
        self.scheduler = SchedulerProcess(
            self.work,
            self.scheduler.port,
            self.scheduler_settings,
            log_level="info",
            host=self.scheduler.host,
        ).start(timeout)
        return self.scheduler

    def stop_ipfs(self) -> None:
        """Stop every party's IPFS node (SIGTERM); :meth:`start_ipfs` brings them back."""
        self.ipfs_swarm.stop()

    def start_ipfs(self) -> None:
        """Start every IPFS node again (same repositories, API and swarm ports) and reconnect
        them all."""
        before = {d.name: d.api_addr for d in self.ipfs_swarm}
        self.ipfs_swarm.start()
        after = {d.name: d.api_addr for d in self.ipfs_swarm}
        if after != before:
            raise ServiceError(f"IPFS nodes came back on {after}, not {before}")

    def stop_chain(self) -> None:
        """Stop anvil cleanly (SIGTERM): it writes its state file, which the restart loads."""
        self.anvil.stop()

    def start_chain(self) -> None:
        """Start anvil again on the same port from its state file (blocks, logs, balances)."""
        self.anvil.start()

    def rpc(self, method: str, *params: Any) -> Any:
        """A raw JSON-RPC call to anvil (``evm_increaseTime``, ``evm_mine``, ...)."""
        response = self.w3.provider.make_request(method, list(params))  # type: ignore[arg-type]
        if "error" in response:
            raise ServiceError(f"anvil refused {method}{list(params)}: {response['error']}")
        return response.get("result")


def _loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.")


def _docker(work: Path, bind_host: str = "127.0.0.1") -> tuple[Dockerd | None, str]:
    """dockerd when it can run here (root, docker.io installed), else None and why. With a
    ``bind_host`` off loopback, dockerd takes the registry there as insecure (it does not
    verify the registry's self-signed certificate)."""
    if os.geteuid() != 0:
        return None, "dockerd needs root: agents serve WASM jobs only"
    if shutil.which("dockerd") is None:
        return None, "dockerd is not installed (scripts/setup_services.sh): WASM jobs only"
    insecure = [] if _loopback(bind_host) else [f"{bind_host}/32"]
    engine = Dockerd(work / "dockerd", insecure_registries=insecure)
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


def _registry(
    work: Path, engine: Dockerd, bind_host: str = "127.0.0.1"
) -> tuple[Registry, str, str | None]:
    """The devnet's OCI registry (Debian's docker-registry) with the job images pushed to it;
    the busybox image's pinned reference ``127.0.0.1:<port>/gridmarket/busybox@sha256:…``.
    The local tag is then dropped, so the agents' engine pulls the image by digest the first
    time a job names it (the layers stay cached: the pull is quick)."""
    tls = not _loopback(bind_host)  # clients speak HTTPS to every registry off loopback
    registry = Registry(work / "registry", bind=bind_host, tls=tls).start()
    client = docker.DockerClient(base_url=engine.host)
    try:
        ref = publish_busybox(client, registry.host)
        client.images.remove(ref)
        python_ref: str | None = None
        try:  # ~3 s to build cold (0.02 s cached) + ~4 s to push the first time
            python_ref = publish_python_image(client, registry.host)
            client.images.remove(python_ref)
        except ServiceError as exc:  # its .debs are not cached: no Python job, the rest runs
            log.warning("no Python job image: %s", exc)
    except Exception:
        registry.stop()
        raise
    finally:
        client.close()
    return registry, ref, python_ref


def registry_allowance(registry: Registry | None) -> list[str]:
    """``public`` and ``registry``'s ``host:port``: the allow-list of a devnet's parties
    (agents' ``pull_registries``, the scheduler's and the front end's ``image_registries``)."""
    return ["public", registry.host] if registry is not None else ["public"]


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


def start_agent(
    grid: LocalGrid,
    index: int,
    *,
    name: str,
    region: str,
    slots: int = 1,
    scheduler_url: str | None = None,
    ipfs_api: str | None = None,
    launcher: Callable[..., ManagedProcess] = ManagedProcess,
) -> AgentProcess:
    """Register provider ``index`` on-chain (staked) and start its agent daemon process,
    talking to ``scheduler_url`` (default: the grid's scheduler; a replica's URL for tests).
    The agent takes tUSD jobs: its configuration names a floor and a stake in tUSD
    (:func:`agent_token_settings`), and the stake is made here, on-chain, before it starts
    (the agent has no RPC URL: its own top-up at start is not used on the devnet).

    ``ipfs_api``: the agent's own IPFS node, started by the caller (default: one added to the
    grid's swarm). ``launcher`` builds the process (ManagedProcess's arguments): a
    :meth:`devstack.netns.Netns.process` runs the agent in a network namespace."""
    account = grid.providers[index]
    home = grid.work / "agents" / name
    home.mkdir(parents=True, exist_ok=True)
    keystore = home / "keystore.json"
    if not keystore.exists():
        from gridmarket.keystore import create_keystore

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
        "scheduler_url": scheduler_url or grid.scheduler.url,
        "ipfs_api": ipfs_api or _agent_ipfs(grid, name).api_addr,
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
        "pull_registries": grid.registries,
        "hold_margin_s": margin_of(grid.deployment.params),  # the scheduler's (no deployment)
    }
    if grid.dockerd is not None:
        config["docker_host"] = grid.dockerd.host
    config.update(agent_token_settings(grid.deployment, grid.deployment_file, grid.test_token))
    if config.get("stake_tokens"):
        from gridmarket.lightchain import LightEscrowClient

        light = LightEscrowClient.connect(grid.anvil.url, grid.deployment)
        try:
            stake_agent_tokens(light, account, config)
        finally:
            light.close()
    config_path = home / "agent.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=True))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if grid.registry is not None and grid.registry.ca_file is not None:
        env["REQUESTS_CA_BUNDLE"] = str(grid.registry.ca_file)  # the manifest check (HTTPS)
    proc = launcher(
        f"agent {name}",
        [sys.executable, "-m", "agent.cli", "--config", str(config_path), "run"],
        home / "agent.log",
        env=env,
        cwd=ROOT,
    )
    proc.start()
    agent = AgentProcess(name, account, proc, config_path)
    grid.agents.append(agent)
    return agent


def agent_token_settings(
    deployment: Deployment, deployment_file: Path, token: str
) -> dict[str, Any]:
    """A devnet agent's settings for jobs paid in ``token`` (TestUSD): the deployment file
    (which lists it), ``price_floors`` of :data:`AGENT_TUSD_FLOOR` and ``stake_tokens`` of
    :data:`AGENT_TUSD_STAKE`; nothing on a grid without the token."""
    if int(token, 16) == 0:
        return {}
    symbol = by_address(tokens_of(deployment.tokens), token).symbol
    return {
        "deployment": str(deployment_file),
        "price_floors": {symbol: AGENT_TUSD_FLOOR},
        "stake_tokens": {symbol: AGENT_TUSD_STAKE},
    }


def stake_agent_tokens(
    escrow: LightEscrowClient, account: LocalAccount, settings: dict[str, Any]
) -> None:
    """Bring ``account``'s token stakes up to the ``stake_tokens`` of ``settings``, read the way
    the agent reads them (:func:`agent.config.load_config`), with the agent's own top-up
    (:func:`agent.signup.top_up_token_stakes`: permit and stakeToken in one transaction, nothing
    sent when the stake is there, so a restarted agent's wallet is not staked twice)."""
    if not settings.get("stake_tokens"):
        return
    from agent.config import load_config
    from agent.signup import top_up_token_stakes

    keys = ("deployment", "price_floors", "stake_tokens")
    config = load_config(None, **{k: settings[k] for k in keys if k in settings})
    top_up_token_stakes(escrow, account, config.token_stakes, config.token)


def _agent_ipfs(grid: LocalGrid, name: str) -> IpfsDaemon:
    """The agent's own IPFS node: started and connected to every other party's on first use,
    kept (same repo and ports) when the agent restarts."""
    if name in grid.ipfs_swarm.names:
        return grid.ipfs_swarm[name]
    return grid.ipfs_swarm.add(name)


def start_replica(grid: LocalGrid, name: str = "scheduler-b") -> SchedulerProcess:
    """Another scheduler replica with the grid's settings (database, token secret, chain) on
    a new port; stopped with the grid. Only meaningful when the database is PostgreSQL."""
    host = grid.scheduler.host
    replica = SchedulerProcess(
        grid.work,
        free_host_port(host),
        grid.scheduler_settings,
        name=name,
        log_level="info",
        host=host,
    )
    grid.replicas.append(replica)
    replica.start()
    return replica


def wait_nodes(grid: LocalGrid, count: int, timeout: float = 60) -> None:
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


DEVNET_ESCROW: dict[str, Any] = {
    "min_duration": 60,
    "challenge_window": 15,  # a result nobody disputes is paid 15 s after it is posted
    # the operator takes a job back from a silent node 12 s after the assignment at the
    # earliest, and not before the hold the node signed for is over (gridmarket.holds)
    "reassign_delay": 12,
    "mediation_window": 120,
}
"""Escrow parameters of the local devnet (production defaults: gridmarket.deploy.EscrowParams)."""
DEVNET_HOLD_MARGIN_S = 5
"""The devnet's hold margin (``hold_margin_s`` in its deployment file, gridmarket/holds.py): a
job's hold is its timeout plus 5 s, so a killed node's job moves on within a test or a demo;
production's is 300 s."""


@contextlib.contextmanager
def run_grid(
    work: Path,
    *,
    agents: int = 3,
    with_frontend: bool = True,
    scheduler_overrides: dict[str, str] | None = None,
    escrow_overrides: dict[str, Any] | None = None,
    on_step: Callable[[str], None] = lambda s: None,
    bind_host: str = "127.0.0.1",
) -> Iterator[LocalGrid]:
    """Start everything under ``work`` (logs there too); stop it all when the block ends.

    ``bind_host``: where the scheduler, the IPFS swarm and the registry listen (see the module
    doc); an address of this host, e.g. :class:`devstack.netns.Netns`'s ``host_ip``.

    The devnet's escrow has short windows (:data:`DEVNET_ESCROW`) so that a job paid after its
    challenge window is paid within a demo; ``escrow_overrides`` changes any parameter."""
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    # a new devnet every time: state from an earlier run belongs to another chain (the IPFS
    # repo and dockerd's image store are kept: they only hold content, and start faster)
    for stale in ("agents", "outputs", "scheduler-work"):
        shutil.rmtree(work / stale, ignore_errors=True)
    for db in [*work.glob("scheduler.db*"), *work.glob("mediator.db*")]:
        db.unlink()
    state_file = work / "anvil-state.json"  # written on a clean stop: stop_chain/start_chain
    state_file.unlink(missing_ok=True)
    with contextlib.ExitStack() as stack:
        on_step("anvil devnet")
        anvil = Anvil(log_file=work / "anvil.log", state_file=state_file, idle_block_s=1.0)
        stack.enter_context(anvil)
        w3 = Web3(Web3.HTTPProvider(anvil.url))
        accounts = [Account.from_key(k) for k in dev_accounts(11)]
        on_step("deploy JobEscrow")
        params = EscrowParams(
            operator=accounts[1].address,
            treasury=accounts[2].address,
            mediator=accounts[10].address,
            **{**DEVNET_ESCROW, **(escrow_overrides or {})},
        )
        deployment = deploy_escrow(w3, accounts[0], params)
        on_step("TestUSD (the devnet's stablecoin: 6 decimals, permit) listed for bounties")
        test_token = deploy_test_token(w3, accounts[0])
        deployment = list_token(w3, accounts[0], deployment, test_token)
        minter = TokenClient(w3, test_token)
        # the dev submitters and providers, and the mediator (a dispute of a tUSD job is ruled
        # on a re-run it funds in tUSD)
        for holder in [*accounts[3:10], accounts[10]]:
            minter.send(accounts[0], "mint", holder.address, DEVNET_TOKEN_GRANT)
        # the mediator's public key, for the submitters' clients to seal spot seeds to it
        # (they check it against params.mediator: gridmarket.spot.check_public_key)
        mediator_pubkey = spot.public_key_of(bytes(accounts[10].key))
        deployment = dataclasses.replace(
            deployment,
            params={
                **deployment.params,
                "mediator_pubkey": "0x" + mediator_pubkey.hex(),
                "hold_margin_s": DEVNET_HOLD_MARGIN_S,
            },
        )
        deployment_file = work / "deployment.json"
        deployment.save(deployment_file)
        escrow = EscrowClient(w3, deployment)
        on_step("IPFS nodes (js-ipfs, one per party, loopback swarm)")
        parties = [SUBMITTER_IPFS, SCHEDULER_IPFS, MEDIATOR_IPFS]
        parties += [FRONTEND_IPFS] if with_frontend else []
        parties += [FLEET[i % len(FLEET)][0] for i in range(agents)]
        ipfs_swarm = IpfsSwarm(work / "ipfs", parties, swarm_host=bind_host)
        stack.callback(ipfs_swarm.stop)
        ipfs_swarm.start()  # in parallel, then a full mesh
        ipfs = IpfsStore(ipfs_swarm[SUBMITTER_IPFS].api_addr)
        stack.callback(ipfs.close)
        on_step("dockerd")
        engine, note = _docker(work, bind_host)
        registry: Registry | None = None
        busybox_image = BUSYBOX_IMAGE
        python_image: str | None = None
        if engine is not None:
            stack.callback(engine.stop)
            on_step("OCI registry (docker-registry, loopback) and job images by digest")
            registry, busybox_image, python_image = _registry(work, engine, bind_host)
            stack.callback(registry.stop)
        on_step("scheduler")
        settings = {
            "database_url": f"sqlite:///{work / 'scheduler.db'}",
            "rpc_url": anvil.url,
            "deployment_file": str(deployment_file),
            "operator_key": "0x" + bytes(accounts[1].key).hex(),
            "ipfs_api": ipfs_swarm[SCHEDULER_IPFS].api_addr,
            "token_secret": secrets.token_hex(32),
            "heartbeat_interval_s": "2",
            "node_timeout_s": "10",
            "lease_ttl_s": "10",
            "chain_poll_s": "0.1",
            "dispatch_tick_s": "0.1",
            "work_dir": str(work / "scheduler-work"),
            "image_registries": json.dumps(registry_allowance(registry)),
        }
        settings.update(scheduler_overrides or {})
        scheduler = SchedulerProcess(
            work, free_host_port(bind_host), settings, log_level="info", host=bind_host
        )
        scheduler.start()
        grid_ref: list[LocalGrid] = []

        def stop_schedulers() -> None:  # the current ones: restart_scheduler replaces it
            current = grid_ref[0].scheduler if grid_ref else scheduler
            for s in [current, *(grid_ref[0].replicas if grid_ref else [])]:
                s.stop()

        stack.callback(stop_schedulers)
        on_step("mediator")
        mediator = MediatorProcess(
            work,
            rpc_url=anvil.url,
            deployment_file=deployment_file,
            ipfs_api=ipfs_swarm[MEDIATOR_IPFS].api_addr,
            key_hex="0x" + bytes(accounts[10].key).hex(),
            scheduler_url=scheduler.url,
        )
        mediator.start()
        stack.callback(mediator.stop)
        frontend, frontend_url = None, None
        if with_frontend:
            on_step("web front end")
            frontend, frontend_url = _frontend(
                work,
                {
                    "GRIDMARKET_FRONTEND_SCHEDULER_URL": scheduler.url,
                    "GRIDMARKET_FRONTEND_RPC_URL": anvil.url,
                    "GRIDMARKET_FRONTEND_DEPLOYMENT_FILE": str(deployment_file),
                    "GRIDMARKET_FRONTEND_IPFS_API": ipfs_swarm[FRONTEND_IPFS].api_addr,
                    **({"GRIDMARKET_FRONTEND_REGISTRY": registry.host} if registry else {}),
                    "GRIDMARKET_FRONTEND_IMAGE_REGISTRIES": json.dumps(
                        registry_allowance(registry)
                    ),
                },
            )
            if frontend is not None:
                stack.callback(frontend.stop)
        grid = LocalGrid(
            work=work,
            anvil=anvil,
            w3=w3,
            deployment=deployment,
            deployment_file=deployment_file,
            escrow=escrow,
            ipfs_swarm=ipfs_swarm,
            ipfs=ipfs,
            dockerd=engine,
            docker_note=note,
            registry=registry,
            busybox_image=busybox_image,
            python_image=python_image,
            scheduler=scheduler,
            scheduler_settings=settings,
            mediator_process=mediator,
            frontend=frontend,
            frontend_url=frontend_url,
            accounts=accounts,
            test_token=test_token,
        )
        grid_ref.append(grid)

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
