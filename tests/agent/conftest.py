"""Fixtures for the agent's tests, on the real services of tests/conftest.py (IPFS, dockerd)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from agent.config import multiaddr_to_url
from agent.executors.docker import DockerExecutor
from agent.executors.wasm import WasmExecutor
from agent.runner import IpfsProbe, JobRunner
from agent.storage.ipfs import AgentIpfsStore
from devstack.ipfs import IpfsDaemon
from gridmarket.wire import ExecutorKind

warnings.filterwarnings("ignore", message="The 'strict' parameter", category=FutureWarning)


@pytest.fixture
def storage(ipfs_daemon: IpfsDaemon) -> Iterator[AgentIpfsStore]:
    with AgentIpfsStore(ipfs_daemon.api_addr, resolve_timeout=5) as storage:
        yield storage


@pytest.fixture(scope="session")
def docker_executor(docker_client: docker.DockerClient, test_image: str) -> DockerExecutor:
    return DockerExecutor(docker_client)


@pytest.fixture(scope="session")
def wasm_executor() -> WasmExecutor:
    return WasmExecutor()


@pytest.fixture
def job(tmp_path: Path) -> tuple[Path, Path]:
    """A per-test job directory: (input dir with data.txt, output dir not yet created)."""
    inp = tmp_path / "input"
    inp.mkdir()
    (inp / "data.txt").write_text("hello gridmarket\n")
    inp.chmod(0o755)
    return inp, tmp_path / "output"


@pytest.fixture(scope="module")
def account() -> LocalAccount:
    key: LocalAccount = Account.from_key("0x" + "07" * 32)
    return key


@pytest.fixture
def runner(
    account: LocalAccount,
    ipfs_daemon: IpfsDaemon,
    docker_client: docker.DockerClient,
    test_image: str,
    tmp_path: Path,
) -> JobRunner:
    return JobRunner(
        account,
        storage=lambda: AgentIpfsStore(ipfs_daemon.api_addr, resolve_timeout=2),
        executors={
            ExecutorKind.DOCKER: lambda: DockerExecutor(docker_client),
            ExecutorKind.WASM: WasmExecutor,
        },
        work_dir=tmp_path / "work",
        storage_alive=IpfsProbe(multiaddr_to_url(ipfs_daemon.api_addr)),
        storage_wait_s=1,
    )
