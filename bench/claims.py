"""Claims per second through the production path, against the Sarva dispatcher, in one run.

Ours (the production path, end to end):

* anvil + the escrow; the js-ipfs daemon; ``--specs`` distinct job specs (Docker CPU, WASM and
  one-GPU jobs of varied resources, ``_stack.spec_mix``) added to IPFS;
* ``--jobs`` jobs funded on anvil with ``createJob`` (a bounty each, spec CIDs in turn), 150 to
  a block (``_stack.fund_jobs_in_blocks``: anvil 1.7.1's per-block cost grows with the
  escrow's storage, docs/platform.md);
* scheduler replicas under uvicorn: one on SQLite, then two sharing a PostgreSQL database,
  ``require_stake`` on, the operator key set. The leader's chain watcher sees each
  ``JobCreated``, its spec fetcher reads the spec from IPFS and checks its CID; the bench
  starts once every job is ``queued``;
* ``--clients`` nodes, each a fresh wallet registered and staked on-chain, capacities from the
  published tier mix (``scripts/spawn_fleet.py``: RTX 4090, 3090, 4070, 3060, CPU-only), sign
  their registrations and long-poll ``POST /v1/nodes/{id}/next-job?wait_s=1`` back to back
  (split over the replicas) until every job is leased. A claim is an offer plus its
  acceptance: the node signs the EIP-712 acceptance of the job's terms with its wallet and posts
  it (``POST /v1/nodes/{id}/jobs/{job}/accept``) on the same connection, as the agent does; the
  latency counted runs from the poll to the accepted answer. Each acceptance queues an
  ``assign`` (carrying the signature) in the outbox; the leader sends them to anvil
  (``scheduler.service.loops.OutboxLoop``) while the claims run, and the bench waits for the
  outbox to drain.

Counted: claims/s (distinct jobs handed out, first poll to the last job leased), claim latency
p50/p99, empty polls while jobs waited (retried), refused polls (error status), dispatch rounds
(each one transaction that locks rows ``FOR UPDATE SKIP LOCKED`` on PostgreSQL), double
assignments as ``clients/db/chain``: jobs received by two or more clients, jobs two of whose
attempts were open at once (ours: an attempt started before the one before it ended; an offer
handed back undelivered and offered again is counted apart, as re-offered) or with two or more
audit rows (the peer) in the database, ``assign`` transactions the chain refused; and assigns
confirmed on-chain per second.

The peer, Sarva's dispatcher (``bench/peers/sarva.py``: FastAPI + SQLAlchemy + SQLite, a plain
``def`` endpoint, no locking), is served the same way and driven by the same load generator
(``bench/_load.py``) with the same number of jobs and nodes; its doubles come from its audit
table. Jobs are held by the node that claimed them (no node finishes a job), so ``--jobs`` is at
most 64 (the most slots a node may offer) per client.

``--finish`` is the soak (issue 12's 100,000 claims without a double): each node, once its
acceptance is taken, reports the run done as the agent does (``POST
/v1/nodes/{id}/jobs/{job}/result``, the output CID signed by its wallet for that job and
attempt; the output is one small file the bench put on IPFS) and asks again, so a node's slot
is used again and ``--jobs`` may be any number; progress is printed every 30 s. With
``--feed`` the jobs are funded while the nodes claim (``--funders`` submitters at once), so the
rate is bounded by the funding too (on this machine anvil then mines 12-50 ``createJob``/s
beside the scheduler's assigns and settles). Behind the
claims the leader verifies each output (fetched from IPFS, hashed back to its CID) and queues
its ``settle``; anvil takes far fewer assigns and settles a second than the nodes claim, so the
outbox is counted at the end, not awaited. Each node stakes the collateral of all the jobs it
may take (the settles that unlock it trail the claims). Doubles are counted as above: a job
received twice by the clients, a job with two or more attempts in the database, an ``assign``
the chain refused.

The nodes renew their bearer tokens as the agent does: a request answered 401 (the token
expired after ``TOKEN_TTL_S``, an hour by default; ``--token-ttl-s`` sets it) signs a fresh
registration of the same node and is sent again (``_stack.NodeAuth``). Until 2026-11-28 they
did not, and the first 100,000-job soak stopped at the hour with every poll refused.

``--duties-apart`` (PostgreSQL): the two replicas that serve the nodes hold no leader duty; the
chain duty (watcher, outbox, spec fetcher) and the verify duty each run in a third and fourth
replica of their own (``GRIDMARKET_SCHEDULER_DUTIES``), as a busy deployment would; their CPU
is counted with the serving replicas'.

    python bench/claims.py [--jobs 2000] [--clients 64] [--db sqlite|postgresql|both] [--no-peer]
    python bench/claims.py --finish --jobs 100000 --db postgresql --no-peer --funders 4 [--feed]
        [--duties-apart]

Goal (issue 12): >= 1,000 claims/s with 64 long-polling nodes, 0 double assignments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil
from _load import Client, Drained, drain
from _stack import (
    NodeAuth,
    acceptor,
    finisher,
    fleet_capacity,
    fund_jobs,
    fund_jobs_in_blocks,
    load_average,
    percentile,
    profiled,
    publish_specs,
    register,
    renewer,
    spec_mix,
    stack,
    uptime,
    wait_queued,
)
from sqlalchemy import create_engine, func, select

from devstack.anvil import free_port
from gridmarket.wire import API, JobSpec
from scheduler.chain import BATCH_MAX_CALLS
from scheduler.store import Store
from scheduler.store.tables import attempts, jobs

WASM_CID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
HERE = Path(__file__).resolve().parent


def spec_kind(spec: JobSpec) -> str:
    """A job's kind as the tail of a soak is read by: ``cpu``, ``wasm`` or ``gpu<VRAM>G``
    (``/4090`` when pinned to the RTX 4090)."""
    res = spec.resources
    if not res.gpu_count:
        return str(spec.executor.value)
    return f"gpu{res.min_vram_mib // 1024}G" + ("/4090" if res.gpu_models else "")


def queued_kinds(db_url: str, kinds: dict[str, str]) -> Counter[str]:
    """The jobs still queued, counted by kind (``kinds``: spec CID -> kind)."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(jobs.c.spec_cid, func.count())
                .where(jobs.c.state == "queued")
                .group_by(jobs.c.spec_cid)
            ).all()
    finally:
        engine.dispose()
    out: Counter[str] = Counter()
    for cid, n in rows:
        out[kinds.get(cid, "other")] += n
    return out


