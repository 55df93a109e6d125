"""Gas per step of a job's on-chain life, on a real anvil devnet.

    make bench-gas            # or: .venv/bin/python bench/gas.py

Deploys JobEscrow, registers and stakes a provider, then runs jobs through both paths:
- relayed (the scheduler's path): createJob -> assign -> settle (the provider's EIP-712 signed
  result relayed and paid in one transaction, after off-chain verification);
- direct: createJob -> assign -> submitResult (sent by the provider) -> release.
The provider's first job pays one-time costs (its first balance credit, the fee accumulator's
first write); later jobs are the steady state the goal is about. Every step emits its event.
Prints a table per job, `total: N` for the steady-state relayed life, and a comparison with the
hackathon escrow the project measured (472,870 gas for the same life, with no events).
"""

from __future__ import annotations

import os
import time

from eth_account import Account
from rich.console import Console
from rich.table import Table
from web3 import Web3

from devstack.anvil import Anvil, dev_accounts
from gridmarket.chain import EscrowClient
from gridmarket.deploy import EscrowParams, deploy_escrow
from gridmarket.eip712 import sign_result

BASELINE = 472_870
GOAL = 150_000


def main() -> int:
    console = Console()
    keys = dev_accounts(5)
    deployer, operator, submitter, provider, treasury = (Account.from_key(k) for k in keys)
    with Anvil() as anvil:
        w3 = Web3(Web3.HTTPProvider(anvil.url))
        deployment = deploy_escrow(
            w3, deployer, EscrowParams(operator=operator.address, treasury=treasury.address)
        )
        escrow = EscrowClient(w3, deployment)
        reg = escrow.send(provider, "registerProvider", "bafkreiprovidermetadata", value=10**17)
        console.print(f"registerProvider + stake: {reg.gas_used:,} gas (once per provider)")
        spec = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
        out = "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"
        chain_id = w3.eth.chain_id

        def life(relayed: bool) -> list[tuple[str, int]]:
            rows = []
            deadline = w3.eth.get_block("latest")["timestamp"] + 3600
            state, sent = escrow.create_job(submitter, os.urandom(32), spec, deadline, 10**17)
            rows.append(("createJob", sent.gas_used))
            state, sent = escrow.call_job(operator, "assign", state, provider.address)
            rows.append(("assign", sent.gas_used))
            if relayed:
                sig = sign_result(
                    provider, chain_id, escrow.address, state.job_id, state.job.attempt, out
                )
                state, sent = escrow.call_job(operator, "settle", state, out, sig)
                rows.append(("settle (signed result + release)", sent.gas_used))
            else:
                state, sent = escrow.call_job(provider, "submitResult", state, out)
                rows.append(("submitResult", sent.gas_used))
                state, sent = escrow.call_job(operator, "release", state)
                rows.append(("release", sent.gas_used))
            assert state.status.name == "RELEASED"
            return rows

        results: dict[str, list[int]] = {}
        for relayed, label in ((True, "relayed"), (False, "direct")):
            results[label] = []
            for n in (1, 2):
                rows = life(relayed)
                total = sum(g for _, g in rows)
                results[label].append(total)
                kind = "provider's first job" if n == 1 and relayed else "steady state"
                table = Table(title=f"{label} path, job {n} ({kind})")
                table.add_column("step")
                table.add_column("gas", justify="right")
                for step, gas in rows:
                    table.add_row(step, f"{gas:,}")
                table.add_row("[bold]total", f"[bold]{total:,}")
                console.print(table)
        totals = results["relayed"]
        console.print(
            f"direct path (provider sends its result, operator releases): "
            f"steady {results['direct'][-1]:,}"
        )
        steady = totals[-1]
        console.print(f"first job: {totals[0]:,}   steady state: {steady:,}   goal: <= {GOAL:,}")
        console.print(
            f"hackathon escrow, same life, no events: {BASELINE:,} ({BASELINE / steady:.2f}x ours)"
        )
        print(f"total: {steady}")
        return 0 if steady <= GOAL else 1


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    print(f"({time.perf_counter() - t0:.1f} s)")
    raise SystemExit(rc)
