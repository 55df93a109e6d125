"""A dispute judged by a re-run, on the whole grid (issue 10): real anvil + escrow, js-ipfs,
dockerd, the scheduler, three agents and the mediator process (``gridmarket-mediator run``).

A submitter disputes a result of a WASM job (deterministic). The mediator funds a re-run of the
same spec with its own key, excluding the disputed provider and the submitter
(``exclude_providers``); the scheduler gives it to another provider; the mediator compares the
two output CIDs and rules: a plausible wrong output (intact, valid CID) is ruled wrong and its
provider slashed, and the job is done again elsewhere; an honest output is upheld and the
dispute deposit pays the mediator. Windows: challenge 12 s (tests/e2e/conftest.py
``FAST_ESCROW``), mediation 120 s (``devstack.grid.DEVNET_ESCROW``): a re-run of the demo's
csvstats module takes a few seconds.

    .venv/bin/python -m pytest tests/e2e/test_rerun.py -q -p no:cacheprovider
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.grid import PROVIDER_STAKE, LocalGrid
from gridmarket.chain import Event
from gridmarket.cid import same_cid
from gridmarket.eip712 import sign_result
from gridmarket.escrow import Status
from gridmarket.wire import API, JobSpec, NodeCapacityIn

from .support import (
    Funded,
    Inputs,
    WireProvider,
    add_inputs,
    agent_of,
    assert_paid_once,
    fetch_output,
    fund,
    job_events,
    job_state,
    names,
    wait_for,
    wait_job,
    wasm_spec,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture(scope="class")
def inputs(grid: LocalGrid) -> Inputs:
    return add_inputs(grid)


def report(provider: WireProvider, assignment: dict[str, Any], cid: str, size: int) -> None:
    """Report success with ``cid`` (signed by the provider's wallet), as the agent does."""
    job_id = bytes.fromhex(assignment["job_id"][2:])
    sig = sign_result(
        provider.account,
        assignment["chain_id"],
        assignment["escrow"],
        job_id,
        assignment["attempt"],
        cid,
    )
    r = provider.http.post(
        API.RESULT.format(node_id=provider.node_id, job_id=assignment["job_id"]),
        json={
            "attempt": assignment["attempt"],
            "reason": "succeeded",
            "exit_code": 0,
            "duration_s": 0.2,
            "output_cid": cid,
            "output_bytes": size,
            "signature": "0x" + sig.hex(),
        },
        headers=provider.auth,
    )
    assert r.status_code in (200, 202), r.text


def dispute_when_submitted(grid: LocalGrid, job: Funded) -> int:
    """Wait for the job's result on chain and dispute it at once (the window is 12 s)."""
    state = wait_for(
        "the result on chain",
        lambda: (s := job_state(grid, job)).status is Status.SUBMITTED and s,
        90,
        every=0.2,
    )
    deposit = int(grid.escrow.call("depositOf", state.job.as_tuple()))  # the bounty
    assert deposit == max(state.job.bounty, int(grid.escrow.call("disputeDeposit")))
    grid.escrow.call_job(job.submitter, "dispute", state, value=deposit)
    return deposit


def rerun_of(grid: LocalGrid, spec: JobSpec) -> tuple[Event, JobSpec]:
    """The re-run the mediator funded for a job with ``spec`` (its JobCreated, its spec)."""
    found = reruns_of(grid, spec)
    assert len(found) == 1, found
    return found[0]


def reruns_of(grid: LocalGrid, spec: JobSpec) -> list[tuple[Event, JobSpec]]:
    """The re-runs the mediator funded for a job with ``spec``, in order (run 1, run 2)."""
    found = []
    for e in grid.escrow.events(grid.deployment.block, "latest"):
        if e.name != "JobCreated" or e.args["submitter"] != grid.mediator.address:
            continue
        theirs = JobSpec.from_bytes(grid.ipfs.cat(e.args["specCid"], max_bytes=1 << 16))
        if theirs.name == f"rerun-{spec.name}":
            found.append((e, theirs))
    return found


def ruled(grid: LocalGrid, job: Funded) -> Event | None:
    return next((e for e in job_events(grid, job) if e.name == "Ruled"), None)


def mediator_log(grid: LocalGrid) -> str:
    return grid.mediator_process.log_path.read_text(errors="replace")


class TestRerun:
    def test_a_plausible_wrong_output_is_rerun_ruled_wrong_slashed_and_done_elsewhere(
        self, grid: LocalGrid, inputs: Inputs, tmp_path: Path
    ) -> None:
        """A cheater uploads a plausible wrong ``stats.txt`` (intact, valid CID) and reports
        it; the scheduler's integrity check passes it and posts it. The submitter disputes.
        The mediator's re-run may not go to the cheater (which keeps asking for work, and
        fits the job best); an honest agent runs it, the CIDs differ, the cheater is slashed
        (the deposit's worth of its collateral to the mediator, the rest to the submitter),
        and the job is done again by an honest agent with the re-run's output."""
        account = grid.providers[4]  # not one of the agents' wallets
        grid.escrow.send(account, "registerProvider", "bafkreie2ererunner", value=PROVIDER_STAKE)
        capacity = NodeCapacityIn(
            cpu_cores=1, ram_mib=256, disk_mib=4096, region="us", executors=["docker", "wasm"]
        )
        cheater = WireProvider(grid, account, "rerun-cheater", capacity)
        cheater.register()
        got: dict[str, Any] = {}
        poll = threading.Thread(target=lambda: got.update(a=cheater.next_job(20)), daemon=True)
        poll.start()
        time.sleep(1.0)  # the cheater's long-poll is parked at the scheduler
        spec = wasm_spec("rerun-cheated", inputs.module_cid, inputs.dataset_cid)
        job = fund(grid, spec)
        poll.join(25)
        offers: list[str] = []
        stop = threading.Event()

        def keep_asking() -> None:  # a live node that best fits every small job
            while not stop.is_set():
                try:
                    cheater.heartbeat([])
                    offer = cheater.next_job(1)
                except (httpx.HTTPError, AssertionError, RuntimeError):
                    time.sleep(0.2)  # the client closed at the end, or a refused poll
                    continue
                if offer is not None:
                    offers.append(offer["job_id"])

        asking = threading.Thread(target=keep_asking, daemon=True)
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
            fake = tmp_path / "fake"
            fake.mkdir()
            text = "bytes=1337\nlines=41\nfields=5\n"  # the shape of csvstats' output
            (fake / "stats.txt").write_text(text)
            wrong = grid.ipfs.add_dir(fake)
            report(cheater, assignment, wrong, len(text))
            asking.start()
            deposit = dispute_when_submitted(grid, job)
            assert job_state(grid, job).output_cid == wrong
            wait_for("the mediator's ruling", lambda: ruled(grid, job), 120, every=0.5)
        finally:
            stop.set()
            if asking.is_alive():
                asking.join(10)
            cheater.close()
        view = wait_job(grid, job, {"released"}, 120)

        (created, rerun_spec), (tie, tie_spec) = reruns_of(grid, spec)  # run 1 differed: run 2
        rerun_id = bytes(created.args["jobId"])
        assert rerun_spec.exclude_providers == [account.address, job.submitter.address]
        assert created.args["mediator"] == grid.mediator.address
        assert created.args["bounty"] == job.bounty
        assert "0x" + rerun_id.hex() not in offers, "the re-run was offered to the cheater"
        rerun = grid.escrow.job_state(rerun_id)
        assert rerun.status is Status.RELEASED  # the mediator accepted it once compared
        assert rerun.job.provider not in (account.address, job.submitter.address)
        assert isinstance(rerun.output_cid, str) and not same_cid(rerun.output_cid, wrong)
        # the tie-break excludes the first re-run's provider too and agrees with it
        assert tie_spec.exclude_providers == [
            account.address,
            job.submitter.address,
            rerun.job.provider,
        ]
        second = grid.escrow.job_state(bytes(tie.args["jobId"]))
        assert second.status is Status.RELEASED
        assert isinstance(second.output_cid, str) and same_cid(second.output_cid, rerun.output_cid)

        events = job_events(grid, job)
        order = [n for n in names(events) if n not in ("Credited",)]
        assert order[:6] == [
            "JobCreated",
            "JobAssigned",
            "ResultSubmitted",  # the wrong output, relayed by the scheduler
            "ResultDisputed",
            "Ruled",
            "ProviderSlashed",
        ], names(events)
        (ruling,) = [e for e in events if e.name == "Ruled"]
        assert ruling.args["mediator"] == grid.mediator.address and not ruling.args["upheld"]
        (slash,) = [e for e in events if e.name == "ProviderSlashed"]
        collateral = job_state(grid, job).job.collateral
        assert slash.args["provider"] == account.address
        assert slash.args["amount"] == collateral
        assert slash.args["toMediator"] == min(2 * deposit, collateral)  # the cheater pays re-runs
        assert min(deposit, collateral) == created.args["bounty"]  # one re-run's worth

        # the submitter gets the right output: done again by an honest agent, as the re-run
        honest = agent_of(grid, view["attempts"][-1]["node_id"])
        assert_paid_once(grid, job, honest.account.address)
        assert view["output_cid"] != wrong and same_cid(view["output_cid"], rerun.output_cid)
        files = fetch_output(grid, view["output_cid"], tmp_path / "right")
        assert list(files) == ["stats.txt"] and files["stats.txt"] != text
        log = mediator_log(grid)
        assert f"re-run 0x{rerun_id.hex()}" in log and "different CID" in log

    def test_an_honest_result_disputed_is_upheld_after_the_rerun(
        self, grid: LocalGrid, inputs: Inputs
    ) -> None:
        """An agent's honest result is disputed; the re-run on another agent gives the same
        CID; the result is upheld and paid, the deposit pays the mediator, and the mediator
        releases its re-run."""
        spec = wasm_spec("rerun-honest", inputs.module_cid, inputs.dataset_cid)
        before = grid.escrow.balance_of(grid.mediator.address)
        job = fund(grid, spec)
        deposit = dispute_when_submitted(grid, job)
        state = job_state(grid, job)
        assert state.status is Status.DISPUTED
        first = state.job.provider
        wait_for("the mediator's ruling", lambda: ruled(grid, job), 120, every=0.5)
        ruling = ruled(grid, job)
        assert ruling is not None and ruling.args["upheld"] is True
        assert_paid_once(grid, job, first)
        assert "ProviderSlashed" not in names(job_events(grid, job))

        created, rerun_spec = rerun_of(grid, spec)
        rerun = grid.escrow.job_state(bytes(created.args["jobId"]))
        assert rerun_spec.exclude_providers == [first, job.submitter.address]
        assert rerun.status is Status.RELEASED
        assert rerun.job.provider not in (first, job.submitter.address)
        assert isinstance(rerun.output_cid, str)
        assert same_cid(rerun.output_cid, state.output_cid)  # type: ignore[arg-type]
        # the deposit (the mediator's re-run fee) went to the mediator
        assert grid.escrow.balance_of(grid.mediator.address) - before == deposit
        assert deposit == rerun.job.bounty  # the submitter who was wrong paid the whole re-run
        assert "the same CID" in mediator_log(grid)
