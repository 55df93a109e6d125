"""An agent on a "remote machine" (issue 11, item 6): the agent and its own IPFS node run in a
network namespace of their own (:class:`devstack.netns.Netns`: a veth to a bridge this test
creates), behind a firewall that lets it open connections only to the scheduler, the IPFS swarm
ports of the submitter's and the scheduler's nodes and the registry on the bridge's host
address, and lets no connection in (a pull-only node behind a NAT).

The grid's scheduler, IPFS swarm and registry (HTTPS, self-signed) listen on the bridge's host
address (``run_grid(bind_host=...)``). A Docker job (the registry's busybox pinned by digest)
on a dataset added on the submitter's node runs on that agent: its node fetches the dataset
through the swarm connections it opened, the scheduler's node fetches the output from it over
the same connections, and the job is paid on-chain. What the agent shares with the host besides
the network: dockerd's unix socket and the filesystem (docs/provider.md, "An agent on another
machine").

    .venv/bin/python -m pytest tests/e2e/test_remote_agent.py -q -p no:cacheprovider
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack._process import ServiceError
from devstack.grid import (
    MEDIATOR_IPFS,
    SCHEDULER_IPFS,
    SUBMITTER_IPFS,
    LocalGrid,
    run_grid,
    start_agent,
    wait_nodes,
)
from devstack.ipfs import IpfsDaemon
from devstack.netns import NETNS_DIR, Netns, remove_leftovers

from .conftest import FAST, FAST_ESCROW
from .support import (
    DATASET,
    assert_paid_once,
    docker_spec,
    fetch_output,
    fund,
    job_events,
    names,
    wait_job,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

REMOTE = "agent-remote"


def connect(host: str, port: int, timeout: float = 1.0) -> str:
    """``"ok"`` when a TCP connection opens, else the error's name and errno text."""
    with socket.socket() as s:
        s.settimeout(timeout)
        try:
            s.connect((host, port))
        except TimeoutError:
            return "timeout"
        except OSError as exc:
            return type(exc).__name__ + ": " + os.strerror(exc.errno or 0)
    return "ok"


def swarm_port(daemon: IpfsDaemon) -> int:
    return int(daemon.swarm_addr.split("/")[4])  # /ip4/<host>/tcp/<port>/p2p/<id>


@pytest.fixture(scope="module")
def net() -> Iterator[Netns]:
    try:
        with Netns() as netns:
            yield netns
    except ServiceError as exc:
        pytest.fail(f"no network namespace: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def grid_and_node(
    net: Netns, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalGrid, IpfsDaemon]]:
    """A grid with no agent on the host, its scheduler, IPFS swarm and registry on the bridge;
    and the remote agent's own IPFS node, started in the namespace while the grid starts (its
    swarm on the namespace's address, connected to nobody yet)."""
    node = IpfsDaemon(
        tmp_path_factory.mktemp("remote-ipfs"),
        swarm=True,
        keep_ports=True,
        name=REMOTE,
        swarm_host=net.ns_ip,
    )
    errors: list[BaseException] = []

    def start_node() -> None:
        try:
            net.call(node.start)
        except BaseException as exc:  # raised below, in the test's thread
            errors.append(exc)

    starter = threading.Thread(target=start_node, name="remote ipfs", daemon=True)
    starter.start()
    try:
        try:
            cm = run_grid(
                tmp_path_factory.mktemp("remote-grid"),
                agents=0,
                with_frontend=False,
                scheduler_overrides=FAST,
                escrow_overrides=FAST_ESCROW,
                bind_host=net.host_ip,
            )
            grid = cm.__enter__()
        except ServiceError as exc:
            pytest.fail(f"the grid did not start: {exc}", pytrace=False)
        try:
            if grid.dockerd is None or grid.registry is None:
                pytest.fail(f"the grid has no Docker engine: {grid.docker_note}", pytrace=False)
            starter.join(120)
            if errors or not node.running():
                pytest.fail(f"the remote agent's IPFS node did not start: {errors}", pytrace=False)
            yield grid, node
        finally:
            cm.__exit__(None, None, None)
    finally:
        starter.join(120)
        node.stop()


