"""Spot checks (``spot:p``) from the submitter's side against the real stack
(tests/frontend/conftest.py: anvil, IPFS, the scheduler, the front end): ``gridmarket submit
--verification spot:0.1`` draws the seed locally, seals it to the listed mediator's public key
(the deployment's ``mediator_pubkey``), keeps it 0600 and funds twice the bounty with the
collateral the arithmetic asks; the spec's sealed seed opens with the mediator's key and
matches the commitment. The mediator's check, a ruling against the provider, the next attempt
disputed from the terminal (sending nothing) and upheld: the job page and ``status`` show each
attempt's check state. The front end's own draw (the browser's path) and the explorer's
"check deposit returned" credit after a cancel; a job that is not comparable is refused.
The scheduler's reveal endpoint is another part's: ``reveal`` is checked to reach it, and its
answer is checked when the scheduler has the endpoint.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from frontend_api.submitter_client import sign_tx
from gridmarket import spot
from gridmarket.cid import bytes_cid
from gridmarket.escrow import FLAG_SPOT, Status
from gridmarket.wire import JobSpec
from tests.frontend.conftest import FrontendStack, unrunnable_spec
from tests.frontend.test_cli import PASSWORD
from tests.frontend.test_replicas_api import PINNED
from tests.frontend.test_replicas_cli import gm

BOUNTY = 2 * 10**15


@pytest.fixture(scope="module")
def home(frontend_stack: FrontendStack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gridmarket.keystore import create_keystore

    home = tmp_path_factory.mktemp("spot-submitter")
    key = bytes(frontend_stack.submitter.key)
    create_keystore(home / "submitter.json", PASSWORD, private_key=key, iterations=2**10)
    return home


def pinned(stack: FrontendStack) -> str:
    """The stack registry's busybox, named by its digest."""
    from gridmarket.images import resolve_image

    registry = stack.get("/api/info").json()["registry"]
    return resolve_image(f"{registry}/gridmarket/busybox:test")


def job_file(
    stack: FrontendStack, folder: Path, name: str, extra: str = "deterministic: true\n"
) -> Path:
    """A Docker job pinned by digest: the stack's agent serves WASM only, so it waits for a
    provider assigned by hand."""
    path = folder / f"{name}.yaml"
    path.write_text(
        f'name: {name}\nexecutor: docker\nimage: {pinned(stack)}\ncommand: ["true"]\n'
        f"limits: {{timeout_s: 60}}\nbounty: 0.002\ndeadline: 2h\n{extra}"
    )
    return path


def spec_of(stack: FrontendStack, cid: str) -> JobSpec:
    response = httpx.post(f"{stack.ipfs_url}/api/v0/cat", params={"arg": cid}, timeout=30)
    response.raise_for_status()
    return JobSpec.from_bytes(response.content)


def scheduler_reveals(stack: FrontendStack, job_id: str) -> bool:
    """Whether this stack's scheduler has the spot endpoint (built by another part)."""
    return httpx.get(f"{stack.scheduler.url}/v1/jobs/{job_id}/spot", timeout=10).status_code != 404


