"""Jobs paid in a listed ERC-20 (TestUSD, 6 decimals) through the front end's API and pages.

* a tUSD job is prepared (the dry run answers the EIP-2612 permit to sign and no transaction),
  funded by ``multicall([permitToken, createJobWith])`` signed locally and relayed, assigned and
  given a result by hand (the manual provider stakes tUSD), accepted through the API, and its
  payout shows in tUSD on ``/api/jobs``, ``/api/payouts`` (``by_token``), ``/api/address``
  (``tokens``), ``/api/fleet`` (a tUSD leaderboard) and the pages, while every ETH total is
  unchanged by it;
* a wallet that cannot sign typed data approves first (``funding.approve_tx``), then prepare
  builds ``createJobWith`` alone;
* a tUSD job's dispute deposits its bounty in tUSD (by permit), no ETH, with no floor; an ETH
  job's deposit is its bounty, at least the escrow's ``disputeDeposit``, as the API and
  ``depositOf`` agree;
* bad currency input (unknown currency, too many decimals, a bounty above the token balance, an
  ETH amount for a token job) is a 400 naming the field, and nothing is funded or pinned;
* a quote in tUSD either comes from the scheduler or says why there is none.
"""

from __future__ import annotations

from typing import Any

from eth_account.signers.local import LocalAccount

from frontend_api.submitter_client import sign_permit
from gridmarket.cid import bytes_cid
from gridmarket.token import TokenClient
from tests.frontend.conftest import FrontendStack, unrunnable_spec
from tests.frontend.test_api import fund, relay, sign

TUSD = 10**6
"""One tUSD in its smallest units (6 decimals)."""


def token_of(stack: FrontendStack) -> str:
    return stack.devnet.token


def prepare(stack: FrontendStack, body: dict[str, Any]) -> dict[str, Any]:
    response = stack.post("/api/jobs/prepare", json=body)
    assert response.status_code == 200, response.text
    out: dict[str, Any] = response.json()
    return out


def fund_tusd(
    stack: FrontendStack,
    name: str,
    bounty: str = "5",
    account: LocalAccount | None = None,
    collateral: str | None = None,
) -> dict[str, Any]:
    """A tUSD job through the API: dry run (the permit to sign), the permit signed locally,
    prepare with it (one multicall), relayed."""
    account = account or stack.submitter
    body = {
        "from": account.address,
        "spec": unrunnable_spec(name=name),
        "currency": "tUSD",
        "bounty": bounty,
        "ttl_s": 3600,
        **({"collateral": collateral} if collateral is not None else {}),
    }
    checked = prepare(stack, {**body, "dry_run": True})
    assert checked["tx"] is None  # nothing to sign before the permit
    funding = checked["funding"]
    amount = int(checked["bounty_wei"])
    assert funding["permit"] is not None, funding
    assert funding["permit"]["domain"]["verifyingContract"] == token_of(stack)
    permit = sign_permit(account, funding["permit"], stack.escrow.address, amount)
    prepared = prepare(stack, {**body, "permit": permit, "salt": checked["salt"]})
    assert prepared["funding"]["method"] == "multicall(permitToken, createJobWith)"
    assert prepared["tx"]["to"] == stack.escrow.address and prepared["tx"]["value"] == "0x0"
    relayed = relay(stack, sign(prepared["tx"], account))
    created = [e for e in relayed["events"] if e["name"] == "JobCreated"]
    assert len(created) == 1 and created[0]["args"]["token"] == token_of(stack)
    assert created[0]["args"]["bounty"] == str(amount)
    prepared["created"] = created[0]["args"]
    return prepared


def stake_tusd(stack: FrontendStack, amount: int) -> None:
    """The manual provider stakes ``amount`` tUSD (permit and stake in one transaction)."""
    stack.client().stake_token(stack.manual_provider, token_of(stack), amount)


