"""The whole grid under faults (issue 6): real anvil + escrow, js-ipfs, dockerd, scheduler
processes and provider agent processes, each with its own wallet. Every test checks the job's
on-chain record (events, ``job_state``) and the escrow's money (``balanceOf``, stakes, fees, the
ETH it holds) to the wei.

``TestOneGrid`` shares one SQLite grid; each of its tests leaves it whole (three agents online)
for the next. The replica test builds its own grid on PostgreSQL. Liveness timings are seconds
(tests/e2e/conftest.py ``FAST``).

    .venv/bin/python -m pytest tests/e2e -q -p no:cacheprovider
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from agent.executors.docker import OWNER_LABEL
from devstack.grid import (
    PROVIDER_STAKE,
    AgentProcess,
    LocalGrid,
    start_agent,
    start_replica,
    wait_nodes,
)
from devstack.images import BUSYBOX_IMAGE
from devstack.torch_image import TRAIN_SCRIPT_IN_IMAGE
from gridmarket.chain import ChainError
from gridmarket.escrow import ZERO_ADDRESS
from gridmarket.wire import JobSpec, NodeCapacityIn

from .support import (
    BOUNTY,
    FEE,
    PAYOUT,
    Funded,
    Inputs,
    WireProvider,
    add_inputs,
    add_spec,
    agent_of,
    assert_paid_once,
    docker_spec,
    fetch_output,
    fund,
    job_events,
    job_state,
    job_view,
    money,
    names,
    wait_for,
    wait_job,
    wait_log,
    wasm_spec,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

COUNT_LINES = "wc -l < /input/data.csv > /output/lines.txt"


def sleeper(name: str, seconds: int) -> JobSpec:
    """A Docker job that runs for ``seconds`` and then writes a small output; its timeout (and
    so the hold a node signs for) leaves 12 s beyond that, so a killed node's job is taken back
    within a test."""
    return docker_spec(
        name, f"sleep {seconds}; echo {name} > /output/done.txt", timeout_s=seconds + 12
    )


def wait_running(grid: LocalGrid, job: Funded) -> Any:
    """Until the job is leased and its container runs on an agent; that agent."""
    view = wait_job(grid, job, {"leased"}, 30)
    agent = agent_of(grid, view["node_id"])
    wait_log(agent, f"job {job.job_id[:10]}: running (docker)")
    time.sleep(0.3)  # the container is up (the step is logged just before it starts)
    return agent


def containers_of(grid: LocalGrid, agent: AgentProcess) -> list[str]:
    """Names and states of the containers the agent started (its executor's owner label:
    ``agent.assembly.executor_owner``), running or not, on the grid's dockerd."""
    assert grid.dockerd is not None
    owner = f"{agent.account.address.lower()}/{agent.name}"
    client = docker.DockerClient(base_url=grid.dockerd.host)
    try:
        found = client.containers.list(all=True, filters={"label": f"{OWNER_LABEL}={owner}"})
        return [f"{c.name} ({c.status})" for c in found]
    finally:
        client.close()


def wait_online(grid: LocalGrid, count: int = 3) -> None:
    """Until every agent's node is online at the scheduler (after a restart)."""

    def online() -> bool:
        nodes = {n["node_id"]: n for n in grid.api("/v1/nodes")["nodes"]}
        return all(nodes.get(a.node_id, {}).get("status") == "online" for a in grid.agents)

    assert len(grid.agents) == count
    wait_for("every agent online", online, 30, every=0.2)


def single_attempt(view: dict[str, Any]) -> str:
    """The one attempt a job took (no retry, no second node); its node id."""
    attempts = view["attempts"]
    assert len(attempts) == 1, f"job {view['job_id']} ran more than once: {attempts}"
    assert attempts[0]["outcome"] == "success", attempts
    return str(attempts[0]["node_id"])