def _kinds_line(counts: Counter[str]) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(counts.items())) or "none"


def _metric(text: str, name: str) -> int:
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
    return int(float(m.group(1))) if m else 0


def run_ours(
    db: str,
    n_jobs: int,
    n_clients: int,
    n_specs: int,
    gpus: int,
    profile: Path | None,
    finish: bool = False,
    funders: int = 1,
    feed: bool = False,
    max_minutes: float = 0.0,
    duties_apart: bool = False,
    token_ttl_s: float = 0.0,
    outbox_batch: int = 0,
) -> dict[str, Any]:
    replicas = 1 if db == "sqlite" else 2
    duties_apart = duties_apart and db != "sqlite"
    slots = min(64, math.ceil(n_jobs / n_clients) + 8)
    # finishing nodes take jobs one after another: each stakes the collateral of all the jobs
    # it may take, since the settles that unlock it trail the claims in the outbox
    stake_jobs = 2 * math.ceil(n_jobs / n_clients) + 64 if finish else 64
    with (
        tempfile.TemporaryDirectory(prefix="gm-bench-claims-") as tmp,
        stack(
            Path(tmp),
            providers=n_clients,
            db=db,
            replicas=replicas,
            stake_jobs=stake_jobs,
            lease_ttl_s="900",
            node_timeout_s="900",
            duties_apart=duties_apart,
            token_ttl_s=str(token_ttl_s or 3600.0),  # the scheduler's default: an hour
            outbox_batch_calls=str(outbox_batch or BATCH_MAX_CALLS),
        ) as st,
    ):
        specs = spec_mix(random.Random(7), n_specs, WASM_CID)
        cids = publish_specs(st.ipfs, specs)
        kinds = {cid: spec_kind(spec) for cid, spec in zip(cids, specs, strict=True)}
        output_cid = st.ipfs.add_bytes(b"the bench's run output\n")
        funded: dict[str, float] = {}
        feeder = None
        if feed:  # jobs are funded while the nodes claim
            fund_s, queue_s = 0.0, 0.0

            def fund_behind() -> None:
                funded["s"] = fund_jobs(st.anvil.url, st.escrow, cids, n_jobs, funders=funders)

            feeder = threading.Thread(target=fund_behind, daemon=True)
            feeder.start()
        else:
            fund_s = fund_jobs_in_blocks(st.anvil.url, st.escrow, cids, n_jobs, funders=funders)
            queue_s = wait_queued(st.db_url, n_jobs, timeout=max(60.0, n_jobs / 20))
        urls = [p.url for p in st.replicas]
        auths: list[NodeAuth] = []  # the nodes' tokens, renewed on a 401 as the agent does

        async def go() -> Drained:
            async with httpx.AsyncClient(timeout=60) as http:
                nodes = await asyncio.gather(
                    *(
                        register(
                            http,
                            urls[i % len(urls)],
                            p,
                            st.deployment.chain_id,
                            st.deployment.escrow,
                            fleet_capacity(i, slots, gpus),
                        )
                        for i, p in enumerate(st.providers)
                    )
                )
            clients = []
            for i, (node_id, token) in enumerate(nodes):
                url = httpx.URL(urls[i % len(urls)])
                auth = NodeAuth(
                    token,
                    renewer(
                        urls[i % len(urls)],
                        st.providers[i],
                        st.deployment.chain_id,
                        st.deployment.escrow,
                        fleet_capacity(i, slots, gpus),
                    ),
                )
                auths.append(auth)
                clients.append(
                    Client(
                        url.host,
                        url.port or 80,
                        "POST",
                        API.NEXT_JOB.format(node_id=node_id) + "?wait_s=1.0",
                        auth.headers,
                        slots,
                        acceptor(st.providers[i], node_id, auth),
                        finisher(st.providers[i], node_id, auth, output_cid) if finish else None,
                        auth,
                    )
                )
            return await drain(
                clients,
                n_jobs,
                lambda b: str(json.loads(b)["job_id"]),
                # fed: the first jobs come after set-up, then funding; finishing: a node's slots
                # wait for the verdicts on its results (a long soak has pauses of its own)
                stall_s=120 if feed or finish else 15,
                progress_s=30 if finish else 0,
                progress_note=queued_note,
                max_s=60 * max_minutes,
            )

        async def queued_note() -> str:
            left = await asyncio.to_thread(queued_kinds, st.db_url, kinds)
            return f"queued by kind: {_kinds_line(left)}"

        tiers = [fleet_capacity(i, slots, gpus) for i in range(n_clients)]
        everyone = [*st.replicas, *st.duty_procs]  # the duty holders' CPU counts too
        procs = [psutil.Process(p.pid) for p in everyone if p.pid is not None]
        cpu0 = sum(sum(p.cpu_times()[:2]) for p in procs)
        with profiled([p.pid for p in everyone], profile, f"claims-{db}"):
            res = asyncio.run(go())
        cpu = sum(sum(p.cpu_times()[:2]) for p in procs) - cpu0
        scraped = [httpx.get(p.url + API.METRICS, timeout=10).text for p in everyone]
        rounds = sum(_metric(t, "gridmarket_dispatch_rounds") for t in scraped)
        lookups = {  # the acceptance check's free collateral: read on-chain or remembered
            src: sum(
                _metric(t, f'gridmarket_collateral_lookups{{source="{src}"}}') for t in scraped
            )
            for src in ("chain", "remembered")
        }
        # the assigns the leases queued: wait for the outbox to send them all to anvil (finishing
        # nodes: their settles too, far more than anvil takes in the run: counted, not awaited)
        store = Store(st.db_url)
        t0 = time.perf_counter()
        while True:
            out = store.outbox_counts()
            if finish or not out.get("pending", 0) or time.perf_counter() - t0 > 600:
                break
            time.sleep(0.5)
        outbox_s = res.elapsed + time.perf_counter() - t0
        store.close()
        if feeder is not None:
            feeder.join(timeout=60)
            fund_s = funded.get("s", float("nan"))
        engine = create_engine(st.db_url)
        with engine.connect() as conn:
            states: dict[str, int] = dict(
                conn.execute(select(jobs.c.state, func.count()).group_by(jobs.c.state)).all()
            )
            again = select(attempts.c.job_id).group_by(attempts.c.job_id).having(func.count() > 1)
            tried = conn.execute(
                select(
                    attempts.c.job_id,
                    attempts.c.attempt,
                    attempts.c.node_id,
                    attempts.c.started_at,
                    attempts.c.ended_at,
                    attempts.c.outcome,
                    attempts.c.detail,
                )
                .where(attempts.c.job_id.in_(again))
                .order_by(attempts.c.job_id, attempts.c.started_at)
            ).all()
        engine.dispose()
        overlapping, reoffered = _attempt_overlaps(tried)
        left = queued_kinds(st.db_url, kinds)
        by_tier: Counter[str] = Counter()
        empty_by_tier: Counter[str] = Counter()
        for cap, got, empty in zip(tiers, res.by_client, res.empty_by_client, strict=True):
            tier = cap.gpu.model if cap.gpu is not None else "cpu"
            by_tier[tier] += len(got)
            empty_by_tier[tier] += empty
        for job_id in overlapping[:12]:
            print(f"    DOUBLE: job {job_id} was held by two attempts at once:")
            for row in (r for r in tried if r.job_id == job_id):
                print(
                    f"      attempt {row.attempt} node {row.node_id} {row.started_at:.3f} -> "
                    f"{row.ended_at} {row.outcome} {row.detail}"
                )
    return {
        "who": f"ours, {db}" + (", duties apart" if duties_apart else ""),
        "replicas": replicas,
        "res": res,
        "cpu": cpu,
        "rounds": rounds,
        "lookups": lookups,
        "db_dupes": len(overlapping),
        "reoffered": reoffered,
        "outbox": out,
        "outbox_s": outbox_s,
        "batch": outbox_batch or BATCH_MAX_CALLS,
        "fund_s": fund_s,
        "queue_s": queue_s,
        "states": states,
        "left": left,
        "by_tier": by_tier,
        "empty_by_tier": empty_by_tier,
        "finish": finish,
        "feed": feed,
        "renewals": sum(a.renewals for a in auths),
    }