def test_a_tusd_job_is_funded_by_permit_paid_and_shown_in_tusd(stack: FrontendStack) -> None:
    token = token_of(stack)
    tusd = TokenClient(stack.escrow.w3, token)
    provider = stack.manual_provider.address
    eth_before = stack.get("/api/payouts").json()
    provider_before = stack.get(f"/api/address/{provider}").json()["totals"]
    balance_before = tusd.balance_of(stack.submitter.address)

    prepared = fund_tusd(stack, "paid in tusd", bounty="5")
    job_id = prepared["job_id"]
    assert prepared["currency"]["symbol"] == "tUSD" and prepared["bounty_wei"] == str(5 * TUSD)
    assert "5 tUSD" in prepared["price"]["summary"]
    assert tusd.balance_of(stack.submitter.address) == balance_before - 5 * TUSD

    view = stack.wait_chain(job_id, "funded")
    chain = view["chain"]
    assert chain["token"] == token and chain["currency"]["symbol"] == "tUSD"
    assert chain["terms"]["currency"]["decimals"] == 6
    page = stack.get(f"/jobs/{job_id}").text
    assert 'id="job-currency"' in page and "5 tUSD" in page and "5 ETH" not in page

    collateral = int(chain["terms"]["collateral_wei"])
    stake_tusd(stack, max(collateral, TUSD))
    stack.assign_by_hand(job_id)
    stack.submit_by_hand(job_id, bytes_cid(b"tusd output"))
    stack.wait_chain(job_id, "submitted")
    accept = stack.post(
        f"/api/jobs/{job_id}/accept/prepare", json={"from": stack.submitter.address}
    )
    assert accept.status_code == 200, accept.text
    relayed = relay(stack, sign(accept.json()["tx"], stack.submitter))
    (released,) = [e for e in relayed["events"] if e["name"] == "JobReleased"]
    payout, fee = int(released["args"]["payout"]), int(released["args"]["fee"])
    assert payout + fee == 5 * TUSD and payout > 0
    stack.wait_chain(job_id, "released")

    # payouts: the tUSD payout in its own sum; ETH's sums and totals unchanged
    body = stack.get("/api/payouts").json()
    assert body["amount_wei"] == eth_before["amount_wei"]
    assert body["fee_wei"] == eth_before["fee_wei"]
    sums = body["by_token"][token]
    assert sums["currency"]["symbol"] == "tUSD"
    assert int(sums["amount_wei"]) >= payout and sums["amount_text"].endswith(" tUSD")
    assert sums["totals"] and int(sums["totals"][-1]["cumulative_amount_wei"]) == int(
        sums["amount_wei"]
    )
    (row,) = [p for p in body["payouts"] if p["job_id"] == job_id]
    assert row["token"] == token and row["amount_wei"] == str(payout)
    assert row["currency"]["symbol"] == "tUSD"
    only = stack.get("/api/payouts", params={"currency": "tUSD"}).json()
    assert only["count"] == sums["count"] and only["amount_wei"] == "0"
    assert stack.get("/api/payouts", params={"currency": "DOGE"}).status_code == 400

    # the provider: tUSD earnings apart from its ETH ones
    address = stack.get(f"/api/address/{provider}").json()
    totals = address["totals"]
    assert totals["earned_wei"] == provider_before["earned_wei"]
    assert (
        int(totals["tokens"][token]["earned"])
        == int(provider_before.get("tokens", {}).get(token, {}).get("earned", 0)) + payout
    )
    live = address["account"]["tokens"][token]
    assert int(live["balance_wei"]) >= payout and live["currency"]["symbol"] == "tUSD"
    assert int(live["stake_wei"]) >= collateral

    fleet = stack.get("/api/fleet").json()
    board = fleet["token_leaderboards"][token]
    assert board["currency"]["symbol"] == "tUSD"
    assert any(r["wallet"] == provider and int(r["earned_wei"]) >= payout for r in board["rows"])

    for path, needle in (
        ("/payouts", 'id="payout-sum-tUSD"'),
        ("/payouts?currency=tUSD", 'id="payout-sum-tUSD"'),
        ("/", 'id="total-paid-tUSD"'),
        ("/providers", "Leaderboard in tUSD"),
        (f"/address/{provider}", 'id="token-totals"'),
        (f"/address/{provider}", "Earnings over time in tUSD"),
        (f"/jobs?submitter={stack.submitter.address}", "5 tUSD"),
    ):
        response = stack.get(path)
        assert response.status_code == 200 and needle in response.text, path
    only_tusd = stack.get("/payouts?currency=tUSD").text
    assert 'id="payout-sum-ETH"' not in only_tusd
    assert stack.get("/payouts?currency=DOGE").status_code == 400
    tx = stack.get(f"/api/tx/{relayed['tx_hash']}").json()
    (event,) = [e for e in tx["events"] if e["name"] == "JobReleased"]
    assert event["token"] == token


