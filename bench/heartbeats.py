"""Heartbeats per second from nodes holding running leases, with latency percentiles.

The production path: one scheduler replica under uvicorn (SQLite, then PostgreSQL), anvil + the
escrow, js-ipfs, ``require_stake`` on, the operator key set. ``--nodes`` nodes, each a fresh
wallet registered and staked on-chain with a signed registration (capacities from the published
tier mix), node ``i`` offering ``1 + i % 4`` slots. Jobs are funded on anvil (``createJob``,
specs on IPFS, picked up by the chain watcher and the spec fetcher) and every node claims
through ``POST next-job`` until it holds its 1-4 leases (each lease's ``assign`` goes through
the outbox to anvil; the bench waits until the outbox has sent them all).

Then every node sends ``POST /v1/nodes/{id}/heartbeat`` with ``{"running": [its jobs]}``:
the handler takes the leases those jobs hold from the replica's in-memory lease view
(``Store.leases_known``; a heartbeat naming a job the view does not know reads the database,
``Store.leases_of``), answers with their new expiry, and the replica writes the pulse and the lease
extension behind, in one transaction per ``flush_s`` (``scheduler/heartbeats.py``,
``Store.flush_heartbeats``, which also reads which reported jobs are no longer leased and
forgets them, so the node's next heartbeat reads and is told to cancel). Two phases in one
run: saturated (every node back to back) and paced (open loop at ``--rate`` heartbeats/s in
all). After each phase the bench reads every
leased job's ``lease_expires`` from the database: each must have moved past its value before
the phase (the extension was really written). Every 20th answer is parsed and must renew
exactly the jobs the node listed.

    python bench/heartbeats.py [--nodes 200] [--seconds 10] [--rate 2000]
                               [--db sqlite|postgresql|both]

Each phase also prints the replica's CPU time per heartbeat (user + system, from psutil):
unlike the rate and the percentiles, it hardly moves with other work on the machine.

Goal (issue 12): >= 2,000 heartbeats/s at p99 < 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from _load import Client, drain
from _stack import (
    RawHttp,
    acceptor,
    fleet_capacity,
    fund_jobs,
    load_average,
    percentile,
    profiled,
    publish_specs,
    register,
    spec_mix,
    stack,
    uptime,
    wait_queued,
)
from sqlalchemy import create_engine, select

from gridmarket.wire import API
from scheduler.store import Store
from scheduler.store.tables import jobs

WASM_CID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"


async def beat_all(
    url: str, nodes: list[tuple[str, str, list[str]]], seconds: float, rate: float
) -> dict[str, Any]:
    """Every node heartbeats its running jobs for ``seconds``; back to back, or paced at
    ``rate`` in all (open loop: each node sends on its own schedule, whatever the answers)."""
    parsed = httpx.URL(url)
    host, port = parsed.host, parsed.port or 80
    lat: list[float] = []
    errors = 0
    wrong = 0
    n = len(nodes)
    stop_at = time.perf_counter() + seconds

    async def beat(node_id: str, token: str, running: list[str]) -> None:
        nonlocal errors, wrong
        conn = RawHttp(host, port)
        headers = {"Authorization": f"Bearer {token}"}
        path = API.HEARTBEAT.format(node_id=node_id)
        body = json.dumps({"running": running}).encode()
        period = n / rate if rate else 0.0
        next_at = time.perf_counter() + random.uniform(0, period)
        k = 0
        try:
            while time.perf_counter() < stop_at:
                if period:
                    await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                    next_at += period
                t0 = time.perf_counter()
                status, _, data = await conn.request("POST", path, headers, body)
                lat.append(time.perf_counter() - t0)
                if status != 200:
                    errors += 1
                elif k % 20 == 0 and sorted(json.loads(data)["leases"]) != sorted(running):
                    wrong += 1
                k += 1
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(beat(*node) for node in nodes))
    return {"count": len(lat), "elapsed": time.perf_counter() - t0, "lat": lat, "errors": errors,
            "wrong": wrong}  # fmt: skip


def leases(db_url: str, job_ids: list[str]) -> dict[str, float]:
    engine = create_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(
            select(jobs.c.job_id, jobs.c.lease_expires).where(jobs.c.job_id.in_(job_ids))
        ).all()
    engine.dispose()
    return {str(j): float(e or 0.0) for j, e in rows}


def run(
    db: str, n_nodes: int, seconds: float, rate: float, profile: Path | None
) -> list[dict[str, Any]]:
    slots = [1 + i % 4 for i in range(n_nodes)]
    n_jobs = sum(slots)
    with (
        tempfile.TemporaryDirectory(prefix="gm-bench-hb-") as tmp,
        stack(Path(tmp), providers=n_nodes, db=db, lease_ttl_s="120", node_timeout_s="120") as st,
    ):
        specs = spec_mix(random.Random(11), 40, WASM_CID)
        fund_jobs(st.anvil.url, st.escrow, publish_specs(st.ipfs, specs), n_jobs)
        wait_queued(st.db_url, n_jobs)
        url = st.replicas[0].url
        parsed = httpx.URL(url)

        async def claim() -> list[tuple[str, str, list[str]]]:
            async with httpx.AsyncClient(timeout=60) as http:
                regs = await asyncio.gather(
                    *(
                        register(
                            http,
                            url,
                            p,
                            st.deployment.chain_id,
                            st.deployment.escrow,
                            fleet_capacity(i, slots[i], 4),
                        )
                        for i, p in enumerate(st.providers)
                    )
                )
            clients = [
                Client(
                    parsed.host,
                    parsed.port or 80,
                    "POST",
                    API.NEXT_JOB.format(node_id=nid) + "?wait_s=1.0",
                    {"Authorization": f"Bearer {tok}"},
                    slots[i],
                    acceptor(st.providers[i], nid, tok),
                )
                for i, (nid, tok) in enumerate(regs)
            ]
            got = await drain(clients, n_jobs, lambda b: str(json.loads(b)["job_id"]), stall_s=5)
            return [(nid, tok, got.by_client[i]) for i, (nid, tok) in enumerate(regs)]

        nodes = asyncio.run(claim())
        held = [j for _, _, running in nodes for j in running]
        # the leases' assigns go to anvil through the outbox first: a grid in its steady state
        # is not sending hundreds of assigns while its nodes heartbeat
        store = Store(st.db_url)
        give_up = time.monotonic() + 600
        while store.outbox_counts().get("pending", 0) and time.monotonic() < give_up:
            time.sleep(0.5)
        store.close()
        out = []
        for phase, r in (("saturated", 0.0), (f"paced {rate:.0f}/s", rate)):
            before = leases(st.db_url, held)
            time.sleep(0.05)
            name = f"heartbeats-{db}-{'saturated' if not r else 'paced'}"
            proc = psutil.Process(st.replicas[0].pid)
            cpu0 = sum(proc.cpu_times()[:2])
            with profiled([st.replicas[0].pid], profile, name):
                res = asyncio.run(beat_all(url, nodes, seconds, r))
            res["cpu"] = sum(proc.cpu_times()[:2]) - cpu0  # the replica's, during the phase
            time.sleep(0.5)  # one flush period (0.1 s) and then some
            after = leases(st.db_url, held)
            res["extended"] = sum(1 for j in held if after.get(j, 0) > before.get(j, 0))
            res["held"] = len(held)
            res["phase"] = phase
            res["db"] = db
            res["load"] = load_average()
            out.append(res)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=10.0, help="per phase")
    ap.add_argument("--rate", type=float, default=2000.0, help="offered heartbeats/s, paced phase")
    ap.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="py-spy flame graphs of the replica during each phase, into this folder",
    )
    args = ap.parse_args()
    dbs = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    load0 = os.getloadavg()[0]
    print(uptime())
    print(
        f"{args.nodes} nodes holding 1-4 leases each (claimed through next-job), one replica, "
        f"{args.seconds:.0f} s per phase"
    )
    rows = [row for db in dbs for row in run(db, args.nodes, args.seconds, args.rate, args.profile)]
    print(
        f"{'database':<11} {'phase':<13} {'beats':>7} {'beats/s':>8} {'p50 ms':>7} "
        f"{'p99 ms':>7} {'CPU ms/beat':>11} {'errors':>6} {'leases extended':>16} "
        f"{'load (1/5/15)':>15}"
    )
    for r in rows:
        bad = r["errors"] + r["wrong"]
        print(
            f"{r['db']:<11} {r['phase']:<13} {r['count']:>7} {r['count'] / r['elapsed']:>8.0f} "
            f"{percentile(r['lat'], 50) * 1e3:>7.1f} {percentile(r['lat'], 99) * 1e3:>7.1f} "
            f"{r['cpu'] * 1e3 / max(1, r['count']):>11.3f} {bad:>6} "
            f"{r['extended']:>7}/{r['held']:<8} {r['load']:>15}"
        )
    mark = " (PROVISIONAL: load > 1)" if max(load0, os.getloadavg()[0]) > 1 else ""
    print(f"load before/after: {load0:.2f} / {load_average()}{mark}")
    print("goal: >= 2000 heartbeats/s at p99 < 50 ms")


if __name__ == "__main__":
    main()
