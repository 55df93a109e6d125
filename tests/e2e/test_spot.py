"""Spot checks on the whole grid (issue 10, ``spot: p``): real anvil + escrow, js-ipfs, dockerd,
the scheduler, three agents and the mediator process (``gridmarket-mediator run``).

A submitter funds two spot-checked WASM jobs at p = 25 %, sealing each seed to the mediator's
public key from the deployment record (``params.mediator_pubkey``, checked against
``params.mediator``). The first job's seed draws its first attempt for a check (and not its
second), and a lying node takes it and reports a plausible wrong output: the mediator opens the
check itself (``dispute``, sending nothing), re-runs the job on an honest agent, rules the lie
wrong (the liar slashed, the check deposit's worth to the mediator), and an honest agent does
the job again and is paid. The second job's seed draws nothing: an honest agent's result is paid
after the challenge window with no check. Once each job is settled the mediator reveals its seed
to the scheduler (``GET /v1/jobs/{id}/spot``).

    .venv/bin/python -m pytest tests/e2e/test_spot.py -q -p no:cacheprovider
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.grid import PROVIDER_STAKE, LocalGrid
from gridmarket import spot
from gridmarket.cid import same_cid
from gridmarket.escrow import FLAG_SPOT, Status
from gridmarket.wire import API, JobSpec, NodeCapacityIn, SpotCheck

from .support import (
    BOUNTY,
    Funded,
    Inputs,
    WireProvider,
    add_inputs,
    add_spec,
    agent_of,
    assert_paid_once,
    chain_now,
    fetch_output,
    job_events,
    job_state,
    names,
    wait_for,
    wait_job,
    wasm_spec,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

P_BPS = 2500


def seed_drawing(first: bool) -> bytes:
    """A seed whose attempt 1 is drawn for a check (``first``) or not, and attempt 2 never
    (so the job done again after a caught lie is not checked again: a shorter test)."""
    while True:
        seed = spot.new_seed()
        if spot.checked(seed, 1, P_BPS) is first and not spot.checked(seed, 2, P_BPS):
            return seed


def fund_spot(grid: LocalGrid, spec: JobSpec, seed: bytes) -> Funded:
    """What a submitter's client does: seal the seed to the deployment's mediator (its key
    checked against its address), commit to it in the spec, and fund the job with FLAG_SPOT
    (twice the bounty: the check deposit) and the least collateral p needs."""
    params = grid.deployment.params
    key = spot.check_public_key(bytes.fromhex(params["mediator_pubkey"][2:]), params["mediator"])
    who = grid.submitters[0]
    policy = SpotCheck(
        p_bps=P_BPS,
        commit="0x" + spot.commit_of(seed, who.address).hex(),
        sealed="0x" + spot.seal(seed, key, who.address).hex(),
    )
    spec = spec.model_copy(update={"spot": policy})
    terms = grid.escrow.default_terms(BOUNTY, who.address)
    collateral = max(terms.collateral, spot.min_collateral(BOUNTY, P_BPS))
    terms = replace(terms, collateral=collateral, flags=FLAG_SPOT)
    now = max(int(time.time()), chain_now(grid))
    state, sent = grid.escrow.create_job(
        who, os.urandom(32), add_spec(grid, spec), now + 1800, BOUNTY, terms
    )
    assert state.job.flags == FLAG_SPOT and state.job.collateral == collateral
    return Funded("0x" + state.job_id.hex(), spec, who, BOUNTY, sent.tx_hash, sent.block)


def revealed(grid: LocalGrid, job: Funded) -> dict[str, Any] | None:
    r = httpx.get(grid.scheduler.url + API.SPOT.format(job_id=job.job_id), timeout=5)
    assert r.status_code == 200, r.text
    view: dict[str, Any] = r.json()
    return view if view["seed"] is not None else None


def decisions(grid: LocalGrid, job: Funded) -> list[str]:
    log = grid.mediator_process.log_path.read_text(errors="replace")
    return [line for line in log.splitlines() if f"decision: job {job.job_id} " in line]


def test_a_drawn_lie_is_checked_and_slashed_and_an_undrawn_job_is_paid_unchecked(
    grid: LocalGrid, tmp_path: Path
) -> None:
    inputs: Inputs = add_inputs(grid)
    account = grid.providers[4]  # not one of the agents' wallets
    grid.escrow.send(account, "registerProvider", "bafkreie2espotliar", value=PROVIDER_STAKE)
    capacity = NodeCapacityIn(
        cpu_cores=1, ram_mib=256, disk_mib=4096, region="us", executors=["docker", "wasm"]
    )
    liar = WireProvider(grid, account, "spot-liar", capacity)
    liar.register()
    got: dict[str, Any] = {}
    poll = threading.Thread(target=lambda: got.update(a=liar.next_job(20)), daemon=True)
    poll.start()
    time.sleep(1.0)  # the liar's long-poll is parked at the scheduler: it gets the first job
    drawn_seed = seed_drawing(first=True)
    drawn = fund_spot(
        grid, wasm_spec("spot-drawn", inputs.module_cid, inputs.dataset_cid), drawn_seed
    )
    poll.join(25)
    stop = threading.Event()

    def keep_alive() -> None:  # heartbeats only: the liar asks for nothing more
        while not stop.wait(0.5):
            try:
                liar.heartbeat([])
            except (httpx.HTTPError, AssertionError):
                continue

    alive = threading.Thread(target=keep_alive, daemon=True)
    try:
        assignment = got.get("a")
        assert assignment is not None and assignment["job_id"] == drawn.job_id, got
        liar.accept(assignment)
        alive.start()
        wait_for(
            "the drawn job assigned to the liar on-chain",
            lambda: job_state(grid, drawn).job.provider == account.address,
            20,
            every=0.2,
        )
        fake = tmp_path / "fake"
        fake.mkdir()
        text = "bytes=1337\nlines=41\nfields=5\n"  # the shape of csvstats' output
        (fake / "stats.txt").write_text(text)
        wrong = grid.ipfs.add_dir(fake)
        liar.report_result(assignment, wrong)
        quiet_seed = seed_drawing(first=False)
        quiet = fund_spot(
            grid, wasm_spec("spot-quiet", inputs.module_cid, inputs.dataset_cid), quiet_seed
        )
        wait_for(
            "the mediator's ruling on the lie",
            lambda: "Ruled" in names(job_events(grid, drawn)),
            90,
            every=0.5,
        )
    finally:
        stop.set()
        if alive.is_alive():
            alive.join(5)
        liar.close()

    # the drawn job: checked by the mediator itself, the liar slashed, done again and paid
    view = wait_job(grid, drawn, {"released"}, 90)
    events = job_events(grid, drawn)
    order = [n for n in names(events) if n != "Credited"]
    assert order[:6] == [
        "JobCreated",
        "JobAssigned",
        "ResultSubmitted",  # the lie, relayed by the scheduler (its integrity is fine)
        "ResultDisputed",  # by the mediator: the spot check
        "Ruled",
        "ProviderSlashed",
    ], names(events)
    (disputed,) = [e for e in events if e.name == "ResultDisputed"]
    tx = grid.w3.eth.get_transaction(disputed.tx_hash)  # type: ignore[arg-type]
    assert tx["from"] == grid.mediator.address and tx["value"] == 0
    (ruling,) = [e for e in events if e.name == "Ruled"]
    assert ruling.args["upheld"] is False and ruling.args["attempt"] == 1
    (slash,) = [e for e in events if e.name == "ProviderSlashed"]
    assert slash.args["provider"] == account.address
    # min(collateral, 2 x the check deposit): the liar pays the re-run and its tie-break
    assert slash.args["toMediator"] == 2 * BOUNTY
    honest = agent_of(grid, view["attempts"][-1]["node_id"])
    assert_paid_once(grid, drawn, honest.account.address)
    assert job_state(grid, drawn).job.attempt == 2
    assert view["output_cid"] != wrong
    files = fetch_output(grid, view["output_cid"], tmp_path / "right")
    assert list(files) == ["stats.txt"] and files["stats.txt"] != text
    reruns = [
        e
        for e in grid.escrow.events(drawn.block)
        if e.name == "JobCreated" and e.args["submitter"] == grid.mediator.address
    ]
    runs = [
        e
        for e in reruns
        if JobSpec.from_bytes(grid.ipfs.cat(e.args["specCid"], max_bytes=1 << 16)).name
        == "rerun-spot-drawn"
    ]
    assert len(runs) == 2, runs  # the re-run differed: the tie-break (run 2) agreed with it
    rerun = runs[0]
    rerun_state = grid.escrow.job_state(bytes(rerun.args["jobId"]))
    assert rerun_state.job.provider != account.address and rerun_state.job.flags == 0
    assert same_cid(view["output_cid"], rerun_state.output_cid)  # type: ignore[arg-type]
    lines = decisions(grid, drawn)
    assert any(
        "attempt 1 (check)" in line
        and "verdict=disputed" in line
        and f"spot check drawn (p={P_BPS} bps, attempt 1)" in line
        for line in lines
    ), lines
    assert any("attempt 1 (dispute)" in line and "verdict=not_upheld" in line for line in lines), (
        lines
    )
    assert any("attempt 2 (check)" in line and "spot check not drawn" in line for line in lines)

    # the quiet job: paid after the window, never checked
    wait_job(grid, quiet, {"released"}, 60)
    quiet_events = names(job_events(grid, quiet))
    assert "ResultDisputed" not in quiet_events and "ProviderSlashed" not in quiet_events
    assert_paid_once(grid, quiet)
    lines = decisions(grid, quiet)
    assert any(f"spot check not drawn (p={P_BPS} bps, attempt 1)" in line for line in lines)

    # both seeds revealed by the mediator once settled: anyone can check the draws
    for job, seed, checked in ((drawn, drawn_seed, [1]), (quiet, quiet_seed, [])):
        shown = wait_for(f"the reveal of {job.job_id}", partial(revealed, grid, job), 30)
        assert shown["seed"] == "0x" + seed.hex()
        assert shown["commit"] == "0x" + spot.commit_of(seed, grid.submitters[0].address).hex()
        assert shown["checked_attempts"] == checked, shown
        assert job_state(grid, job).status is Status.RELEASED
