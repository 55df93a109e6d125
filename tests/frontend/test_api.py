"""The front end's JSON API and pages against the real stack (tests/frontend/conftest.py).

* prepare + relay: a job funded through ``/api/jobs/prepare`` (signed locally, relayed by
  ``/api/tx/relay``) on the scheduler's check runs on the agent until Released, and the payout
  shows on the explorer with the right amounts (``/api/payouts``, ``/api/address``,
  ``/api/jobs``, ``/api/tx``, totals);
* the terms: the deployment's defaults (listed mediator, least collateral, paid after the
  challenge window) and explicit ones reach ``createJob``; a bad mediator or collateral is
  refused naming the field;
* a result submitted by hand (the provider's acceptance signed with ``sign_acceptance``, the
  operator's ``assign``) is disputed through the API within its window, the mediator rules by
  hand, and the ruling, the slash and the deposit's return show on the job, the explorer and
  the addresses; a result the mediator upholds on its own check is paid;
* bad input on every endpoint is a 4xx naming the field, and nothing is created (no spec on IPFS,
  no transaction);
* cancel, refund, accept and dispute build transactions only when the contract allows them;
* uploads, quotes, the IPFS proxy (verified), and every page renders.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
from typing import Any

import httpx
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3.types import Wei

from gridmarket.cid import bytes_cid, path_cid
from gridmarket.escrow import FLAG_ON_VERIFY, Status
from tests.frontend.conftest import CHALLENGE_WINDOW_S, FrontendStack, unrunnable_spec, wasm_spec

BOUNTY = 2 * 10**16
DISPUTE_DEPOSIT = 10**15  # EscrowParams' default: the floor of an ETH job's dispute deposit
DEPOSIT = max(BOUNTY, DISPUTE_DEPOSIT)
"""What disputing a BOUNTY job deposits (JobEscrow.depositOf): its bounty, above the floor."""


def sign(prepared_tx: dict[str, str], account: LocalAccount) -> str:
    """Sign the unsigned transaction the API returned, as any offline wallet would."""
    tx: dict[str, Any] = {
        "to": prepared_tx["to"],
        "data": prepared_tx["data"],
        "value": int(prepared_tx["value"], 16),
        "gas": int(prepared_tx["gas"], 16),
        "gasPrice": int(prepared_tx["gasPrice"], 16),
        "nonce": int(prepared_tx["nonce"], 16),
        "chainId": int(prepared_tx["chainId"], 16),
    }
    return "0x" + bytes(account.sign_transaction(tx).raw_transaction).hex()


def relay(stack: FrontendStack, raw: str) -> dict[str, Any]:
    response = stack.post("/api/tx/relay", json={"raw_tx": raw, "wait_s": 30})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["status"] == "success", body
    return body


def upload_module(stack: FrontendStack) -> str:
    data = stack.wasm_module.read_bytes()
    response = stack.post("/api/uploads/module", files={"file": ("upper.wasm", data)})
    assert response.status_code == 200, response.text
    cid: str = response.json()["cid"]
    assert cid == bytes_cid(data)
    return cid


def upload_dataset(stack: FrontendStack, text: str = "hello gridmarket\n") -> str:
    response = stack.post(
        "/api/uploads/dataset", files=[("files", ("data/data.txt", text.encode()))]
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["files"] == ["data.txt"]  # the folder itself is the dataset
    cid: str = body["cid"]
    return cid


def fund(
    stack: FrontendStack, spec: dict[str, Any], account: LocalAccount | None = None, **extra: Any
) -> dict[str, Any]:
    account = account or stack.submitter
    body = {"from": account.address, "spec": spec, "bounty_wei": str(BOUNTY), "ttl_s": 3600}
    body.update(extra)
    response = stack.post("/api/jobs/prepare", json=body)
    assert response.status_code == 200, response.text
    prepared: dict[str, Any] = response.json()
    relayed = relay(stack, sign(prepared["tx"], account))
    assert [e["name"] for e in relayed["events"]] == ["JobCreated"]
    created = relayed["events"][0]["args"]
    assert created["jobId"] == prepared["job_id"]
    terms = prepared["terms"]  # what was asked (defaults filled in) is what was funded
    assert created["mediator"] == terms["mediator"]
    assert created["collateral"] == terms["collateral_wei"]
    assert created["flags"] == terms["flags"]
    prepared["created"] = created
    return prepared


def submitted_by_hand(stack: FrontendStack, name: str, **terms: Any) -> str:
    """A job nobody's agent can run (Docker), funded through the API, assigned by hand (the
    manual provider's signed acceptance, the operator's ``assign``) and given a result by
    hand: Submitted, its challenge window open."""
    job_id: str = fund(stack, unrunnable_spec(name=name), **terms)["job_id"]
    stack.assign_by_hand(job_id)
    stack.submit_by_hand(job_id, bytes_cid(f"output of {name}".encode()))
    return job_id


def test_info_and_pages_render(stack: FrontendStack) -> None:
    info = stack.get("/api/info").json()
    assert info["chain_id"] == 31337 and info["escrow"] == stack.escrow.address
    assert info["scheduler"]["escrow"] == stack.escrow.address
    assert info["mediator"] == stack.mediator.address
    assert info["mediators"] == [stack.mediator.address]  # from MediatorListed
    assert info["params"]["challenge_window"] == str(CHALLENGE_WINDOW_S)
    assert info["params"]["dispute_deposit"] == str(DISPUTE_DEPOSIT)

    terms = stack.get("/api/terms", params={"bounty_eth": "0.02"}).json()
    assert terms["mediator"] == stack.mediator.address
    assert terms["min_collateral_wei"] == str(BOUNTY)  # 100 % of the bounty by default
    assert terms["challenge_window_s"] == CHALLENGE_WINDOW_S
    assert terms["dispute_deposit_wei"] == str(DEPOSIT) == str(BOUNTY)
    assert terms["dispute_deposit_floor_wei"] == str(DISPUTE_DEPOSIT)
    # under the floor the deposit is the floor; no bounty yet, the floor; no dispute of seats
    under = stack.get("/api/terms", params={"bounty_wei": str(DISPUTE_DEPOSIT // 2)}).json()
    assert under["dispute_deposit_wei"] == str(DISPUTE_DEPOSIT)
    assert stack.get("/api/terms").json()["dispute_deposit_wei"] == str(DISPUTE_DEPOSIT)
    seats = stack.get(
        "/api/terms", params={"bounty_eth": "0.02", "verification": "replicate:2"}
    ).json()
    assert seats["dispute_deposit_wei"] is None
    assert "40 s" in terms["payments"]["after_window"]
    assert "trust" in terms["payments"]["on_verify"]
    bad = stack.get("/api/terms", params={"bounty_eth": "lots"})
    assert bad.status_code == 400 and bad.json()["field"] == "bounty_eth"

    submit = stack.get("/submit", headers={"accept": "text/html"}).text
    assert f'value="{stack.mediator.address}"' in submit  # the mediator field's default
    assert 'name="payment" value="after_window" checked' in submit
    assert "On the scheduler's check" in submit and "40 s after it was submitted" in submit
    assert "verified" not in submit.lower()
    assert f"at least {DISPUTE_DEPOSIT / 10**18:g} ETH (it pays the mediator" in submit
    for path in ("/", "/payouts", "/jobs", "/submit", "/providers"):
        response = stack.get(path, headers={"accept": "text/html"})
        assert response.status_code == 200, (path, response.text[:2000])
        assert "<html" in response.text and "GridMarket" in response.text


def test_funded_job_runs_to_release_and_the_payout_is_on_the_explorer(
    stack: FrontendStack,
) -> None:
    module_cid = upload_module(stack)
    dataset_cid = upload_dataset(stack)
    # paid on the scheduler's check: it settles at once (an after-window job would wait)
    prepared = fund(stack, wasm_spec(module_cid, dataset_cid), payment="on_verify")
    assert prepared["created"]["flags"] == FLAG_ON_VERIFY
    job_id = prepared["job_id"]
    # the spec is on IPFS and is what the chain committed to
    assert stack.get(f"/ipfs/{prepared['spec_cid']}").json()["module_cid"] == module_cid

    job = stack.wait_job(job_id, {"released"}, timeout=120)
    state = stack.escrow.job_state(bytes.fromhex(job_id[2:]))
    assert state.status is Status.RELEASED
    assert job["chain"]["provider"] == stack.provider.address
    fee = BOUNTY * state.job.fee_bps // 10_000
    assert job["chain"]["payout_wei"] == str(BOUNTY - fee)
    names = [e["name"] for e in job["chain"]["events"]]
    assert names == ["JobCreated", "JobAssigned", "ResultSubmitted", "JobReleased"]
    assert [a["outcome"] for a in job["scheduler"]["attempts"]] == ["success"]
    assert "ok" in job["scheduler"]["result"]["stdout_tail"]

    # the output, through the verified proxy, as a tar, recomputes to the CID
    output = job["output_cid"]
    listing = stack.get(f"/ipfs/{output}?format=json").json()
    assert [e["name"] for e in listing["entries"]] == ["upper.txt"]
    assert stack.get(f"/ipfs/{output}/upper.txt").text == "HELLO GRIDMARKET\n"
    tar = stack.get(f"/ipfs/{output}?archive=tar")
    assert tar.headers["x-ipfs-kind"] == "directory"
    out_dir = stack.tmp / f"out-{job_id[:10]}"
    with tarfile.open(fileobj=io.BytesIO(tar.content)) as archive:
        archive.extractall(out_dir, filter="data")
    assert path_cid(out_dir) == output

    # the explorer: payout by provider, by submitter, by job, with the right amounts
    for query in (
        {"job": job_id},
        {"provider": stack.provider.address},
        {"submitter": stack.submitter.address, "job": job_id},
    ):
        payouts = stack.get("/api/payouts", params=query).json()
        (row,) = [p for p in payouts["payouts"] if p["job_id"] == job_id]
        assert row["amount_wei"] == str(BOUNTY - fee) and row["fee_wei"] == str(fee)
        assert row["provider"] == stack.provider.address
        assert row["submitter"] == stack.submitter.address
        assert row["block"] > 0 and row["time"] > 0
        assert sum(int(b["amount_wei"]) for b in payouts["totals"]) == int(payouts["amount_wei"])
    released_tx = row["tx_hash"]

    tx = stack.get(f"/api/tx/{released_tx}").json()
    assert tx["function"] == "settle" and tx["status"] == "success"
    assert tx["from"] == stack.devnet.operator.address
    assert "JobReleased" in [e["name"] for e in tx["events"]]
    assert tx["inputs"]["jobId"] == job_id

    provider = stack.get(f"/api/address/{stack.provider.address}").json()
    assert int(provider["totals"]["earned_wei"]) >= BOUNTY - fee
    assert provider["account"]["registered"] is True
    assert int(provider["account"]["stake_wei"]) == 5 * 10**16
    assert provider["account"]["free_collateral_wei"] == provider["account"]["stake_wei"]
    assert int(provider["account"]["balance_wei"]) >= BOUNTY - fee
    assert provider["nodes"] and provider["nodes"][0]["name"] == "frontend-test-node"

    fleet = stack.get("/api/fleet").json()
    (entry,) = [r for r in fleet["leaderboard"] if r["wallet"] == stack.provider.address]
    assert entry["jobs_paid"] >= 1 and entry["online"] == 1

    for path in (
        f"/jobs/{job_id}",
        f"/tx/{released_tx}",
        f"/address/{stack.provider.address}",
        f"/payouts?provider={stack.provider.address}",
        f"/ipfs/{output}",
    ):
        page = stack.get(path, headers={"accept": "text/html"})
        assert page.status_code == 200, (path, page.text[:2000])
    assert "HELLO" not in stack.get(f"/jobs/{job_id}").text  # output is linked, never inlined


def test_prepare_refuses_bad_input_naming_the_field_and_creates_nothing(
    stack: FrontendStack,
) -> None:
    good = {
        "from": stack.submitter.address,
        "spec": unrunnable_spec(),
        "bounty_eth": "0.01",
        "ttl_s": 3600,
    }
    cases: list[tuple[dict[str, Any], str, int]] = [
        ({"from": "0x1234"}, "from", 400),
        ({"spec": {**unrunnable_spec(), "image": "NOT AN IMAGE"}}, "spec.image", 400),
        ({"spec": {**unrunnable_spec(), "image": None}}, "spec.image", 400),
        (
            {"spec": {**unrunnable_spec(), "resources": {"ram_mib": 1}}},
            "spec.resources.ram_mib",
            400,
        ),
        ({"spec": {**unrunnable_spec(), "surprise": 1}}, "spec.surprise", 400),
        ({"bounty_eth": "lots"}, "bounty_eth", 400),
        ({"bounty_eth": "0.0000001"}, "bounty_eth", 400),  # under the escrow's minimum
        ({"bounty_eth": None}, "bounty_eth", 400),
        ({"bounty_wei": "1000"}, "bounty_eth", 400),  # both given
        ({"ttl_s": 5}, "ttl_s", 400),
        ({"ttl_s": 10**9}, "ttl_s", 400),
        ({"ttl_s": None, "deadline": int(time.time()) - 10}, "deadline", 400),
        ({"salt": "0xzz"}, "salt", 400),
        ({"bounty_eth": "100000"}, "from", 400),  # more than the wallet holds
        ({"unexpected": True}, "unexpected", 422),
        ({"mediator": "0x1234"}, "mediator", 400),
        ({"mediator": Account.create().address}, "mediator", 400),  # not listed
        ({"mediator": "0x" + "00" * 20}, "mediator", 400),
        ({"collateral_eth": "0.001"}, "collateral_eth", 400),  # under minCollateral(0.01 ETH)
        ({"collateral_wei": "lots"}, "collateral_wei", 400),
        ({"collateral_wei": str(2**96)}, "collateral_wei", 400),
        ({"collateral_wei": "1", "collateral_eth": "1"}, "collateral_eth", 400),
        ({"payment": "whenever"}, "payment", 422),
    ]
    ipfs = httpx.Client(base_url=stack.ipfs_url, timeout=10)
    for change, field, status in cases:
        body = {**good, **change}
        body = {k: v for k, v in body.items() if v is not None}
        spec_cid = bytes_cid(
            _canonical(body["spec"]) if isinstance(body.get("spec"), dict) else b""
        )
        before = stack.escrow.w3.eth.block_number
        response = stack.post("/api/jobs/prepare", json=body)
        assert response.status_code == status, (change, response.text)
        error = response.json()
        assert error["field"] == field, (change, error)
        assert field.split(".")[-1] in error["detail"], error
        assert stack.escrow.w3.eth.block_number == before  # no transaction
        assert not _pinned(ipfs, spec_cid), change  # no spec document added
    ipfs.close()

    # the operator (the scheduler's key) can never rule; the message says why
    operator = stack.post(
        "/api/jobs/prepare", json={**good, "mediator": stack.devnet.operator.address}
    )
    assert operator.status_code == 400 and operator.json()["field"] == "mediator"
    assert "operator" in operator.json()["detail"]
    unlisted = stack.post("/api/jobs/prepare", json={**good, "mediator": stack.provider.address})
    assert "not a listed mediator" in unlisted.json()["detail"]
    low = stack.post("/api/jobs/prepare", json={**good, "collateral_eth": "0.001"})
    assert "at least 10000000000000000 wei" in low.json()["detail"]

    # the same request is fine once corrected, and a dry run adds nothing either
    dry = stack.post("/api/jobs/prepare", json={**good, "dry_run": True})
    assert dry.status_code == 200, dry.text
    assert dry.json()["dry_run"] is True
    assert not _pinned(httpx.Client(base_url=stack.ipfs_url), dry.json()["spec_cid"])


def _canonical(spec: dict[str, Any]) -> bytes:
    import json

    return json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()


def _pinned(client: httpx.Client, cid: str) -> bool:
    response = client.post("/api/v0/pin/ls", params={"arg": cid, "type": "recursive"})
    return response.status_code == 200 and cid in response.text


def test_relay_refuses_foreign_malformed_and_reverting_transactions(stack: FrontendStack) -> None:
    account = stack.submitter
    w3 = stack.escrow.w3
    base = {
        "gas": 100_000,
        "gasPrice": w3.eth.gas_price,
        "nonce": w3.eth.get_transaction_count(account.address, "pending"),
        "chainId": 31337,
        "value": 0,
    }

    def raw(**tx: Any) -> str:
        return "0x" + bytes(account.sign_transaction({**base, **tx}).raw_transaction).hex()

    cases = [
        ("nothing", "must be the signed transaction"),
        ("0x1234", "not a signed Ethereum transaction"),
        (raw(to=stack.provider.address, data=b""), "not to the escrow"),
        (raw(to=stack.escrow.address, data=b"", chainId=1), "chain 1"),
        # withdraw() with a zero balance reverts: refused before it is sent
        (
            raw(to=stack.escrow.address, data=stack.escrow.encode("withdraw")),
            "JobEscrowNothingToWithdraw",
        ),
    ]
    before = w3.eth.get_transaction_count(account.address)
    for raw_tx, words in cases:
        response = stack.post("/api/tx/relay", json={"raw_tx": raw_tx})
        assert response.status_code == 400, response.text
        assert response.json()["field"] == "raw_tx"
        assert words in response.json()["detail"], response.json()
    assert w3.eth.get_transaction_count(account.address) == before
    response = stack.post("/api/tx/relay", json={})
    assert response.status_code == 422 and response.json()["field"] == "raw_tx"


def test_cancel_only_while_funded_and_only_by_the_submitter(stack: FrontendStack) -> None:
    prepared = fund(stack, unrunnable_spec(name="to-cancel"))
    job_id = prepared["job_id"]
    view = stack.wait_job(job_id, {"queued"}, timeout=30)
    assert view["actions"] == {
        "cancel": True,
        "refund": False,
        "release": False,
        "dispute": False,
        "finalize": False,
    }
    early_dispute = stack.post(
        f"/api/jobs/{job_id}/dispute/prepare", json={"from": stack.submitter.address}
    )
    assert early_dispute.status_code == 400
    assert "JobEscrowWrongStatus" in early_dispute.json()["detail"]

    outsider = stack.devnet.submitters[1]
    refused = stack.post(f"/api/jobs/{job_id}/cancel/prepare", json={"from": outsider.address})
    assert refused.status_code == 400
    assert "JobEscrowNotSubmitter" in refused.json()["detail"]
    early = stack.post(f"/api/jobs/{job_id}/refund/prepare", json={"from": outsider.address})
    assert early.status_code == 400 and "JobEscrowDeadlineNotPassed" in early.json()["detail"]

    ok = stack.post(f"/api/jobs/{job_id}/cancel/prepare", json={"from": stack.submitter.address})
    assert ok.status_code == 200, ok.text
    relayed = relay(stack, sign(ok.json()["tx"], stack.submitter))
    assert [e["name"] for e in relayed["events"]] == ["JobRefunded"]
    view = stack.wait_job(job_id, {"refunded"}, timeout=30)
    assert view["chain_status"] == "refunded" and view["actions"]["cancel"] is False
    again = stack.post(f"/api/jobs/{job_id}/cancel/prepare", json={"from": stack.submitter.address})
    assert again.status_code == 400 and "JobEscrowWrongStatus" in again.json()["detail"]

    # the refund is in the submitter's balance: withdraw builds and relays
    balance = stack.escrow.balance_of(stack.submitter.address)
    assert balance >= BOUNTY
    w = stack.post("/api/withdraw/prepare", json={"from": stack.submitter.address})
    assert w.status_code == 200, w.text
    relay(stack, sign(w.json()["tx"], stack.submitter))
    assert stack.escrow.balance_of(stack.submitter.address) == 0
    nothing = stack.post("/api/withdraw/prepare", json={"from": stack.submitter.address})
    assert nothing.status_code == 400 and nothing.json()["field"] == "from"
    totals = stack.get(f"/api/address/{stack.submitter.address}").json()["totals"]
    assert int(totals["withdrawn_wei"]) >= balance and int(totals["refunded_wei"]) >= BOUNTY


def test_refund_after_the_deadline_by_anyone(stack: FrontendStack) -> None:
    # straight on-chain with a deadline seconds away (this escrow's minimum duration is 1 s)
    spec_cid = bytes_cid(_canonical(unrunnable_spec(name="expires")))
    now = int(stack.escrow.w3.eth.get_block("latest")["timestamp"])
    state, _ = stack.client().create_job(stack.submitter, os.urandom(32), spec_cid, now + 3, BOUNTY)
    job_id = "0x" + state.job_id.hex()
    anyone = Account.create()
    time.sleep(4)
    # funding the outsider also mines a block past the deadline (anvil mines on demand)
    stack.escrow.w3.eth.send_transaction(
        {"from": stack.devnet.owner.address, "to": anyone.address, "value": Wei(10**17)}
    )
    view = stack.job(job_id)
    assert view["actions"]["refund"] is True and view["actions"]["cancel"] is True
    ok = stack.post(f"/api/jobs/{job_id}/refund/prepare", json={"from": anyone.address})
    assert ok.status_code == 200, ok.text
    relayed = relay(stack, sign(ok.json()["tx"], anyone))
    assert relayed["events"][0]["name"] == "JobRefunded"
    assert relayed["events"][0]["args"]["submitter"] == stack.submitter.address


def test_uploads_quotes_and_lookups_refuse_bad_input(stack: FrontendStack) -> None:
    bad_module = stack.post("/api/uploads/module", files={"file": ("x.wasm", b"not wasm")})
    assert bad_module.status_code == 400 and bad_module.json()["field"] == "file"
    no_files = stack.post("/api/uploads/dataset", files={"other": ("a", b"x")})
    assert no_files.status_code == 400 and no_files.json()["field"] == "files"
    escape = stack.post("/api/uploads/dataset", files=[("files", ("../etc/passwd", b"x"))])
    assert escape.status_code == 400 and "unsafe" in escape.json()["detail"]

    q = stack.post("/api/quote", json={"executor": "wasm", "region": "eu-west", "duration_s": 600})
    assert q.status_code == 200, q.text
    quote = q.json()
    assert quote["quotes"][0]["tier"] == "cpu" and int(quote["quotes"][0]["fee_wei"]) > 0
    assert quote["provider_count"] == 1  # the stack's agent: wasm, eu-west
    assert stack.post("/api/quote", json={"executor": "docker"}).json()["provider_count"] == 0
    for body, field in (
        ({"region": "mars"}, "region"),
        ({"gpu_models": ["warp-drive"], "gpu_count": 1}, "gpu_models"),
        ({"min_vram_mib": 1024}, "gpu_count"),
        ({"gpu_count": 99}, "gpu_count"),
    ):
        response = stack.post("/api/quote", json=body)
        assert response.status_code in (400, 422), response.text
        assert response.json()["field"] == field, response.json()

    for path, field in (
        ("/api/jobs/0x1234", "job_id"),
        ("/api/address/0xnope", "address"),
        ("/api/tx/0x12", "tx_hash"),
        ("/api/payouts?provider=bob", "provider"),
        ("/ipfs/not-a-cid", "cid"),
    ):
        response = stack.get(path)
        assert response.status_code == 400, (path, response.text)
        assert response.json()["field"] == field
    missing = stack.get("/api/jobs/0x" + "ab" * 32)
    assert missing.status_code == 404 and "not on escrow" in missing.json()["detail"]
    assert stack.get("/api/tx/0x" + "cd" * 32).status_code == 404
    page = stack.get("/jobs/0x12", headers={"accept": "text/html"})
    assert page.status_code == 400 and "job_id" in page.text and "<html" in page.text


@pytest.mark.parametrize("path", ["/api/payouts", "/api/jobs", "/api/fleet"])
def test_lists_answer_json(stack: FrontendStack, path: str) -> None:
    response = stack.get(path)
    assert response.status_code == 200 and response.headers["content-type"].startswith(
        "application/json"
    )


def test_job_stream_pushes_state_changes(stack: FrontendStack) -> None:
    prepared = fund(stack, unrunnable_spec(name="streamed"))
    job_id = prepared["job_id"]
    seen: list[str] = []
    with httpx.stream("GET", f"{stack.frontend_url}/api/jobs/{job_id}/stream", timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        event = ""
        cancelled = False
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "job":
                import json

                data = json.loads(line[6:])
                seen.append(str(data["view"].get("state")))
                assert data["html"] and 'id="job-summary"' in data["html"]
                if data["view"].get("state") == "queued" and not cancelled:
                    cancelled = True
                    ok = stack.post(
                        f"/api/jobs/{job_id}/cancel/prepare",
                        json={"from": stack.submitter.address},
                    )
                    relay(stack, sign(ok.json()["tx"], stack.submitter))
            elif line.startswith("data: ") and event == "end":
                break
    assert "queued" in seen and seen[-1] == "refunded", seen


@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
def test_the_explorer_keeps_working_while_the_scheduler_is_down(stack: FrontendStack) -> None:
    from fastapi.testclient import TestClient

    from devstack.anvil import free_port
    from frontend_api.app import create_app
    from frontend_api.settings import Settings
    from gridmarket.chain import ChainError

    settings = Settings(
        scheduler_url=f"http://127.0.0.1:{free_port()}",  # nothing listens there
        rpc_url=stack.devnet.url,
        deployment_file=stack.deployment_file,
        ipfs_api=stack.ipfs_api,
        request_timeout_s=2,
    )
    with TestClient(create_app(settings)) as client:
        assert client.get("/api/payouts").status_code == 200
        assert client.get("/api/jobs").status_code == 200
        fleet = client.get("/api/fleet").json()
        assert "unreachable" in fleet["error"] and fleet["nodes"] == []
        assert fleet["leaderboard"]  # the chain still knows the providers
        page = client.get("/providers", headers={"accept": "text/html"})
        assert page.status_code == 200 and "unreachable" in page.text
        quote = client.post("/api/quote", json={})
        assert quote.status_code == 502 and "unreachable" in quote.json()["detail"]

    broken = Settings(deployment_file=stack.tmp / "missing.json", rpc_url=stack.devnet.url)
    with (
        pytest.raises(ChainError, match=r"missing\.json not found: deploy the contracts first"),
        TestClient(create_app(broken)),
    ):
        pass


def test_provider_sign_up_registers_and_stakes(stack: FrontendStack) -> None:
    newcomer = Account.create()
    stack.escrow.w3.eth.send_transaction(
        {"from": stack.devnet.owner.address, "to": newcomer.address, "value": Wei(10**17)}
    )
    bad = stack.post("/api/providers/prepare", json={"from": newcomer.address, "stake_eth": "-1"})
    assert bad.status_code == 400 and bad.json()["field"] == "stake_eth"
    body = {"from": newcomer.address, "stake_eth": "0.02", "name": "newcomer", "region": "jp"}
    ok = stack.post("/api/providers/prepare", json=body)
    assert ok.status_code == 200, ok.text
    metadata = stack.get(f"/ipfs/{ok.json()['metadata_cid']}").json()
    assert metadata["name"] == "newcomer" and metadata["wallet"] == newcomer.address
    relayed = relay(stack, sign(ok.json()["tx"], newcomer))
    assert [e["name"] for e in relayed["events"]] == ["ProviderRegistered", "Staked"]
    account = stack.get(f"/api/address/{newcomer.address}").json()["account"]
    assert account["registered"] and account["eligible"] and account["stake_wei"] == str(2 * 10**16)


def test_funding_with_default_and_explicit_terms(stack: FrontendStack) -> None:
    # defaults: the listed mediator, minCollateral(bounty), paid after the challenge window
    default = fund(stack, unrunnable_spec(name="default-terms"))
    assert default["terms"] == {
        "mediator": stack.mediator.address,
        "collateral_wei": str(BOUNTY),
        "flags": 0,
        "payment": "after_window",
        "token": "0x" + "00" * 20,  # paid in ETH
        "operator": stack.devnet.operator.address,  # who assigns it: the one in office
    }
    assert default["challenge_window_s"] == CHALLENGE_WINDOW_S
    assert default["dispute_deposit_wei"] == str(DEPOSIT)  # the bounty, not the flat floor
    state = stack.chain_job(default["job_id"])
    assert state.job.mediator == stack.mediator.address and state.job.collateral == BOUNTY
    assert state.job.operator == stack.devnet.operator.address and state.job.flags == 0
    terms = stack.wait_chain(default["job_id"], "funded")["chain"]["terms"]
    assert terms["mediator"] == stack.mediator.address and terms["payment"] == "after_window"
    assert terms["collateral_wei"] == str(BOUNTY) and terms["window_ends"] is None

    # explicit: the submitter mediates itself, more collateral, paid on the scheduler's check
    me = stack.submitter.address
    explicit = fund(
        stack,
        unrunnable_spec(name="explicit-terms"),
        mediator=me.lower(),
        collateral_eth="0.05",
        payment="on_verify",
    )
    assert explicit["terms"]["mediator"] == me
    assert explicit["created"]["collateral"] == str(5 * 10**16)
    assert explicit["created"]["flags"] == FLAG_ON_VERIFY
    state = stack.chain_job(explicit["job_id"])
    assert state.job.on_verify and state.job.mediator == me
    view = stack.wait_chain(explicit["job_id"], "funded")
    assert view["chain"]["terms"]["payment"] == "on_verify"
    assert view["chain"]["terms"]["mediator_is_submitter"] is True
    page = stack.get(f"/jobs/{explicit['job_id']}", headers={"accept": "text/html"}).text
    assert 'data-payment="on_verify"' in page and "the submitter itself" in page
    assert "0.05 ETH" in page
    listed = {j["job_id"]: j for j in stack.get("/api/jobs").json()["jobs"]}
    assert listed[explicit["job_id"]]["payment"] == "on_verify"
    jobs_page = stack.get("/jobs", headers={"accept": "text/html"}).text
    assert 'data-payment="on_verify"' in jobs_page and 'data-payment="after_window"' in jobs_page
    assert listed[default["job_id"]]["mediator"] == stack.mediator.address

    # an on-verify job's operator may pay it at once (the flag is on-chain, not a label)
    stack.assign_by_hand(explicit["job_id"])
    stack.submit_by_hand(explicit["job_id"], bytes_cid(b"on-verify output"))
    state, _ = stack.client().call_job(
        stack.devnet.operator, "release", stack.chain_job(explicit["job_id"])
    )
    assert state.status is Status.RELEASED
    # ...and an after-window job's operator may not
    stack.assign_by_hand(default["job_id"])
    stack.submit_by_hand(default["job_id"], bytes_cid(b"after-window output"))
    with pytest.raises(Exception, match="JobEscrowNotAllowed"):
        stack.client().call_job(
            stack.devnet.operator, "release", stack.chain_job(default["job_id"])
        )
    stack.wait_chain(default["job_id"], "submitted")
    accepted = stack.post(
        f"/api/jobs/{default['job_id']}/accept/prepare", json={"from": stack.submitter.address}
    )
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["action"] == "release"
    relayed = relay(stack, sign(accepted.json()["tx"], stack.submitter))
    assert [e["name"] for e in relayed["events"]] == ["JobReleased"]


def test_dispute_through_the_api_and_the_ruling_and_slash_on_the_explorer(
    stack: FrontendStack,
) -> None:
    job_id = submitted_by_hand(stack, "disputed")
    state = stack.chain_job(job_id)
    view = stack.wait_chain(job_id, "submitted")
    terms = view["chain"]["terms"]
    assert view["chain_status"] == "submitted"
    assert terms["window_ends"] == state.job.since + CHALLENGE_WINDOW_S and terms["window_open"]
    assert view["actions"]["dispute"] and view["actions"]["release"]
    assert not view["actions"]["finalize"]
    assert (
        view["chain"]["events"][1]["args"]["since"] == view["chain"]["events"][1]["time"]
    )  # JobAssigned.since is the assignment's block time
    page = stack.get(f"/jobs/{job_id}", headers={"accept": "text/html"}).text
    assert 'id="dispute-job"' in page and 'id="job-window"' in page
    assert f"deposit {DEPOSIT / 10**18:g} ETH" in page  # the bounty
    assert "at least the escrow" in page and "the price of the mediator" in page

    # only the submitter may dispute, with exactly the deposit
    outsider = stack.devnet.submitters[1]
    refused = stack.post(f"/api/jobs/{job_id}/dispute/prepare", json={"from": outsider.address})
    assert refused.status_code == 400 and "JobEscrowNotSubmitter" in refused.json()["detail"]
    prepared = stack.post(
        f"/api/jobs/{job_id}/dispute/prepare", json={"from": stack.submitter.address}
    )
    assert prepared.status_code == 200, prepared.text
    body = prepared.json()
    assert body["deposit_wei"] == str(DEPOSIT)
    assert int(stack.escrow.call("depositOf", state.job.as_tuple())) == DEPOSIT
    assert body["mediator"] == stack.mediator.address
    assert int(body["tx"]["value"], 16) == DEPOSIT
    relayed = relay(stack, sign(body["tx"], stack.submitter))
    assert [e["name"] for e in relayed["events"]] == ["ResultDisputed"]
    assert relayed["events"][0]["args"]["deposit"] == str(DEPOSIT)

    view = stack.job(job_id)
    assert view["chain_status"] == "disputed" and not view["final"]
    assert not view["actions"]["dispute"] and not view["actions"]["finalize"]
    assert view["chain"]["terms"]["mediation_ends"] > view["chain"]["terms"]["disputed_at"]
    disputed = stack.get("/api/jobs", params={"status": "disputed"}).json()["jobs"]
    assert job_id in [j["job_id"] for j in disputed]
    page = stack.get(f"/jobs/{job_id}", headers={"accept": "text/html"}).text
    assert 'id="job-disputed"' in page and 'data-state="disputed"' in page

    # the mediator rules the result wrong: the provider loses the collateral
    provider = stack.manual_provider.address
    stake_before = int(stack.get(f"/api/address/{provider}").json()["account"]["stake_wei"])
    state, sent = stack.rule_by_hand(job_id, upheld=False)
    assert state.status is Status.FUNDED
    assert [e.name for e in sent.events] == ["Ruled", "Credited", "ProviderSlashed"]
    view = stack.wait_chain(job_id, "funded")
    assert view["chain_status"] == "funded" and view["chain"]["provider"] is None
    (ruling,) = view["chain"]["rulings"]
    assert ruling["upheld"] is False and ruling["mediator"] == stack.mediator.address
    assert ruling["slashed_wei"] == str(BOUNTY)
    assert ruling["to_mediator_wei"] == str(
        min(BOUNTY, 2 * DEPOSIT)
    )  # re-runs, from the collateral
    (credit,) = view["chain"]["credits"]
    assert credit["account"] == stack.submitter.address and credit["reason"] == "deposit returned"
    names = [e["name"] for e in view["chain"]["events"]]
    assert names[-4:] == ["ResultDisputed", "Ruled", "Credited", "ProviderSlashed"]
    slash = view["chain"]["events"][-1]["args"]
    assert slash["submitter"] == stack.submitter.address
    assert slash["toMediator"] == str(min(BOUNTY, 2 * DEPOSIT))

    page = stack.get(f"/jobs/{job_id}", headers={"accept": "text/html"}).text
    assert 'data-upheld="false"' in page and "not upheld" in page
    assert f'slashed <span class="slashed">{BOUNTY / 10**18:g} ETH' in page
    after = stack.get(f"/api/address/{provider}").json()
    assert int(after["account"]["stake_wei"]) == stake_before - BOUNTY
    assert int(after["totals"]["slashed_wei"]) >= BOUNTY and after["totals"]["slash_count"] >= 1
    names = [e["name"] for e in after["events"]]
    assert "ProviderSlashed" in names
    mediator = stack.get(f"/api/address/{stack.mediator.address}").json()["totals"]
    assert mediator["rulings"] >= 1 and mediator["rulings_against"] >= 1
    assert int(mediator["mediator_fees_wei"]) >= DEPOSIT
    submitter = stack.get(f"/api/address/{stack.submitter.address}").json()["totals"]
    assert int(submitter["slash_credits_wei"]) >= BOUNTY - min(BOUNTY, DEPOSIT)
    assert int(submitter["credited_wei"]) >= DEPOSIT  # the deposit came back
    tx_page = stack.get(f"/tx/{sent.tx_hash}", headers={"accept": "text/html"}).text
    assert "not upheld: the provider is slashed" in tx_page and "deposit returned" in tx_page
    address_page = stack.get(f"/address/{provider}", headers={"accept": "text/html"}).text
    assert "ProviderSlashed" in address_page and "lost to mediators" in address_page

    # the job is open again (same attempt count); its submitter takes the bounty back
    ok = stack.post(f"/api/jobs/{job_id}/cancel/prepare", json={"from": stack.submitter.address})
    assert ok.status_code == 200, ok.text
    relay(stack, sign(ok.json()["tx"], stack.submitter))


def test_a_result_the_mediator_upholds_on_its_own_check_is_paid(stack: FrontendStack) -> None:
    job_id = submitted_by_hand(stack, "upheld")
    state, sent = stack.rule_by_hand(job_id, upheld=True)
    assert state.status is Status.RELEASED
    assert [e.name for e in sent.events] == ["Ruled", "JobReleased"]  # no deposit to credit
    view = stack.wait_chain(job_id, "released")
    (ruling,) = view["chain"]["rulings"]
    assert ruling["upheld"] is True and ruling["slashed_wei"] is None
    assert view["final"] and not view["actions"]["dispute"]
    page = stack.get(f"/jobs/{job_id}", headers={"accept": "text/html"}).text
    assert 'data-upheld="true"' in page and "the result stands" in page
    (payout,) = stack.get("/api/payouts", params={"job": job_id}).json()["payouts"]
    assert payout["provider"] == stack.manual_provider.address


def test_the_funding_expects_the_operator_shown_and_says_so_when_it_changed(
    stack: FrontendStack,
) -> None:
    """The terms show the operator in office; the wallet's ``createJob`` names exactly the one
    the submitter approved (``expectedOperator``). Another one: refused before anything is
    signed, in words, on the ``operator`` field. The owner replacing the operator between the
    prepare and the mining: the relay refuses the signed transaction in words; sent anyway, it
    reverts, nothing is funded, and the transaction's view says why."""
    operator = stack.devnet.operator.address
    assert stack.get("/api/terms").json()["operator"] == operator
    spec = unrunnable_spec(name="operator-shown")
    body = {"from": stack.submitter.address, "spec": spec, "bounty_wei": str(BOUNTY), "ttl_s": 3600}
    checked = stack.post("/api/jobs/prepare", json={**body, "dry_run": True}).json()
    assert checked["terms"]["operator"] == operator
    other = Account.create().address  # not a provider: the registry refuses those
    wrong = stack.post("/api/jobs/prepare", json={**body, "operator": other, "dry_run": True})
    assert wrong.status_code == 400 and wrong.json()["field"] == "operator", wrong.text
    detail = wrong.json()["detail"]
    assert "JobEscrowOperatorChanged" in detail and "the escrow's operator changed" in detail
    assert f"you approved {other}" in detail and "Nothing was funded" in detail

    prepared = stack.post("/api/jobs/prepare", json={**body, "operator": operator})
    assert prepared.status_code == 200, prepared.text
    assert prepared.json()["terms"]["operator"] == operator
    raw = sign(prepared.json()["tx"], stack.submitter)
    w3 = stack.escrow.w3
    before = stack.escrow.balance_of(stack.submitter.address)
    owner = stack.devnet.owner
    stack.client().send(owner, "setOperator", other)
    try:
        refused = stack.post("/api/tx/relay", json={"raw_tx": raw, "wait_s": 30})
        assert refused.status_code == 400 and refused.json()["field"] == "raw_tx"
        assert f"now {other}" in refused.json()["detail"] or other in refused.json()["detail"]
        assert "the escrow's operator changed" in refused.json()["detail"]
        tx_hash = w3.eth.send_raw_transaction(bytes.fromhex(raw[2:]))
        assert w3.eth.wait_for_transaction_receipt(tx_hash, timeout=30)["status"] == 0
    finally:
        stack.client().send(owner, "setOperator", operator)
    view = stack.get(f"/api/tx/0x{bytes(tx_hash).hex()}").json()
    assert view["status"] == "reverted"
    assert "the escrow's operator changed" in view["error"]
    assert f"you approved {operator}" in view["error"]
    page = stack.get(f"/tx/0x{bytes(tx_hash).hex()}", headers={"accept": "text/html"}).text
    assert 'id="tx-error"' in page and "the escrow&#39;s operator changed" in page
    assert stack.escrow.balance_of(stack.submitter.address) == before
    assert stack.get(f"/api/jobs/{prepared.json()['job_id']}").status_code == 404
