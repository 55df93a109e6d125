"""Shared set-up of the scheduler benches, on the production path.

anvil + the escrow; N providers, each a fresh wallet registered and staked on-chain; the js-ipfs
daemon; a database (SQLite file or a fresh PostgreSQL database); scheduler replicas as child
processes (uvicorn) with ``require_stake`` on and the operator key set, so every lease's
``assign`` goes through the outbox to anvil. Jobs are funded on anvil with ``createJob``
(:func:`fund_jobs`) against specs added to IPFS; the replicas' chain watcher picks them up and
the spec fetcher reads them from IPFS, as in production. Nodes register with signed
registrations and capacities from the published tier mix (``scripts/spawn_fleet.py``).

(The older figures in docs/benchmarks.md wrote jobs straight into the store, one spec, with
synthetic ``JobCreated`` events: an easier path, gone from these benches.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

from devstack.anvil import Anvil, dev_accounts, free_port
from devstack.ipfs import IpfsDaemon
from devstack.mediator import MediatorProcess
from devstack.postgres import fresh_database
from devstack.providers import new_providers
from devstack.scheduler import SchedulerProcess
from gridmarket.chain import Deployment, EscrowClient
from gridmarket.deploy import EscrowParams, deploy_escrow
from gridmarket.eip712 import sign_acceptance, sign_result
from gridmarket.ipfs import IpfsStore
from gridmarket.wire import (
    API,
    GpuGroup,
    JobSpec,
    JobTerms,
    NodeCapacityIn,
    NodeRegistration,
    RegisterRequest,
    sign_registration,
)
from scheduler.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from spawn_fleet import MIX, capacity  # the published tier mix, from its script

# anvil's dev accounts: 0 deployer, 1 operator (the scheduler's key), 2 treasury, 3 submitter
SUBMITTER = 3


@dataclass
class Stack:
    anvil: Anvil
    deployment: Deployment
    deployment_file: Path
    providers: list[LocalAccount]
    db_url: str
    replicas: list[SchedulerProcess]
    escrow: EscrowClient
    ipfs: IpfsStore
    mediator_key: str
    """The private key (hex) of the mediator the deployment lists (dev account 10)."""
    mediator: MediatorProcess | None = None
    duty_procs: list[SchedulerProcess] = field(default_factory=list)
    """With ``duties_apart``: the replicas that hold the chain duty and the verify duty, and
    serve no node (``replicas`` then hold none)."""


@contextlib.contextmanager
def stack(
    work: Path,
    *,
    providers: int,
    db: str,
    replicas: int = 1,
    escrow: dict[str, int] | None = None,
    mediator: bool = False,
    stake_jobs: int = 64,
    duties_apart: bool = False,
    **settings: str,
) -> Iterator[Stack]:
    """Everything up; torn down when the block ends. ``db``: ``sqlite`` or ``postgresql``.

    The replicas run with the scheduler's defaults (``require_stake`` true) plus the operator
    key, the IPFS daemon, ``chain_poll_s=0.1`` (as ``run_grid``) and ``settings``. ``escrow``
    overrides deployment parameters (:class:`EscrowParams` fields, e.g. ``challenge_window``);
    ``mediator`` also runs the real mediator (``python -m mediator run``,
    :class:`devstack.mediator.MediatorProcess`) with the listed mediator's key. Each provider
    stakes the minimum plus the collateral of ``stake_jobs`` jobs of 0.001 ETH.

    ``duties_apart`` (PostgreSQL): the ``replicas`` serving the nodes take no leader duty; two
    more replicas run the chain duty (watcher, outbox, specs) and the verify duty, each in a
    process (and GIL) of its own, as ``Settings.duties`` lets a deployment do."""
    if duties_apart and db == "sqlite":
        raise ValueError("duties_apart needs PostgreSQL (SQLite has one replica)")
    work.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as es:
        # the last 128 states, as a geth node that is not an archive: with all of them anvil's
        # every transaction costs more as the chain grows (createJob 47/s at the start of a
        # 20,000-job funding, 12/s at its end)
        anvil = es.enter_context(Anvil(log_file=work / "anvil.log", prune_history=128))
        daemon = es.enter_context(IpfsDaemon(work / "ipfs"))
        ipfs = IpfsStore(daemon.api_addr)
        es.callback(ipfs.close)
        w3 = Web3(Web3.HTTPProvider(anvil.url))
        dev_keys = dev_accounts(11)
        keys = [Account.from_key(k) for k in dev_keys]
        params = EscrowParams(
            operator=keys[1].address,
            treasury=keys[2].address,
            mediator=keys[10].address,
            **(escrow or {}),
        )
        deployment = deploy_escrow(w3, keys[0], params)
        dep_file = work / "deployment.json"
        deployment.save(dep_file)
        client = EscrowClient(w3, deployment)
        # each node stakes enough collateral for the most jobs it may hold at once (by default
        # 64 slots of 0.001 ETH bounties, collateral 100 % of the bounty) on top of the minimum
        accounts = new_providers(
            client,
            keys[0],
            providers,
            metadata_cid="bafkreibenchnode",
            stake_wei=params.min_stake + stake_jobs * 10**15,
            fund_wei=10**18 + params.min_stake + stake_jobs * 10**15,  # the stake, and gas
        )
        if db == "sqlite":
            db_url = f"sqlite:///{work / ('bench-' + secrets.token_hex(3) + '.db')}"
        else:
            db_url = es.enter_context(fresh_database("gm_bench"))
        store = Store(db_url)
        store.migrate()
        store.close()
        common = {
            "database_url": db_url,
            "rpc_url": anvil.url,
            "deployment_file": str(dep_file),
            "token_secret": secrets.token_hex(16),
            "ipfs_api": daemon.api_addr,
            "operator_key": dev_keys[1],
            "chain_poll_s": "0.1",
        }
        common.update(settings)
        procs = []
        duty_procs = []
        if duties_apart:  # the duty holders first: the serving replicas then find them held
            for duty in ("chain", "verify"):
                proc = SchedulerProcess(
                    work,
                    free_port(),
                    {**common, "replica_id": duty, "duties": f'["{duty}"]'},
                    name=f"scheduler-{duty}",
                )
                es.enter_context(proc)
                duty_procs.append(proc)
        for i in range(replicas):
            serving = {"duties": "[]"} if duties_apart else {}
            proc = SchedulerProcess(
                work,
                free_port(),
                {**common, "replica_id": f"r{i}", **serving},
                name=f"scheduler-{i}",
            )
            es.enter_context(proc)
            procs.append(proc)
        med = None
        if mediator:
            med = es.enter_context(
                MediatorProcess(
                    work,
                    rpc_url=anvil.url,
                    deployment_file=dep_file,
                    ipfs_api=daemon.api_addr,
                    key_hex=dev_keys[10],
                )
            )
        yield Stack(
            anvil,
            deployment,
            dep_file,
            accounts,
            db_url,
            procs,
            client,
            ipfs,
            dev_keys[10],
            med,
            duty_procs,
        )


# --------------------------------------------------------------------------- jobs

GIB = 1024


def spec_mix(rng: random.Random, count: int, wasm_cid: str) -> list[JobSpec]:
    """``count`` distinct job specs: 60% Docker CPU jobs, 20% WASM, 20% one-GPU jobs needing
    8, 11 or 20 GiB of VRAM (a fifth of those pinned to the RTX 4090), varied cores, RAM,
    disk, timeouts and environments."""
    specs = []
    for i in range(count):
        roll = rng.random()
        env = {"BENCH_VARIANT": str(i)}
        limits = {"timeout_s": rng.choice((300, 600, 1800))}
        if roll < 0.6:
            res: dict[str, Any] = {
                "cpu_cores": rng.choice((1, 1, 2)),
                "ram_mib": rng.choice((128, 256, 512)),
                "disk_mib": rng.choice((256, 1024)),
            }
            body: dict[str, Any] = {"executor": "docker", "image": "busybox:1"}
            body["command"] = ["sh", "-c", f"echo {i}"]
        elif roll < 0.8:
            res = {"cpu_cores": 1, "ram_mib": 128, "disk_mib": 64}
            body = {"executor": "wasm", "module_cid": wasm_cid}
        else:
            res = {
                "gpu_count": 1,
                "min_vram_mib": rng.choice((8, 11, 20)) * GIB,
                "cpu_cores": rng.choice((1, 2)),
                "ram_mib": rng.choice((512, 1024)),
                "disk_mib": 2048,
            }
            if rng.random() < 0.2:
                res["gpu_models"] = ["rtx-4090"]
            body = {"executor": "docker", "image": "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime"}
            body["command"] = ["python", "-c", f"print({i})"]
        specs.append(
            JobSpec.model_validate(
                {**body, "name": f"bench-{i}", "env": env, "resources": res, "limits": limits}
            )
        )
    return specs


def publish_specs(ipfs: IpfsStore, specs: Sequence[JobSpec]) -> list[str]:
    """Add each spec's canonical bytes to IPFS; their CIDs (what ``createJob`` commits to)."""
    return [ipfs.add_bytes(s.to_bytes()) for s in specs]


