"""What each verification policy lets through, and what it costs, on the production path.

For each cell of ``--cheaters`` (percent of the provider nodes that lie) x ``--policies``:

* one stack for the whole run (``_stack.stack``): anvil + the escrow (version 5), the js-ipfs
  daemon, one scheduler (SQLite) with ``require_stake`` on and the operator key, so every
  ``assign``, relayed result, ``settle`` and ``resolve`` goes through the outbox to anvil;
* a fresh fleet per cell: ``--nodes`` new wallets, funded, registered and staked on-chain, each
  a simulated node of ``scripts/spawn_fleet.py`` (:class:`spawn_fleet.Node`) speaking the wire
  protocol: signed registration, heartbeats, ``next-job`` long polls, an EIP-712 acceptance of
  each offer, a real output added to IPFS and its signed CID reported. Honest nodes upload the
  right output (:func:`spawn_fleet.right_output`, a deterministic function of the job's
  workload, so replicas and re-runs agree); cheaters upload a plausible wrong one (same shape, a
  valid CID of real bytes, each cheater its own bytes, or one shared wrong output with
  ``--collude``); ``--lazy``
  nodes replay an output of an earlier job. Which nodes lie is a seeded shuffle. The scheduler
  stops offering work to a node whose results were outvoted (reputation); with ``--sybils`` a
  lying wallet that is slashed comes back as a fresh wallet (funded, registered, staked), as an
  attacker would, so liars keep their share of the runs (column ``lruns``);
* ``--jobs`` jobs per cell, each its own job spec on IPFS, funded on anvil by the submitter dev
  account while the nodes work, each as soon as fewer than ``--backlog`` funded seats wait for
  a node (so every node that asks gets work, whatever order the dispatcher prefers nodes in,
  and the liars run their share; the wait in that queue is part of funded -> paid):
  ``integrity`` jobs with ``createJob`` (one seat, a 0.001 ETH bounty, paid on the
  scheduler's check, ``FLAG_ON_VERIFY``: the single-provider life the gas goal names, and the
  quickest; nobody disputes here, so paying after the window would accept the same outputs),
  or ``integrity:window`` (relayed, finalized after the challenge window: the same steps as a
  seat); ``replicate:k`` jobs with ``createJob`` and ``replicas`` = k (k seats of a
  0.001 ETH share each; the scheduler keeps the seats on distinct wallets, as the escrow
  requires, relays each seat's result and sends ``resolve`` once every seat has one: the
  agreeing strict majority is paid, the rest slashed); ``spot:p`` jobs (below);
* when nothing moves any more and every open job has all its results on-chain (a 1-1 split of
  replicate:2, two different lies of replicate:3, or an after-window job), or nothing at all
  moved for ``--warp-after-s`` (a seat whose ``assign`` the chain refused waits for the
  deadline), the chain's clock is moved past the deadline plus the mediation window
  (``evm_increaseTime``) so the scheduler's deferred ``resolve``/``finalize`` go through; those
  jobs' times are not counted as latency.

Figures per cell, all from the chain's events and receipts unless said otherwise:

* **wrong accepted**: jobs whose paid result is not the right output (a single job's
  ``JobReleased`` with a ``ResultSubmitted`` CID other than the right one; a replicated job's
  ``Resolved`` with a majority digest other than the right CID's), of the jobs funded;
* **no result**: jobs refunded without a paid result (``Resolved`` with no majority);
* **runs/job**: results the nodes computed and reported (their own count), per job funded;
* **gas/job**: the sum of ``gasUsed`` of every transaction about the cell's jobs (funding,
  ``assign``, relayed results, ``settle``/``finalize``/``resolve``; found by decoding each
  escrow transaction's calldata in the cell's blocks, reverted ones included; a
  ``tryMulticall`` (or ``multicall``) batch of the outbox is decoded call by call, each
  charged an equal share of the batch's gas), per job funded.
  No withdrawals (``bench/gas.py`` amortises one per 10 jobs into its figure);
* **funded -> paid** p50/p99: from ``createJob``'s receipt to the first
  sight of ``JobReleased``/``Resolved`` (logs polled every 0.1 s), jobs paid without the clock
  moved;
* **slashed**: ``ProviderSlashed`` events: distinct cheating wallets slashed, and any honest one;
* **cheater net**: what the lying wallets were paid minus what they were slashed, per lying run,
  in bounties (0.001 ETH): negative means lying loses money.

**Spot checks** (``spot:0.1``, ``spot:0.25``; docs/trust.md, "Spot checks"): each job is
funded with ``createJob`` and ``FLAG_SPOT`` (twice the bounty: the bounty and the check deposit),
a collateral of ``max(minCollateral, spot.min_collateral(bounty, p))`` (nine bounties and a wei
at p = 0.1, three and a wei at p = 0.25), and a spec carrying ``spot`` as the submitter's
client writes it: a fresh seed per job (``spot.new_seed``), its commitment, and the seed sealed
to the deployment's mediator key (``spot.seal`` to ``spot.public_key_of`` of dev account 10,
checked against the listed mediator's address with ``spot.check_public_key``). The spec is a
deterministic Docker job (image pinned by digest), as a spot job must be. The nodes stake
``minStake`` + 64 such collaterals. The stack runs the **real mediator** (``python -m
mediator run``, :class:`devstack.mediator.MediatorProcess`, the listed mediator's
key), and everything about a check is the real mediator's: on each ``ResultSubmitted`` of a
spot job it reads the spec from IPFS, opens the sealed seed with its key against the commitment
(``spot.unseal``), and when ``spot.checked(seed, attempt, p_bps)`` sends its own ``dispute`` (no
value: the deposit is locked); it re-runs the disputed job through the
market on another node of the fleet (a plain job it funds, excluding the checked provider),
compares the two output CIDs, sends ``rule``, and releases its re-run. A result ruled wrong
sends the job back to Funded and the scheduler gives it to another node (the next attempt is
drawn afresh). An unchecked result is finalized by the scheduler once the challenge window
passed (``--challenge-s`` sets the deployment's window; the default is the deployment's hour,
after which the clock is moved and those latencies are not counted). The nodes compute a job's
right output from its workload (``spawn_fleet.workload_of``: the spec without name, exclusions
and spot policy), so a re-run of an honest result agrees with it. The bench knows each job's
seed (it is the submitter) and checks the mediator against it (:class:`SpotObserver`): every
attempt the seed draws must be disputed by the mediator and no other (``checks`` drawn/opened;
a difference is printed). Spot rows count the re-runs'
results in **runs/job** (extra compute), their transactions (the mediator's ``createJob``,
``assign``, relay, ``release``) with the checked job's in **gas/job**, and print the checks
opened (``checks``) and the expected profit of a lying run at the job's terms
(``spot.cheater_profit`` of the payout: ``(1 - p) (B - fee) - p C``, in bounties) beside the
measured **net**.

    python bench/verification.py                     # 0/10/30 % x integrity, replicate:2, :3
    python bench/verification.py --cheaters 30 --policies replicate:3 --jobs 1000 --sybils
    python bench/verification.py --policies spot:0.1,spot:0.25 --challenge-s 30

Goals (issue 10): replicate:3 accepts 0 wrong outputs in >= 1,000 jobs with <= 30 % cheaters;
spot:0.1 costs <= 1.15x compute and a cheater's expected profit is negative; a 3-replica life
<= 2.5x the gas of a single one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import secrets
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from _stack import (
    SUBMITTER,
    Stack,
    chain_time,
    load_average,
    percentile,
    rpc_batch,
    send_sync,
    stack,
    uptime,
    warp,
)
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils.crypto import keccak

from devstack.anvil import dev_accounts
from devstack.providers import new_providers
from gridmarket import spot
from gridmarket.chain import EscrowClient, Event
from gridmarket.cid import path_cid
from gridmarket.escrow import (
    FLAG_SPOT,
    JOB_EVENTS,
    JobState,
    Terms,
    apply_event,
    cid_digest,
    job_id,
    seat_ids,
)
from gridmarket.wire import API, JobSpec
from mediator.service import RERUN_SALT_TAG
from scheduler.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from spawn_fleet import Node, capacity, right_output, workload_of  # the simulated nodes

SHARE = 10**15
"""The bounty of a single job and of each seat of a replicated one (0.001 ETH)."""
POLICIES = {
    "integrity": 1, "integrity:window": 1, "replicate:2": 2, "replicate:3": 3,
    "spot:0.1": 1, "spot:0.25": 1,
}  # fmt: skip
"""Seats per job. ``integrity``: paid on the scheduler's check (``FLAG_ON_VERIFY``);
``integrity:window``: relayed and finalized after the challenge window; ``spot:p``: a spot job
checked with probability p per attempt."""
SPOT_P_BPS = {"spot:0.1": 1000, "spot:0.25": 2500}
MAX_ATTEMPTS = 32
"""Attempts of a spot job whose re-run ids the bench looks for (the mediator's fixed salt)."""
SETTLE_QUIET_S = 3.0
"""Seconds without a new event, every open job's results on-chain, before the clock is moved."""


def output_cid(data: bytes) -> str:
    """The CID of ``data`` added as the nodes add an output (``spawn_fleet.add_output``: a
    directory holding ``result.txt``), computed here without IPFS."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        (out / "result.txt").write_bytes(data)
        return path_cid(out)


@dataclass
class Job:
    """One funded job: a single job (``seats`` is itself) or a replicated job (its group)."""

    key: str
    spec_cid: str
    right_cid: str
    seats: list[str]
    deadline: int
    funded_at: float = 0.0
    paid_at: float | None = None
    seed: bytes | None = None
    """A spot job's seed (what the submitter's client keeps until the job is settled)."""
    p_bps: int | None = None


class Watcher(threading.Thread):
    """Reads every escrow event from ``start`` on, every 0.1 s, noting when each was first
    seen on this machine's clock."""

    def __init__(self, escrow: EscrowClient, start: int) -> None:
        super().__init__(daemon=True)
        self.escrow, self.next = escrow, start
        self.events: list[Event] = []
        self.seen: dict[tuple[str, str], float] = {}
        self.changed = time.perf_counter()
        self.halt = threading.Event()
        self.error: Exception | None = None

    def poll(self) -> None:
        head = self.escrow.w3.eth.block_number
        if head < self.next:
            return
        got = self.escrow.events(self.next, head)
        now = time.perf_counter()
        self.next = head + 1
        for ev in got:
            key = ev.args.get("jobId", ev.args.get("groupId"))
            if key is not None:
                self.seen.setdefault((ev.name, "0x" + bytes(key).hex()), now)
        if got:
            self.events.extend(got)
            self.changed = now

    def run(self) -> None:
        while not self.halt.wait(0.1):
            try:
                self.poll()
            except Exception as exc:  # reported by the bench, which stops
                self.error = exc
                return


