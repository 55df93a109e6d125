"""Poison on the chain against the whole grid (tests/frontend/conftest.py): jobs funded and a
provider registered with strings that are not UTF-8 or not CID-like text. The scheduler's
watcher marks the jobs invalid naming the field and keeps going (an honest job funded after them
runs to Released), the explorer shows the entries as invalid, every page answers, and a front end
started afterwards reads the same log and starts. Events that cannot be folded (out of order,
missing arguments) are kept and shown but never stop the index."""

from __future__ import annotations

import os
import sys
import time

import httpx
from eth_account import Account
from web3.types import Wei

from devstack._process import ROOT, ManagedProcess
from devstack.anvil import free_port
from frontend_api.index import ChainIndex
from gridmarket.chain import Event, Sent
from tests.frontend.conftest import FrontendStack, _wait_http, unrunnable_spec, wasm_spec
from tests.frontend.test_api import fund, upload_dataset, upload_module
from tests.hostile import INVALID_UTF8, ODD_128, escrow_call


def create_job_raw(stack: FrontendStack, raw_spec: bytes, deadline: int, bounty: int) -> Sent:
    """``createJob`` (version 5: default terms, the operator in office, one seat) with the
    spec CID as raw bytes."""
    terms = stack.escrow.default_terms(bounty, stack.devnet.submitters[1].address)
    return escrow_call(
        stack.escrow,
        stack.devnet.submitters[1],
        "createJob",
        os.urandom(32),
        raw_spec,
        deadline,
        stack.escrow.expected_operator(terms),
        terms.mediator,
        terms.collateral,
        terms.flags,
        0,
        value=bounty,
    )


def _scheduler_job(stack: FrontendStack, job_id: str, timeout: float = 60) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    body: dict[str, object] = {}
    while time.monotonic() < deadline:
        r = httpx.get(f"{stack.scheduler.url}/v1/jobs/{job_id}", timeout=10)
        if r.status_code == 200:
            body = r.json()
            if body.get("state") == "invalid":
                return body
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} not invalid at the scheduler: {body}")


def test_poison_events_are_shown_invalid_and_the_grid_keeps_serving(
    stack: FrontendStack,
) -> None:
    w3 = stack.escrow.w3
    attacker = stack.devnet.submitters[1]
    deadline = int(w3.eth.get_block("latest")["timestamp"]) + 3600
    assert attacker == stack.devnet.submitters[1]
    poison = [create_job_raw(stack, raw, deadline, 10**16) for raw in (INVALID_UTF8, ODD_128)]
    job_ids = ["0x" + bytes(p.events[0].args["jobId"]).hex() for p in poison]
    squatter = Account.create()
    w3.eth.send_transaction(
        {"from": stack.devnet.owner.address, "to": squatter.address, "value": Wei(10**17)}
    )
    escrow_call(stack.escrow, squatter, "registerProvider", INVALID_UTF8)

    # an honest job funded after the poison is seen, queued and paid
    prepared = fund(
        stack, wasm_spec(upload_module(stack), upload_dataset(stack)), payment="on_verify"
    )
    stack.wait_job(prepared["job_id"], {"released"}, timeout=120)

    # the scheduler marked each poisoned job invalid, naming the field
    for job_id in job_ids:
        job = _scheduler_job(stack, job_id)
        assert "invalid specCid" in str(job["reason"]), job
    info = httpx.get(f"{stack.scheduler.url}/v1/info", timeout=10)
    assert info.status_code == 200

    # the explorer shows them as invalid, and every page answers
    listed = {j["job_id"]: j for j in stack.get("/api/jobs").json()["jobs"]}
    assert listed[job_ids[0]]["problem"] == "specCid not valid UTF-8 (byte 0xff at offset 4)"
    assert "U+202E" in listed[job_ids[1]]["problem"]
    assert listed[prepared["job_id"]]["problem"] is None
    html = {"accept": "text/html"}
    for job_id in job_ids:
        page = stack.get(f"/jobs/{job_id}", headers=html)
        assert page.status_code == 200, page.text[:2000]
        assert 'id="job-invalid"' in page.text and "specCid" in page.text
        assert stack.get(f"/api/jobs/{job_id}").json()["chain"]["problem"]
    jobs_page = stack.get("/jobs", headers=html)
    assert jobs_page.status_code == 200 and 'data-state="invalid"' in jobs_page.text
    address = stack.get(f"/address/{squatter.address}", headers=html)
    assert address.status_code == 200 and 'id="metadata-invalid"' in address.text
    assert stack.get(f"/api/address/{squatter.address}").json()["totals"]["metadata_problem"]
    tx = stack.get(f"/tx/{poison[0].tx_hash}", headers=html)
    assert tx.status_code == 200 and "invalid: not valid UTF-8" in tx.text
    for path in ("/", "/payouts", "/providers", "/submit", "/api/info", "/api/fleet"):
        response = stack.get(path, headers={} if path.startswith("/api") else html)
        assert response.status_code == 200, (path, response.text[:500])

    # a front end started now reads the same log from the deployment block, and starts
    port = free_port()
    env = dict(stack.frontend.env or {})
    second = ManagedProcess(
        "frontend-after-poison",
        [sys.executable, "-m", "frontend_api", "--port", str(port), "--log-level", "warning"],
        stack.tmp / "frontend-after-poison.log",
        env=env,
        cwd=ROOT,
    )
    second.start()
    try:
        _wait_http(f"http://127.0.0.1:{port}/healthz", second)
        page = httpx.get(f"http://127.0.0.1:{port}/jobs/{job_ids[0]}", headers=html, timeout=30)
        assert page.status_code == 200 and 'id="job-invalid"' in page.text
    finally:
        second.stop()


def test_an_event_that_does_not_fold_is_kept_and_the_index_goes_on(stack: FrontendStack) -> None:
    index = ChainIndex(stack.client())
    index.refresh(force=True)
    known = len(index.jobs())
    block = stack.escrow.w3.eth.block_number
    tx = "0x" + "ee" * 32
    ghost = b"\x13" * 32
    hostile = [
        # a ruling, a slash and a credit for a job the log never created
        Event("Ruled", {"jobId": ghost, "mediator": stack.mediator.address,
                        "provider": stack.provider.address, "attempt": 1, "upheld": False},
              block, tx, 0),
        Event("ProviderSlashed", {"provider": stack.provider.address, "jobId": ghost,
                                  "amount": 5, "submitter": stack.submitter.address,
                                  "toMediator": 1}, block, tx, 1),
        # an argument missing (an older or foreign ABI)
        Event("ProviderSlashed", {"provider": stack.provider.address, "jobId": ghost,
                                  "amount": 5}, block, tx, 2),
        Event("JobReleased", {"jobId": ghost}, block, tx, 3),
    ]  # fmt: skip
    for event in hostile:
        index._ingest(event)
    bad = index.bad_events()
    # every one is only shown: even the orderly slash, whose job (so whose token) is unknown,
    # is counted nowhere (its amount is in no known currency)
    assert len(bad) == 4, bad
    assert any("EventOrderError" in why for why in bad.values())
    assert any("KeyError" in why for why in bad.values())
    assert any("no token to count its amounts in" in why for why in bad.values())
    assert len(index.events()) >= len(hostile)
    # the index still reads the chain and folds what follows
    fund(stack, unrunnable_spec(name="after-the-bad-events"))
    index.refresh(force=True)
    assert len(index.jobs()) == known + 1