def fund_jobs(
    anvil_url: str,
    escrow: EscrowClient,
    spec_cids: Sequence[str],
    n: int,
    on_verify: bool = True,
    funders: int = 1,
) -> float:
    """Fund ``n`` jobs with ``createJob`` (a 0.001 ETH bounty each), spec CIDs taken in turn;
    returns the seconds it took. ``funders`` submitters (dev accounts 3, 4, ... at most 7) send
    at once, each from a thread of its own, one transaction at a time with anvil's
    ``eth_sendTransactionSync`` (anvil holds the dev keys and signs; the receipt comes back in
    the same round trip); a job that fails to fund stops the bench. (Batched
    ``eth_sendTransaction`` lost transactions in anvil's pool and left nonce gaps.)"""
    if not 1 <= funders <= 7:
        raise ValueError(f"funders {funders}: dev accounts 3 to 9 are the submitters (1 to 7)")
    keys = dev_accounts(SUBMITTER + funders)[SUBMITTER:]
    deadline = int(time.time()) + 6 * 3600
    operator = escrow.expected_operator(escrow.default_terms(10**15, escrow.address))
    failed: list[BaseException] = []

    def fund(k: int) -> None:
        submitter = Account.from_key(keys[k]).address
        terms = escrow.default_terms(10**15, submitter, on_verify=on_verify)
        with httpx.Client(timeout=120) as http:
            for i in range(k, n, funders):
                if failed:
                    return
                data = escrow.encode(
                    "createJob",
                    os.urandom(32),
                    spec_cids[i % len(spec_cids)],
                    deadline,
                    operator,
                    terms.mediator,
                    terms.collateral,
                    terms.flags,
                    0,  # replicas: a single job
                )
                tx = {
                    "from": submitter,
                    "to": escrow.address,
                    "data": "0x" + data.hex(),
                    "value": hex(10**15),
                    "gas": hex(200_000),
                }
                body = {"jsonrpc": "2.0", "id": i, "method": "eth_sendTransactionSync"}
                answer = http.post(anvil_url, json={**body, "params": [tx]}).json()
                if "error" in answer:
                    raise RuntimeError(f"createJob {i} refused: {answer['error']}")
                if int(answer["result"]["status"], 16) != 1:
                    raise RuntimeError(f"createJob {i} reverted: {answer['result']}")

    def guarded(k: int) -> None:
        try:
            fund(k)
        except BaseException as exc:  # re-raised by the caller's thread below
            failed.append(exc)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=guarded, args=(k,), daemon=True) for k in range(funders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]
    return time.perf_counter() - t0