def test_approve_then_create_for_a_wallet_without_typed_data(stack: FrontendStack) -> None:
    account = stack.devnet.submitters[1]
    body = {
        "from": account.address,
        "spec": unrunnable_spec(name="approved tusd"),
        "currency": token_of(stack),  # by address works as well as by symbol
        "bounty": "2.5",
        "ttl_s": 3600,
    }
    first = prepare(stack, body)
    assert first["tx"] is None and first["funding"]["approve_tx"]["to"] == token_of(stack)
    approved = stack.escrow.w3.eth.send_raw_transaction(
        bytes.fromhex(sign(first["funding"]["approve_tx"], account)[2:])
    )
    stack.escrow.w3.eth.wait_for_transaction_receipt(approved)
    second = prepare(stack, {**body, "salt": first["salt"]})
    assert second["funding"]["method"] == "createJobWith"
    relayed = relay(stack, sign(second["tx"], account))
    (created,) = [e for e in relayed["events"] if e["name"] == "JobCreated"]
    assert created["args"]["bounty"] == str(2_500_000)
    assert created["args"]["token"] == token_of(stack)


def test_a_tusd_dispute_deposits_the_bounty_in_tusd(stack: FrontendStack) -> None:
    token = token_of(stack)
    tusd = TokenClient(stack.escrow.w3, token)
    # collateral over the bounty: the deposit is the bounty (JobEscrow.depositOf), not it
    prepared = fund_tusd(stack, "disputed tusd", bounty="3", collateral="4.5")
    job_id = prepared["job_id"]
    assert prepared["dispute_deposit_wei"] == str(3 * TUSD)  # the bounty, not the collateral
    chain = stack.wait_chain(job_id, "funded")["chain"]
    collateral = int(chain["terms"]["collateral_wei"])
    assert collateral == 4_500_000
    deposit = 3_000_000
    state = stack.escrow.job_state(bytes.fromhex(job_id[2:]))
    assert int(stack.escrow.call("depositOf", state.job.as_tuple())) == deposit
    assert deposit < int(stack.escrow.call("disputeDeposit"))  # no ETH floor for a token
    assert chain["terms"]["dispute_deposit_wei"] == str(deposit)
    stake_tusd(stack, max(collateral, TUSD))
    stack.assign_by_hand(job_id)
    stack.submit_by_hand(job_id, bytes_cid(b"disputed tusd output"))
    stack.wait_chain(job_id, "submitted")
    page = stack.get(f"/jobs/{job_id}").text
    assert f"deposit {deposit / TUSD:g} tUSD" in page

    submitter = stack.submitter
    path = f"/api/jobs/{job_id}/dispute/prepare"
    first = stack.post(path, json={"from": submitter.address})
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["deposit_wei"] == str(deposit) and body["deposit_text"].endswith(" tUSD")
    assert body["tx"] is None and body["funding"]["permit"] is not None
    permit = sign_permit(submitter, body["funding"]["permit"], stack.escrow.address, deposit)
    second = stack.post(path, json={"from": submitter.address, "permit": permit})
    assert second.status_code == 200, second.text
    tx = second.json()["tx"]
    assert tx["value"] == "0x0"  # the deposit is pulled in tUSD, no ETH sent
    eth_before = stack.escrow.w3.eth.get_balance(submitter.address)
    tusd_before = tusd.balance_of(submitter.address)
    relayed = relay(stack, sign(tx, submitter))
    (disputed,) = [e for e in relayed["events"] if e["name"] == "ResultDisputed"]
    assert disputed["args"]["deposit"] == str(deposit)
    assert tusd.balance_of(submitter.address) == tusd_before - deposit
    receipt = stack.escrow.w3.eth.get_transaction_receipt(relayed["tx_hash"])
    gas = int(receipt["gasUsed"]) * int(receipt["effectiveGasPrice"])
    assert stack.escrow.w3.eth.get_balance(submitter.address) == eth_before - gas
    stack.wait_chain(job_id, "disputed")


