"""The pages in a real browser: Debian's Chromium driven by Playwright (npm playwright-core) from
tests/frontend/browser/run.cjs, with an injected EIP-1193 wallet forwarding to anvil (anvil signs
for its dev account). Against the session's real stack and agent, the script:

* is refused a bad bounty on the submit page (the field is marked, nothing is sent);
* uploads a WASM module and a dataset, funds the job from the wallet (createJob) to be paid on
  the scheduler's check, follows the job page (server-sent events) until Released, opens the
  integrity-checked output;
* finds the payout on the explorer (job, provider, tx pages);
* funds a job nobody can run, cancels it with the page's button, withdraws the refund.

The dispute scenario: the submit page shows the terms (the listed mediator, both payment modes
with their trust, the collateral with the quote) and refuses a collateral under the minimum;
the job funded with explicit terms is assigned and given a result by hand (signed acceptance,
the operator's ``assign``) while the page watches; the Dispute button shows to the submitter's
wallet only, disputes, and the mediator's ruling (by hand) and the slash appear live.

Here the test checks the chain itself agrees, and keeps every page's screenshot (pytest's tmp
dir and ``.run/screenshots/``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from gridmarket.cid import bytes_cid
from gridmarket.escrow import Status
from tests.frontend.conftest import CHALLENGE_WINDOW_S, FrontendStack

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "browser" / "run.cjs"
SCREENSHOTS = ROOT / ".run" / "screenshots"


def _browser_env(stack: FrontendStack, shots: Path, **extra: str) -> dict[str, str]:
    assert Path("/usr/bin/chromium").exists(), "run scripts/setup_services.sh (apt chromium)"
    shots.mkdir(exist_ok=True)
    return {
        **os.environ,
        "GM_URL": stack.frontend_url,
        "GM_RPC_URL": stack.devnet.url,
        "GM_ACCOUNT": stack.browser_account.address,
        "GM_CHAIN_ID": "31337",
        "GM_SHOTS": str(shots),
        "NODE_PATH": str(ROOT / "node_modules"),
        **extra,
    }


def _result(returncode: int, stdout: str, stderr: str, shots: Path) -> dict[str, Any]:
    """The script's JSON line, its screenshots kept in ``.run/screenshots/``."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for png in shots.glob("*.png"):
        shutil.copy(png, SCREENSHOTS / png.name)
    lines = stdout.strip().splitlines()
    assert returncode == 0 and lines, f"{stdout}\n{stderr}"
    result: dict[str, Any] = json.loads(lines[-1])
    assert not result["errors"], result["errors"]
    return result