def make_specs(
    n: int,
    tag: str,
    p_bps: int | None = None,
    mediator_key: bytes | None = None,
    submitter: str = "",
) -> tuple[list[JobSpec], list[bytes | None]]:
    """``n`` distinct small Docker jobs: each has its own workload, so its own right output.
    With ``p_bps``, spot jobs as the submitter's client writes them: deterministic (the image
    pinned by digest), a fresh seed per job committed in ``spot`` and sealed to the public key
    of ``mediator_key`` (checked against its address first), both bound to ``submitter``. The
    seeds, None for other jobs."""
    seal_to = b""
    if p_bps is not None:
        assert mediator_key is not None
        public = spot.public_key_of(mediator_key)
        seal_to = spot.check_public_key(public, Account.from_key(mediator_key).address)
    specs, seeds = [], []
    for i in range(n):
        body: dict[str, Any] = {
            "name": f"verify-{tag}-{i}",
            "executor": "docker",
            "image": "busybox:1",
            "command": ["sh", "-c", f"echo {tag}-{i}"],
            "env": {"BENCH_JOB": f"{tag}-{i}"},
            "resources": {"cpu_cores": 1, "ram_mib": 128, "disk_mib": 64},
            "limits": {"timeout_s": 300},
        }
        seed = None
        if p_bps is not None:
            seed = spot.new_seed()
            digest = keccak(text=f"bench image {tag}").hex()
            body["image"] = f"busybox@sha256:{digest}"
            body["deterministic"] = True
            body["spot"] = {
                "p_bps": p_bps,
                "commit": "0x" + spot.commit_of(seed, submitter).hex(),
                "sealed": "0x" + spot.seal(seed, seal_to, submitter).hex(),
            }
        specs.append(JobSpec.model_validate(body))
        seeds.append(seed)
    return specs, seeds


