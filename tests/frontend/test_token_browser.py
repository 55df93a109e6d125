"""The submit page funds a job in tUSD in Chromium (tests/frontend/browser/run.cjs, scenario
``token``): the currency picker shows the token, the quote is in tUSD or says why there is none,
too many decimals are refused on the bounty field, the injected wallet (anvil) signs the
EIP-2612 permit with ``eth_signTypedData_v4`` and sends one transaction,
``multicall([permitToken, createJobWith])``; the job page shows the amounts in tUSD. The test
checks the chain: the job is paid in tUSD, the submitter's tUSD went to the escrow, no approval
was left behind, and no ETH moved with it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from gridmarket.cid import bytes_cid
from gridmarket.escrow import Status
from gridmarket.token import TokenClient
from tests.frontend.conftest import FrontendStack
from tests.frontend.test_browser import ROOT, SCRIPT, _browser_env, _result
from tests.frontend.test_token_api import fund_tusd

TUSD = 10**6


def test_the_submit_page_funds_a_tusd_job_by_permit(stack: FrontendStack, tmp_path: Path) -> None:
    account = stack.browser_account.address
    token = stack.devnet.token
    tusd = TokenClient(stack.escrow.w3, token)
    before = tusd.balance_of(account)
    shots = tmp_path / "screenshots"
    done = subprocess.run(
        ["node", str(SCRIPT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_browser_env(stack, shots, GM_SCENARIO="token"),
        timeout=300,
        check=False,
    )
    result = _result(done.returncode, done.stdout, done.stderr, shots)

    assert "tUSD" in result["bounty_label"]
    assert "more than 6 decimals" in result["bounty_error"]
    if result["quote_unavailable"] is not None:  # the scheduler does not quote in tUSD (yet)
        assert "No quote in tUSD" in result["quote_unavailable"]
    else:
        assert result["quote_total"].strip().endswith(" tUSD")
    assert "You pay 4 tUSD for one run" in result["price_line"]
    assert "4.5 tUSD" in result["price_line"]
    assert result["permits_sent"] == 1  # the permit path, not the approval fallback

    job_id = result["job_id"]
    state = stack.escrow.job_state(bytes.fromhex(job_id[2:]))
    assert state.status is Status.FUNDED and state.job.submitter == account
    assert state.job.token == token and state.job.bounty == 4 * TUSD
    assert state.job.collateral == 4_500_000
    assert tusd.balance_of(account) == before - 4 * TUSD
    assert tusd.allowance(account, stack.escrow.address) == 0  # the permit's amount, all used
    assert result["job_bounty"].strip().startswith("4 tUSD")
    assert result["job_collateral"].strip().startswith("4.5 tUSD")
    assert result["job_currency"].strip().startswith("tUSD")

    view = stack.job(job_id)
    funding_tx = view["chain"]["events"][0]["tx_hash"]
    tx = stack.get(f"/api/tx/{funding_tx}").json()
    assert tx["function"] == "multicall" and tx["value_wei"] == "0"
    assert [e["name"] for e in tx["events"]] == ["JobCreated"]


def test_the_job_page_disputes_a_tusd_job_with_the_collateral_in_tusd(
    stack: FrontendStack, tmp_path: Path
) -> None:
    browser = stack.devnet.submitters[1]  # the page's wallet: the job's submitter
    token = stack.devnet.token
    tusd = TokenClient(stack.escrow.w3, token)
    job_id = fund_tusd(stack, "browser tusd dispute", bounty="2", account=browser)["job_id"]
    collateral = int(stack.wait_chain(job_id, "funded")["chain"]["terms"]["collateral_wei"])
    stack.client().stake_token(stack.manual_provider, token, collateral)
    stack.assign_by_hand(job_id)
    stack.submit_by_hand(job_id, bytes_cid(b"browser tusd disputed output"))
    stack.wait_chain(job_id, "submitted")
    before = tusd.balance_of(browser.address)
    shots = tmp_path / "screenshots"
    done = subprocess.run(
        ["node", str(SCRIPT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_browser_env(stack, shots, GM_SCENARIO="token-dispute", GM_JOB=job_id),
        timeout=300,
        check=False,
    )
    result = _result(done.returncode, done.stdout, done.stderr, shots)
    assert f"deposit {collateral / TUSD:g} tUSD" in result["dispute_button"]
    assert "tUSD" in result["dispute_hint"] and "ETH" not in result["dispute_hint"]
    assert "eth_signTypedData_v4" in result["wallet_methods"]  # the permit, not an approval
    state = stack.escrow.job_state(bytes.fromhex(job_id[2:]))
    assert state.status is Status.DISPUTED
    assert tusd.balance_of(browser.address) == before - collateral
    events = stack.job(job_id)["chain"]["events"]
    (disputed,) = [e for e in events if e["name"] == "ResultDisputed"]
    assert disputed["args"]["deposit"] == str(collateral)
    tx = stack.get(f"/api/tx/{disputed['tx_hash']}").json()
    assert tx["function"] == "multicall" and tx["value_wei"] == "0"
