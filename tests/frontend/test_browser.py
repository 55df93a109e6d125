"""The pages in a real browser: Debian's Chromium driven by Playwright (npm playwright-core) from
tests/frontend/browser/run.cjs, with an injected EIP-1193 wallet forwarding to anvil (anvil signs
for its dev account). Against the session's real stack and agent, the script:

* is refused a bad bounty on the submit page (the field is marked, nothing is sent);
* uploads a WASM module and a dataset, funds the job from the wallet (createJob), follows the
  job page (server-sent events) until Released, opens the verified output;
* finds the payout on the explorer (job, provider, tx pages);
* funds a job nobody can run, cancels it with the page's button, withdraws the refund.

Here the test checks the chain itself agrees, and keeps every page's screenshot (pytest's tmp
dir and ``.run/screenshots/``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from gridmarket.escrow import Status
from tests.frontend.conftest import FrontendStack

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "browser" / "run.cjs"
SCREENSHOTS = ROOT / ".run" / "screenshots"


def test_fund_follow_and_find_the_payout_in_chromium(stack: FrontendStack, tmp_path: Path) -> None:
    assert Path("/usr/bin/chromium").exists(), "run scripts/setup_services.sh (apt chromium)"
    shots = tmp_path / "screenshots"
    shots.mkdir()
    dataset = tmp_path / "data.txt"
    dataset.write_text("hello from the browser\n")
    account = stack.browser_account.address
    env = {
        **os.environ,
        "GM_URL": stack.frontend_url,
        "GM_RPC_URL": stack.devnet.url,
        "GM_ACCOUNT": account,
        "GM_CHAIN_ID": "31337",
        "GM_PROVIDER": stack.provider.address,
        "GM_MODULE": str(stack.wasm_module),
        "GM_DATASET": str(dataset),
        "GM_SHOTS": str(shots),
        "NODE_PATH": str(ROOT / "node_modules"),
    }
    done = subprocess.run(
        ["node", str(SCRIPT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=420,
        check=False,
    )
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for png in shots.glob("*.png"):
        shutil.copy(png, SCREENSHOTS / png.name)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, f"{done.stdout}\n{done.stderr}"
    result = json.loads(lines[-1])
    assert not result["errors"], result["errors"]

    assert "bounty_eth" not in result["bounty_error"] and "ETH" in result["bounty_error"]
    assert "1 online node" in result["quote_providers"]

    job_id = result["job_id"]
    state = stack.escrow.job_state(bytes.fromhex(job_id[2:]))
    assert state.status is Status.RELEASED
    assert state.job.submitter == account  # the wallet funded it
    assert state.job.bounty == 4 * 10**15
    assert state.job.provider == stack.provider.address
    assert result["output_text"] == "HELLO FROM THE BROWSER\n"
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