def spot_terms(escrow: EscrowClient, p_bps: int) -> Terms:
    """A spot job's terms: the listed mediator, ``FLAG_SPOT``, and the collateral that makes
    lying unprofitable at p (at least the escrow's floor)."""
    least = max(escrow.min_collateral(SHARE), spot.min_collateral(SHARE, p_bps))
    listed = escrow.default_terms(SHARE, "0x" + "00" * 20).mediator
    return Terms(listed, least, FLAG_SPOT)


class SpotObserver(threading.Thread):
    """Holds the real mediator to the draws: on each ``ResultSubmitted`` of one of ``jobs``
    (folded from the watcher's events) the bench, knowing the job's seed as its submitter, works
    out whether the attempt is drawn (``spot.checked``); each ``ResultDisputed`` of a spot job
    (nobody else disputes here) is a check the mediator opened. ``missed``: drawn attempts the
    mediator did not check; ``unasked``: checks of attempts not drawn."""

    def __init__(self, watcher: Watcher, jobs: list[Job]) -> None:
        super().__init__(daemon=True)
        self.watcher = watcher
        self.jobs = jobs
        self.states: dict[str, JobState] = {}
        self.seen = 0
        self.drawn: set[tuple[str, int]] = set()
        self.opened: list[tuple[str, int]] = []
        self.skipped = 0
        self.halt = threading.Event()
        self.error: Exception | None = None

    def step(self) -> None:
        seeds = {j.key: j for j in self.jobs if j.key and j.seed is not None}
        fresh = self.watcher.events[self.seen :]
        self.seen += len(fresh)
        for ev in fresh:
            if ev.name not in JOB_EVENTS or "jobId" not in ev.args:
                continue
            key = "0x" + bytes(ev.args["jobId"]).hex()
            job = seeds.get(key)
            if job is None:
                continue
            state = apply_event(self.states.get(key), ev.name, ev.args)
            self.states[key] = state
            if ev.name == "ResultSubmitted" and state.job.flags & FLAG_SPOT:
                assert job.seed is not None and job.p_bps is not None
                if spot.checked(job.seed, state.job.attempt, job.p_bps):
                    self.drawn.add((key, state.job.attempt))
                else:
                    self.skipped += 1
            elif ev.name == "ResultDisputed":
                self.opened.append((key, state.job.attempt))

    @property
    def missed(self) -> list[tuple[str, int]]:
        return sorted(self.drawn - set(self.opened))

    @property
    def unasked(self) -> list[tuple[str, int]]:
        return sorted(set(self.opened) - self.drawn)

    def run(self) -> None:
        while not self.halt.wait(0.1):
            try:
                self.step()
            except Exception as exc:  # reported by the bench, which stops
                self.error = exc
                return


def fund(
    st: Stack,
    jobs: list[Job],
    k: int,
    on_verify: bool,
    args: argparse.Namespace,
    http: httpx.Client,
) -> None:
    """Fund ``jobs`` in turn from the submitter dev account, ``createJob`` of one job (k = 1)
    or of k seats (``replicas``), each as soon as fewer than ``args.backlog`` funded seats
    wait for a node (not yet leased: funded but not yet seen by the scheduler, ``pending_spec``
    or ``queued`` in its store), so every node that asks finds work and the dispatcher's
    preferences do not pick who runs; at most ``args.rate`` jobs per second. Each job's
    funding time is its receipt's. With ``args.fund_for``, funding stops after that many
    seconds and ``jobs`` is cut to the jobs funded."""
    submitter = Account.from_key(dev_accounts(SUBMITTER + 1)[SUBMITTER]).address
    terms = st.escrow.default_terms(SHARE, submitter, on_verify=on_verify and k == 1)
    if args.p_bps is not None:
        terms = spot_terms(st.escrow, args.p_bps)
    terms = replace(terms, operator=st.escrow.expected_operator(terms))  # read once
    backlog = args.backlog or args.nodes
    store = Store(st.db_url)
    try:
        known0 = sum(store.job_counts().values())
        t0 = time.perf_counter()
        for i, job in enumerate(jobs):
            if args.fund_for and time.perf_counter() - t0 > args.fund_for:
                print(f"    --fund-for {args.fund_for:g} s: {i} jobs funded", flush=True)
                del jobs[i:]
                return
            wait = t0 + i / args.rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            while True:
                counts = store.job_counts()
                unseen = i * k - (sum(counts.values()) - known0)
                waiting = unseen + counts.get("queued", 0) + counts.get("pending_spec", 0)
                if waiting < backlog:
                    break
                time.sleep(0.1)
            _fund_one(st, http, submitter, terms, job, i, k)
    finally:
        store.close()


