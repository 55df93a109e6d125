"""The ``spot:p`` choice and a spot job's page in a real browser (Debian's Chromium, npm
playwright-core, tests/frontend/browser/spot.cjs, the injected wallet of run.cjs): the submit
page offers spot:0.1 and spot:0.25 beside the other policies, shows what spot:0.1 costs (twice
the bounty, the check deposit returned unless a check upholds the result, the collateral above
B (1 - p) / p, expected compute 1 + p), disables on-verify payment, refuses a Docker job not
declared deterministic naming ``spec.deterministic``, and funds the job from the wallet with
twice the bounty; the job's page shows p and the commitment the server sealed for it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gridmarket import spot
from gridmarket.escrow import FLAG_SPOT
from tests.frontend.conftest import FrontendStack
from tests.frontend.test_browser import ROOT, _browser_env, _result
from tests.frontend.test_spot import pinned, spec_of

SCRIPT = Path(__file__).resolve().parent / "browser" / "spot.cjs"


def test_spot_choice_price_and_page_in_chromium(stack: FrontendStack, tmp_path: Path) -> None:
    shots = tmp_path / "screenshots"
    env = _browser_env(stack, shots, GM_IMAGE=pinned(stack))
    done = subprocess.run(
        ["node", str(SCRIPT)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=240,
        check=False,
    )  # fmt: skip
    result = _result(done.returncode, done.stdout, done.stderr, shots)

    assert "spot:0.1" in result["options"] and "spot:0.25" in result["options"]
    assert "replicate:2" in result["options"] and "integrity" in result["options"]
    assert "sealed to the mediator" in result["spot_hint"]
    assert "draws the hidden seed, seals it to the mediator and forgets it" in result["draw_note"]
    assert result["on_verify_disabled"] is True
    assert result["price_state"] == "spot:0.1"
    assert result["price"].startswith(
        "You send 0.004 ETH: the bounty 0.002 ETH and a check deposit of 0.002 ETH, returned to "
        "you unless a check upholds the result (it then pays the mediator's re-run)."
    ), result["price"]
    assert "expected compute 1 + 0.1 runs" in result["price"]
    assert "bounty x (1 - p) / p = 0.002 ETH x 9" in result["price"]
    assert (
        result["collateral_placeholder"] == "0.018000000000000001 (the minimum)"
    )  # exact: 9 B + 1 wei
    assert "honest runs agree" in result["deterministic_error"]

    job_id = result["job_id"]
    state = stack.chain_job(job_id)
    assert state.job.flags == FLAG_SPOT and state.job.bounty == 2 * 10**15
    assert state.job.collateral == spot.min_collateral(2 * 10**15, 1000)
    created = next(t for t in stack.job(job_id)["transactions"] if "JobCreated" in t["events"])
    assert stack.escrow.w3.eth.get_transaction(created["tx_hash"])["value"] == 4 * 10**15
    check = spec_of(stack, state.spec_cid).spot
    assert check is not None and result["spot_commit"] == check.commit
    assert result["spot_p"] == "0.1"
    spot.unseal(
        check.sealed_bytes, bytes(stack.mediator.key), state.job.submitter, check.commit_bytes
    )
    assert "revealed once the job is settled" in result["pending"]
    assert "spot-checked" in result["payment"]