def fund_jobs_in_blocks(
    anvil_url: str,
    escrow: EscrowClient,
    spec_cids: Sequence[str],
    n: int,
    on_verify: bool = True,
    funders: int = 1,
    per_block: int = 150,
    progress_s: float = 30.0,
) -> float:
    """Fund ``n`` jobs as :func:`fund_jobs` does, but ``per_block`` to a block: automining is
    off meanwhile, each round's ``createJob`` transactions (submitters in turn, explicit
    nonces, anvil signs) go in one JSON-RPC batch, ``evm_mine`` mines them, and every receipt
    is checked (a job that fails to fund stops the bench). Returns the seconds it took.

    Why: anvil 1.7.1 rebuilds its whole account and storage tries for every block it mines
    (foundry-rs/foundry#15715, fixed upstream after the last npm release), so a block's cost
    grows with the escrow's storage: one ``createJob`` a block ran at 364/s for the first
    2,000 jobs and 48/s by 12,000 (``--prune-history 128``; docs/platform.md). A busy public
    chain carries many transactions a block too. Nothing else may send transactions while
    this runs (they would wait for its blocks)."""
    if not 1 <= funders <= 7:
        raise ValueError(f"funders {funders}: dev accounts 3 to 9 are the submitters (1 to 7)")
    keys = dev_accounts(SUBMITTER + funders)[SUBMITTER:]
    submitters = [Account.from_key(k).address for k in keys]
    deadline = int(time.time()) + 6 * 3600
    terms = [escrow.default_terms(10**15, a, on_verify=on_verify) for a in submitters]
    operator = escrow.expected_operator(terms[0])
    t0 = shown = time.perf_counter()
    with httpx.Client(timeout=120) as http:
        ids = iter(range(1, 1 << 62))

        def call(method: str, params: list[Any]) -> Any:
            body = {"jsonrpc": "2.0", "id": next(ids), "method": method, "params": params}
            answer = http.post(anvil_url, json=body).json()
            if "error" in answer:
                raise RuntimeError(f"{method}: {answer['error']}")
            return answer["result"]

        def batch(method: str, params: list[list[Any]]) -> list[dict[str, Any]]:
            body = [
                {"jsonrpc": "2.0", "id": next(ids), "method": method, "params": p} for p in params
            ]
            answers = http.post(anvil_url, json=body).json()
            by_id = {a["id"]: a for a in answers}
            return [by_id[b["id"]] for b in body]

        nonces = [int(call("eth_getTransactionCount", [a, "pending"]), 16) for a in submitters]
        call("evm_setAutomine", [False])
        try:
            done = 0
            while done < n:
                txs = []
                for i in range(done, min(n, done + per_block)):
                    k = i % funders
                    data = escrow.encode(
                        "createJob",
                        os.urandom(32),
                        spec_cids[i % len(spec_cids)],
                        deadline,
                        operator,
                        terms[k].mediator,
                        terms[k].collateral,
                        terms[k].flags,
                        0,  # replicas: a single job
                    )
                    txs.append(
                        {
                            "from": submitters[k],
                            "to": escrow.address,
                            "data": "0x" + data.hex(),
                            "value": hex(10**15),
                            "gas": hex(200_000),
                            "nonce": hex(nonces[k]),
                        }
                    )
                    nonces[k] += 1
                sent = batch("eth_sendTransaction", [[tx] for tx in txs])
                refused = [a["error"] for a in sent if "error" in a]
                if refused:
                    raise RuntimeError(f"createJob {done}+: {len(refused)} refused: {refused[0]}")
                hashes = [a["result"] for a in sent]
                for _ in range(20):  # a block holds what its gas limit lets in: mine till all are
                    call("evm_mine", [])
                    receipts = batch("eth_getTransactionReceipt", [[h] for h in hashes])
                    if all(r.get("result") for r in receipts):
                        break
                else:
                    raise RuntimeError(f"createJob {done}+: not all mined in 20 blocks")
                bad = [r["result"] for r in receipts if int(r["result"]["status"], 16) != 1]
                if bad:
                    raise RuntimeError(f"createJob {done}+: {len(bad)} reverted: {bad[0]}")
                done += len(txs)
                now = time.perf_counter()
                if progress_s and now - shown >= progress_s:
                    shown = now
                    print(
                        f"    {time.strftime('%H:%M:%S')} funded {done}/{n} "
                        f"({done / (now - t0):.0f}/s)",
                        flush=True,
                    )
        finally:
            call("evm_setAutomine", [True])
    return time.perf_counter() - t0