def _fund_one(
    st: Stack, http: httpx.Client, submitter: str, terms: Any, job: Job, i: int, k: int
) -> None:
    salt = secrets.token_bytes(32)
    ident = job_id(submitter, job.spec_cid, salt)
    job.key = "0x" + ident.hex()
    data = st.escrow.encode(
        "createJob",
        salt,
        job.spec_cid,
        job.deadline,
        terms.operator,  # expectedOperator
        terms.mediator,
        terms.collateral,
        terms.flags,
        0 if k == 1 else k,  # replicas
    )
    if k == 1:
        job.seats = [job.key]
    else:
        job.seats = ["0x" + s.hex() for s in seat_ids(ident, k)]
    tx = {
        "from": submitter,
        "to": st.escrow.address,
        "data": "0x" + data.hex(),
        "value": hex(terms.funding(SHARE) * k),
        "gas": hex(250_000 * k),
    }
    send_sync(http, st.anvil.url, tx, f"funding job {i} ({'createJob' if k == 1 else k})")
    job.funded_at = time.perf_counter()


def gas_by_job(
    st: Stack, http: httpx.Client, first: int, last: int, owner: dict[str, str]
) -> tuple[dict[str, int], dict[str, list[int]], int]:
    """Gas of every escrow transaction in blocks ``first..last`` about a job of ``owner``
    (seat or job id -> the job's key), found by decoding its calldata: gas per job key, gas
    per function name, and how many of them reverted."""
    per_job: dict[str, int] = defaultdict(int)
    per_fn: dict[str, list[int]] = defaultdict(list)
    reverted = 0
    escrow = st.escrow.address.lower()
    for lo in range(first, last + 1, 50):
        blocks = range(lo, min(last, lo + 49) + 1)
        calls = [("eth_getBlockByNumber", [hex(b), True]) for b in blocks]
        calls += [("eth_getBlockReceipts", [hex(b)]) for b in blocks]
        answers = rpc_batch(http, st.anvil.url, calls)
        n = len(blocks)
        for block, receipts in zip(answers[:n], answers[n:], strict=True):
            gas = {r["transactionHash"]: r for r in receipts or []}
            for tx in block["transactions"]:
                if (tx.get("to") or "").lower() != escrow:
                    continue
                fn, args = st.escrow.contract.decode_function_input(tx["input"])
                # the outbox batches operator steps in (try)multicall: each inner call is one
                # step, charged an equal share of the batch's gas
                steps: list[tuple[Any, Any]] = (
                    [st.escrow.contract.decode_function_input(c) for c in args["data"]]
                    if fn.fn_name in ("multicall", "tryMulticall")
                    else [(fn, args)]
                )
                receipt = gas[tx["hash"]]
                share = int(receipt["gasUsed"], 16) / max(1, len(steps))
                counted = False
                for inner, inner_args in steps:
                    name = inner.fn_name
                    if name == "createJob":
                        ident = job_id(tx["from"], inner_args["specCid"], bytes(inner_args["salt"]))
                    else:
                        first_arg = inner.abi["inputs"][0]["name"]
                        value = inner_args.get(first_arg)  # registerProvider's is a string
                        ident = bytes(value) if isinstance(value, bytes | bytearray) else b""
                    key = owner.get("0x" + ident.hex()) if len(ident) == 32 else None
                    if key is None:
                        continue
                    per_job[key] += round(share)
                    per_fn[name].append(round(share))
                    counted = True
                if counted and int(receipt["status"], 16) != 1:
                    reverted += 1
    return per_job, per_fn, reverted


