"""The main job: the whole grid on a local devnet doing real jobs, end to end.

    make demo

Starts anvil and deploys the escrow, one IPFS node per party (loopback swarm), dockerd when it can
run, the scheduler, the web front end (when installed) and a fleet of real provider agents with
distinct wallets. A submitter then funds jobs that do real work on the dataset in
examples/datasets/gpu-hours: a Docker job (busybox awk: GPU-hours and mean price per tier), a
WASM job (examples/wasm/csvstats.wat: bytes, lines and fields) and a Python data job (python3 +
numpy, examples/python/hours_regression.py: a least-squares fit of the price per GPU-hour on tier
and region, result.json and plot.svg) and a PyTorch training job that checkpoints as it goes
(examples/python/train_mlp.py: an MLP, its model, metrics and loss curve; the agent copies its
/checkpoint every 10 s and the scheduler keeps the newest copy, so a lost node's successor would
resume from it). The scheduler matches them, the
agents run them sandboxed and upload the outputs, the scheduler verifies each output CID against
its bytes (an integrity check: the output exists and hashes to its CID) and pays on-chain: the
first job on the escrow's trustless terms (its result is relayed and paid once the challenge
window passes with no dispute: 15 s on the devnet), the second "on the scheduler's check" (the
submitter's opt-in: paid at once). Both name the devnet's mediator and lock collateral from
the provider's stake while it runs them (docs/trust.md). One more WASM job is paid in the
devnet's stablecoin (TestUSD, 6 decimals): funded in one transaction with an EIP-2612 permit,
its collateral locked from the provider's tUSD stake, paid in tUSD. The demo downloads every
output (checked against its CID), prints the payout transactions and the explorer URL, has
providers withdraw their earnings in ETH and in tUSD (balance changes shown), and exits 0 only if
every job was paid exactly bounty minus fee, in its own currency.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import httpx
import wasmtime
from rich.console import Console
from rich.live import Live
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devstack._process import ServiceError  # noqa: E402
from devstack.grid import LocalGrid, run_grid  # noqa: E402
from devstack.images import PYTHON_SCRIPT_IN_IMAGE  # noqa: E402
from devstack.torch_image import TRAIN_SCRIPT_IN_IMAGE  # noqa: E402
from gridmarket.escrow import Status  # noqa: E402
from gridmarket.token import ETH_TOKEN, TokenClient, by_address, tokens_of  # noqa: E402
from gridmarket.wire import JobSpec  # noqa: E402

DATASET = ROOT / "examples" / "datasets" / "gpu-hours"
WASM = ROOT / "examples" / "wasm" / "csvstats.wat"
BOUNTY = 10**16  # 0.01 ETH
TOKEN_BOUNTY = 2 * 10**6  # 2 tUSD (6 decimals)
SUMMARY = (
    "echo tier,gpu_hours,revenue_gwei,mean_price_gwei > /output/summary.csv && "
    "awk -F, 'NR>1 {h[$1]+=$3; r[$1]+=$3*$4} END {for (t in h) "
    'printf "%s,%d,%d,%d\\n", t, h[t], r[t], r[t]/h[t]}\' /input/data.csv '
    "| sort >> /output/summary.csv && wc -l < /input/data.csv"
)
FINAL = {"released", "failed", "invalid", "refunded", "expired"}

# In a pipe or a log file, whole hashes and CIDs stay on one line (rich wraps at 80 columns).
console = Console() if sys.stdout.isatty() else Console(soft_wrap=True, width=100)


def log(message: str) -> None:
    """A timestamped line: rich's log on a terminal, one unwrapped line in a pipe."""
    if console.is_terminal:
        console.log(message, _stack_offset=2)
    else:
        console.print(f"{time.strftime('%H:%M:%S')} {message}")