def _attempt_overlaps(rows: Sequence[Any]) -> tuple[list[str], Counter[str]]:
    """From the attempts of the jobs tried more than once (ordered by job, then start): the
    jobs two of whose attempts were open at once (one started before the one before it ended:
    a double assignment), and how the earlier attempts of the others ended (an offer whose
    long poll had already gone is handed back undelivered, ``declined``, and offered again)."""
    overlapping: list[str] = []
    reoffered: Counter[str] = Counter()
    by_job: dict[str, list[Any]] = {}
    for row in rows:
        by_job.setdefault(row.job_id, []).append(row)
    for job_id, tries in by_job.items():
        ends = [math.inf if r.ended_at is None else r.ended_at for r in tries]
        if any(later.started_at < end for later, end in zip(tries[1:], ends, strict=False)):
            overlapping.append(job_id)
        else:
            reoffered.update(str(r.outcome) for r in tries[:-1])
    return overlapping, reoffered


def run_sarva(n_jobs: int, n_clients: int) -> dict[str, Any]:
    sys.path.insert(0, str(HERE / "peers"))
    import sarva

    with tempfile.TemporaryDirectory(prefix="gm-bench-sarva-") as tmp:
        db = str(Path(tmp) / "sarva.db")
        port = free_port()
        nodes = [f"node-{i}" for i in range(n_clients)]
        sarva.seed(db, n_jobs, nodes)
        log = open(Path(tmp) / "sarva.log", "w")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "peers" / "sarva.py"), "--db", db, "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            for _ in range(200):
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            else:
                raise RuntimeError(f"the Sarva peer did not start: see {log.name}")
            clients = [
                Client("127.0.0.1", port, "GET", f"/jobs/next?node_id={n}", {}, 64) for n in nodes
            ]
            p = psutil.Process(proc.pid)
            cpu0 = sum(p.cpu_times()[:2])
            res = asyncio.run(
                drain(
                    clients,
                    n_jobs,
                    lambda b: str(json.loads(b)["job_id"]),
                    empty_means_done=True,
                    stall_s=60,  # its pool waits 30 s for a connection before it errs
                )
            )
            cpu = sum(p.cpu_times()[:2]) - cpu0
        finally:
            proc.terminate()  # uvicorn waits for requests still in its thread pool: not long
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            log.close()
        rows, db_dupes = sarva.assignments(db)
    return {
        "who": "Sarva (peer), sqlite",
        "replicas": 1,
        "res": res,
        "cpu": cpu,
        "rounds": 0,
        "db_dupes": db_dupes,
        "audit_rows": rows,
    }