async def run_nodes(
    st: Stack,
    base: str,
    accounts: list[LocalAccount],
    behaviours: list[str],
    args: argparse.Namespace,
    watcher: Watcher,
    body: Any,
) -> tuple[list[Node], Any]:
    """Register the fleet, let it work while ``body()`` runs, then stop it. With
    ``args.sybils``, a lying node whose wallet is slashed is stopped and replaced by a fresh
    wallet (funded, registered, staked) that lies the same way, as an attacker whose wallet the
    scheduler stops offering work to would do: the lying share of the fleet stays the same."""
    stats: Counter[str] = Counter()
    limits = httpx.Limits(max_connections=4 * len(accounts) + 10)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        info = (await client.get(base + API.INFO)).json()
        until = time.monotonic() + 10**6
        nodes: list[Node] = []
        tasks: list[asyncio.Task[None]] = []

        async def start(acct: LocalAccount, behaviour: str) -> Node:
            n = Node(
                client,
                base,
                acct,
                f"verify-{len(nodes):03d}",
                capacity("cpu", "us"),
                st.ipfs,
                stats,
                behaviour,
                args.collude,
            )
            nodes.append(n)
            await n.register(info["chain_id"], info["escrow"])
            tasks.append(asyncio.create_task(n.heartbeats(info["heartbeat_interval_s"], until)))
            tasks.append(asyncio.create_task(n.work(until, args.run_s)))
            return n

        for acct, behaviour in zip(accounts, behaviours, strict=True):
            await start(acct, behaviour)

        async def replace_caught() -> None:
            seen = 0
            funder = Account.from_key(dev_accounts(1)[0])
            stake = args.stake_wei
            while True:
                await asyncio.sleep(0.25)
                fresh, seen = watcher.events[seen:], len(watcher.events)
                caught = {
                    str(e.args["provider"]).lower() for e in fresh if e.name == "ProviderSlashed"
                }
                for n in list(nodes):
                    if n.behaviour == "honest" or n.stopped:
                        continue
                    if n.account.address.lower() in caught:
                        n.stopped = True
                        (acct,) = await asyncio.to_thread(
                            new_providers, st.escrow, funder, 1, metadata_cid="bafkreibenchsybil",
                            stake_wei=stake,
                        )  # fmt: skip
                        await start(acct, n.behaviour)
                        stats["sybils"] += 1

        monitor = asyncio.create_task(replace_caught()) if args.sybils else None
        try:
            result = await body()
        finally:
            if monitor is not None:
                monitor.cancel()
                await asyncio.gather(monitor, return_exceptions=True)
            for n in nodes:
                n.stopped = True
            done, pending = await asyncio.wait(tasks, timeout=20)
            for t in pending:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if monitor is not None and not monitor.cancelled() and monitor.exception() is not None:
            raise RuntimeError(f"replacing caught liars failed: {monitor.exception()!r}")
        for t in done:
            if not t.cancelled() and t.exception() is not None:
                print(f"    a node's loop failed: {t.exception()!r}", flush=True)
    return nodes, result