def specs(grid: LocalGrid, dataset_cid: str, module_cid: str) -> list[JobSpec]:
    jobs = [
        JobSpec.model_validate(
            {
                "name": "csv stats (wasm)",
                "executor": "wasm",
                "module_cid": module_cid,
                "dataset_cid": dataset_cid,
                "resources": {"cpu_cores": 1, "ram_mib": 256, "disk_mib": 64},
                "limits": {"timeout_s": 60, "output_max_bytes": 1 << 20},
            }
        )
    ]
    if grid.dockerd is not None:
        jobs.insert(
            0,
            JobSpec.model_validate(
                {
                    "name": "price summary (docker)",
                    "executor": "docker",
                    "image": grid.busybox_image,  # pinned by digest in the devnet's registry
                    "command": ["sh", "-c", SUMMARY],
                    "dataset_cid": dataset_cid,
                    "resources": {"cpu_cores": 1, "ram_mib": 256, "disk_mib": 64},
                    "limits": {"timeout_s": 120, "output_max_bytes": 1 << 20},
                }
            ),
        )
    if grid.dockerd is not None and grid.python_image:
        jobs.append(
            JobSpec.model_validate(
                {
                    "name": "price regression (python + numpy)",
                    "executor": "docker",
                    "image": grid.python_image,  # pinned by digest in the devnet's registry
                    "command": ["python3", PYTHON_SCRIPT_IN_IMAGE],
                    "dataset_cid": dataset_cid,
                    "resources": {"cpu_cores": 1, "ram_mib": 256, "disk_mib": 64},
                    "limits": {"timeout_s": 120, "output_max_bytes": 1 << 20},
                }
            )
        )
    if grid.dockerd is not None and grid.torch_image:
        jobs.append(
            JobSpec.model_validate(
                {
                    "name": "train an MLP (pytorch, checkpointing)",
                    "executor": "docker",
                    "image": grid.torch_image,  # pinned by digest in the devnet's registry
                    "command": ["python3", TRAIN_SCRIPT_IN_IMAGE],
                    "env": {
                        "TRAIN_STEPS": "3000",
                        "CHECKPOINT_EVERY": "200",
                        "LOG_EVERY": "500",
                        "STEP_SLEEP_S": "0.004",
                    },
                    # the agent copies /checkpoint every 10 s; a lost node's successor resumes
                    "checkpoint": {"interval_s": 10, "max_bytes": 16 << 20},
                    "resources": {"cpu_cores": 1, "ram_mib": 512, "disk_mib": 64},
                    "limits": {"timeout_s": 180, "output_max_bytes": 8 << 20},
                }
            )
        )
    return jobs


def table(rows: dict[str, dict[str, str]]) -> Table:
    t = Table(title="jobs", expand=False)
    for col in ("job", "name", "state", "node", "progress", "why"):
        t.add_column(col, overflow="fold", max_width=60 if col == "why" else None)
    colors = {"released": "green", "failed": "red", "invalid": "red", "expired": "red"}
    for job_id, r in rows.items():
        color = colors.get(r["state"], "yellow")
        t.add_row(
            job_id[:10] + "…",
            r["name"],
            f"[{color}]{r['state']}[/]",
            r.get("node") or "",
            r.get("progress", ""),
            r.get("reason", ""),
        )
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--agents", type=int, default=3, help="provider agents to start (1-5)")
    ap.add_argument("--work", type=Path, default=ROOT / ".run" / "demo")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for payment")
    ap.add_argument(
        "--wasm-only",
        action="store_true",
        help="run without dockerd (the Docker job is left out); without this flag a grid "
        "whose dockerd cannot run is an error",
    )
    args = ap.parse_args()
    started = time.monotonic()
    with console.status("starting the grid") as status:

        def step(what: str) -> None:
            status.update(f"starting: {what}")
            log(f"[dim]start[/] {what}")

        grid_cm = run_grid(args.work, agents=args.agents, on_step=step)
        grid = grid_cm.__enter__()
    try:
        return demo(grid, args, started)
    finally:
        with console.status("stopping the grid"):
            grid_cm.__exit__(None, None, None)