def test_an_eth_jobs_deposit_is_its_bounty_at_least_the_floor_as_depositof_says(
    stack: FrontendStack,
) -> None:
    """The front end's mirror of `depositOf` for ETH jobs: a bounty above the escrow's
    `disputeDeposit` deposits the bounty; one at the floor (the least bounty of this
    deployment) the floor. The quote at funding, the job's terms and the chain agree."""
    floor = int(stack.escrow.call("disputeDeposit"))
    for bounty in (7 * floor, floor):
        prepared = fund(
            stack, unrunnable_spec(name=f"eth deposit {bounty}"), bounty_wei=str(bounty)
        )
        assert prepared["dispute_deposit_wei"] == str(max(bounty, floor))
        state = stack.escrow.job_state(bytes.fromhex(prepared["job_id"][2:]))
        assert state.job.bounty == bounty
        deposit = int(stack.escrow.call("depositOf", state.job.as_tuple()))
        assert deposit == max(bounty, floor)
        terms = stack.wait_chain(prepared["job_id"], "funded")["chain"]["terms"]
        assert terms["dispute_deposit_wei"] == str(deposit)


def test_bad_currency_input_is_refused_and_nothing_is_funded(stack: FrontendStack) -> None:
    account = stack.devnet.submitters[1]
    tusd = TokenClient(stack.escrow.w3, token_of(stack))
    balance = tusd.balance_of(account.address)
    jobs_before = stack.get("/api/jobs", params={"submitter": account.address}).json()["count"]
    base = {
        "from": account.address,
        "spec": unrunnable_spec(name="refused tusd"),
        "ttl_s": 3600,
    }
    too_much = f"{balance // TUSD + 1}"
    for extra, field, words in (
        ({"currency": "DOGE", "bounty": "1"}, "currency", "not a currency of this escrow"),
        ({"currency": "tUSD", "bounty": "1.1234567"}, "bounty", "more than 6 decimals"),
        ({"currency": "tUSD", "bounty": "abc"}, "bounty", "not an amount"),
        ({"currency": "tUSD", "bounty_eth": "1"}, "bounty_eth", "paid in tUSD"),
        ({"currency": "tUSD", "bounty": too_much}, "bounty", "less than the bounty"),
        ({"currency": "tUSD", "bounty": "0.001"}, "bounty", "the escrow's minimum"),
        (
            {"currency": "tUSD", "bounty": "5", "collateral": "0.0000001"},
            "collateral",
            "6 decimals",
        ),
        (
            {"bounty_eth": "0.01", "permit": {"value": 1, "deadline": 1, "signature": "0x"}},
            "permit",
            "ETH",
        ),
    ):
        for dry_run in (True, False):
            response = stack.post("/api/jobs/prepare", json={**base, **extra, "dry_run": dry_run})
            assert response.status_code == 400, (extra, response.text)
            assert response.json()["field"] == field, (extra, response.json())
            assert words in response.json()["detail"], (extra, response.json())
    bad_permit = {
        **base,
        "currency": "tUSD",
        "bounty": "1",
        "permit": {"value": str(TUSD), "deadline": 2**40, "signature": "0x" + "11" * 65},
    }
    response = stack.post("/api/jobs/prepare", json=bad_permit)
    assert response.status_code == 400 and response.json()["field"] == "permit", response.text
    stack.mine()
    assert tusd.balance_of(account.address) == balance
    after = stack.get("/api/jobs", params={"submitter": account.address}).json()["count"]
    assert after == jobs_before


def test_a_quote_in_tusd_is_given_or_says_why_not(stack: FrontendStack) -> None:
    body = {"executor": "wasm", "cpu_cores": 1, "ram_mib": 128, "duration_s": 600}
    eth = stack.post("/api/quote", json=body)
    assert eth.status_code == 200 and eth.json()["currency"]["symbol"] == "ETH"
    response = stack.post("/api/quote", json={**body, "token": "tUSD"})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["currency"]["symbol"] == "tUSD"
    if answer["quote_unavailable"]:
        assert answer["quotes"] == [] and "tUSD" in answer["quote_unavailable"]
    else:
        assert answer["quotes"]
    bad = stack.post("/api/quote", json={**body, "token": "DOGE"})
    assert bad.status_code == 400 and bad.json()["field"] == "token"