def test_agent_in_its_own_network_namespace_runs_a_docker_job_and_is_paid(
    net: Netns, grid_and_node: tuple[LocalGrid, IpfsDaemon], tmp_path: Path
) -> None:
    grid, node = grid_and_node
    assert grid.registry is not None
    submitter_node, scheduler_node = (
        grid.ipfs_swarm[SUBMITTER_IPFS],
        grid.ipfs_swarm[SCHEDULER_IPFS],
    )
    allowed = {
        "scheduler": grid.scheduler.port,
        "registry": grid.registry.port,
        "submitter's swarm": swarm_port(submitter_node),
        "scheduler's swarm": swarm_port(scheduler_node),
    }
    net.allow_tcp(allowed.values())
    assert grid.scheduler.url == f"http://{net.host_ip}:{grid.scheduler.port}"
    assert grid.busybox_image.startswith(f"{net.host_ip}:{grid.registry.port}/")
    assert "@sha256:" in grid.busybox_image

    # -- what the namespace reaches, and what it does not
    for what, port in allowed.items():
        assert net.call(connect, net.host_ip, port) == "ok", what
    mediator_swarm = swarm_port(grid.ipfs_swarm[MEDIATOR_IPFS])  # listening on the bridge too
    assert connect(net.host_ip, mediator_swarm) == "ok"  # from the host
    refused = "ConnectionRefusedError: Connection refused"
    assert net.call(connect, net.host_ip, mediator_swarm) == refused  # the firewall
    anvil_port = int(grid.anvil.url.rsplit(":", 1)[1])
    assert net.call(connect, "127.0.0.1", anvil_port) == refused  # its own loopback
    assert net.call(connect, net.host_ip, anvil_port) == refused  # no chain RPC for the agent
    unreachable = "OSError: Network is unreachable"
    assert net.call(connect, "192.0.2.1", 80) == unreachable  # no route off the /24
    assert net.call(connect, "1.1.1.1", 443) == unreachable

    # -- the agent's own IPFS node, in the namespace: it dials out, takes no connection in
    for peer in (submitter_node, scheduler_node):
        net.call(node.connect, peer)
    assert net.call(node.peers) == {submitter_node.peer_id, scheduler_node.peer_id}
    assert net.call(connect, net.ns_ip, swarm_port(node)) == "ok"  # it listens...
    assert connect(net.ns_ip, swarm_port(node)) == "timeout"  # ...but nobody gets in
    with pytest.raises(ServiceError):  # a peer it did not dial cannot reach it
        grid.ipfs_swarm[MEDIATOR_IPFS].connect(node, timeout=3)

    agent = start_agent(
        grid, 0, name=REMOTE, region="eu-west", ipfs_api=node.api_addr, launcher=net.process
    )
    wait_nodes(grid, 1, timeout=30)
    pid = agent.process.pid
    assert pid is not None
    assert os.readlink(f"/proc/{pid}/ns/net") == os.readlink(f"/proc/{node.pid}/ns/net")
    assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")

    dataset = grid.ipfs.add_dir(DATASET)  # on the submitter's node only
    spec = docker_spec(
        "remote count",
        "wc -l < /input/data.csv > /output/lines.txt",
        dataset_cid=dataset,
        image=grid.busybox_image,
    )
    job = fund(grid, spec, on_verify=True)
    view = wait_job(grid, job, {"released"}, 60)
    (attempt,) = view["attempts"]
    assert attempt["node_id"] == agent.node_id and attempt["outcome"] == "success"
    assert "verified" in [a["event"] for a in view["audit"]]  # the scheduler fetched it
    assert_paid_once(grid, job, agent.account.address)
    assert names(job_events(grid, job)) == [
        "JobCreated",
        "JobAssigned",
        "ResultSubmitted",
        "JobReleased",
    ]
    # the output left the namespace only through the swarm: the submitter's node has it too
    assert fetch_output(grid, view["output_cid"], tmp_path / "out") == {"lines.txt": "401\n"}
    log = agent.log_path.read_text(errors="replace")
    assert f"pulled {grid.busybox_image}" in log  # manifest checked over HTTPS, then pulled


def test_leftovers_of_a_crashed_run_are_removed() -> None:
    """A process that made a Netns and died by SIGKILL leaves its namespace, bridge, veth and
    iptables chain; the next start (``remove_leftovers``) deletes them, and only them."""
    script = (
        "import os, signal\n"
        "from devstack.netns import Netns\n"
        "net = Netns().start()\n"
        "print(net.tag, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == -9, result.stderr
    tag = result.stdout.strip()
    assert len(tag) == 6, result.stdout
    chain = f"GMN-{tag}"

    def present() -> set[str]:
        found = set()
        if any(p.name.endswith(f"-{tag}") for p in NETNS_DIR.iterdir()):
            found.add("netns")
        for link in (f"gmb{tag}", f"gmv{tag}"):
            if Path(f"/sys/class/net/{link}").exists():
                found.add(link)
        rules = subprocess.run(["iptables", "-w", "10", "-S"], capture_output=True, text=True)
        if f"-N {chain}" in rules.stdout:
            found.add(chain)
        return found

    assert present() == {"netns", f"gmb{tag}", f"gmv{tag}", chain}
    with Netns() as live:  # its start removes the leftovers; a live one (this process) stays
        assert present() == set()
        assert not any(live.tag in r for r in remove_leftovers())
        assert live.path.exists()
        assert Path(f"/sys/class/net/{live.bridge}").exists()
