"""devstack: services that fail say why and where the log is; restarts recover."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import urllib.request
from pathlib import Path

import docker
import pytest

from devstack._process import ServiceError
from devstack.anvil import Anvil, DevnetError
from devstack.dockerd import Dockerd
from devstack.images import BUSYBOX_IMAGE, ensure_busybox_image
from devstack.ipfs import IpfsDaemon


def _fake(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_ipfs_not_installed(tmp_path: Path) -> None:
    with pytest.raises(ServiceError, match=r"js-ipfs is not installed.*npm ci"):
        IpfsDaemon(tmp_path / "w", node_modules=tmp_path).start()


def test_ipfs_init_failure_names_the_log(tmp_path: Path) -> None:
    node = _fake(tmp_path, "node", "echo 'repo is on fire' >&2; exit 3")
    daemon = IpfsDaemon(tmp_path / "w", node=node)
    with pytest.raises(ServiceError, match="init` failed") as err:
        daemon.start()
    assert str(daemon.log_path) in str(err.value) and "repo is on fire" in str(err.value)


def test_dockerd_exit_names_the_log(tmp_path: Path) -> None:
    fake = _fake(tmp_path, "dockerd", "echo 'no cgroups here' >&2; exit 1")
    engine = Dockerd(tmp_path / "w", dockerd=fake)
    with pytest.raises(ServiceError, match="exited with code 1 before it was ready") as err:
        engine.start()
    assert str(engine.log_path) in str(err.value) and "no cgroups here" in str(err.value)


def test_dockerd_that_never_answers_times_out(tmp_path: Path) -> None:
    fake = _fake(tmp_path, "dockerd", "echo starting; exec sleep 60")
    engine = Dockerd(tmp_path / "w", dockerd=fake, start_timeout=1)
    started = time.monotonic()
    with pytest.raises(ServiceError, match="not ready after 1 s"):
        engine.start()
    assert time.monotonic() - started < 10
    assert not engine.running()


def test_dockerd_refuses_a_live_pidfile(tmp_path: Path) -> None:
    engine = Dockerd(tmp_path / "w")
    engine.run_dir.mkdir(parents=True, exist_ok=True)
    engine.pidfile.write_text(str(os.getpid()))
    try:
        with pytest.raises(ServiceError, match=f"pid {os.getpid()}"):
            engine.start()
        engine.stop()
        assert engine.pidfile.exists()  # another engine's files are left alone
    finally:
        shutil.rmtree(engine.run_dir)


def test_long_work_dirs_get_a_short_socket(tmp_path: Path) -> None:
    engine = Dockerd(tmp_path / ("x" * 80))
    assert len(str(engine.socket_path)) < 60
    assert Dockerd(tmp_path / ("x" * 80)).socket_path == engine.socket_path  # stable name
    assert not engine.run_dir.exists()  # made by start(), not by the constructor


def test_ipfs_restarts_after_a_crash(tmp_path: Path) -> None:
    """A killed daemon leaves repo.lock and repo/api behind; the next start clears them."""
    daemon = IpfsDaemon(tmp_path / "ipfs").start()
    try:
        assert daemon._proc is not None and daemon._proc.pid is not None
        os.killpg(daemon._proc.pid, signal.SIGKILL)
        daemon._proc._proc.wait()  # type: ignore[union-attr]
        assert (daemon.repo / "repo.lock").exists() and (daemon.repo / "api").exists()
        daemon._proc = None
        daemon.start()
        assert daemon.running() and daemon.api_addr.startswith("/ip4/127.0.0.1/tcp/")
    finally:
        daemon.stop()


def test_busybox_image_is_reused(docker_client: docker.DockerClient, test_image: str) -> None:
    started = time.monotonic()
    assert ensure_busybox_image(docker_client) == docker_client.images.get(BUSYBOX_IMAGE).id
    assert time.monotonic() - started < 1


def _rpc(url: str, method: str) -> str:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": []}).encode()
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(url, body, headers)  # noqa: S310 (loopback http)
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
        return str(json.loads(response.read())["result"])


def test_anvil_bad_state_file_names_the_log(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text('{"broken": ')
    anvil = Anvil(state_file=state, log_file=tmp_path / "anvil.log")
    with pytest.raises(DevnetError, match="exited with code") as err:
        anvil.start()
    assert isinstance(err.value, ServiceError)
    assert str(anvil.log_file) in str(err.value) and "failed to parse json" in str(err.value)
    assert not anvil.running() and anvil.port == 0  # a port it picked is given back


def test_anvil_refuses_a_taken_port_and_restarts_from_its_state(tmp_path: Path) -> None:
    """A second anvil on a held port fails clearly; a stopped one comes back with its chain."""
    with Anvil() as other, pytest.raises(DevnetError, match="Address already in use"):
        Anvil(port=other.port, log_file=tmp_path / "second.log").start()
    anvil = Anvil(state_file=tmp_path / "state.json", log_file=tmp_path / "anvil.log").start()
    try:
        port = anvil.port
        for _ in range(3):
            _rpc(anvil.url, "evm_mine")
        anvil.stop()  # SIGTERM: anvil writes its state file
        assert not anvil.running() and (tmp_path / "state.json").is_file()
        anvil.start()
        assert anvil.port == port and int(_rpc(anvil.url, "eth_blockNumber"), 16) == 3
    finally:
        anvil.stop()


def test_devnet_agents_take_tusd_jobs(tmp_path: Path) -> None:
    """What start_agent gives each devnet agent: a tUSD floor the demo's job passes, a tUSD
    stake made on-chain before it starts (once: a restart sends nothing), and settings the
    agent itself reads to the same floor and stake."""
    from agent.config import load_config
    from devstack.grid import AGENT_TUSD_FLOOR, agent_token_settings, stake_agent_tokens
    from gridmarket.escrow import ZERO_ADDRESS
    from gridmarket.wire import JobSpec, offered_price_wei_per_hour
    from tests.agent.chain_support import own_chain

    with own_chain(tmp_path) as chain:
        deployment = chain.escrow.deployment
        assert agent_token_settings(deployment, chain.deployment_file, ZERO_ADDRESS) == {}
        settings = agent_token_settings(deployment, chain.deployment_file, chain.token_address)
        assert settings == {
            "deployment": str(chain.deployment_file),
            "price_floors": {"tUSD": "0.10"},
            "stake_tokens": {"tUSD": "1000"},
        }
        config = load_config(**settings)
        assert config.token_floors == {chain.token_address: 100_000}
        # the demo's tUSD job (scripts/demo.py: 2 tUSD, a WASM spec with a 60 s timeout)
        module = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
        demo = JobSpec.model_validate(
            {"executor": "wasm", "module_cid": module, "limits": {"timeout_s": 60}}
        )
        assert offered_price_wei_per_hour(2 * 10**6, demo) >= chain.tusd.to_units(AGENT_TUSD_FLOOR)

        provider = chain.accounts[5]
        chain.stake(provider, 10**17)
        stake_agent_tokens(chain.light, provider, settings)
        stake = chain.escrow.call("stakeOf", provider.address, chain.token_address)[0]
        assert stake == 1000 * 10**6
        block = chain.w3.eth.block_number
        stake_agent_tokens(chain.light, provider, settings)  # a restarted agent
        assert chain.w3.eth.block_number == block