def payouts(grid: LocalGrid, paid: list[tuple[Funded, str]]) -> dict[str, int]:
    """The exact escrow changes of jobs paid to the given node ids (nothing else moved)."""
    by_wallet: Counter[str] = Counter()
    for _, node_id in paid:
        by_wallet[agent_of(grid, node_id).account.address] += PAYOUT
    delta = {f"balance:{w}": v for w, v in by_wallet.items()}
    delta["fees"] = FEE * len(paid)
    delta["held"] = BOUNTY * len(paid)
    return delta


@pytest.fixture(scope="class")
def inputs(grid: LocalGrid) -> Inputs:
    return add_inputs(grid)


class TestOneGrid:
    def test_happy_path_docker_and_wasm(
        self, grid: LocalGrid, inputs: Inputs, tmp_path: Path
    ) -> None:
        before = money(grid)
        # the default terms (paid once the challenge window passes) and the on-verify opt-in
        docker = fund(
            grid,
            docker_spec(
                "count lines",
                COUNT_LINES,
                dataset_cid=inputs.dataset_cid,
                image=grid.busybox_image,  # pinned in the devnet's registry: pulled by digest
            ),
        )
        wasm = fund(
            grid, wasm_spec("csv stats", inputs.module_cid, inputs.dataset_cid), on_verify=True
        )
        paid = []
        for job in (docker, wasm):
            view = wait_job(grid, job, {"released"}, 60)
            node_id = single_attempt(view)
            agent = agent_of(grid, node_id)
            assert_paid_once(grid, job, agent.account.address)
            assert names(job_events(grid, job)) == [
                "JobCreated",
                "JobAssigned",
                "ResultSubmitted",
                "JobReleased",
            ]
            state = job_state(grid, job)
            assert state.output_cid == view["output_cid"]
            assert state.job.attempt == 1
            paid.append((job, node_id))
        assert before.delta(money(grid)) == payouts(grid, paid)
        docker_out = fetch_output(grid, job_state(grid, docker).output_cid or "", tmp_path / "d")
        wasm_out = fetch_output(grid, job_state(grid, wasm).output_cid or "", tmp_path / "w")
        assert docker_out == {"lines.txt": "401\n"}
        assert wasm_out == {"stats.txt": "bytes=8856\nlines=401\nfields=1604\n"}

    def test_agent_killed_mid_job_is_reassigned_and_paid_once(self, grid: LocalGrid) -> None:
        before = money(grid)
        job = fund(grid, sleeper("killed-mid-job", 4))
        first = wait_running(grid, job)
        grid.kill_agent(first)  # SIGKILL: no hand-back; heartbeats stop
        left = containers_of(grid, first)
        assert len(left) == 1, f"the killed agent's container: {left}"  # it runs on in dockerd
        view = wait_job(grid, job, {"released"}, 90)  # its hold: 16 s timeout + 5 s margin
        attempts = view["attempts"]
        assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "timeout"), (2, "success")]
        assert attempts[0]["node_id"] == first.node_id
        second = agent_of(grid, attempts[1]["node_id"])
        assert second.name != first.name
        events = job_events(grid, job)
        assert names(events) == [
            "JobCreated",
            "JobAssigned",
            "JobUnassigned",  # taken back once the node's hold was over: collateral unlocked
            "JobAssigned",  # attempt 2, another provider, with its own acceptance
            "ResultSubmitted",
            "JobReleased",
        ]
        assigned = [e for e in events if e.name == "JobAssigned"]
        assert [(e.args["provider"], e.args["attempt"]) for e in assigned] == [
            (first.account.address, 1),
            (second.account.address, 2),
        ]
        (taken_back,) = [e for e in events if e.name == "JobUnassigned"]
        assert taken_back.args["provider"] == first.account.address
        assert assigned[1].args["previousProvider"] == ZERO_ADDRESS
        assert_paid_once(grid, job, second.account.address)
        assert job_state(grid, job).job.attempt == 2
        assert before.delta(money(grid)) == payouts(grid, [(job, second.node_id)])
        grid.restart_agent(first)  # same wallet and name: the same node comes back
        wait_online(grid)
        # registered only after its start-up removed what the killed run left in dockerd
        assert containers_of(grid, first) == [], "the killed agent's container is left"

    @pytest.mark.timeout(480)
    def test_killed_mid_training_the_job_resumes_elsewhere(
        self, grid: LocalGrid, tmp_path: Path
    ) -> None:
        """The PyTorch example (examples/python/train_mlp.py) as a job: SIGKILL the agent
        training it once the scheduler keeps one of its checkpoints. The next node starts from
        that checkpoint (its log says so), not from step 0; the loss curve in the output runs
        over every step with one resume in it; the second provider is paid once."""
        image = grid.publish_torch()  # ~600 MB, pushed once per grid; the engine keeps layers
        steps = 1500  # ~35 s of training at 20 ms a step; checkpoints every 10 s
        spec = JobSpec.model_validate(
            {
                "name": "train-mlp",
                "executor": "docker",
                "image": image,
                "command": ["python3", TRAIN_SCRIPT_IN_IMAGE],
                "env": {
                    "TRAIN_STEPS": str(steps),
                    "CHECKPOINT_EVERY": "50",
                    "LOG_EVERY": "100",
                    "STEP_SLEEP_S": "0.02",
                },
                "checkpoint": {"interval_s": 10, "max_bytes": 16 << 20},
                "resources": {"cpu_cores": 1, "ram_mib": 512, "disk_mib": 64},
                "limits": {"timeout_s": 90, "output_max_bytes": 8 << 20},
            }
        )
        job = fund(grid, spec)
        first = wait_running(grid, job)
        path = f"/v1/jobs/{job.job_id}/checkpoints"
        kept = wait_for("a kept checkpoint", lambda: grid.api(path).get("resume"), 60, every=0.5)
        grid.kill_agent(first)  # SIGKILL: its checkpoint is on the scheduler's own IPFS node
        view = wait_job(grid, job, {"released"}, 240)  # the dead node's hold: 90 s + 5 s
        attempts = view["attempts"]
        assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "timeout"), (2, "success")]
        second = agent_of(grid, attempts[1]["node_id"])
        assert second.name != first.name
        kept_step = kept["progress"]["step"]
        assert 0 < kept_step < steps
        lines = grid.api(f"/v1/jobs/{job.job_id}/logs?limit=1000")["lines"]
        second_lines = [line["text"] for line in lines if line["attempt"] == 2]
        assert any(t.startswith(f"[resuming from checkpoint {kept['cid']}") for t in second_lines)
        started = [t for t in second_lines if t.startswith("resuming from step ")]
        assert started and int(started[0].split()[-1]) >= kept_step, second_lines
        out = grid.ipfs.fetch(view["output_cid"], tmp_path / "out", 8 << 20)  # checked
        assert {"model.pt", "metrics.json", "loss.csv", "loss.svg"} <= {
            f.name for f in out.iterdir()
        }
        files = {name: (out / name).read_text() for name in ("metrics.json", "loss.csv")}
        metrics = json.loads(files["metrics.json"])
        assert metrics["steps"] == steps and metrics["resumes"] == 1, metrics
        assert kept_step <= metrics["resumed_at"][0] < steps
        rows = [line.split(",") for line in files["loss.csv"].splitlines()[1:]]
        assert [int(r[0]) for r in rows] == list(range(1, steps + 1))  # no gap, no restart
        assert_paid_once(grid, job, second.account.address)
        grid.restart_agent(first)
        wait_online(grid)

    def test_scheduler_killed_and_restarted_mid_flight(
        self, grid: LocalGrid, inputs: Inputs
    ) -> None:
        before = money(grid)
        running = fund(grid, sleeper("through-the-restart", 9))  # still running at the restart
        agent = wait_running(grid, running)
        grid.scheduler.kill()
        down_at = time.monotonic()
        dataset = inputs.dataset_cid
        late = [
            fund(grid, docker_spec("funded-while-down", COUNT_LINES, dataset_cid=dataset)),
            fund(grid, wasm_spec("funded-while-down", inputs.module_cid, dataset)),
        ]
        # Down for longer than the node timeout and the lease (5 s): the restarted scheduler
        # must not blame the nodes for its own silence (no requeue, no second run).
        time.sleep(max(0.0, 7.0 - (time.monotonic() - down_at)))
        grid.restart_scheduler()
        paid = []
        for job in (running, *late):
            view = wait_job(grid, job, {"released"}, 60)
            node_id = single_attempt(view)
            assert_paid_once(grid, job, agent_of(grid, node_id).account.address)
            assert Counter(names(job_events(grid, job)))["JobAssigned"] == 1
            paid.append((job, node_id))
        assert paid[0][1] == agent.node_id  # the running job's kept result was delivered
        ids = [j["job_id"] for j in grid.api("/v1/jobs?limit=1000")["jobs"]]
        assert len(ids) == len(set(ids))
        assert {j.job_id for j in (running, *late)} <= set(ids)
        assert before.delta(money(grid)) == payouts(grid, paid)
        wait_online(grid)

    def test_forged_output_posted_on_chain_is_ruled_wrong_slashed_and_done_elsewhere(
        self, grid: LocalGrid, inputs: Inputs
    ) -> None:
        """A node accepts a job, reports an output CID it never produced, and posts it on-chain
        itself (the scheduler's integrity check refused to relay it). The mediator the job names
        finds the output missing within the window and rules it wrong: the node loses the job's
        collateral to the submitter, and the job is done by an honest node and paid."""
        account = grid.providers[4]  # not one of the agents' wallets
        grid.escrow.send(account, "registerProvider", "bafkreie2echeater", value=PROVIDER_STAKE)
        # A tight fit for the job (1 core, 256 MiB): best fit prefers it to the real agents.
        capacity = NodeCapacityIn(
            cpu_cores=1, ram_mib=256, disk_mib=4096, region="us", executors=["docker", "wasm"]
        )
        cheater = WireProvider(grid, account, "cheater", capacity)
        cheater.register()
        got: dict[str, Any] = {}
        poll = threading.Thread(target=lambda: got.update(a=cheater.next_job(20)), daemon=True)
        poll.start()
        time.sleep(1.0)  # the cheater's long-poll is parked at the scheduler
        before = money(grid)
        job = fund(grid, wasm_spec("stats", inputs.module_cid, inputs.dataset_cid))
        poll.join(25)
        try:
            assignment = got.get("a")
            assert assignment is not None, "the cheater was not given the job"
            assert assignment["job_id"] == job.job_id
            cheater.accept(assignment)
            wait_for(
                "the job assigned to the cheater on-chain",
                lambda: job_state(grid, job).job.provider == account.address,
                20,
                every=0.2,
            )
            forged = cheater.report_forged(assignment)
            state = job_state(grid, job)
            grid.escrow.call_job(account, "submitResult", state, forged)
            view = wait_job(grid, job, {"released"}, 120)
        finally:
            cheater.close()
        attempts = view["attempts"]
        assert attempts[0]["node_id"] == cheater.node_id
        assert attempts[0]["outcome"] != "success", attempts
        assert attempts[-1]["outcome"] == "success", attempts
        honest = agent_of(grid, attempts[-1]["node_id"])
        events = job_events(grid, job)
        assert names(events) == [
            "JobCreated",
            "JobAssigned",
            "ResultSubmitted",  # the forged CID, posted by the cheater itself
            "Ruled",
            "ProviderSlashed",
            "JobAssigned",
            "ResultSubmitted",
            "JobReleased",
        ], names(events)
        submitted = [e for e in events if e.name == "ResultSubmitted"]
        assert submitted[0].args["outputCid"] == forged
        assert submitted[0].args["provider"] == account.address
        assert submitted[1].args["outputCid"] == view["output_cid"] != forged
        (ruled,) = [e for e in events if e.name == "Ruled"]
        assert ruled.args["mediator"] == grid.mediator.address and not ruled.args["upheld"]
        collateral = job_state(grid, job).job.collateral
        (slash,) = [e for e in events if e.name == "ProviderSlashed"]
        assert slash.args["provider"] == account.address
        assert slash.args["amount"] == collateral
        assert slash.args["submitter"] == job.submitter.address
        assert slash.args["toMediator"] == 0  # ruled on its own check: no dispute, no fee
        assert_paid_once(grid, job, honest.account.address)
        expected = payouts(grid, [(job, honest.node_id)])
        expected[f"stake:{account.address}"] = -collateral
        expected[f"balance:{job.submitter.address}"] = collateral
        assert before.delta(money(grid)) == expected  # the slash moved ETH within the escrow
        node = grid.api(f"/v1/nodes/{cheater.node_id}")
        assert node["jobs_done"] == 0 and node["jobs_failed"] >= 1

    def test_ipfs_then_chain_down_for_a_while_work_resumes(
        self, grid: LocalGrid, inputs: Inputs
    ) -> None:
        before = money(grid)
        # IPFS stops while a job runs (it cannot upload its output) and while another job is
        # funded (the scheduler cannot read its spec); both go through once it is back.
        uploading = fund(grid, sleeper("upload-after-ipfs-outage", 2))
        wait_running(grid, uploading)
        spec = wasm_spec("funded-during-ipfs-outage", inputs.module_cid, inputs.dataset_cid)
        spec_cid = add_spec(grid, spec)
        grid.stop_ipfs()
        try:
            unread = fund(grid, spec, spec_cid=spec_cid)
            time.sleep(4)
            assert (job_view(grid, unread.job_id) or {}).get("state") == "pending_spec"
            assert (job_view(grid, uploading.job_id) or {}).get("state") == "leased"
        finally:
            grid.start_ipfs()
        paid = []
        for job in (uploading, unread):
            view = wait_job(grid, job, {"released"}, 60)
            node_id = single_attempt(view)
            assert_paid_once(grid, job, agent_of(grid, node_id).account.address)
            paid.append((job, node_id))
        # The chain stops while a job runs: the result is verified, and the settle transaction
        # waits for the RPC; anvil comes back from its state file on the same port.
        settling = fund(grid, sleeper("settle-after-chain-outage", 2))
        wait_running(grid, settling)
        wait_for(
            "the on-chain assignment",
            lambda: (job_view(grid, settling.job_id) or {}).get("chain_status") == "assigned",
            15,
        )
        grid.stop_chain()
        try:
            wait_for(
                "the result to wait for the chain",
                lambda: (job_view(grid, settling.job_id) or {}).get("state") == "settling",
                20,
            )
            time.sleep(2)
        finally:
            grid.start_chain()
        view = wait_job(grid, settling, {"released"}, 60)
        node_id = single_attempt(view)
        assert_paid_once(grid, settling, agent_of(grid, node_id).account.address)
        paid.append((settling, node_id))
        assert before.delta(money(grid)) == payouts(grid, paid)
        wait_online(grid)

    def test_no_capable_provider_submitter_refunds_without_operator(self, grid: LocalGrid) -> None:
        spec = JobSpec.model_validate(
            {
                "name": "needs-a-gpu",
                "executor": "docker",
                "image": BUSYBOX_IMAGE,
                "command": ["true"],
                "resources": {"gpu_count": 1, "cpu_cores": 1, "ram_mib": 256, "disk_mib": 64},
            }
        )
        submitter = grid.submitters[1]
        before = money(grid)
        job = fund(grid, spec, submitter=submitter, ttl=70)  # min_duration is 60 s
        view = wait_for(
            "the scheduler to say why the job waits",
            lambda: (
                v
                if (v := job_view(grid, job.job_id)) and "gpu_count eliminates" in v["reason"]
                else None
            ),
            20,
        )
        assert view["state"] == "queued"
        # every idle node is ruled out by the GPU count ("... eliminates the most (3 of 3)")
        assert re.search(r"gpu_count eliminates the most \((\d+) of \1\)", view["reason"]), view
        with pytest.raises(ChainError) as refused:
            grid.escrow.call_job(submitter, "refund", job_state(grid, job))
        assert "DeadlineNotPassed" in str(refused.value.reason)
        grid.rpc("evm_increaseTime", 75)
        grid.rpc("evm_mine")
        state, sent = grid.escrow.call_job(submitter, "refund", job_state(grid, job))
        tx = grid.w3.eth.get_transaction(sent.tx_hash)  # type: ignore[arg-type]
        assert tx["from"] == submitter.address != grid.operator.address
        assert state.status.name == "REFUNDED"
        assert names(job_events(grid, job)) == ["JobCreated", "JobRefunded"]
        assert before.delta(money(grid)) == {
            f"balance:{submitter.address}": BOUNTY,
            "held": BOUNTY,
        }
        view = wait_job(grid, job, {"refunded"}, 20)
        assert view["attempts"] == []