def wait_queued(db_url: str, n: int, timeout: float = 600) -> float:
    """Wait until ``n`` jobs are ``queued`` (seen by the watcher, spec fetched from IPFS and
    parsed); seconds waited. Raises with the job counts if that does not happen in time."""
    store = Store(db_url)
    t0 = time.perf_counter()
    try:
        while True:
            counts = store.job_counts()
            if counts.get("queued", 0) >= n:
                return time.perf_counter() - t0
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"only {counts} after {timeout:.0f} s; {n} queued wanted")
            time.sleep(0.2)
    finally:
        store.close()


def fleet_capacity(i: int, slots: int, gpus: int) -> NodeCapacityIn:
    """Node ``i`` of the published tier mix (``scripts/spawn_fleet.py``: RTX 4090, 3090, 4070,
    3060 and CPU-only in equal parts, over the pricing regions), offering ``slots`` leases at
    once; a GPU node is a rig of ``gpus`` cards of its tier (one card per node would let a
    node hold one GPU lease only)."""
    regions = ["us", "eu-west", "in", "br", "jp", "sg", "eu-east", "ca"]
    cap = capacity(MIX[i % len(MIX)], regions[i % len(regions)])
    update: dict[str, Any] = {"slots": slots}
    if cap.gpu is not None:
        update["gpu"] = GpuGroup(
            model=cap.gpu.model, name=cap.gpu.name, vram_mib=cap.gpu.vram_mib, count=gpus
        )
        update["cpu_cores"] = cap.cpu_cores * max(1, gpus // 2)
        update["ram_mib"] = cap.ram_mib * max(1, gpus // 2)
    else:
        update["ram_mib"] = cap.ram_mib * max(1, slots // 8)
    out: NodeCapacityIn = cap.model_copy(update=update)
    return out


_RAW = os.environ.get("BENCH_PROFILE_RAW") == "1"
"""``BENCH_PROFILE_RAW=1``: py-spy writes collapsed stacks (``.txt``, one line per stack with
its sample count: what ``bench/profile_shares.py`` reads) instead of a flame graph.
``BENCH_PROFILE_GIL=1``: only the thread holding the GIL is sampled (py-spy ``--gil``): where
the process's Python CPU goes, without the threads waiting on locks, sockets or the GIL."""


@contextlib.contextmanager
def profiled(pids: Sequence[int | None], out_dir: Path | None, name: str) -> Iterator[None]:
    """Sample the given processes with py-spy while the block runs (when ``out_dir`` is set):
    one flame graph per process, ``<out_dir>/<name>-<k>.svg``. py-spy needs root (or ptrace
    rights) and is in the dev extras."""
    if out_dir is None:
        yield
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    spies = [
        subprocess.Popen(
            [
                "py-spy",
                "record",
                "--pid",
                str(pid),
                "--rate",
                "200",
                "--nonblocking",
                *(["--gil"] if os.environ.get("BENCH_PROFILE_GIL") == "1" else []),
                "--output",
                str(out_dir / f"{name}-{k}.{'txt' if _RAW else 'svg'}"),
                "--format",
                "raw" if _RAW else "flamegraph",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for k, pid in enumerate(pids)
        if pid is not None
    ]
    try:
        yield
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            spy.wait(60)


def load_average() -> str:
    """``uptime``'s load averages (1, 5, 15 min), recorded with every figure."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


async def register(
    http: httpx.AsyncClient,
    base: str,
    account: LocalAccount,
    chain_id: int,
    escrow: str,
    cap: NodeCapacityIn,
) -> tuple[str, str]:
    """Sign and send a registration; (node id, token)."""
    reg = NodeRegistration(
        wallet=account.address,
        name="bench",
        capacity=cap,
        nonce=time.time_ns(),
        expiry=int(time.time()) + 300,
    )
    body = RegisterRequest(
        registration=reg, signature=sign_registration(account, chain_id, escrow, reg)
    )
    r = await http.post(base + API.REGISTER, json=body.model_dump(mode="json"))
    r.raise_for_status()
    data = r.json()
    return data["node_id"], data["token"]


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


class RawHttp:
    """One keep-alive HTTP/1.1 connection with the least client-side work possible.

    The benches measure the scheduler; httpx's async client costs about as much CPU per request
    as the server on this 2-core machine, so the load generator would be what is measured.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(
        self, method: str, path: str, headers: dict[str, str], body: bytes = b""
    ) -> tuple[int, dict[str, str], bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Length: {len(body)}\r\n"
        if body:
            head += "Content-Type: application/json\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        self._writer.write(head.encode() + body)
        status_line = await self._reader.readline()
        if not status_line:
            self.close()
            raise ConnectionError(f"{self.host}:{self.port} closed the connection")
        status = int(status_line.split()[1])
        got: dict[str, str] = {}
        while True:
            line = await self._reader.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.decode().partition(":")
            got[k.strip().lower()] = v.strip()
        data = await self._reader.readexactly(int(got.get("content-length", "0")))
        return status, got, data

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


class NodeAuth:
    """A bench node's bearer token, renewed as the agent renews it (``agent/client.py``): a
    request answered 401 (the token expired: ``TOKEN_TTL_S``, an hour by default, so a long
    soak outlives its tokens) signs a fresh registration of the same node (same wallet and
    name: same node id) and is sent once more."""

    def __init__(self, token: str, renew: Callable[[], Awaitable[str]] | None = None) -> None:
        self.headers = {"Authorization": f"Bearer {token}"}
        self._renew = renew
        self.renewals = 0

    async def request(
        self, conn: RawHttp, method: str, path: str, body: bytes = b""
    ) -> tuple[int, dict[str, str], bytes]:
        status, got, data = await conn.request(method, path, self.headers, body)
        if status == 401 and self._renew is not None:
            self.headers["Authorization"] = f"Bearer {await self._renew()}"
            self.renewals += 1
            status, got, data = await conn.request(method, path, self.headers, body)
        return status, got, data


def renewer(
    base: str, account: LocalAccount, chain_id: int, escrow: str, cap: NodeCapacityIn
) -> Callable[[], Awaitable[str]]:
    """A fresh token for the node of ``account`` registered with ``cap`` at ``base``."""

    async def renew() -> str:
        async with httpx.AsyncClient(timeout=60) as http:
            return (await register(http, base, account, chain_id, escrow, cap))[1]

    return renew


def _auth(token: str | NodeAuth) -> NodeAuth:
    return token if isinstance(token, NodeAuth) else NodeAuth(token)


def acceptor(
    account: LocalAccount, node_id: str, token: str | NodeAuth
) -> Callable[[RawHttp, bytes], Awaitable[bool]]:
    """A node's answer to an offer, as the agent gives it: sign the EIP-712 acceptance of the
    offered job's terms with the node's wallet and post it to ``API.ACCEPT``."""
    auth = _auth(token)

    async def accept(conn: RawHttp, body: bytes) -> bool:
        a = json.loads(body)
        t = a["terms"]
        offer = JobTerms.model_validate(t)
        job_id = bytes.fromhex(a["job_id"][2:])
        sig = sign_acceptance(
            account,
            a["chain_id"],
            a["escrow"],
            job_id,
            a["attempt"],
            offer.as_job(),
            offer.hold_for,
        )
        payload = json.dumps({"attempt": a["attempt"], "signature": "0x" + sig.hex()}).encode()
        path = API.ACCEPT.format(node_id=node_id, job_id=a["job_id"])
        status, _, answer = await auth.request(conn, "POST", path, payload)
        return status == 200 and bool(json.loads(answer).get("accepted"))

    return accept


def finisher(
    account: LocalAccount, node_id: str, token: str | NodeAuth, output_cid: str
) -> Callable[[RawHttp, bytes], Awaitable[bool]]:
    """A node's report that its run of an accepted job ended, as the agent sends it: the
    output ``output_cid`` (already on IPFS) signed with the node's wallet for this job and
    attempt, posted to ``API.RESULT``. The scheduler checks the signature, moves the job to
    ``verifying`` (its verifier then fetches the output from IPFS and checks its CID, and the
    outbox relays the result to the escrow with ``settle``) and the node's slot is free."""
    auth = _auth(token)

    async def finish(conn: RawHttp, body: bytes) -> bool:
        a = json.loads(body)
        job_id = bytes.fromhex(a["job_id"][2:])
        sig = sign_result(account, a["chain_id"], a["escrow"], job_id, a["attempt"], output_cid)
        report = {
            "attempt": a["attempt"],
            "reason": "succeeded",
            "exit_code": 0,
            "duration_s": 0.0,
            "output_cid": output_cid,
            "signature": "0x" + sig.hex(),
        }
        path = API.RESULT.format(node_id=node_id, job_id=a["job_id"])
        status, _, _ = await auth.request(conn, "POST", path, json.dumps(report).encode())
        return status == 202

    return finish


# --------------------------------------------------------------------------- raw chain access


def rpc_batch(http: httpx.Client, url: str, calls: Sequence[tuple[str, list[Any]]]) -> list[Any]:
    """One JSON-RPC batch to anvil; the results in the order of ``calls``. Raises naming the
    method when anvil answers one of them with an error."""
    if not calls:
        return []
    body = [{"jsonrpc": "2.0", "id": i, "method": m, "params": p} for i, (m, p) in enumerate(calls)]
    answers = http.post(url, json=body).json()
    if not isinstance(answers, list):
        raise RuntimeError(f"anvil answered a batch of {len(calls)} with {answers!r:.300}")
    by_id = {a.get("id"): a for a in answers if isinstance(a, dict)}
    out = []
    for i, (method, params) in enumerate(calls):
        a = by_id.get(i)
        if a is None or "error" in a:
            why = a.get("error") if a else "no answer"
            raise RuntimeError(f"anvil refused {method}{params!r:.200}: {why}")
        out.append(a["result"])
    return out


def send_sync(http: httpx.Client, url: str, tx: dict[str, Any], what: str) -> dict[str, Any]:
    """Send ``tx`` from one of anvil's dev accounts with ``eth_sendTransactionSync`` (anvil
    signs; the receipt comes back in the same round trip, as :func:`fund_jobs`); the receipt.
    Raises naming ``what`` when it is refused or reverts."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "eth_sendTransactionSync", "params": [tx]}
    answer = http.post(url, json=body).json()
    if "error" in answer:
        raise RuntimeError(f"{what} refused: {answer['error']}")
    receipt: dict[str, Any] = answer["result"]
    if int(receipt["status"], 16) != 1:
        raise RuntimeError(f"{what} reverted: {receipt}")
    return receipt


def chain_time(http: httpx.Client, url: str) -> int:
    """The latest block's timestamp (the escrow's clock)."""
    (block,) = rpc_batch(http, url, [("eth_getBlockByNumber", ["latest", False])])
    return int(block["timestamp"], 16)


def warp(http: httpx.Client, url: str, to: int) -> None:
    """Move the chain's clock forward to ``to`` (a block is mined at that time)."""
    now = chain_time(http, url)
    if to > now:
        rpc_batch(http, url, [("evm_increaseTime", [to - now])])
        rpc_batch(http, url, [("evm_mine", [])])
