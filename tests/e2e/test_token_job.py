"""A job paid in the devnet's stablecoin on the real grid (escrow version 4, docs/contracts.md).

The submitter funds a WASM job in TestUSD (tUSD, 6 decimals) with an EIP-2612 permit and the
funding in one transaction; the scheduler offers it only to nodes with a tUSD price floor, the
provider's collateral is locked from its tUSD stake, the result is paid in tUSD after the
challenge window, and the provider withdraws its tUSD with `gridmarket-agent withdraw --token`.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from devstack.grid import LocalGrid
from gridmarket.token import TokenClient, tokens_of

from .support import (
    FEE_BPS,
    Inputs,
    add_inputs,
    assert_paid_once,
    fund,
    job_events,
    names,
    wait_job,
    wasm_spec,
)

TOKEN_BOUNTY = 3 * 10**6  # 3 tUSD


@pytest.fixture(scope="class")
def inputs(grid: LocalGrid) -> Inputs:
    return add_inputs(grid)


class TestTokenBounty:
    def test_a_job_funded_in_tusd_with_a_permit_is_paid_and_withdrawn_in_tusd(
        self, grid: LocalGrid, inputs: Inputs
    ) -> None:
        tusd = tokens_of(grid.deployment.tokens)["tUSD"]
        wallet = TokenClient(grid.w3, tusd.address)
        submitter = grid.submitters[1]
        held = wallet.balance_of(submitter.address)
        escrow_held = wallet.balance_of(grid.escrow.address)
        fees_before = int(grid.escrow.call("tokenFeesAccrued", tusd.address))

        spec = wasm_spec("stats-in-tusd", inputs.module_cid, inputs.dataset_cid)
        job = fund(grid, spec, submitter=submitter, bounty=TOKEN_BOUNTY, token=tusd.address)
        # one transaction moved exactly the bounty: no approval was sent before it
        assert wallet.balance_of(submitter.address) == held - TOKEN_BOUNTY
        assert wallet.balance_of(grid.escrow.address) == escrow_held + TOKEN_BOUNTY
        assert wallet.allowance(submitter.address, grid.escrow.address) == 0
        state = grid.escrow.job_state(job.id_bytes)
        assert state.job.token == tusd.address

        view = wait_job(grid, job.job_id, {"released"}, timeout=180)
        assert view["token"] == tusd.address
        ev = assert_paid_once(grid, job)  # payout + fee == 3 tUSD, in tUSD units
        provider = str(ev.args["provider"])
        payout = TOKEN_BOUNTY - TOKEN_BOUNTY * FEE_BPS // 10_000
        assert "ProviderSlashed" not in names(job_events(grid, job))
        assert int(grid.escrow.call("tokenFeesAccrued", tusd.address)) == fees_before + (
            TOKEN_BOUNTY - payout
        )
        # the collateral came from (and went back to) the provider's tUSD stake
        stake = grid.escrow.call("stakeOf", provider, tusd.address)
        assert stake[1] == 0, f"tUSD still locked: {stake}"
        owed = grid.escrow.balance_of(provider, tusd.address)
        assert owed >= payout

        agent = next(a for a in grid.agents if a.account.address == provider)
        before = wallet.balance_of(provider)
        cli = [sys.executable, "-m", "agent.cli", "--config", str(agent.config_path)]
        done = subprocess.run(
            [*cli, "withdraw", "--token", "tUSD", "--rpc-url", grid.anvil.url],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert wallet.balance_of(provider) == before + owed
        assert grid.escrow.balance_of(provider, tusd.address) == 0
        assert tusd.fmt(owed) in done.stdout, done.stdout
