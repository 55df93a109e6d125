"""The escrow walkthrough on a local devnet: one job's whole on-chain life, step by step.

    make demo-escrow

Starts anvil, deploys JobEscrow, and walks one job through its life with distinct accounts:
the provider registers and stakes, the submitter funds a job, the operator (the scheduler's key)
assigns it, the provider signs its result off-chain (EIP-712, no gas), the operator verifies and
settles it (relayed result + release in one transaction), the treasury collects the fee, and the
provider withdraws its pay. Prints every transaction with its gas, and the final balances.
Exits non-zero if any amount is not exactly what the contract's rules say.
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
from gridmarket.eip712 import sign_result
from gridmarket.escrow import Status

ETH = 10**18
SPEC_CID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
OUTPUT_CID = "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"
ROOT = Path(__file__).resolve().parent.parent


def eth(wei: int) -> str:
    return f"{wei / ETH:.6f} ETH"


def main() -> int:
    console = Console()
    names = ["deployer", "operator", "submitter", "provider", "treasury"]
    accts = dict(zip(names, (Account.from_key(k) for k in dev_accounts(5)), strict=True))
    txs = Table(title="transactions", show_lines=False)
    for col in ("step", "from", "tx", "gas", "events"):
        txs.add_column(col, justify="right" if col == "gas" else "left")

    def record(step: str, who: str, sent: Sent) -> None:
        txs.add_row(
            step, who, sent.tx_hash[:18] + "…", f"{sent.gas_used:,}",
            ", ".join(e.name for e in sent.events),
        )  # fmt: skip
        console.print(f"  [green]✓[/] {step:<28} {who:<10} gas {sent.gas_used:>7,}  {sent.tx_hash}")

    run_dir = ROOT / ".run"
    run_dir.mkdir(exist_ok=True)
    with Anvil(log_file=run_dir / "demo-anvil.log") as anvil:
        console.rule("[bold]GridMarket devnet demo")
        console.print(f"anvil devnet at {anvil.url} (chain {anvil.chain_id})")
        w3 = Web3(Web3.HTTPProvider(anvil.url))
        params = EscrowParams(
            operator=accts["operator"].address, treasury=accts["treasury"].address
        )
        deployment = deploy_escrow(w3, accts["deployer"], params)
        deployment.save(run_dir / "demo-deployment.json")
        console.print(
            f"JobEscrow deployed at [bold]{deployment.escrow}[/] (block {deployment.block}); "
            f"fee {params.fee_bps / 100:.2f}%, min stake {eth(params.min_stake)}"
        )
        for name, acct in accts.items():
            console.print(f"  {name:<10} {acct.address}")
        escrow = EscrowClient(w3, deployment)
        start = {n: w3.eth.get_balance(a.address) for n, a in accts.items()}

        console.rule("job life")
        sent = escrow.send(accts["provider"], "registerProvider", "bafkreiprovidermeta",
                           value=params.min_stake * 10)  # fmt: skip
        record("registerProvider + stake", "provider", sent)

        bounty = ETH // 10
        deadline = w3.eth.get_block("latest")["timestamp"] + 3600
        state, sent = escrow.create_job(accts["submitter"], os.urandom(32), SPEC_CID, deadline,
                                        bounty)  # fmt: skip
        record("createJob (fund bounty)", "submitter", sent)
        console.print(f"    job 0x{state.job_id.hex()} funded with {eth(bounty)}")

        state, sent = escrow.call_job(accts["operator"], "assign", state,
                                      accts["provider"].address)  # fmt: skip
        record("assign", "operator", sent)

        signature = sign_result(accts["provider"], anvil.chain_id, escrow.address, state.job_id,
                                state.job.attempt, OUTPUT_CID)  # fmt: skip
        console.print(f"    provider signed result {OUTPUT_CID} off-chain (EIP-712, no gas)")
        state, sent = escrow.call_job(accts["operator"], "settle", state, OUTPUT_CID, signature)
        record("settle (result + release)", "operator", sent)

        sent = escrow.send(accts["treasury"], "collectFees")
        record("collectFees", "treasury", sent)
        fee_wd = escrow.send(accts["treasury"], "withdraw")
        record("withdraw fee", "treasury", fee_wd)
        pay_wd = escrow.send(accts["provider"], "withdraw")
        record("withdraw pay", "provider", pay_wd)
        console.print(txs)

        # ------------------------------------------------------------------ the books
        replayed = escrow.job_state(state.job_id)
        fee = bounty * params.fee_bps // 10_000
        end = {n: w3.eth.get_balance(a.address) for n, a in accts.items()}
        table = Table(title="balances (ETH)")
        for col in ("account", "start", "end", "change"):
            table.add_column(col, justify="right")
        for n in names:
            table.add_row(n, eth(start[n]), eth(end[n]), eth(end[n] - start[n]))
        held = w3.eth.get_balance(Web3.to_checksum_address(escrow.address))
        table.add_row("escrow contract", "", eth(held), "")
        console.print(table)
        withdrawn = {e.args["account"]: e.args["amount"] for e in pay_wd.events + fee_wd.events}
        checks = {
            "job is Released on-chain (events replayed)": replayed.status is Status.RELEASED,
            "output CID recorded": replayed.output_cid == OUTPUT_CID,
            f"provider withdrew bounty - fee = {eth(bounty - fee)}": withdrawn.get(
                accts["provider"].address
            ) == bounty - fee,
            f"treasury withdrew fee = {eth(fee)}": withdrawn.get(accts["treasury"].address) == fee,
            "escrow holds only the provider's stake": held == params.min_stake * 10,
            "submitter paid exactly the bounty plus gas": start["submitter"] - end["submitter"]
            > bounty,
        }  # fmt: skip
        ok = all(checks.values())
        for text, passed in checks.items():
            console.print(f"  {'[green]✓' if passed else '[red]✗'}[/] {text}")
        console.rule("[bold green]job paid" if ok else "[bold red]demo FAILED")
        return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
