"""Cached images on the real grid: two agents with their own Docker engines (the grid's dockerd
and a second one), their own wallets and IPFS nodes. The first job pulls the registry image by
digest on one node; that node then advertises it (heartbeats), and a repeat of the job goes to it
rather than to a cheaper node without the image, and runs from its cache: pulled once. With the
cached node gone the same job goes to the cheaper node, which pulls the image: it was eligible
all along, so the image made the choice."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from devstack._process import ROOT, ManagedProcess
from devstack.dockerd import Dockerd
from devstack.grid import AGENT_PASSWORD, PROVIDER_STAKE, AgentProcess, LocalGrid, wait_nodes
from gridmarket.holds import margin_of
from gridmarket.wire import API

from .conftest import _grid
from .support import add_inputs, docker_spec, fund, wait_for, wait_job


@pytest.fixture
def bare_grid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGrid]:
    yield from _grid(tmp_path_factory.mktemp("image-grid"), agents=0)


def parked(grid: LocalGrid, count: int) -> None:
    """Until ``count`` nodes are waiting in a long poll (the scheduler's ``waiting_nodes``): a
    job funded now is matched among them."""
    wait_for(
        f"{count} nodes waiting in a long poll",
        lambda: (
            httpx.get(grid.scheduler.url + API.HEALTH, timeout=5).json()["waiting_nodes"] >= count
        ),
        30,
    )


def start_agent_on(
    grid: LocalGrid, index: int, name: str, docker_host: str, price_floor_wei: int
) -> AgentProcess:
    """An agent (provider ``index``, region eu-west) on the Docker engine at ``docker_host``
    with its own IPFS node, stopped with the grid."""
    from gridmarket.keystore import create_keystore

    account = grid.providers[index]
    home = grid.work / "agents" / name
    home.mkdir(parents=True, exist_ok=True)
    keystore = home / "keystore.json"
    create_keystore(
        keystore, AGENT_PASSWORD, private_key=bytes(account.key), kdf="pbkdf2", iterations=1000
    )
    if not grid.escrow.call("providerOf", account.address)[3]:
        grid.escrow.send(account, "registerProvider", "bafkreiimagetest", value=PROVIDER_STAKE)
    config = {
        "scheduler_url": grid.scheduler.url,
        "ipfs_api": grid.ipfs_swarm.add(name).api_addr,
        "keystore": str(keystore),
        "password": AGENT_PASSWORD,
        "name": name,
        "region": "eu-west",
        "work_dir": str(home / "work"),
        "cpu_cores": 2,
        "ram_mib": 2048,
        # long polls, so a node is rarely between two polls when a job is queued (the match is
        # among the nodes waiting at that moment: a node re-polling right then would miss it)
        "poll_wait_s": 30,  # the scheduler's longest (long_poll_max_s)
        "executors": ["docker", "wasm"],
        "docker_host": docker_host,
        "price_floor_wei_per_hour": price_floor_wei,
        "pull_registries": grid.registries,  # the devnet's registry (loopback), explicitly
        "hold_margin_s": margin_of(grid.deployment.params),  # the scheduler's hold margin
    }
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


def advertised(grid: LocalGrid, agent: AgentProcess) -> list[str]:
    r = httpx.get(grid.scheduler.url + API.NODE.format(node_id=agent.node_id), timeout=5)
    return list(r.json().get("images", [])) if r.status_code == 200 else []


def pulls(agent: AgentProcess, image: str) -> int:
    return agent.log_path.read_text(errors="replace").count(f"pulled {image} ")


def node_of(view: dict[str, object]) -> str:
    attempts = view["attempts"]
    assert isinstance(attempts, list) and len(attempts) == 1, attempts
    return str(attempts[0]["node_id"])


def test_the_node_with_the_image_is_chosen_and_a_repeat_is_served_from_its_cache(
    bare_grid: LocalGrid, tmp_path: Path
) -> None:
    grid = bare_grid
    image = grid.busybox_image
    assert "@sha256:" in image, image
    script = "cat /input/data.csv | wc -l > /output/lines"
    inputs = add_inputs(grid)
    with Dockerd(tmp_path / "dockerd-b") as engine_b:
        assert grid.dockerd is not None
        cached = start_agent_on(grid, 0, "agent-cached", grid.dockerd.host, 10**15)
        wait_nodes(grid, 1)
        assert image not in advertised(grid, cached)

        first = fund(grid, docker_spec("first", script, dataset_cid=inputs.dataset_cid,
                                       image=image), on_verify=True)  # fmt: skip
        view = wait_job(grid, first, {"released"}, timeout=120)
        assert node_of(view) == cached.node_id
        assert pulls(cached, image) == 1
        wait_for("the image in the node's advert", lambda: image in advertised(grid, cached), 15)

        # a cheaper node on an engine without the image joins; both are idle, both eligible
        plain = start_agent_on(grid, 1, "agent-plain", engine_b.host, 0)
        wait_nodes(grid, 2)
        assert image not in advertised(grid, plain)

        time.sleep(2.5)  # one heartbeat (2 s on the grid): its advert reaches the parked entries
        parked(grid, 2)  # then fund at once: both nodes are waiting when the job is matched
        repeat = fund(grid, docker_spec("repeat", script, dataset_cid=inputs.dataset_cid,
                                        image=image), on_verify=True)  # fmt: skip
        view = wait_job(grid, repeat, {"released"}, timeout=120)
        assert node_of(view) == cached.node_id, "the node without the image was chosen"
        assert pulls(cached, image) == 1, "the repeat pulled the image again"
        assert pulls(plain, image) == 0

        # the cheaper node was eligible for that very job: with the cached node gone, the same
        # job goes to it and it pulls the image (deterministic, unlike racing both nodes' polls)
        cached.process.stop(timeout=30)
        again = fund(grid, docker_spec("again", script, dataset_cid=inputs.dataset_cid,
                                       image=image), on_verify=True)  # fmt: skip
        view = wait_job(grid, again, {"released"}, timeout=120)
        assert node_of(view) == plain.node_id
        assert pulls(plain, image) == 1
        for agent in (cached, plain):
            agent.process.stop(timeout=30)