def demo(grid: LocalGrid, args: argparse.Namespace, started: float) -> int:
    log(f"[bold]{grid.docker_note}[/]")
    if grid.dockerd is None and not args.wasm_only:
        console.print(
            "[bold red]error:[/] dockerd could not run here, so the Docker job cannot run: "
            f"{grid.docker_note}\nFix dockerd (scripts/setup_services.sh, as root), or run "
            "`python scripts/demo.py --wasm-only` to run the WASM job alone."
        )
        return 2
    log(f"grid up in {time.monotonic() - started:.1f} s")
    for key, value in grid.describe().items():
        console.print(f"  {key:<16} {value}")
    if grid.dockerd is not None:
        with console.status("building and pushing the PyTorch image (~600 MB; cached after)"):
            t0 = time.monotonic()
            try:
                log(f"pytorch image {grid.publish_torch()} ({time.monotonic() - t0:.1f} s)")
            except ServiceError as exc:  # its .debs are not cached: no training job
                log(f"[yellow]no PyTorch job: {exc}[/]")
    dataset_cid = grid.ipfs.add_dir(DATASET)
    module_cid = grid.ipfs.add_bytes(bytes(wasmtime.wat2wasm(WASM.read_text())))
    log(f"dataset {DATASET.relative_to(ROOT)} -> {dataset_cid}")
    log(f"module {WASM.relative_to(ROOT)} -> {module_cid}")
    submitter = grid.submitters[0]
    jobs: dict[str, dict[str, str]] = {}
    for i, spec in enumerate(specs(grid, dataset_cid, module_cid)):
        spec_cid = grid.ipfs.add_bytes(spec.to_bytes())
        now = int(grid.w3.eth.get_block("latest")["timestamp"])
        on_verify = i % 2 == 1
        terms = grid.escrow.default_terms(BOUNTY, submitter.address, on_verify=on_verify)
        state, sent = grid.escrow.create_job(
            submitter, os.urandom(32), spec_cid, now + 1800, BOUNTY, terms
        )
        job_id = "0x" + state.job_id.hex()
        jobs[job_id] = {"name": spec.name, "state": "funded", "fund_tx": sent.tx_hash}
        mode = "paid on the scheduler's check" if on_verify else "paid after the window"
        log(
            f"funded {spec.name}: job {job_id} (tx {sent.tx_hash}, {BOUNTY / 1e18} ETH, "
            f"{mode}, collateral {terms.collateral / 1e18} ETH, mediator {terms.mediator})"
        )
    tusd = tokens_of(grid.deployment.tokens)["tUSD"]
    spec = specs(grid, dataset_cid, module_cid)[-1 if grid.dockerd is None else 1]
    spec = spec.model_copy(update={"name": "csv stats, paid in tUSD (wasm)"})
    spec_cid = grid.ipfs.add_bytes(spec.to_bytes())
    now = int(grid.w3.eth.get_block("latest")["timestamp"])
    terms = grid.escrow.default_terms(TOKEN_BOUNTY, submitter.address, token=tusd.address)
    state, sent = grid.escrow.create_job(
        submitter, os.urandom(32), spec_cid, now + 1800, TOKEN_BOUNTY, terms
    )
    job_id = "0x" + state.job_id.hex()
    jobs[job_id] = {"name": spec.name, "state": "funded", "fund_tx": sent.tx_hash}
    log(
        f"funded {spec.name}: job {job_id} (tx {sent.tx_hash}: permit + createJobWith in one "
        f"transaction, {sent.gas_used:,} gas; {tusd.fmt(TOKEN_BOUNTY)}, collateral "
        f"{tusd.fmt(terms.collateral)} from the provider's tUSD stake)"
    )
    groups: dict[str, list[str]] = {}
    if len(grid.agents) >= 2:
        k = min(3, len(grid.agents))
        spec = specs(grid, dataset_cid, module_cid)[-1 if grid.dockerd is None else 1]
        spec = spec.model_copy(update={"name": f"csv stats, replicated x{k} (wasm)"})
        spec_cid = grid.ipfs.add_bytes(spec.to_bytes())
        now = int(grid.w3.eth.get_block("latest")["timestamp"])
        terms = grid.escrow.default_terms(BOUNTY, submitter.address)
        group, seats, sent = grid.escrow.create_replicated(
            submitter, os.urandom(32), spec_cid, now + 1800, k * BOUNTY, k, terms
        )
        group_id = "0x" + group.hex()
        groups[group_id] = []
        for i, seat in enumerate(seats):
            job_id = "0x" + seat.job_id.hex()
            groups[group_id].append(job_id)
            jobs[job_id] = {
                "name": f"{spec.name} seat {i}",
                "state": "funded",
                "fund_tx": sent.tx_hash,
            }
        log(
            f"funded {spec.name}: group {group_id} as {k} seats (tx {sent.tx_hash}, "
            f"{k * BOUNTY / 1e18} ETH), run by {k} distinct providers, paid when their outputs "
            f"agree (collateral {terms.collateral / 1e18} ETH per seat)"
        )
    funded_at = time.monotonic()
    deadline = funded_at + args.timeout
    with Live(table(jobs), console=console, refresh_per_second=4) as live:
        while time.monotonic() < deadline:
            for job_id, row in jobs.items():
                try:
                    j = grid.api(f"/v1/jobs/{job_id}")
                except httpx.HTTPStatusError:  # 404: the watcher has not seen the block yet
                    continue
                row.update(state=j["state"], node=j["node_id"] or row.get("node", ""))
                row["reason"] = j["reason"]
                row["output_cid"] = j["output_cid"] or ""
                p = j.get("progress")  # a checkpointing job's last reported step
                if p:
                    row["progress"] = f"step {p['step']}" + (f"/{p['total']}" if p["total"] else "")
            live.update(table(jobs))
            if all(r["state"] in FINAL for r in jobs.values()):
                break
            time.sleep(0.25)
    if not console.is_terminal:
        console.line()  # Live leaves its last table line open in a pipe
    log(f"jobs settled {time.monotonic() - funded_at:.1f} s after funding")
    for group_id in groups:
        verdict = [
            e
            for e in grid.escrow.events(grid.deployment.block)
            if e.name == "Resolved" and "0x" + bytes(e.args["groupId"]).hex() == group_id
        ]
        if verdict:
            v = verdict[0]
            log(
                f"replicated group {group_id}: {v.args['agreeing']} of {v.args['replicas']} "
                f"providers agreed (result digest 0x{bytes(v.args['resultDigest']).hex()}, "
                f"tx {v.tx_hash})"
            )
    return report(grid, jobs)