def _counts(r: dict[str, Any]) -> str:
    return ", ".join(f"{n} {k}" for k, n in r["reoffered"].most_common()) or "none"


def _line(r: dict[str, Any]) -> str:
    d: Drained = r["res"]
    return (
        f"{r['who']}: {d.unique} jobs in {d.elapsed:.2f} s, "
        f"{d.unique / d.elapsed if d.elapsed else 0:.0f} claims/s, doubles {d.dupes}/"
        f"{r['db_dupes']}, outbox {r.get('outbox', '-')}, load {load_average()}"
    )


def main() -> None:
    # `timeout` and `kill` send SIGTERM: leave through the context managers, which stop
    # anvil, IPFS, the replicas and drop the database (Python's default leaves them running)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=2000, help="jobs funded on anvil and claimed")
    ap.add_argument("--clients", type=int, default=64, help="long-polling nodes")
    ap.add_argument(
        "--db",
        choices=["sqlite", "postgresql", "both", "none"],
        default="both",
        help="ours on which database(s); none: the peer only",
    )
    ap.add_argument("--specs", type=int, default=40, help="distinct job specs on IPFS")
    ap.add_argument("--gpus", type=int, default=16, help="cards per GPU node (its tier's)")
    ap.add_argument("--no-peer", action="store_true", help="skip the Sarva peer")
    ap.add_argument(
        "--finish",
        action="store_true",
        help="each node reports each job done (a signed result) before it asks again: any --jobs "
        "(the 100,000-claim soak)",
    )
    ap.add_argument(
        "--feed", action="store_true", help="fund the jobs while the nodes claim, not before"
    )
    ap.add_argument(
        "--funders", type=int, default=1, help="submitters funding jobs at once (1 to 7)"
    )
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=0.0,
        help="stop the claims after this long and report what was done (0: no limit)",
    )
    ap.add_argument(
        "--token-ttl-s",
        type=float,
        default=0.0,
        help="the node tokens' lifetime (TOKEN_TTL_S; 0: the scheduler's default, an hour); "
        "the nodes renew an expired one as the agent does",
    )
    ap.add_argument(
        "--outbox-batch",
        type=int,
        default=0,
        help="operator calls per tryMulticall transaction (OUTBOX_BATCH_CALLS; 0: the "
        "scheduler's default)",
    )
    ap.add_argument(
        "--duties-apart",
        action="store_true",
        help="PostgreSQL: the chain duty (watcher, outbox, specs) and the verify duty each in a "
        "replica of its own that serves no node (GRIDMARKET_SCHEDULER_DUTIES)",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="py-spy flame graphs of the replicas while the claims run, into this folder",
    )
    args = ap.parse_args()
    if args.jobs > 64 * args.clients and not args.finish:
        raise SystemExit(
            f"--jobs {args.jobs}: at most 64 per client ({64 * args.clients}) unless --finish"
        )
    dbs = {"both": ["sqlite", "postgresql"], "none": []}.get(args.db, [args.db])
    load0 = os.getloadavg()[0]
    print(f"{uptime()}")
    print(
        f"{args.jobs} jobs funded on anvil ({args.specs} specs on IPFS), {args.clients} "
        "long-polling nodes of the published tier mix, stake required, assigns through the outbox"
    )
    rows = []
    for db in dbs:
        rows.append(
            run_ours(
                db,
                args.jobs,
                args.clients,
                args.specs,
                args.gpus,
                args.profile,
                args.finish,
                args.funders,
                args.feed,
                args.max_minutes,
                args.duties_apart,
                args.token_ttl_s,
                args.outbox_batch,
            )
        )
        print(f"  done: {_line(rows[-1])}", flush=True)
    if not args.no_peer:
        rows.append(run_sarva(args.jobs, args.clients))
        print(f"  done: {_line(rows[-1])}", flush=True)
    print(
        f"{'who':<30} {'repl':>4} {'claims':>7} {'claims/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'retried':>8} {'refused':>8} {'rounds':>7} {'double c/db/chain':>18} "
        f"{'CPU ms/claim':>13}"
    )
    for r in rows:
        d: Drained = r["res"]
        rate = d.unique / d.elapsed if d.elapsed else 0.0
        chain = r["outbox"].get("failed", 0) if "outbox" in r else "-"
        doubles = f"{d.dupes}/{r['db_dupes']}/{chain}"
        print(
            f"{r['who']:<30} {r['replicas']:>4} {d.unique:>7} {rate:>9.0f} "
            f"{percentile(d.lat, 50) * 1e3:>7.1f} {percentile(d.lat, 99) * 1e3:>7.1f} "
            f"{d.empty:>8} {d.refused:>8} {r['rounds']:>7} {doubles:>18} "
            f"{r['cpu'] * 1e3 / max(1, d.claims):>13.2f}"
            + ("  STALLED" if d.stalled else "")
            + ("  STOPPED (--max-minutes)" if d.stopped else "")
        )
    for r in rows:
        if "by_tier" in r:
            print(
                f"{r['who']}: claims by node tier "
                + ", ".join(f"{t} {n}" for t, n in sorted(r["by_tier"].items()))
                + "; empty polls by tier "
                + ", ".join(f"{t} {n}" for t, n in sorted(r["empty_by_tier"].items()))
                + f"; queued at the end by kind: {_kinds_line(r['left'])}"
            )
        if r.get("finish"):
            d = r["res"]
            print(
                f"{r['who']}: funded {args.jobs} in {r['fund_s']:.1f} s"
                + (
                    " while the nodes claimed"
                    if r["feed"]
                    else f", queued {r['queue_s']:.1f} s later"
                )
                + "; "
                f"{d.finished} results taken, {d.unfinished} refused; jobs by state at the end "
                f"{r['states']}; outbox at the end {r['outbox']} (the settles and assigns not "
                f"yet sent are not awaited), {r['outbox'].get('done', 0) / r['outbox_s']:.1f} "
                f"rows/s confirmed on anvil, at most {r['batch']} calls a tryMulticall; re-offered "
                f"jobs' earlier attempts {_counts(r)}; node tokens renewed after a 401 "
                f"{r['renewals']}"
            )
        elif "outbox" in r:
            done = r["outbox"].get("done", 0)
            print(
                f"{r['who']}: funded {args.jobs} in {r['fund_s']:.1f} s, all queued (watcher + "
                f"IPFS spec fetch) {r['queue_s']:.1f} s later; outbox {r['outbox']}: "
                f"{done / r['outbox_s']:.0f} assigns/s confirmed on anvil; free collateral "
                f"read on-chain {r['lookups']['chain']} times, remembered "
                f"{r['lookups']['remembered']} (COLLATERAL_CACHE_S); re-offered jobs' earlier "
                f"attempts {_counts(r)}"
            )
        else:
            d = r["res"]
            print(
                f"{r['who']}: {r['audit_rows']} assignments written for {d.unique} jobs "
                f"({r['db_dupes']} jobs assigned twice or more; {d.claims} answers received)"
            )
    if len(rows) > 1 and "audit_rows" in rows[-1]:
        peer = rows[-1]["res"]
        peer_rate = peer.unique / peer.elapsed if peer.elapsed else 0.0
        for r in rows[:-1]:
            d = r["res"]
            if not peer_rate:
                print(f"{r['who']} / Sarva: the peer completed no claim")
                continue
            print(f"{r['who']} / Sarva: {d.unique / d.elapsed / peer_rate:.2f}x claims/s")
    mark = " (PROVISIONAL: load > 1)" if max(load0, os.getloadavg()[0]) > 1 else ""
    print(f"load before/after: {load0:.2f} / {load_average()}{mark}")
    print("goal: >= 1000 claims/s with 64 long-polling nodes, 0 double assignments")


if __name__ == "__main__":
    main()