def run_cell(
    st: Stack, pct: float, policy: str, args: argparse.Namespace, rng: random.Random
) -> dict[str, Any]:
    k = POLICIES[policy]
    p_bps = SPOT_P_BPS.get(policy)
    args = argparse.Namespace(**{**vars(args), "p_bps": p_bps})
    collateral = spot_terms(st.escrow, p_bps).collateral if p_bps else SHARE
    args.stake_wei = int(st.escrow.call("minStake")) + 64 * collateral
    funder = Account.from_key(dev_accounts(1)[0])
    accounts = new_providers(
        st.escrow,
        funder,
        args.nodes,
        metadata_cid="bafkreibenchverify",
        stake_wei=args.stake_wei,
    )
    n_cheat = round(args.nodes * pct / 100)
    n_lazy = round(args.nodes * args.lazy / 100)
    behaviours = ["cheater"] * n_cheat + ["lazy"] * n_lazy
    behaviours += ["honest"] * (args.nodes - len(behaviours))
    rng.shuffle(behaviours)

    tag = secrets.token_hex(3)
    mediator_key = bytes.fromhex(st.mediator_key.removeprefix("0x"))
    submitter = Account.from_key(dev_accounts(SUBMITTER + 1)[SUBMITTER]).address
    specs, seeds = make_specs(args.jobs, tag, p_bps, mediator_key, submitter)
    cids = [st.ipfs.add_bytes(s.to_bytes()) for s in specs]
    with httpx.Client(timeout=120) as http:
        now = chain_time(http, st.anvil.url)
        deadline = now + 2 * 3600
        jobs = [
            Job("", c, output_cid(right_output(workload_of(s.model_dump(mode="json")))), [],
                deadline, seed=seed, p_bps=p_bps)
            for c, s, seed in zip(cids, specs, seeds, strict=True)
        ]  # fmt: skip
        start_block = int(rpc_batch(http, st.anvil.url, [("eth_blockNumber", [])])[0], 16) + 1
        watcher = Watcher(st.escrow, start_block)
        watcher.start()
        checker = SpotObserver(watcher, jobs) if p_bps else None
        if checker is not None:
            checker.start()
        base = st.replicas[0].url
        on_verify = policy == "integrity"
        state: dict[str, Any] = {"warped": None, "stalled": False}

        def finished(job: Job) -> bool:
            if k == 1:
                return ("JobReleased", job.key) in watcher.seen
            return ("Resolved", job.key) in watcher.seen

        def all_submitted(job: Job) -> bool:
            return all(("ResultSubmitted", s) in watcher.seen for s in job.seats)

        async def body() -> None:
            fund_task = asyncio.create_task(
                asyncio.to_thread(fund, st, jobs, k, on_verify, args, http)
            )
            while True:
                await asyncio.sleep(0.25)
                if watcher.error is not None:
                    raise watcher.error
                if checker is not None and checker.error is not None:
                    raise checker.error
                if fund_task.done():
                    fund_task.result()  # a funding failure stops the bench
                else:
                    continue
                open_jobs = [j for j in jobs if not finished(j)]
                if not open_jobs:
                    return
                quiet = time.perf_counter() - watcher.changed
                if (
                    state["warped"] is None
                    and quiet > SETTLE_QUIET_S
                    and (
                        (not p_bps and all(all_submitted(j) for j in open_jobs))
                        or quiet > args.warp_after_s  # a spot job may be under a check
                    )
                ):
                    mediation = int(st.escrow.call("mediationWindow"))
                    challenge = int(st.escrow.call("challengeWindow"))
                    now = chain_time(http, st.anvil.url)
                    to = max(deadline + mediation, now + challenge) + 10
                    print(
                        f"    {len(open_jobs)} jobs unpaid, nothing new for {quiet:.0f} s: "
                        f"chain clock moved {to - now} s ahead, past deadline + mediation window",
                        flush=True,
                    )
                    warp(http, st.anvil.url, to)
                    state["warped"] = time.perf_counter()
                    watcher.changed = time.perf_counter()
                elif state["warped"] is not None and quiet > args.stall_s:
                    state["stalled"] = True
                    return

        wall0 = time.perf_counter()
        nodes, _ = asyncio.run(run_nodes(st, base, accounts, behaviours, args, watcher, body))
        wall = time.perf_counter() - wall0
        time.sleep(0.5)
        watcher.halt.set()
        watcher.join()
        watcher.poll()  # the last blocks
        if checker is not None:
            checker.halt.set()
            checker.join()
        last_block = watcher.next - 1

        owner: dict[str, str] = {}
        for j in jobs:
            owner[j.key] = j.key
            for s in j.seats:
                owner[s] = j.key
        # the mediator's re-runs of the checks: its fixed salt names the checked job
        reruns = 0
        if p_bps:
            salts = {
                keccak(RERUN_SALT_TAG + bytes.fromhex(j.key[2:]) + a.to_bytes(2, "big")): j.key
                for j in jobs
                for a in range(1, MAX_ATTEMPTS)
            }
            mediator = Account.from_key(st.mediator_key).address.lower()
            for ev in watcher.events:
                if ev.name != "JobCreated" or str(ev.args["submitter"]).lower() != mediator:
                    continue
                checked_job = salts.get(bytes(ev.args["salt"]))
                if checked_job is not None:
                    owner["0x" + bytes(ev.args["jobId"]).hex()] = checked_job
                    reruns += 1
        per_job, per_fn, reverted = gas_by_job(st, http, start_block, last_block, owner)

    # ------------------------------------------------------------------ the chain's verdicts
    submitted: dict[str, str] = {}
    released: dict[str, Event] = {}
    resolved: dict[str, Event] = {}
    slashes: list[Event] = []
    for ev in watcher.events:
        ident = ev.args.get("jobId", ev.args.get("groupId"))
        key = "0x" + bytes(ident).hex() if ident is not None else ""
        if ev.name == "ResultSubmitted":
            submitted[key] = str(ev.args["outputCid"])
        elif ev.name == "JobReleased":
            released[key] = ev
        elif ev.name == "Resolved":
            resolved[key] = ev
        elif ev.name == "ProviderSlashed" and key in owner:
            slashes.append(ev)
    wrong = no_result = right = 0
    lat: list[float] = []
    for j in jobs:
        if k == 1:
            paid = j.key in released
            # the paid attempt's result is the job's last ResultSubmitted
            bad = paid and submitted.get(j.key) != j.right_cid
        else:
            res = resolved.get(j.key)
            paid = bad = False
            if res is not None:
                paid = int(res.args["agreeing"]) > 0
                bad = paid and bytes(res.args["resultDigest"]) != cid_digest(j.right_cid)
                no_result += int(not paid)
        wrong += int(bad)
        right += int(paid and not bad)
        seen = watcher.seen.get(("JobReleased" if k == 1 else "Resolved", j.key))
        if paid and seen is not None and (state["warped"] is None or seen < state["warped"]):
            lat.append(seen - j.funded_at)
    who = {n.account.address.lower(): n.behaviour for n in nodes}
    runs = [(n.behaviour, r) for n in nodes for r in n.reports if owner.get(r[0])]
    expected = None
    if p_bps:
        collateral = spot_terms(st.escrow, p_bps).collateral
        payout = SHARE - SHARE * int(st.escrow.call("feeBps")) // 10_000  # what a liar is paid
        expected = float(spot.cheater_profit(payout, collateral, p_bps)) / SHARE
    liar_runs = sum(1 for b, _ in runs if b != "honest")
    liar_paid = sum(
        int(e.args["payout"])
        for e in released.values()
        if who.get(str(e.args["provider"]).lower()) in ("cheater", "lazy")
    )
    liar_slashed = sum(
        int(e.args["amount"])
        for e in slashes
        if who.get(str(e.args["provider"]).lower()) in ("cheater", "lazy")
    )
    slashed_wallets = {str(e.args["provider"]).lower() for e in slashes}
    store = Store(st.db_url)
    try:
        outbox = store.outbox_counts()
        stuck = []
        for j in jobs:
            if not finished(j):
                for s in j.seats:
                    row = store.job(s)
                    stuck.append(f"{s[:10]} {row.state} {row.reason}")
    finally:
        store.close()
    return {
        "pct": pct,
        "lazy_pct": args.lazy,
        "policy": policy,
        "jobs": len(jobs),
        "wrong": wrong,
        "right": right,
        "no_result": no_result,
        "unfinished": sum(1 for j in jobs if not finished(j)),
        "runs": len(runs),
        "liar_runs": liar_runs,
        "gas": sum(per_job.values()),
        "per_fn": per_fn,
        "reverted": reverted,
        "lat": lat,
        "warped": state["warped"] is not None,
        "stalled": state["stalled"],
        "cheaters": sum(1 for b in who.values() if b == "cheater"),
        "lazy": sum(1 for b in who.values() if b == "lazy"),
        "cheaters_slashed": sum(1 for w in slashed_wallets if who.get(w) == "cheater"),
        "lazy_slashed": sum(1 for w in slashed_wallets if who.get(w) == "lazy"),
        "honest_slashed": sum(
            1 for e in slashes if who.get(str(e.args["provider"]).lower()) == "honest"
        ),
        "slashes": len(slashes),
        "liar_net": (liar_paid - liar_slashed) / SHARE / liar_runs if liar_runs else None,
        "outbox": outbox,
        "stuck": stuck,
        "wall": wall,
        "node_stats": dict(nodes[0].stats) if nodes else {},
        "checks": len(checker.opened) if checker is not None else 0,
        "unchecked": checker.skipped if checker is not None else 0,
        "check_failures": (
            [f"drawn, not checked: {k[:10]} attempt {a}" for k, a in checker.missed]
            + [f"checked, not drawn: {k[:10]} attempt {a}" for k, a in checker.unasked]
            if checker is not None
            else []
        ),
        "reruns": reruns,
        "expected_net": expected,
    }


