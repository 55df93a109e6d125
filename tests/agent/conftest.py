"""Fixtures for the agent's tests, on the real services of tests/conftest.py (IPFS, dockerd)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from agent.executors.docker import DockerExecutor
from agent.executors.wasm import WasmExecutor
from agent.storage.ipfs import AgentIpfsStore
from devstack.ipfs import IpfsDaemon

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