def test_fund_follow_and_find_the_payout_in_chromium(stack: FrontendStack, tmp_path: Path) -> None:
    shots = tmp_path / "screenshots"
    dataset = tmp_path / "data.txt"
    dataset.write_text("hello from the browser\n")
    account = stack.browser_account.address
    env = _browser_env(
        stack,
        shots,
        GM_PROVIDER=stack.provider.address,
        GM_MODULE=str(stack.wasm_module),
        GM_DATASET=str(dataset),
    )
    done = subprocess.run(
        ["node", str(SCRIPT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=420,
        check=False,
    )
    result = _result(done.returncode, done.stdout, done.stderr, shots)

    assert "bounty_eth" not in result["bounty_error"] and "ETH" in result["bounty_error"]
    assert "1 online node" in result["quote_providers"]

    job_id = result["job_id"]
    state = stack.escrow.job_state(bytes.fromhex(job_id[2:]))
    assert state.status is Status.RELEASED
    assert state.job.submitter == account  # the wallet funded it
    assert state.job.on_verify  # as chosen on the page
    assert state.job.bounty == 4 * 10**15
    assert state.job.provider == stack.provider.address
    assert result["output_text"] == "HELLO FROM THE BROWSER\n"
    (line,) = result["log_lines"]  # the job page's live log: the module's "ok" on stdout
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}  attempt 1  n-\S+  stdout  ok", line), line
    payout = state.job.bounty - state.job.bounty * state.job.fee_bps // 10_000
    assert result["released_payout"].startswith(f"{payout / 10**18:g} ETH")
    row = result["payout_row"]
    assert (
        f"{payout / 10**18:g} ETH" in row and f"{(state.job.bounty - payout) / 10**18:g} ETH" in row
    )
    assert result["settle_function"].strip() == "settle"

    cancelled = stack.escrow.job_state(bytes.fromhex(result["cancel_job_id"][2:]))
    assert cancelled.status is Status.REFUNDED and cancelled.job.submitter == account
    assert (
        result["balance_before"].strip() != "0 ETH" and result["balance_after"].strip() == "0 ETH"
    )
    assert stack.escrow.balance_of(account) == 0

    names = {Path(p).stem for p in result["screenshots"]}
    assert {"submit", "job-released", "payouts", "tx", "provider", "providers", "home"} <= names


def _created_by(stack: FrontendStack, account: str, from_block: int, timeout: float) -> str:
    """The id of the first job ``account`` funds from ``from_block`` on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        head = stack.escrow.w3.eth.block_number
        for event in stack.escrow.events(from_block, head) if head >= from_block else []:
            if event.name == "JobCreated" and event.args["submitter"] == account:
                return "0x" + bytes(event.args["jobId"]).hex()
        time.sleep(0.3)
    raise AssertionError(f"{account} funded no job within {timeout} s")


def _wait_status(stack: FrontendStack, job_id: str, status: Status, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stack.chain_job(job_id).status is status:
            return
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} not {status.name} within {timeout} s")


def _wait_file(path: Path, script: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and script.poll() is None:
        if path.exists():
            return
        time.sleep(0.2)
    raise AssertionError(f"the browser script did not signal (exit {script.poll()})")


def test_terms_dispute_and_ruling_in_chromium(stack: FrontendStack, tmp_path: Path) -> None:
    shots = tmp_path / "screenshots"
    account = stack.browser_account.address
    env = _browser_env(
        stack,
        shots,
        GM_SCENARIO="dispute",
        GM_OTHER_ACCOUNT=stack.devnet.submitters[0].address,
        GM_MEDIATOR=stack.mediator.address,
        GM_SIGNAL=str(tmp_path / "signal"),
    )
    start = stack.escrow.w3.eth.block_number + 1  # blocks mined from now on
    provider = stack.manual_provider.address
    stake_before = int(stack.get(f"/api/address/{provider}").json()["account"]["stake_wei"])
    script = subprocess.Popen(
        ["node", str(SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    try:
        # meanwhile, as the provider and the operator: accept, assign, deliver a result
        job_id = _created_by(stack, account, start, timeout=120)
        stack.assign_by_hand(job_id)
        stack.submit_by_hand(job_id, bytes_cid(b"a result the browser disputes"))
        # ...and as the mediator, once the page showed the dispute: the result is wrong
        _wait_status(stack, job_id, Status.DISPUTED, timeout=CHALLENGE_WINDOW_S)
        _wait_file(tmp_path / "signal", script, timeout=60)
        stack.rule_by_hand(job_id, upheld=False)
        stdout, stderr = script.communicate(timeout=180)
    except AssertionError as exc:
        if script.poll() is None:
            script.kill()
        out, err = script.communicate()
        raise AssertionError(f"{exc}\n{out}\n{err}") from None
    finally:
        if script.poll() is None:
            script.kill()
            script.communicate()
    result = _result(script.returncode, stdout, stderr, shots)

    assert result["job_id"] == job_id
    assert result["mediator_default"] == stack.mediator.address
    assert f"{CHALLENGE_WINDOW_S} s after it was submitted" in result["after_window_hint"]
    assert "trust the scheduler" in result["on_verify_hint"]
    assert "at least 0.004 ETH of collateral" in result["quote_collateral"]
    assert "at least 4000000000000000 wei" in result["collateral_error"]
    assert stack.mediator.address in result["mediator_shown"]
    assert result["collateral_shown"].startswith("0.006 ETH")
    assert result["payment_shown"] == "after_window"
    assert "may dispute this result until" in result["window_text"]
    assert "deposit 0.004 ETH" in result["dispute_button"]  # the bounty, above the 0.001 floor
    assert f"mediator {stack.mediator.address[:6]}" in result["dispute_button"]
    assert stack.mediator.address[:6] in result["dispute_hint"]
    assert result["other_sees_dispute"] is False  # another wallet gets no Dispute button
    assert result["other_sees_finalize"] == 0  # nobody may finalize while the window is open
    assert "the mediator" in result["disputed_text"]
    assert "not upheld" in result["ruling_text"] and "0.006 ETH" in result["ruling_text"]
    assert result["chain_status_after"] == "funded"
    assert result["ruling_tx_function"].strip() == "rule"
    assert "not upheld: the provider is slashed" in result["ruling_tx_text"]
    assert int(result["mediator_rulings"]) >= 1

    state = stack.chain_job(job_id)
    assert state.status is Status.FUNDED and state.job.submitter == account
    assert state.job.collateral == 6 * 10**15 and state.job.flags == 0
    after = int(stack.get(f"/api/address/{provider}").json()["account"]["stake_wei"])
    assert after == stake_before - 6 * 10**15
    names = {Path(p).stem for p in result["screenshots"]}
    assert {"submit-terms-refused", "job-submitted", "job-disputed", "job-ruled"} <= names