def _row(r: dict[str, Any]) -> str:
    n = r["jobs"]
    p50 = f"{percentile(r['lat'], 50):.2f}" if r["lat"] else "-"
    p99 = f"{percentile(r['lat'], 99):.2f}" if r["lat"] else "-"
    net = "-" if r["liar_net"] is None else f"{r['liar_net']:+.2f}"
    liars = r["cheaters"] + r["lazy"]
    return (
        f"{r['pct']:>4.0f}% {r['lazy_pct']:>4.0f}% {r['policy']:<16} {n:>5} {r['wrong']:>5} "
        f"{100 * r['wrong'] / n:>6.2f}% "
        f"{100 * r['no_result'] / n:>6.1f}% {r['runs'] / n:>5.2f}x {r['gas'] / n:>9,.0f} "
        f"{p50:>6} {p99:>6} {100 * r['liar_runs'] / max(1, r['runs']):>5.0f}% "
        f"{r['cheaters_slashed'] + r['lazy_slashed']:>3}/{liars:<3} {r['slashes']:>4} "
        f"{r['honest_slashed']:>4} {net:>6}"
        + (
            f"  checks {r['checks']}/{r['checks'] + r['unchecked']} results, "
            f"re-runs {r['reruns']}, expected net {r['expected_net']:+.6f}"
            if r["expected_net"] is not None
            else ""
        )
        + ("  STALLED" if r["stalled"] else "")
        + (f"  {r['unfinished']} unfinished" if r["unfinished"] else "")
    )


HEADER = (
    f"{'cheat':>5} {'lazy':>5} {'policy':<16} {'jobs':>5} {'wrong':>5} {'wrong%':>7} {'no res':>7} "
    f"{'runs':>6} {'gas/job':>9} {'p50 s':>6} {'p99 s':>6} {'lruns':>6} {'slashed':>7} "
    f"{'cuts':>4} {'hon.':>4} {'net':>6}"
)


def _fn_line(r: dict[str, Any]) -> str:
    parts = [f"{name} {len(v)} x {sum(v) / len(v):,.0f}" for name, v in sorted(r["per_fn"].items())]
    return ", ".join(parts) + (f"; {r['reverted']} reverted" if r["reverted"] else "")


def _tick(url: str, stop: threading.Event) -> None:
    """Mine an empty block every second until ``stop`` (anvil mines only on a transaction, so
    without this a quiet chain's clock stands still and no challenge window ever passes)."""
    with httpx.Client(timeout=10) as http:
        while not stop.wait(1.0):
            with contextlib.suppress(httpx.HTTPError, RuntimeError):
                rpc_batch(http, url, [("evm_mine", [])])


