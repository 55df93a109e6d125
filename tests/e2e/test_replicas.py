"""Replicated jobs on the real grid: three seats of one job run by three distinct wallets, the
agreeing majority paid, the liar slashed (escrow version 3, docs/trust.md).

The grid is devstack's (anvil + escrow, an IPFS node per party, dockerd, the scheduler and three
agents); the liar is a provider speaking the scheduler's wire protocol itself
(:class:`~tests.e2e.support.WireProvider`) that uploads a plausible wrong output: real bytes on
IPFS under a valid CID, so the scheduler's integrity check passes it. Only the comparison of the
seats' results catches it.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from devstack.grid import PROVIDER_STAKE, LocalGrid
from gridmarket.escrow import Status, cid_digest, seat_ids
from gridmarket.wire import NodeCapacityIn

from .support import (
    BOUNTY,
    FEE_BPS,
    Inputs,
    WireProvider,
    add_inputs,
    add_spec,
    chain_now,
    money,
    wait_for,
    wait_job,
    wasm_spec,
)


@pytest.fixture(scope="class")
def inputs(grid: LocalGrid) -> Inputs:
    return add_inputs(grid)


class TestReplicas:
    def test_three_seats_one_liar_the_majority_is_paid_and_the_liar_slashed(
        self, grid: LocalGrid, inputs: Inputs
    ) -> None:
        account = grid.providers[4]  # not one of the agents' wallets
        grid.escrow.send(account, "registerProvider", "bafkreie2eliar", value=PROVIDER_STAKE)
        # A tight fit for the job (1 core, 256 MiB): best fit offers it a seat first.
        capacity = NodeCapacityIn(
            cpu_cores=1, ram_mib=256, disk_mib=4096, region="us", executors=["docker", "wasm"]
        )
        liar = WireProvider(grid, account, "liar", capacity)
        liar.register()
        got: dict[str, Any] = {}
        poll = threading.Thread(target=lambda: got.update(a=liar.next_job(20)), daemon=True)
        poll.start()
        time.sleep(1.0)  # the liar's long-poll is parked at the scheduler

        submitter = grid.submitters[0]
        spec = wasm_spec("replicated-stats", inputs.module_cid, inputs.dataset_cid)
        cid = add_spec(grid, spec)
        deadline = max(int(time.time()), chain_now(grid)) + 1800
        terms = grid.escrow.default_terms(BOUNTY, submitter.address)
        before = money(grid)
        group, seats, _ = grid.escrow.create_replicated(
            submitter, os.urandom(32), cid, deadline, 3 * BOUNTY, 3, terms
        )
        ids = ["0x" + s.job_id.hex() for s in seats]
        assert [s.job_id for s in seats] == seat_ids(group, 3)
        poll.join(25)
        try:
            offer = got.get("a")
            assert offer is not None, "the liar was offered no seat"
            assert offer["job_id"] in ids
            liar.accept(offer)
            wait_for(
                "the liar's seat assigned on-chain",
                lambda: (
                    grid.escrow.job_state(bytes.fromhex(offer["job_id"][2:])).job.provider
                    == account.address
                ),
                20,
                every=0.2,
            )
            wrong = grid.ipfs.add_bytes(b"mean,42\n")  # on IPFS, under its own valid CID
            liar.report_result(offer, wrong)
            views = {i: wait_job(grid, i, {"released", "refunded"}, 120) for i in ids}
        finally:
            liar.close()

        liar_seat = offer["job_id"]
        honest = [i for i in ids if i != liar_seat]
        assert views[liar_seat]["state"] == "refunded", views[liar_seat]
        assert "disagreed with the majority" in views[liar_seat]["reason"]
        assert all(views[i]["state"] == "released" for i in honest), views
        outputs = {views[i]["output_cid"] for i in honest}
        assert len(outputs) == 1 and wrong not in outputs  # the submitter gets the right output
        wallets = {views[i]["attempts"][-1]["node_id"] for i in honest}
        assert len(wallets) == 2  # two distinct honest nodes

        states = [grid.escrow.job_state(s.job_id) for s in seats]
        assert [s.status for s in states].count(Status.RELEASED) == 2
        events = list(grid.escrow.events(grid.escrow.deployment.block))
        (resolved,) = [
            e for e in events if e.name == "Resolved" and bytes(e.args["groupId"]) == group
        ]
        assert resolved.args["agreeing"] == 2 and resolved.args["replicas"] == 3
        assert bytes(resolved.args["resultDigest"]) == cid_digest(outputs.pop())
        (slash,) = [
            e
            for e in events
            if e.name == "ProviderSlashed" and "0x" + bytes(e.args["jobId"]).hex() == liar_seat
        ]
        assert slash.args["provider"] == account.address
        assert slash.args["amount"] == terms.collateral

        after = money(grid)
        delta = before.delta(after)
        assert delta[f"stake:{account.address}"] == -terms.collateral
        # the submitter paid 3 shares, got back the liar's share and its collateral
        assert delta[f"balance:{submitter.address}"] == BOUNTY + terms.collateral
        payout = BOUNTY - BOUNTY * FEE_BPS // 10_000
        paid = [e for e in events if e.name == "JobReleased" and "0x" + bytes(
            e.args["jobId"]).hex() in honest]  # fmt: skip
        assert sorted(int(e.args["payout"]) for e in paid) == [payout, payout]
        node = grid.api(f"/v1/nodes/{liar.node_id}")
        assert node["jobs_done"] == 0 and node["jobs_failed"] >= 1

    def test_two_seats_split_the_mediator_breaks_the_tie_and_the_liar_is_slashed(
        self, grid: LocalGrid, inputs: Inputs
    ) -> None:
        """Two seats, one liar: no majority. The job's mediator re-runs the job on a provider
        neither seat's, rules the honest seat upheld (paid) and the liar's wrong (slashed);
        the liar's seat is run again by another provider and the job resolves 2 of 2."""
        account = grid.providers[3]  # not one of the agents' wallets, nor the first test's liar
        grid.escrow.send(account, "registerProvider", "bafkreie2etieliar", value=PROVIDER_STAKE)
        capacity = NodeCapacityIn(
            cpu_cores=1, ram_mib=256, disk_mib=4096, region="us", executors=["docker", "wasm"]
        )
        liar = WireProvider(grid, account, "tie-liar", capacity)
        liar.register()
        got: dict[str, Any] = {}
        poll = threading.Thread(target=lambda: got.update(a=liar.next_job(20)), daemon=True)
        poll.start()
        time.sleep(1.0)

        submitter = grid.submitters[0]
        spec = wasm_spec("replicated-tie", inputs.module_cid, inputs.dataset_cid)
        cid = add_spec(grid, spec)
        deadline = max(int(time.time()), chain_now(grid)) + 1800
        terms = grid.escrow.default_terms(BOUNTY, submitter.address)
        group, seats, _ = grid.escrow.create_replicated(
            submitter, os.urandom(32), cid, deadline, 2 * BOUNTY, 2, terms
        )
        ids = ["0x" + s.job_id.hex() for s in seats]
        poll.join(25)
        try:
            offer = got.get("a")
            assert offer is not None and offer["job_id"] in ids, "the liar was offered no seat"
            liar.accept(offer)
            wait_for(
                "the liar's seat assigned on-chain",
                lambda: (
                    grid.escrow.job_state(bytes.fromhex(offer["job_id"][2:])).job.provider
                    == account.address
                ),
                20,
                every=0.2,
            )
            liar.report_result(offer, grid.ipfs.add_bytes(b"mean,41\n"))
            views = {i: wait_job(grid, i, {"released"}, 240) for i in ids}
        finally:
            liar.close()

        liar_seat = offer["job_id"]
        honest_seat = next(i for i in ids if i != liar_seat)
        assert views[liar_seat]["output_cid"] == views[honest_seat]["output_cid"]
        attempts = views[liar_seat]["attempts"]
        assert attempts[0]["node_id"] == liar.node_id and attempts[0]["outcome"] != "success"
        assert attempts[-1]["outcome"] == "success" and attempts[-1]["node_id"] != liar.node_id

        events = list(grid.escrow.events(grid.escrow.deployment.block))

        def of(job: str, name: str) -> list[Any]:
            return [
                e
                for e in events
                if e.name == name and "0x" + bytes(e.args.get("jobId", b"")).hex() == job
            ]

        (ruled_liar,) = of(liar_seat, "Ruled")
        (ruled_honest,) = of(honest_seat, "Ruled")
        assert ruled_liar.args["mediator"] == grid.mediator.address
        assert not ruled_liar.args["upheld"] and ruled_honest.args["upheld"]
        (slash,) = of(liar_seat, "ProviderSlashed")
        assert slash.args["provider"] == account.address
        assert slash.args["amount"] == terms.collateral
        (resolved,) = [
            e for e in events if e.name == "Resolved" and bytes(e.args["groupId"]) == group
        ]
        assert resolved.args["agreeing"] == 2 and resolved.args["replicas"] == 2
        # the mediator's tie-break re-run was a job of its own, paid to a third provider
        reruns = [
            e
            for e in events
            if e.name == "JobCreated" and e.args["submitter"] == grid.mediator.address
        ]
        assert reruns, "the mediator funded no re-run"
        rerun_state = grid.escrow.job_state(bytes(reruns[-1].args["jobId"]))
        assert rerun_state.status is Status.RELEASED
        assert rerun_state.job.provider not in (account.address,)
