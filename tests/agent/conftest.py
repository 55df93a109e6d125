"""Real services for the agent's tests: a js-ipfs daemon and a private dockerd (devstack).

Both are started once per session under pytest's temporary directory and stopped at the end.
A service that cannot start FAILS the tests that need it, with the service's log in the message:
these tests never skip (docs/agent.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import docker
import ipfshttpclient
import pytest

from agent.executors.docker import DockerExecutor
from agent.executors.wasm import WasmExecutor
from agent.storage.ipfs import IpfsStorage
from gridmarket.devstack._process import ServiceError
from gridmarket.devstack.dockerd import Dockerd
from gridmarket.devstack.images import BUSYBOX_IMAGE, ensure_busybox_image
from gridmarket.devstack.ipfs import IpfsDaemon

warnings.filterwarnings("ignore", message="The 'strict' parameter", category=FutureWarning)


@pytest.fixture(scope="session")
def ipfs_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IpfsDaemon]:
    daemon = IpfsDaemon(tmp_path_factory.mktemp("ipfs"))
    try:
        daemon.start()
    except ServiceError as exc:
        pytest.fail(
            f"the js-ipfs daemon did not start (run scripts/setup.sh): {exc}", pytrace=False
        )
    yield daemon
    daemon.stop()


@pytest.fixture(scope="session")
def ipfs_client(ipfs_daemon: IpfsDaemon) -> Iterator[ipfshttpclient.Client]:
    """The raw RPC client: what the daemon itself says, to compare our code against."""
    client = ipfshttpclient.Client(ipfs_daemon.api_addr)
    yield client
    client.close()


@pytest.fixture
def storage(ipfs_daemon: IpfsDaemon) -> Iterator[IpfsStorage]:
    with IpfsStorage(ipfs_daemon.api_addr, resolve_timeout=5) as storage:
        yield storage


@pytest.fixture(scope="session")
def dockerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dockerd]:
    engine = Dockerd(tmp_path_factory.mktemp("dockerd"))
    try:
        engine.start()
    except ServiceError as exc:
        pytest.fail(
            f"dockerd did not start (run scripts/setup_services.sh, as root): {exc}", pytrace=False
        )
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def docker_client(dockerd: Dockerd) -> Iterator[docker.DockerClient]:
    client = docker.DockerClient(base_url=dockerd.host)
    yield client
    client.close()


@pytest.fixture(scope="session")
def test_image(docker_client: docker.DockerClient) -> str:
    try:
        ensure_busybox_image(docker_client)
    except ServiceError as exc:
        pytest.fail(f"cannot build {BUSYBOX_IMAGE}: {exc}", pytrace=False)
    return BUSYBOX_IMAGE


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


def pytest_configure(config: pytest.Config) -> None:
    # ipfshttpclient 0.8.0a2 passes urllib3 a deprecated argument on every connection.
    config.addinivalue_line("filterwarnings", "ignore:The 'strict' parameter:FutureWarning")