def test_two_scheduler_replicas_on_postgresql(pg_grid: LocalGrid) -> None:
    grid = pg_grid
    replica = start_replica(grid)
    start_agent(grid, 0, name="agent-eu", region="eu-west")  # the first replica
    start_agent(grid, 1, name="agent-us", region="us", scheduler_url=replica.url)
    start_agent(grid, 2, name="agent-in", region="in", scheduler_url=replica.url)
    wait_nodes(grid, 3)
    inputs = add_inputs(grid)
    before = money(grid)
    jobs = []
    for i in range(6):
        if i % 2:
            spec = wasm_spec(f"wasm-{i}", inputs.module_cid, inputs.dataset_cid)
        else:
            spec = sleeper(f"docker-{i}", 1)
        jobs.append(fund(grid, spec))
    paid = []
    runs: dict[str, list[tuple[float, float]]] = {}
    for job in jobs:
        view = wait_job(grid, job, {"released"}, 90)
        node_id = single_attempt(view)  # no job on two nodes
        attempt = view["attempts"][0]
        # the run ends at the verdict on its result, which frees the node's slot; the attempt
        # itself stays open until the job is paid (after the challenge window)
        (verdict,) = [a["ts"] for a in view["audit"] if a["event"] == "verified"]
        assert attempt["started_at"] < verdict <= attempt["ended_at"]
        runs.setdefault(node_id, []).append((attempt["started_at"], verdict))
        assert_paid_once(grid, job, agent_of(grid, node_id).account.address)
        assert Counter(names(job_events(grid, job)))["JobAssigned"] == 1
        paid.append((job, node_id))
    for node_id, spans in runs.items():  # one slot each: a node's runs never overlap
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end, f"node {node_id} ran two jobs at once: {spans}"
    on_b = {grid.agents[1].node_id, grid.agents[2].node_id}
    assert on_b & set(runs), f"no job went to the second replica's nodes: {runs}"
    assert before.delta(money(grid)) == payouts(grid, paid)
    leaders = [
        p.name
        for p in (grid.scheduler.log_path, replica.log_path)
        if "holds the chain duty" in p.read_text(errors="replace")
    ]
    assert len(leaders) == 1, f"leaders: {leaders}"
    # both replicas serve the same state
    for url in (grid.scheduler.url, replica.url):
        counts = httpx.get(url + "/v1/jobs", timeout=10).json()["counts"]
        assert counts == {"released": len(jobs)}, counts