def test_cli_spot_job_sealed_funded_checked_disputed_and_revealed(
    stack: FrontendStack, home: Path, tmp_path: Path
) -> None:
    path = job_file(stack, tmp_path, "spot-cli")
    dry = gm(stack, home, "submit", str(path), "--verify", "spot:0.1", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would lock 0.004 ETH" in dry.stdout
    assert "spot:0.1: you send 0.004 ETH (bounty 0.002 ETH + check deposit 0.002 ETH" in dry.stdout
    assert "expected compute 1 + 0.1 runs" in dry.stdout
    assert not (home / "spot").exists() or not list((home / "spot").iterdir())  # nothing kept

    done = gm(stack, home, "submit", str(path), "--verification", "spot:0.1")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    found = re.search(r"^(0x[0-9a-f]{64})$", out, re.M)
    assert found is not None, out
    job_id = found[1]
    assert "funded   0.004 ETH" in out and "check deposit 0.002 ETH" in out
    assert "cheating is unprofitable when C > B (1 - p) / p = 0.002 ETH x 9" in out

    # on-chain: FLAG_SPOT, 2 x bounty sent (the contract took half as the bounty), collateral
    state = stack.chain_job(job_id)
    least = spot.min_collateral(BOUNTY, 1000)
    assert (state.job.flags, state.job.bounty, state.job.collateral) == (FLAG_SPOT, BOUNTY, least)
    assert least == 9 * BOUNTY + 1
    created = next(t for t in stack.job(job_id)["transactions"] if "JobCreated" in t["events"])
    tx = stack.escrow.w3.eth.get_transaction(created["tx_hash"])
    assert tx["value"] == 2 * BOUNTY

    # the seed: kept 0600 here, sealed in the spec to the mediator's key, matching the commit
    record_path = home / "spot" / f"{job_id}.json"
    assert record_path.stat().st_mode & 0o777 == 0o600
    record = json.loads(record_path.read_text())
    check = spec_of(stack, state.spec_cid).spot
    assert check is not None and check.p_bps == 1000 and record["commit"] == check.commit
    seed = spot.unseal(
        check.sealed_bytes, bytes(stack.mediator.key), state.job.submitter, check.commit_bytes
    )
    assert "0x" + seed.hex() == record["seed"]

    # attempt 1: the mediator's check (a dispute sending nothing), ruled against the provider
    state = stack.assign_by_hand(job_id)
    state = stack.submit_by_hand(job_id, bytes_cid(b"skipped the work\n"))
    state, _ = stack.client().call_job(stack.mediator, "dispute", state)
    assert state.status is Status.DISPUTED
    view = stack.wait_chain(job_id, "disputed")
    assert view["spot"]["attempts"][0]["state"] == "check open"
    page = stack.get(f"/jobs/{job_id}").text
    assert 'id="job-spot"' in page and check.commit in page and 'data-check="check open"' in page
    state, _ = stack.rule_by_hand(job_id, upheld=False)
    assert state.status is Status.FUNDED  # offered again; the check deposit stays locked

    # attempt 2: disputed from the terminal (value 0: the deposit was locked at funding)
    stack.assign_by_hand(job_id)
    stack.submit_by_hand(job_id, bytes_cid(b"the right output\n"))
    stack.wait_chain(job_id, "submitted")
    disputed = gm(stack, home, "dispute", job_id)
    assert disputed.returncode == 0, disputed.stderr
    assert "deposit  0.002 ETH" in disputed.stdout
    sent_tx = re.search(r"tx (0x[0-9a-f]{64})", disputed.stdout)
    assert sent_tx is not None, disputed.stdout
    assert stack.escrow.w3.eth.get_transaction(sent_tx[1])["value"] == 0  # type: ignore[arg-type]
    stack.rule_by_hand(job_id, upheld=True)
    view = stack.wait_chain(job_id, "released")
    states = [a["state"] for a in view["spot"]["attempts"]]
    assert states == ["check: not upheld (slashed)", "ruling: upheld"], states  # no check
    status = gm(stack, home, "status", job_id)
    assert status.returncode == 0, status.stderr
    assert re.search(r"^verify +spot:0\.1$", status.stdout, re.M)
    assert re.search(r"^attempt 1 +check: not upheld \(slashed\)", status.stdout, re.M)
    assert re.search(rf"^commit +{check.commit}$", status.stdout, re.M)

    # the reveal: checked against the commitment by the front end, then the scheduler's word
    wrong = stack.post(f"/api/jobs/{job_id}/spot", json={"seed": "0x" + "00" * 32})
    assert wrong.status_code == 400 and wrong.json()["field"] == "seed"
    revealed = gm(stack, home, "reveal", job_id)
    if scheduler_reveals(stack, job_id):
        assert revealed.returncode == 0, revealed.stderr
        want = [a for a in (1, 2) if spot.checked(seed, a, 1000)]
        page = stack.get(f"/jobs/{job_id}").text
        assert 'data-verified="true"' in page
        drawn = ", ".join(map(str, want)) if want else "no attempt"
        assert f'id="spot-drawn">{drawn}<' in page
    else:  # the front end took it and passed it on; this scheduler has no such endpoint yet
        assert revealed.returncode == 1 and "scheduler:" in revealed.stderr, revealed.stderr
        page = stack.get(f"/jobs/{job_id}").text
        assert 'id="spot-reveal-pending"' in page  # the page renders from the chain alone


def test_cli_refuses_a_docker_job_that_is_not_deterministic(
    stack: FrontendStack, home: Path, tmp_path: Path
) -> None:
    path = job_file(stack, tmp_path, "spot-nondeterministic", extra="")
    before = stack.get("/api/jobs", params={"submitter": stack.submitter.address}).json()["count"]
    refused = gm(stack, home, "submit", str(path), "--verification", "spot:0.1")
    assert refused.returncode == 1
    assert "spot checks need a job whose honest runs agree" in refused.stderr, refused.stderr
    assert "deterministic" in refused.stderr
    after = stack.get("/api/jobs", params={"submitter": stack.submitter.address}).json()["count"]
    assert after == before
    on_verify = gm(stack, home, "submit", str(job_file(stack, tmp_path, "spot-ov")), "--verify",
                   "spot:0.25", "--payment", "on-verify", "--dry-run")  # fmt: skip
    assert on_verify.returncode == 1 and "payment" in on_verify.stderr


def test_front_end_draw_for_the_browser_and_the_check_deposit_returned(
    stack: FrontendStack, home: Path
) -> None:
    submitter = stack.submitter
    body = {
        "from": submitter.address,
        "spec": unrunnable_spec(name="spot-api", image=PINNED, deterministic=True),
        "bounty_wei": str(BOUNTY),
        "verification": "spot:0.25",
        "ttl_s": 7200,
    }
    prepared = stack.post("/api/jobs/prepare", json=body).json()
    assert prepared["verification"] == "spot:0.25" and prepared["funding_wei"] == str(2 * BOUNTY)
    assert int(prepared["tx"]["value"], 16) == 2 * BOUNTY
    assert prepared["terms"]["flags"] == FLAG_SPOT
    assert prepared["terms"]["collateral_wei"] == str(spot.min_collateral(BOUNTY, 2500))
    price = prepared["price"]["spot"]
    assert price["check_deposit_wei"] == str(BOUNTY) and price["expected_runs"] == "1 + 0.25"
    check = JobSpec.model_validate(prepared["spec"]).spot
    assert check is not None and prepared["spot"]["commit"] == check.commit
    seed = spot.unseal(
        check.sealed_bytes, bytes(stack.mediator.key), submitter.address, check.commit_bytes
    )
    assert seed.hex() not in json.dumps(prepared).lower()  # sealed and committed, never shown
    assert "expects to lose on it" in prepared["price"]["summary"]
    tx = prepared["tx"]
    raw = sign_tx(submitter, tx)  # as the CLI signs
    mined = stack.post("/api/tx/relay", json={"raw_tx": raw, "wait_s": 60}).json()
    assert mined["status"] == "success", mined
    job_id = prepared["job_id"]
    view = stack.wait_chain(job_id, "funded")
    assert view["chain"]["verification"] == "spot:0.25" and view["spot"]["attempts"] == []

    cancelled = gm(stack, home, "cancel", job_id)
    assert cancelled.returncode == 0, cancelled.stderr
    view = stack.wait_chain(job_id, "refunded")
    credits = [c["reason"] for c in view["chain"]["credits"]]
    assert "check deposit returned" in credits
    cancel_tx = next(t for t in view["transactions"] if "Credited" in t["events"])["tx_hash"]
    explorer = stack.get(f"/tx/{cancel_tx}").text
    assert '<span class="reason">check deposit returned</span>' in explorer
    created = next(t for t in view["transactions"] if "JobCreated" in t["events"])["tx_hash"]
    assert (
        "spot-checked: a check deposit locked beside the bounty" in stack.get(f"/tx/{created}").text
    )
    page = stack.get(f"/jobs/{job_id}").text
    assert "check deposit returned" in page and 'id="spot-p">0.25<' in page