def parse_list(text: str, allowed: Sequence[str] | None = None) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if allowed is not None:
        bad = [t for t in items if t not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"{bad}: choose from {', '.join(allowed)}")
    return items


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=20, help="jobs funded per cell")
    ap.add_argument("--nodes", type=int, default=10, help="simulated provider nodes per cell")
    ap.add_argument(
        "--cheaters", default="0,10,30", help="percents of lying nodes, comma-separated"
    )
    ap.add_argument(
        "--policies",
        default="integrity,replicate:2,replicate:3",
        help=f"comma-separated, of {', '.join(POLICIES)}",
    )
    ap.add_argument(
        "--collude", action="store_true", help="cheaters upload one shared wrong output"
    )
    ap.add_argument("--lazy", type=float, default=0, help="percent of nodes replaying outputs")
    ap.add_argument(
        "--sybils",
        action="store_true",
        help="replace each slashed lying wallet by a fresh one that lies the same way",
    )
    ap.add_argument("--rate", type=float, default=20.0, help="most jobs funded per second")
    ap.add_argument(
        "--backlog",
        type=int,
        default=0,
        help="fund while fewer seats than this wait for a node (default: --nodes)",
    )
    ap.add_argument(
        "--fund-for",
        type=float,
        default=0,
        help="stop funding a cell after this many seconds (0: fund all --jobs)",
    )
    ap.add_argument("--run-s", type=float, default=0.5, help="simulated run time of a job")
    ap.add_argument(
        "--warp-after-s",
        type=float,
        default=30,
        help="move the clock past the deadlines after this long without a new event, even "
        "when a seat has no result on-chain (its assign was refused): such a seat is refunded "
        "by resolve only after the deadline",
    )
    ap.add_argument(
        "--stall-s", type=float, default=90, help="give a cell up after this quiet, once warped"
    )
    ap.add_argument(
        "--challenge-s",
        type=int,
        default=0,
        help="the escrow's challenge window in seconds (0: the deployment default, an hour); "
        "set, an empty block is also mined every second so that the window passes on a quiet "
        "chain",
    )
    ap.add_argument("--seed", type=int, default=10)
    ap.add_argument(
        "--work",
        type=Path,
        default=None,
        help="keep the stack's folder (scheduler and anvil logs, the database) here",
    )
    args = ap.parse_args()
    try:
        pcts = [float(p) for p in parse_list(args.cheaters)]
        policies = parse_list(args.policies, list(POLICIES))
    except (ValueError, argparse.ArgumentTypeError) as exc:
        ap.error(str(exc))
    if any(not 0 <= p + args.lazy <= 100 for p in pcts):
        ap.error("--cheaters plus --lazy must be between 0 and 100 percent")
    if args.nodes < max(POLICIES[p] for p in policies):
        ap.error(f"--nodes {args.nodes}: fewer than the seats of a replicated job")
    load0 = os.getloadavg()[0]
    print(uptime())
    print(
        f"{args.jobs} jobs per cell funded with a backlog of {args.backlog or args.nodes} "
        f"seats waiting for a node (at most {args.rate:g}/s), {args.nodes} simulated nodes per "
        f"cell (fresh wallets), liars {'colluding' if args.collude else 'each its own lie'}, "
        f"lazy {args.lazy:g} %, simulated run {args.run_s} s (x0.5..1.5)"
        + (", slashed liars come back as fresh wallets" if args.sybils else ""),
        flush=True,
    )
    rng = random.Random(args.seed)
    rows = []
    with (
        (
            contextlib.nullcontext(str(args.work))
            if args.work
            else tempfile.TemporaryDirectory(prefix="gm-bench-verify-")
        ) as tmp,
        stack(
            Path(tmp),
            providers=0,
            db="sqlite",
            escrow={"challenge_window": args.challenge_s} if args.challenge_s else None,
            mediator=any(p in SPOT_P_BPS for p in policies),
        ) as st,
    ):
        ticker = threading.Event()
        if args.challenge_s:  # blocks every second, as a chain has: the clock moves when idle
            threading.Thread(target=_tick, args=(st.anvil.url, ticker), daemon=True).start()
        for pct in pcts:
            for policy in policies:
                t0 = time.perf_counter()
                r = run_cell(st, pct, policy, args, rng)
                rows.append(r)
                print(
                    f"  done {pct:g} % {policy}: {time.perf_counter() - t0:.0f} s, "
                    f"load {load_average()}, outbox {r['outbox']}, nodes {r['node_stats']}",
                    flush=True,
                )
                for line in r["stuck"][:10]:
                    print(f"    open: {line}")
        ticker.set()
    print()
    print(HEADER)
    for r in rows:
        print(_row(r))
    print(
        "cheat, lazy: percent of the nodes that lie, that replay; wrong: paid results that "
        "are not the right output; no res: refunded without a paid result; runs: results "
        "computed per job; lruns: share of runs by lying nodes; "
        "slashed: lying wallets slashed / lying wallets; cuts: slash events; hon.: honest "
        "slashes; net: lying wallets' pay minus slashes per lying run, in bounties; spot rows: "
        "checks opened / results posted, the mediator's re-runs, and the expected net of a "
        "lying run at the job's terms ((1 - p) B - p C, in bounties)"
    )
    for r in rows:
        for line in r["check_failures"][:5]:
            print(f"  a check {r['pct']:g} % {r['policy']} could not be opened: {line}")
    for r in rows:
        print(f"  gas {r['pct']:g} % {r['policy']}: {_fn_line(r)}")
    # ------------------------------------------------------------------ goals
    triple = [r for r in rows if r["policy"] == "replicate:3"]
    if triple:
        hard = [r for r in triple if r["pct"] + r["lazy_pct"] <= 30]
        jobs = sum(r["jobs"] for r in hard)
        bad = sum(r["wrong"] for r in hard)
        top = max(r["pct"] + r["lazy_pct"] for r in hard) if hard else 0
        verdict = "met" if bad == 0 and jobs >= 1000 else ("missed" if bad else "not yet shown")
        print(
            f"goal replicate:3 accepts 0 wrong in >= 1,000 jobs at <= 30 % liars: {bad} wrong in "
            f"{jobs} jobs (up to {top:g} % liars{', colluding' if args.collude else ''}): "
            f"{verdict}"
        )
    for name in ("integrity", "integrity:window"):
        single = [r for r in rows if r["policy"] == name]
        if not (single and triple):
            continue
        g1 = sum(r["gas"] for r in single) / sum(r["jobs"] for r in single)
        g3 = sum(r["gas"] for r in triple) / sum(r["jobs"] for r in triple)
        print(
            f"goal a 3-replica life <= 2.5x a single one's gas: {g3:,.0f} / {g1:,.0f} ({name}) "
            f"= {g3 / g1:.2f}x: {'met' if g3 <= 2.5 * g1 else 'missed'}"
        )
    for name, bound in (("spot:0.1", 1.15), ("spot:0.25", None)):
        cells = [r for r in rows if r["policy"] == name]
        if not cells:
            continue
        runs = sum(r["runs"] for r in cells) / sum(r["jobs"] for r in cells)
        nets = [r["liar_net"] for r in cells if r["liar_net"] is not None]
        expected = cells[0]["expected_net"]
        compute = (
            f"{runs:.2f}x compute: {'met' if runs <= bound else 'missed'} (<= {bound}x)"
            if bound
            else f"{runs:.2f}x compute"
        )
        print(
            f"goal {name}: {compute}; cheating unprofitable: expected {expected:+.6f} bounties "
            f"a lying run ({'met' if expected < 0 else 'missed'}), measured "
            + (", ".join(f"{n:+.2f}" for n in nets) if nets else "no lying run")
        )
    mark = " (PROVISIONAL: load > 1)" if max(load0, os.getloadavg()[0]) > 1 else ""
    print(f"load before/after: {load0:.2f} / {load_average()}{mark}")


if __name__ == "__main__":
    main()
