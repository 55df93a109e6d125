"""The agent put together: the executor factories and the job runner, the scheduler session,
and the daemon (:func:`build_agent`), from the configuration and the provider's wallet."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from agent.acceptance import AcceptancePolicy, EscrowFacts
from agent.capacity import (
    DEFAULT_DOCKER_HOST,
    CapacitySource,
    node_capacity,
    remove_leftover_containers,
    usable_executors,
)
from agent.client import Backoff, NodeSession
from agent.config import AgentConfig
from agent.daemon import Agent
from agent.errors import AgentError
from agent.executors.base import LABEL, OWNER_LABEL
from agent.runner import IpfsProbe, JobRunner, StepReporter
from gridmarket.wire import ExecutorKind, NodeCapacityIn, RegisterResponse, ResultReport

if TYPE_CHECKING:
    from agent.executors.base import Executor
    from agent.executors.docker import DockerExecutor
    from agent.hardware import HardwareReport
    from agent.onchain import ResultGuard
    from agent.storage.ipfs import AgentIpfsStore
    from gridmarket.ethsig import Signer
    from gridmarket.lightchain import LightEscrowClient

__all__ = [
    "ChainDuties",
    "build_agent",
    "build_runner",
    "chain_duties",
    "executor_owner",
    "node_session",
    "stake_tokens_at_start",
]

log = logging.getLogger(__name__)


def build_runner(
    config: AgentConfig,
    account: Signer,
    executors: list[ExecutorKind],
    *,
    steps: StepReporter | None = None,
) -> JobRunner:
    """A :class:`JobRunner` whose adapters (IPFS client, docker SDK, wasmtime) load lazily.

    When it serves Docker jobs, its start-up (:meth:`JobRunner.clean_leftovers`) also removes
    the containers an earlier run of this agent left in the engine (a crash, a SIGKILL), over
    httpx (:func:`agent.capacity.remove_leftover_containers`): the docker SDK loads with the
    first Docker job (at start only for an ``ssh://`` engine).
    """

    def storage() -> AgentIpfsStore:
        from agent.storage.ipfs import AgentIpfsStore

        return AgentIpfsStore(config.ipfs_api)

    @functools.cache  # one engine client: the runner's and the start-up clean-up's
    def docker_executor() -> DockerExecutor:
        from agent.executors.docker import DockerExecutor, PullPolicy
        from gridmarket.images import load_docker_credentials
        from gridmarket.registry_policy import RegistryPolicy

        auth = config.registry_auth_file
        pull = PullPolicy(
            enabled=config.pull_images,
            max_download_bytes=config.pull_max_bytes,
            max_image_bytes=config.pull_max_image_bytes,
            timeout_s=config.pull_timeout_s,
            cache_bytes=config.image_cache_bytes,
            credentials=load_docker_credentials(auth) if auth is not None else {},
            state_file=config.work_dir.parent / "pulled-images.json",
            registries=RegistryPolicy.of(config.pull_registries, "pull_registries"),
        )
        return DockerExecutor(
            docker_host=config.docker_host, owner=executor_owner(config, account), pull=pull
        )

    def wasm_executor() -> Executor:
        from agent.executors.wasm import WasmExecutor

        return WasmExecutor()

    def remove_leftovers() -> int:
        host = config.docker_host or DEFAULT_DOCKER_HOST
        if urlsplit(host).scheme == "ssh":
            return docker_executor().remove_leftovers()
        labels = [LABEL, f"{OWNER_LABEL}={executor_owner(config, account)}"]
        return remove_leftover_containers(host, labels)  # no docker SDK at start

    factories: dict[ExecutorKind, Callable[[], Executor]] = {
        ExecutorKind.DOCKER: docker_executor,
        ExecutorKind.WASM: wasm_executor,
    }
    return JobRunner(
        account,
        storage=storage,  # AgentIpfsStore is its own context manager
        executors={k: factories[k] for k in executors},
        work_dir=config.work_dir,
        max_dataset_bytes=config.max_dataset_bytes,
        max_module_bytes=config.max_module_bytes,
        storage_alive=IpfsProbe(config.ipfs_url),
        steps=steps,
        remove_leftovers=remove_leftovers if ExecutorKind.DOCKER in executors else None,
    )


def node_session(
    config: AgentConfig, account: Signer, capacity: Callable[[], NodeCapacityIn]
) -> NodeSession:
    """The node's session with the scheduler at ``config.scheduler_url``."""
    from agent.client import agent_version

    return NodeSession(
        config.scheduler_url,
        account,
        name=config.name,
        capacity=capacity,
        agent_version=agent_version(),
        timeout_s=config.request_timeout_s,
        images=capacity.images if isinstance(capacity, CapacitySource) else None,
    )


def executor_owner(config: AgentConfig, account: Signer) -> str:
    """The label value marking this agent's containers (wallet and node name): several agents
    may share one Docker engine, and each removes only its own leftovers."""
    return f"{account.address.lower()}/{config.name}"


def build_agent(
    config: AgentConfig,
    account: Signer,
    *,
    report: HardwareReport | None = None,
    steps: StepReporter | None = None,
    on_registered: Callable[[RegisterResponse], None] | None = None,
) -> Agent:
    """The daemon for ``config``: detects hardware and executors, wires client and runner."""
    from agent.hardware import detect_hardware

    kinds, notes = usable_executors(config)
    for note in notes:
        log.warning("%s: serving %s jobs only", note, " and ".join(kinds))
    if report is None:
        report = detect_hardware(config.work_dir)
    client = node_session(config, account, node_capacity(config, report, kinds))
    runner = build_runner(config, account, kinds, steps=steps)
    chain = chain_duties(config, account, client)
    stake_tokens_at_start(config, account, chain.escrow)
    return Agent(
        client,
        runner,
        slots=config.slots,
        poll_wait_s=config.poll_wait_s,
        heartbeat_interval_s=config.heartbeat_interval_s,
        stop_grace_s=config.stop_grace_s,
        report_flush_s=config.report_flush_s,
        backoff=lambda: Backoff(config.backoff_base_s, config.backoff_cap_s),
        storage_alive=IpfsProbe(config.ipfs_url),
        on_registered=on_registered,
        submit_on_chain=chain.submit_on_chain,
        policy=chain.policy.decide,
        guard=chain.guard,
        finalize=chain.finalize,
        finalize_interval_s=config.finalize_interval_s,
    )


def stake_tokens_at_start(
    config: AgentConfig, account: Signer, escrow: LightEscrowClient | None
) -> None:
    """``run``'s start: bring the stakes of ``stake_tokens`` up to their amounts when below
    (:func:`agent.signup.top_up_token_stakes`; nothing is sent when they are there), so that an
    agent restarted after a slash, or with a raised target, keeps the collateral its token jobs
    lock. A failure is logged and the node serves on: a token job whose collateral its free
    stake cannot cover is declined by the acceptance policy."""
    if not config.token_stakes:
        return
    if escrow is None:
        log.warning("stake_tokens is set but rpc_url is not: the token stakes are not checked")
        return
    from agent.signup import top_up_token_stakes

    try:
        done = top_up_token_stakes(escrow, account, config.token_stakes, config.token)
    except Exception as exc:  # TokenStakeError, an RPC error: serve on, say why
        log.error("token stake not topped up: %s", exc)
        return
    for stake in done:
        log.info("%s", stake.line())


@dataclass
class ChainDuties:
    """What the daemon does with the chain (all optional but the policy): see agent.onchain."""

    policy: AcceptancePolicy
    escrow: LightEscrowClient | None = None
    submit_on_chain: Callable[[str, ResultReport], str | None] | None = None
    guard: ResultGuard | None = None
    finalize: Callable[[], object] | None = None


def chain_duties(config: AgentConfig, account: Signer, client: NodeSession) -> ChainDuties:
    """The acceptance policy, and with ``rpc_url`` and ``deployment`` the on-chain submitter,
    the result guard and the finalizer, sharing one escrow client (one nonce cache): the light
    one (:class:`gridmarket.lightchain.LightEscrowClient`, JSON-RPC over httpx), so web3 and
    eth-account are never imported, with ``rpc_url`` or without (~28 MB of RSS, docs/agent.md
    "Footprint")."""
    from gridmarket.deployment import ChainError, Deployment
    from gridmarket.holds import margin_of

    deployment = Deployment.load(config.deployment) if config.deployment is not None else None

    def expected() -> tuple[int, str]:
        info = client.info()
        return info.chain_id, info.escrow

    escrow: LightEscrowClient | None = None
    if config.rpc_url is not None and deployment is not None:
        from gridmarket.lightchain import LightEscrowClient

        try:
            escrow = LightEscrowClient.connect(config.rpc_url, deployment)
        except ChainError:
            raise
        except Exception as exc:  # the RPC node unreachable
            raise AgentError(f"the chain at {config.rpc_url} does not answer: {exc}") from None
    mediator = deployment.params.get("mediator") if deployment is not None else None
    policy = AcceptancePolicy(
        account.address,
        accepted_mediators=config.accepted_mediators,
        accept_self_mediated=config.accept_self_mediated,
        max_collateral_wei=config.max_collateral_wei,
        price_floor_wei_per_hour=config.price_floor_wei_per_hour,
        token_floors=config.token_floors,
        token_of=config.token,
        deployment_mediator=mediator if isinstance(mediator, str) else None,
        chain=EscrowFacts(escrow) if escrow is not None else None,
        expected=expected,
        hold_margin_s=(
            config.hold_margin_s
            if config.hold_margin_s is not None
            else margin_of(deployment.params if deployment is not None else None)
        ),
    )
    duties = ChainDuties(policy, escrow)
    if escrow is None:
        return duties
    from agent.onchain import (
        Finalizer,
        OnChainSubmitter,
        ResultGuard,
        guard_delay,
        reassign_delay,
    )

    submitter = OnChainSubmitter(escrow, account)
    if config.submit_on_chain:
        duties.submit_on_chain = submitter.submit
    elif config.guard_results:
        duties.guard = ResultGuard(
            submitter.submit,
            guard_delay(config.guard_delay_s, deployment),
            take_back_s=reassign_delay(deployment),
            time_left=submitter.time_left,
        )
    duties.finalize = Finalizer(escrow, account).run_once
    return duties
