"""Test-wide set-up: the offline compiler, and the real local services every suite shares.

Services (all real, started once per session under pytest's temporary directory, stopped at the
end): a js-ipfs daemon, a private dockerd, and an anvil devnet with the escrow deployed
(:func:`devnet`). A service that cannot start FAILS the tests that need it, with the service's
log in the message: these tests never skip (docs/platform.md).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import ipfshttpclient
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

ROOT = Path(__file__).resolve().parent.parent
# Ape compiles lazily and finds anvil with shutil.which at connect time, both after this runs,
# so `pytest` works without the Makefile's environment too.
os.environ.setdefault("SOLCX_BINARY_PATH", str(ROOT / "tools" / "solc"))
_bin = str(ROOT / "node_modules" / ".bin")
if _bin not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _bin + os.pathsep + os.environ.get("PATH", "")

from devstack._process import ServiceError  # noqa: E402
from devstack.anvil import Anvil, DevnetError, DevRoles, dev_accounts  # noqa: E402
from devstack.dockerd import Dockerd  # noqa: E402
from devstack.images import BUSYBOX_IMAGE, ensure_busybox_image  # noqa: E402
from devstack.ipfs import IpfsDaemon  # noqa: E402
from gridmarket.chain import Deployment  # noqa: E402
from gridmarket.deploy import (  # noqa: E402
    EscrowParams,
    deploy_escrow,
    deploy_test_token,
    list_token,
)
from gridmarket.token import TokenClient  # noqa: E402

TEST_USD_GRANT = 1_000_000 * 10**6
"""TestUSD each dev submitter and provider holds in the session devnet (1,000,000 tUSD)."""

warnings.filterwarnings("ignore", message="The 'strict' parameter", category=FutureWarning)


def pytest_configure(config: pytest.Config) -> None:
    # ipfshttpclient 0.8.0a2 passes urllib3 a deprecated argument on every connection.
    config.addinivalue_line("filterwarnings", "ignore:The 'strict' parameter:FutureWarning")


# --------------------------------------------------------------------------- two runs
# Ape's pytest plugin replaces eth-abi's global decoders with lenient ones (truncated data is
# padded and decoded: ``decode(["uint256"], bytes(31))`` gives ``(0,)`` with it and raises
# without it). Production never loads Ape, so every test outside tests/contracts runs without
# the plugin (``-p no:ape_test`` in pyproject.toml), on the decoder production runs; the contract
# tests, written against Ape, run in a pytest of their own: ``pytest -p ape.pytest.plugin
# tests/contracts`` (``make pytest`` runs both).
CONTRACT_TESTS = ROOT / "tests" / "contracts"


def _ape_loaded(config: pytest.Config) -> bool:
    return config.pluginmanager.has_plugin("ape.pytest.plugin") or config.pluginmanager.has_plugin(
        "ape_test"
    )


def _under_contracts(path: Path) -> bool:
    return path == CONTRACT_TESTS or CONTRACT_TESTS in path.parents


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if _ape_loaded(config) or not _under_contracts(collection_path):
        return None
    asked = [Path(str(a).split("::")[0]).resolve() for a in config.args]
    if any(_under_contracts(a) for a in asked):
        raise pytest.UsageError(
            "tests/contracts run with Ape's plugin, in a pytest of their own: "
            "`pytest -p ape.pytest.plugin tests/contracts` (make pytest runs both)"
        )
    return True  # the default run: the contract tests are the second run of `make pytest`


def pytest_collection_finish(session: pytest.Session) -> None:
    if not _ape_loaded(session.config):
        return
    outside = [i.nodeid for i in session.items if not _under_contracts(Path(i.path))]
    if outside:
        raise pytest.UsageError(
            f"{len(outside)} tests outside tests/contracts were collected with Ape's plugin "
            f"(first: {outside[0]}): they must run on production's eth-abi decoder, without it"
        )


# --------------------------------------------------------------------------- IPFS


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


# --------------------------------------------------------------------------- Docker


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


# --------------------------------------------------------------------------- chain


@dataclass(frozen=True)
class Devnet(DevRoles):
    """A plain anvil (not Ape's managed one: ~7x faster per call) with the escrow deployed.

    Roles are anvil's dev accounts: 0 owner/deployer, 1 operator (the scheduler's key),
    2 treasury, 3-4 submitters, 5-9 providers (none registered: tests register what they need),
    10 mediator (listed at deployment).
    """

    anvil: Anvil
    w3: Web3
    deployment: Deployment
    params: EscrowParams
    accounts: list[LocalAccount]
    token: str
    """TestUSD (6 decimals, permit), listed; every submitter and provider holds 1,000,000."""

    @property
    def url(self) -> str:
        return self.anvil.url


@pytest.fixture(scope="session")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Devnet]:
    """One anvil + escrow per session. Tests that need a pristine chain start their own."""
    log = tmp_path_factory.mktemp("anvil") / "anvil.log"
    anvil = Anvil(log_file=log)
    try:
        anvil.start()
    except DevnetError as exc:
        pytest.fail(f"anvil did not start (run scripts/setup.sh): {exc}", pytrace=False)
    try:
        w3 = Web3(Web3.HTTPProvider(anvil.url))
        accounts = [Account.from_key(k) for k in dev_accounts(11)]
        params = EscrowParams(
            operator=accounts[1].address,
            treasury=accounts[2].address,
            mediator=accounts[10].address,
        )
        deployment = deploy_escrow(w3, accounts[0], params)
        token = deploy_test_token(w3, accounts[0])
        deployment = list_token(w3, accounts[0], deployment, token)
        minter = TokenClient(w3, token)
        for holder in accounts[3:10]:
            minter.send(accounts[0], "mint", holder.address, TEST_USD_GRANT)
        yield Devnet(anvil, w3, deployment, params, accounts, token)
    finally:
        anvil.stop()
