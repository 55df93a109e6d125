"""`ape run deploy` end to end: the local network with Ape's test accounts, and the public-testnet
path (an imported Ape account, the RPC URL from the environment) rehearsed against an anvil that
calls itself Sepolia (chain id 11155111) or Base Sepolia (84532). Each run is a real `ape`
subprocess; the installed-package read of the artifacts is checked in a subprocess too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from web3 import Web3

from devstack.anvil import Anvil, dev_accounts
from gridmarket.build import EXPORTED, load_artifacts
from gridmarket.chain import Deployment, EscrowClient
from gridmarket.deploy import explorer_lines

ROOT = Path(__file__).resolve().parents[2]
APE = str(Path(sys.executable).with_name("ape"))
KEYS = dev_accounts(3)
OPERATOR = Account.from_key(KEYS[1]).address
TREASURY = Account.from_key(KEYS[2]).address
PASSPHRASE = "correct-Horse-battery-9!"


def _ape_run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **env}
    return subprocess.run(
        [APE, "run", "deploy", *args],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


# network, chain id, the env var ape-config.yaml reads its RPC URL from, the explorer
PUBLIC = {
    "sepolia": (
        "ethereum:sepolia:node",
        11155111,
        "GRIDMARKET_SEPOLIA_RPC_URL",
        "https://sepolia.etherscan.io",
    ),
    "base-sepolia": (
        "base:sepolia:node",
        84532,
        "GRIDMARKET_BASE_SEPOLIA_RPC_URL",
        "https://sepolia.basescan.org",
    ),
}


def _public_anvil(chain_id: int, tmp_path: Path) -> Anvil:
    # Ape waits for 2 confirmations on these networks: blocks must keep coming, as on the real
    # chain, so this anvil mines one a second.
    return Anvil(chain_id=chain_id, block_time=1, log_file=tmp_path / "anvil.log").start()


@pytest.fixture
def sepolia_anvil(tmp_path: Path) -> Iterator[Anvil]:
    anvil = _public_anvil(11155111, tmp_path)
    yield anvil
    anvil.stop()


@pytest.fixture
def ape_data(tmp_path: Path) -> Path:
    """A private Ape data folder holding one imported keyfile account, ``deployer``."""
    folder = tmp_path / "ape-data"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from ape_accounts import import_account_from_private_key as imp; "
            "imp('deployer', sys.argv[1], sys.argv[2])",
            PASSPHRASE,
            KEYS[0],
        ],
        env={**os.environ, "APE_DATA_FOLDER": str(folder)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return folder


@pytest.mark.parametrize("name", PUBLIC)
def test_dry_run_on_a_public_chain_id(name: str, ape_data: Path, tmp_path: Path) -> None:
    network, chain_id, url_var, explorer = PUBLIC[name]
    with _public_anvil(chain_id, tmp_path) as anvil:
        _dry_run(network, chain_id, url_var, explorer, anvil, ape_data, tmp_path)


def _dry_run(
    network: str,
    chain_id: int,
    url_var: str,
    explorer: str,
    anvil: Anvil,
    ape_data: Path,
    tmp_path: Path,
) -> None:
    out = tmp_path / "deployment.json"
    run = _ape_run(
        [
            "--network",
            network,
            "--account",
            "deployer",
            "--yes",
            "--operator",
            OPERATOR,
            "--treasury",
            TREASURY,
            "--fee-bps",
            "300",
            "--out",
            str(out),
        ],
        {
            "APE_DATA_FOLDER": str(ape_data),
            "APE_ACCOUNTS_deployer_PASSPHRASE": PASSPHRASE,
            url_var: anvil.url,
        },
    )
    assert run.returncode == 0, run.stdout + run.stderr
    deployment = Deployment.load(out)
    assert deployment.chain_id == chain_id
    assert deployment.rpc_url is None  # a public RPC URL may carry an API key
    assert deployment.params["fee_bps"] == 300
    assert f"{explorer}/address/{deployment.escrow}" in run.stdout
    # the contract answers, through the same client the services use
    client = EscrowClient.connect(anvil.url, deployment)
    assert Web3.to_checksum_address(client.call("operator")) == OPERATOR
    assert Web3.to_checksum_address(client.call("treasury")) == TREASURY
    assert client.call("feeBps") == 300
    w3 = Web3(Web3.HTTPProvider(anvil.url))
    deployer = Account.from_key(KEYS[0]).address
    assert w3.eth.get_transaction_count(deployer) == 1  # one transaction: the deployment
    # Ape's artifacts are the product's artifacts: the deployed code is what load_artifacts has
    receipt_block = w3.eth.get_block(deployment.block, full_transactions=True)
    txs: list[Any] = list(receipt_block["transactions"])
    (tx,) = [t for t in txs if t["from"] == deployer]
    assert bytes(tx["input"]).hex().startswith(load_artifacts()["JobEscrow"].bytecode[2:])


def test_public_network_without_an_account_is_refused(sepolia_anvil: Anvil, tmp_path: Path) -> None:
    out = tmp_path / "sepolia.json"
    run = _ape_run(
        [
            "--network",
            "ethereum:sepolia:node",
            "--operator",
            OPERATOR,
            "--treasury",
            TREASURY,
            "--out",
            str(out),
        ],
        {
            "APE_DATA_FOLDER": str(tmp_path / "empty-ape"),
            "GRIDMARKET_SEPOLIA_RPC_URL": sepolia_anvil.url,
            "GRIDMARKET_DEPLOY_ACCOUNT": "",
        },
    )
    assert run.returncode != 0
    assert "--account ALIAS" in run.stdout + run.stderr
    assert not out.exists()
    assert (
        Web3(Web3.HTTPProvider(sepolia_anvil.url)).eth.get_transaction_count(
            Account.from_key(KEYS[0]).address
        )
        == 0
    )


def test_local_network_with_test_accounts(tmp_path: Path) -> None:
    with Anvil(log_file=tmp_path / "anvil.log") as anvil:
        out = tmp_path / "local.json"
        run = _ape_run(
            ["--network", "ethereum:local:foundry", "--out", str(out)],
            {"APE_FOUNDRY_HOST": anvil.url, "APE_DATA_FOLDER": str(tmp_path / "ape")},
        )
        assert run.returncode == 0, run.stdout + run.stderr
        deployment = Deployment.load(out)
        assert deployment.rpc_url == anvil.url
        assert "explorer" not in run.stdout  # none for a local chain
        client = EscrowClient.connect(anvil.url, deployment)
        # local defaults: test account 1 operates, 2 collects fees (the devnet's roles)
        assert Web3.to_checksum_address(client.call("operator")) == OPERATOR
        assert Web3.to_checksum_address(client.call("treasury")) == TREASURY


def test_explorer_links_for_known_chains_only() -> None:
    addr = "0x" + "ab" * 20
    assert explorer_lines(84532, addr, "0x01") == [
        f"Base Sepolia explorer: https://sepolia.basescan.org/address/{addr}",
        "deploy transaction: https://sepolia.basescan.org/tx/0x01",
    ]
    assert explorer_lines(31337, addr, "0x01") == []


def test_artifacts_exported_from_apes_compile() -> None:
    artifacts = load_artifacts()
    # no interfaces, no test attackers; TestUSD is the devnet's stablecoin
    assert set(artifacts) == {"JobEscrow", "TestUSD"}
    exported = load_artifacts(EXPORTED)  # what an installed package reads
    assert exported["JobEscrow"] == artifacts["JobEscrow"]
    manifest = load_artifacts(ROOT / ".build" / "__local__.json")
    assert manifest["JobEscrow"].bytecode == artifacts["JobEscrow"].bytecode


def test_installed_package_reads_the_exported_artifacts(tmp_path: Path) -> None:
    """Installed without the source tree (no contracts/, no ape-config.yaml beside it), the
    package reads its package-data copy of Ape's output and never tries to compile."""
    load_artifacts()  # a source checkout: makes sure the export is current
    site = tmp_path / "site"
    shutil.copytree(
        ROOT / "gridmarket", site / "gridmarket", ignore=shutil.ignore_patterns("__pycache__")
    )
    code = (
        "import gridmarket.build as b, json, sys; a = b.load_artifacts(); "
        "print(json.dumps([b.__file__, sorted(a), a['JobEscrow'].bytecode[:40]]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(site), "PATH": "/nonexistent"},  # no `ape` either
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    path, names, head = json.loads(done.stdout)
    assert path.startswith(str(site))
    assert names == ["JobEscrow", "TestUSD"]
    assert head == load_artifacts()["JobEscrow"].bytecode[:40]
    # without the export it says what to do
    (site / "gridmarket" / "_compiled" / "contracts.json").unlink()
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(site)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "no compiled contracts at" in done.stderr and "ape compile" in done.stderr


def test_gridmarket_deploy_cli_deploys_the_same_artifacts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gridmarket.deploy import main

    with Anvil(log_file=tmp_path / "anvil.log") as anvil:
        out = tmp_path / "cli.json"
        monkeypatch.delenv("GRIDMARKET_DEPLOYER_KEY", raising=False)
        argv = ["--rpc-url", anvil.url, "--out", str(out), "--operator", OPERATOR]
        argv += ["--treasury", TREASURY]
        assert main(argv) == 2  # no key: refused, nothing written
        assert "GRIDMARKET_DEPLOYER_KEY" in capsys.readouterr().err
        assert not out.exists()
        monkeypatch.setenv("GRIDMARKET_DEPLOYER_KEY", KEYS[0])
        assert main(argv) == 0
        deployment = Deployment.load(out)
        code = Web3(Web3.HTTPProvider(anvil.url)).eth.get_code(
            Web3.to_checksum_address(deployment.escrow)
        )
        assert len(code) > 0
        assert deployment.abi == load_artifacts()["JobEscrow"].abi
        assert "explorer" not in capsys.readouterr().out  # chain 31337: none
