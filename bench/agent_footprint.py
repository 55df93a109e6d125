"""The provider agent's idle footprint, on the path production takes.

What it exercises: a local grid (``devstack.grid.run_grid``: anvil with the escrow, the
scheduler, the mediator, one js-ipfs node per party, dockerd and the registry when they can run)
with one agent daemon started exactly as ``make up`` starts it (``gridmarket-agent run`` with
its keystore, its own IPFS node, Docker and WASM executors, the deployment file for its tUSD
settings, no ``rpc_url``). The agent registers, removes leftover containers, then long-polls the
scheduler and heartbeats every 2 s with no job to run. After ``--settle`` seconds the bench
samples the daemon's process with psutil for ``--seconds``: RSS, USS (the pages only this
process holds), threads and CPU. Then it restarts the same agent with ``rpc_url`` added, as a
provider who wants its on-chain duties runs it (the acceptance's collateral reads, the result
guard, the finalizer, the token stake top-up, over ``gridmarket.lightchain``'s JSON-RPC client:
no web3 since 2026-11-25), and samples it again.

The comparison, measured in the same run on the same interpreter: bare ``python -c pass``, the
imports the daemon cannot do without (pydantic, httpx) and eth-account (which it loaded for its
EIP-712 signatures before ``gridmarket.ethsig``; the row stays for comparison), each in a fresh
process, so the floor under the agent's figure is visible. Goal
(issue 12): idle RSS <= 60 MB at ~0 % CPU.

    python bench/agent_footprint.py [--settle 10] [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devstack.grid import run_grid  # noqa: E402

GOAL_MB = 60.0
FLOORS = {
    "python -c pass": "pass",
    "+ pydantic, httpx": "import pydantic, httpx",
    "+ eth_account": "import pydantic, httpx, eth_account",
}


def mb(n: int) -> float:
    return n / 1e6


def footprint(code: str) -> tuple[float, float]:
    """RSS and USS (MB) of a fresh interpreter that ran ``code`` and then waits."""
    proc = subprocess.Popen(
        [sys.executable, "-c", f"{code}\nprint('ok', flush=True)\nimport time\ntime.sleep(30)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        info = psutil.Process(proc.pid).memory_full_info()
        return mb(info.rss), mb(info.uss)
    finally:
        proc.kill()
        proc.wait()


def sample(pid: int, seconds: float) -> dict[str, float]:
    proc = psutil.Process(pid)
    proc.cpu_percent(None)
    rss, uss, threads = [], [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        info = proc.memory_full_info()
        rss.append(mb(info.rss))
        uss.append(mb(info.uss))
        threads.append(proc.num_threads())
        time.sleep(0.5)
    return {
        "rss": max(rss),
        "uss": max(uss),
        "threads": max(threads),
        "cpu": proc.cpu_percent(None),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settle", type=float, default=10.0, help="idle seconds before sampling")
    parser.add_argument("--seconds", type=float, default=10.0, help="sampling time")
    args = parser.parse_args()
    load0 = os.getloadavg()[0]
    with (
        tempfile.TemporaryDirectory(prefix="agent-footprint-") as tmp,
        run_grid(
            Path(tmp), agents=1, with_frontend=False, on_step=lambda s: print(f"  {s}", flush=True)
        ) as grid,
    ):
        agent = grid.agents[0]
        pid = agent.process.pid
        assert pid is not None, "the agent did not start"
        print(f"agent {agent.name} (pid {pid}) up; idle for {args.settle:g} s", flush=True)
        time.sleep(args.settle)
        got = {"make up": sample(pid, args.seconds)}
        agent.process.stop(30)
        config = yaml.safe_load(agent.config_path.read_text())
        config["rpc_url"] = grid.anvil.url
        agent.config_path.write_text(yaml.safe_dump(config, sort_keys=True))
        grid.restart_agent(agent)
        pid = agent.process.pid
        assert pid is not None, "the agent did not start again"
        print(f"agent {agent.name} again with rpc_url (pid {pid}); idle {args.settle:g} s")
        time.sleep(args.settle)
        got["with rpc_url"] = sample(pid, args.seconds)
    print()
    print(
        f"idle agent daemon, sampled every 0.5 s for {args.seconds:g} s "
        f"after {args.settle:g} s idle (maxima)"
    )
    print(f"{'process':<34} {'RSS MB':>8} {'USS MB':>8}")
    for name, code in FLOORS.items():
        rss, uss = footprint(code)
        print(f"{name:<34} {rss:8.1f} {uss:8.1f}")
    for how, row in got.items():
        name = f"agent run, idle ({how})"
        print(
            f"{name:<34} {row['rss']:8.1f} {row['uss']:8.1f}   "
            f"threads {row['threads']:.0f}, CPU {row['cpu']:.2f} %"
        )
    for how, row in got.items():
        verdict = "met" if row["rss"] <= GOAL_MB else f"missed by {row['rss'] - GOAL_MB:.1f} MB"
        print(f"goal: idle RSS <= {GOAL_MB:g} MB ({how}): {verdict}")
    load1 = os.getloadavg()[0]
    mark = " (PROVISIONAL: load > 1)" if max(load0, load1) > 1 else ""
    print(f"load before/after: {load0:.2f} / {load1:.2f}{mark}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
