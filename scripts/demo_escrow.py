"""The escrow walkthrough on a local devnet: two jobs' whole on-chain lives, step by step.

    make demo-escrow

Starts anvil, deploys JobEscrow (version 5: no key in the middle can move a bounty or a stake,
and a funding names the operator its submitter expects, docs/trust.md) and walks two jobs
through their lives with distinct accounts.

Job 1, paid without trusting anyone: the provider registers and stakes; the submitter funds a
job naming a mediator and the collateral; the provider signs its acceptance (EIP-712, no gas,
with the time it is given to hold the job) and
the operator (the scheduler's key) assigns it, locking the collateral; the provider signs its
result off-chain and the operator relays it; nobody disputes within the challenge window, so a
stranger finalizes it and the provider is paid. Job 2, a wrong result: the submitter disputes
it, depositing the job's bounty (the price of the mediator's re-run; for an ETH job at least
the escrow's disputeDeposit), the mediator rules it wrong, the deposit comes back and the
provider's collateral goes to the submitter (less the mediator's re-run fee). Then the
treasury collects the fee and everyone withdraws.
Prints every transaction with its gas, and the final balances. Exits non-zero if any amount is
not exactly what the contract's rules say.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from eth_account import Account
from rich.console import Console
from rich.table import Table
from web3 import Web3

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devstack.anvil import Anvil, dev_accounts
from gridmarket.chain import EscrowClient, Sent
from gridmarket.deploy import EscrowParams, deploy_escrow
from gridmarket.eip712 import sign_acceptance, sign_result
from gridmarket.escrow import ZERO_ADDRESS, JobState, Status, deposit_of
from gridmarket.holds import hold_for

ETH = 10**18
SPEC_CID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
OUTPUT_CID = "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"
WRONG_CID = "bafkreibm6jg3ux5qumhcn2b3flc3tyu6dmlb4xa7u5bf44yegnrjhc4yeq"
ROOT = Path(__file__).resolve().parent.parent


def eth(wei: int) -> str:
    return f"{wei / ETH:.6f} ETH"


def main() -> int:
    console = Console() if sys.stdout.isatty() else Console(soft_wrap=True, width=120)
    names = ["deployer", "operator", "submitter", "provider", "treasury", "mediator", "stranger"]
    accts = dict(zip(names, (Account.from_key(k) for k in dev_accounts(7)), strict=True))
    txs = Table(title="transactions", show_lines=False)
    for col in ("step", "from", "tx", "gas", "events"):
        txs.add_column(col, justify="right" if col == "gas" else "left")

    def record(step: str, who: str, sent: Sent) -> None:
        txs.add_row(
            step, who, sent.tx_hash[:18] + "…", f"{sent.gas_used:,}",
            ", ".join(e.name for e in sent.events),
        )  # fmt: skip
        console.print(f"  [green]✓[/] {step:<30} {who:<10} gas {sent.gas_used:>7,}  {sent.tx_hash}")

    run_dir = ROOT / ".run"
    run_dir.mkdir(exist_ok=True)
    with Anvil(log_file=run_dir / "demo-anvil.log") as anvil:
        console.rule("[bold]GridMarket devnet demo")
        console.print(f"anvil devnet at {anvil.url} (chain {anvil.chain_id})")
        w3 = Web3(Web3.HTTPProvider(anvil.url))
        params = EscrowParams(
            operator=accts["operator"].address,
            treasury=accts["treasury"].address,
            mediator=accts["mediator"].address,
        )
        deployment = deploy_escrow(w3, accts["deployer"], params)
        deployment.save(run_dir / "demo-deployment.json")
        console.print(
            f"JobEscrow deployed at [bold]{deployment.escrow}[/] (block {deployment.block}); "
            f"fee {params.fee_bps / 100:.2f}%, challenge window {params.challenge_window} s, "
            f"collateral >= {params.min_collateral_bps / 100:.0f}% of the bounty"
        )
        for name, acct in accts.items():
            console.print(f"  {name:<10} {acct.address}")
        escrow = EscrowClient(w3, deployment)
        start = {n: w3.eth.get_balance(a.address) for n, a in accts.items()}

        def sleep(seconds: int) -> None:
            w3.provider.make_request("evm_increaseTime", [seconds])  # type: ignore[arg-type]
            w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
            console.print(f"    … {seconds} s pass on the chain")

        def fund_and_run(output_cid: str) -> JobState:
            deadline = w3.eth.get_block("latest")["timestamp"] + 7200
            state, sent = escrow.create_job(accts["submitter"], os.urandom(32), SPEC_CID,
                                            deadline, bounty)  # fmt: skip
            record("createJob (fund bounty)", "submitter", sent)
            job = state.job
            console.print(
                f"    job 0x{state.job_id.hex()} funded with {eth(bounty)}; mediator "
                f"{job.mediator}, collateral {eth(job.collateral)}, paid after the window"
            )
            hold = hold_for(600)  # a run of up to 10 minutes: the provider's time to hold it
            acceptance = sign_acceptance(accts["provider"], anvil.chain_id, escrow.address,
                                         state.job_id, job.attempt + 1, job, hold)  # fmt: skip
            console.print(f"    provider signed its acceptance of the terms and of a {hold} s "
                          "hold (EIP-712, no gas)")  # fmt: skip
            state, sent = escrow.assign(accts["operator"], state, accts["provider"].address,
                                        hold, acceptance)  # fmt: skip
            record("assign (collateral locked)", "operator", sent)
            signature = sign_result(accts["provider"], anvil.chain_id, escrow.address,
                                    state.job_id, state.job.attempt, output_cid)  # fmt: skip
            console.print(f"    provider signed result {output_cid} off-chain (EIP-712, no gas)")
            state, sent = escrow.call_job(accts["operator"], "submitResultFor", state,
                                          output_cid, signature)  # fmt: skip
            record("submitResultFor (relayed)", "operator", sent)
            return state

        console.rule("job 1: paid after the challenge window, by anyone")
        stake = params.min_stake * 100
        sent = escrow.send(accts["provider"], "registerProvider", "bafkreiprovidermeta",
                           value=stake)  # fmt: skip
        record("registerProvider + stake", "provider", sent)
        bounty = ETH // 10
        job1 = fund_and_run(OUTPUT_CID)
        sleep(params.challenge_window)
        job1, sent = escrow.call_job(accts["stranger"], "finalize", job1)
        record("finalize (after the window)", "stranger", sent)

        console.rule("job 2: a wrong result, disputed and ruled")
        job2 = fund_and_run(WRONG_CID)
        deposit = int(escrow.call("depositOf", job2.job.as_tuple()))  # bounty, at least floor
        console.print(f"    the dispute deposits {eth(deposit)}: the job's bounty (floor "
                      f"{eth(params.dispute_deposit)})")  # fmt: skip
        job2, sent = escrow.call_job(accts["submitter"], "dispute", job2,
                                     value=deposit)  # fmt: skip
        record("dispute (deposit)", "submitter", sent)
        job2, sent = escrow.rule(accts["mediator"], job2, False)
        record("rule: not upheld (slash)", "mediator", sent)
        job2, sent = escrow.call_job(accts["submitter"], "cancel", job2)
        record("cancel (bounty back)", "submitter", sent)

        console.rule("money out")
        sent = escrow.send(accts["treasury"], "collectFees")
        record("collectFees", "treasury", sent)
        withdrawals = []
        for who in ("treasury", "provider", "submitter", "mediator"):
            wd = escrow.send(accts[who], "withdraw")
            record(f"withdraw ({who})", who, wd)
            withdrawals.append(wd)
        console.print(txs)

        # ------------------------------------------------------------------ the books
        replayed = escrow.job_state(job1.job_id)
        fee = bounty * params.fee_bps // 10_000
        collateral = job2.job.collateral
        to_mediator = min(collateral, 2 * deposit)  # the re-run and its tie-break
        end = {n: w3.eth.get_balance(a.address) for n, a in accts.items()}
        table = Table(title="balances (ETH)")
        for col in ("account", "start", "end", "change"):
            table.add_column(col, justify="right")
        for n in names:
            table.add_row(n, eth(start[n]), eth(end[n]), eth(end[n] - start[n]))
        held = w3.eth.get_balance(Web3.to_checksum_address(escrow.address))
        table.add_row("escrow contract", "", eth(held), "")
        console.print(table)
        withdrawn = {e.args["account"]: e.args["amount"] for wd in withdrawals for e in wd.events}
        provider_now = escrow.call("providerOf", accts["provider"].address)
        checks = {
            "job 1 is Released on-chain (events replayed)": replayed.status is Status.RELEASED,
            "job 1's stored commitment is its folded struct": escrow.call(
                "isCurrent", replayed.job_id, replayed.job.as_tuple()
            ),
            "output CID recorded": replayed.output_cid == OUTPUT_CID,
            f"provider withdrew bounty - fee = {eth(bounty - fee)}": withdrawn.get(
                accts["provider"].address
            ) == bounty - fee,
            f"treasury withdrew fee = {eth(fee)}": withdrawn.get(accts["treasury"].address) == fee,
            f"job 2's dispute deposit is its bounty = {eth(deposit)}": (
                deposit == deposit_of(bounty, ZERO_ADDRESS, params.dispute_deposit) == bounty
            ),
            f"submitter got job 2's bounty, its deposit and collateral - re-run fee "
            f"= {eth(bounty + deposit + collateral - to_mediator)}": withdrawn.get(
                accts["submitter"].address
            ) == bounty + deposit + collateral - to_mediator,
            f"mediator was paid the re-run fee = {eth(to_mediator)}, a re-run's bounty": (
                withdrawn.get(accts["mediator"].address) == to_mediator == bounty
            ),
            "provider's stake lost exactly job 2's collateral, nothing locked": (
                provider_now[0] == stake - collateral and provider_now[1] == 0
            ),
            "escrow holds only the provider's stake": held == stake - collateral,
            "the operator received nothing": end["operator"] <= start["operator"],
        }  # fmt: skip
        ok = all(checks.values())
        for text, passed in checks.items():
            console.print(f"  {'[green]✓' if passed else '[red]✗'}[/] {text}")
        console.rule("[bold green]escrow rules held" if ok else "[bold red]demo FAILED")
        return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