def report(grid: LocalGrid, jobs: dict[str, dict[str, str]]) -> int:
    ok = True
    payouts = {
        "0x" + bytes(e.args["jobId"]).hex(): e
        for e in grid.escrow.events(grid.deployment.block)
        if e.name == "JobReleased"
    }
    tokens = tokens_of(grid.deployment.tokens)
    out = Table(title="payouts (JobReleased events)")
    for col in ("job", "output CID", "provider", "payout", "fee", "tx"):
        out.add_column(col, overflow="fold")
    for job_id, row in jobs.items():
        state = grid.escrow.job_state(bytes.fromhex(job_id[2:]))
        ev = payouts.get(job_id)
        if row["state"] != "released" or state.status is not Status.RELEASED or ev is None:
            ok = False
            console.print(f"[red]job {job_id} ({row['name']}) was not paid: {row.get('reason')}[/]")
            continue
        token = by_address(tokens, state.job.token)
        bounty = BOUNTY if token.is_eth else TOKEN_BOUNTY
        payout, fee = int(ev.args["payout"]), int(ev.args["fee"])
        if payout != state.job.payout or fee != state.job.fee or payout + fee != bounty:
            ok = False
            console.print(
                f"[red]job {job_id}: paid {token.fmt(payout)} + fee {token.fmt(fee)}, "
                f"expected {token.fmt(bounty)}[/]"
            )
        target = grid.work / "outputs" / job_id
        if target.exists():
            import shutil

            shutil.rmtree(target)
        path = grid.ipfs.fetch(row["output_cid"], target, 1 << 20)  # verified against its CID
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            console.rule(f"{row['name']}: {f.relative_to(path)}")
            if f.suffix in (".svg", ".pt"):  # a plot, a model: the path, not the bytes
                console.print(f"{f.stat().st_size:,} bytes: {f}")
                continue
            text = f.read_text().rstrip().splitlines()
            if len(text) > 12:  # a long CSV: its head and tail
                text = [*text[:5], f"... ({len(text) - 10} more lines)", *text[-5:]]
            console.print("\n".join(text))
        if row.get("progress"):
            doc = grid.api(f"/v1/jobs/{job_id}/checkpoints")
            latest = doc.get("latest") or {}
            log(
                f"{row['name']}: {len(doc.get('points') or [])} checkpoint(s) reported, the "
                f"last at step {(latest.get('progress') or {}).get('step', '?')} "
                f"({latest.get('size', 0):,} bytes, kept on the scheduler's IPFS node: "
                f"{latest.get('kept')})"
            )
        if not console.is_terminal:  # one line per payout: nothing wrapped or cut in a pipe
            console.print(
                f"paid job {job_id} output {row['output_cid']} provider {ev.args['provider']} "
                f"payout {token.fmt(payout)} fee {token.fmt(fee)} tx {ev.tx_hash}"
            )
        out.add_row(
            job_id[:10] + "…",
            row["output_cid"],
            str(ev.args["provider"]),
            token.fmt(payout),
            token.fmt(fee),
            ev.tx_hash,
        )
    if console.is_terminal:
        console.print(out)
    paid_providers = {str(ev.args["provider"]) for ev in payouts.values()}
    tusd = tokens["tUSD"]
    for p in grid.providers[: len(grid.agents)]:
        log(
            f"provider {p.address} withdrawable: "
            f"{ETH_TOKEN.fmt(grid.escrow.balance_of(p.address))}, "
            f"{tusd.fmt(grid.escrow.balance_of(p.address, tusd.address))}"
        )
    earner = next(
        (
            p
            for p in grid.providers
            if p.address in paid_providers and grid.escrow.balance_of(p.address) > 0
        ),
        None,
    )
    token_earner = next(
        (p for p in grid.providers if grid.escrow.balance_of(p.address, tusd.address) > 0), None
    )
    if token_earner is not None:
        wallet = TokenClient(grid.w3, tusd.address)
        before = wallet.balance_of(token_earner.address)
        owed = grid.escrow.balance_of(token_earner.address, tusd.address)
        sent = grid.escrow.send(token_earner, "withdrawToken", tusd.address, token_earner.address)
        after = wallet.balance_of(token_earner.address)
        log(
            f"provider {token_earner.address} withdrew {tusd.fmt(owed)} (tx {sent.tx_hash}): "
            f"wallet {tusd.fmt(before)} -> {tusd.fmt(after)}"
        )
        if after - before != owed:
            ok = False
            console.print("[red]the tUSD withdrawal did not move the provider's earnings[/]")
    elif any(r["name"].endswith("paid in tUSD (wasm)") for r in jobs.values()):
        ok = False
        console.print("[red]no provider holds tUSD earnings after the tUSD job[/]")
    if earner is None:
        ok = False
        console.print("[red]no provider holds ETH earnings to withdraw[/]")
    else:
        before = grid.w3.eth.get_balance(earner.address)
        owed = grid.escrow.balance_of(earner.address)
        sent = grid.escrow.send(earner, "withdraw")
        after = grid.w3.eth.get_balance(earner.address)
        log(
            f"provider {earner.address} withdrew {owed / 1e18:.6f} ETH (tx {sent.tx_hash}): "
            f"wallet {before / 1e18:.6f} -> {after / 1e18:.6f} ETH "
            f"({(after - before) / 1e18:+.6f} ETH after gas)"
        )
        if grid.escrow.balance_of(earner.address) != 0 or after - before <= 0:
            ok = False
            console.print("[red]the withdrawal did not move the provider's earnings[/]")
    if grid.frontend_url:
        log(f"explorer: {grid.frontend_url}/payouts")
        for job_id in jobs:
            log(f"  job page: {grid.frontend_url}/jobs/{job_id}")
        log("(the demo's grid stops now: `make up` keeps one running to browse)")
    else:
        log("explorer: front end not installed; payouts above are read from chain events")
    if ok and grid.dockerd is None:
        console.print("[bold yellow]every job paid (WASM only: the Docker job was left out)[/]")
    else:
        console.print(
            "[bold green]every job paid[/]" if ok else "[bold red]not every job was paid[/]"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
