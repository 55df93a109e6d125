"""Sustained heartbeats per second, with latency percentiles, through the real API.

One scheduler replica under uvicorn on loopback (SQLite, then PostgreSQL). N nodes, each with
its own registered wallet and token, heartbeat back to back for ``--seconds``; every heartbeat
is a real write (``last_seen``) in its own transaction.

    python bench/heartbeats.py [--nodes 64] [--seconds 10] [--db sqlite|postgresql|both]

Goal (issue 3): >= 2,000 heartbeats/s at p99 < 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _stack import RawHttp, percentile, register, stack
from eth_account.signers.local import LocalAccount

from gridmarket.wire import API


async def hammer(
    url: str,
    providers: list[LocalAccount],
    chain_id: int,
    escrow: str,
    seconds: float,
    rate: float = 0.0,
) -> dict[str, Any]:
    n = len(providers)
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(limits=limits, timeout=30) as http:
        nodes = await asyncio.gather(
            *(register(http, url, p, chain_id, escrow, 1) for p in providers)
        )
        lat: list[float] = []
        errors = 0
        stop_at = time.perf_counter() + seconds
        parsed = httpx.URL(url)
        host, port = parsed.host, parsed.port or 80

        async def beat(node_id: str, token: str) -> None:
            nonlocal errors
            conn = RawHttp(host, port)
            headers = {"Authorization": f"Bearer {token}"}
            path = API.HEARTBEAT.format(node_id=node_id)
            body = b'{"running":[]}'
            period = n / rate if rate else 0.0  # open loop: this client's share of the rate
            next_at = time.perf_counter() + random.uniform(0, period)
            try:
                while time.perf_counter() < stop_at:
                    if period:
                        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                        next_at += period
                    t0 = time.perf_counter()
                    status, _, _ = await conn.request("POST", path, headers, body)
                    lat.append(time.perf_counter() - t0)
                    if status != 200:
                        errors += 1
            finally:
                conn.close()

        t0 = time.perf_counter()
        await asyncio.gather(*(beat(nid, tok) for nid, tok in nodes))
        elapsed = time.perf_counter() - t0
    return {"count": len(lat), "elapsed": elapsed, "lat": lat, "errors": errors}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    ap.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="offered heartbeats/s, paced (open loop); 0: every node back to back (saturation)",
    )
    args = ap.parse_args()
    dbs = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    load = f"paced at {args.rate:.0f}/s" if args.rate else "back to back"
    print(f"{args.nodes} nodes heartbeating {load} for {args.seconds:.0f} s, one replica")
    print(f"{'database':<12} {'beats':>7} {'beats/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'errors':>7}")
    for db in dbs:
        with (
            tempfile.TemporaryDirectory(prefix="gm-bench-hb-") as tmp,
            stack(Path(tmp), providers=args.nodes, db=db, require_stake="false") as st,
        ):
            r = asyncio.run(
                hammer(
                    st.replicas[0].url,
                    st.providers,
                    st.deployment.chain_id,
                    st.deployment.escrow,
                    args.seconds,
                    args.rate,
                )
            )
        print(
            f"{db:<12} {r['count']:>7} {r['count'] / r['elapsed']:>8.0f} "
            f"{percentile(r['lat'], 50) * 1e3:>7.1f} {percentile(r['lat'], 99) * 1e3:>7.1f} "
            f"{r['errors']:>7}"
        )
    print("goal: >= 2000 heartbeats/s at p99 < 50 ms")


if __name__ == "__main__":
    main()
