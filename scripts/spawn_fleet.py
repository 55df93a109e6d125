"""N simulated provider nodes with the seeds' tier mix, for load and for watching the fleet view.

    make up && python scripts/spawn_fleet.py --nodes 50 --seconds 120

Each node gets its own wallet (funded from anvil's first dev account, registered and staked on
the escrow), registers with the scheduler with a signed registration, heartbeats on the
scheduler's schedule and long-polls for work. Nodes are simulated, the protocol is not: a node
signs its acceptance of each offered job's terms (EIP-712) and posts it, "runs" the job for a
short while, then adds a small real output to IPFS, signs its CID and reports it, so the
scheduler checks it and the escrow pays as for a real agent.

The right output of a job is a deterministic function of its workload (:func:`workload_of`: the
spec without its name, excluded providers and spot policy; :func:`right_output`), as for a real
deterministic job: honest nodes given seats of one replicated job, or a mediator's re-run of a
job (its spec renamed, the checked provider excluded), upload the same bytes and report the same
CID.

Dishonest nodes, for the verification policies (docs/trust.md):
  --cheaters 20   20 % of the nodes upload a plausible wrong output (a valid CID of real bytes
                  of the same shape that are not the job's result, :func:`wrong_output`): an
                  integrity check cannot tell. Each cheater has its own wrong bytes...
  --collude       ... unless the cheaters collude: then they all upload the same wrong bytes.
  --lazy 10       10 % of the nodes replay an output they produced for an earlier job.

Jobs (``--jobs``) are funded with ``createJob`` (one seat), or with ``--replicas K`` as
replicated jobs (``createJob(..., replicas)``: K seats of a 0.001 ETH bounty each, paid to the
agreeing majority of K distinct providers by ``resolve``). Each job has its own spec on IPFS.

Tier mix (the seeds' table): RTX 4090, 3090, 4070, 3060 and CPU-only in equal parts, spread over
the pricing regions. Settings default to the running ``make up`` grid (.run/grid/grid.json).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devstack.anvil import dev_accounts  # noqa: E402
from devstack.images import BUSYBOX_IMAGE  # noqa: E402
from devstack.providers import new_providers  # noqa: E402
from gridmarket.chain import Deployment, EscrowClient  # noqa: E402
from gridmarket.eip712 import sign_acceptance, sign_result  # noqa: E402
from gridmarket.ipfs import IpfsStore  # noqa: E402
from gridmarket.tiers import REGIONS, TIERS  # noqa: E402
from gridmarket.wire import (  # noqa: E402
    API,
    GpuGroup,
    JobSpec,
    JobTerms,
    NodeCapacityIn,
    NodeRegistration,
    RegisterRequest,
    sign_registration,
)

MIX = ["rtx-4090", "rtx-3090", "rtx-4070", "rtx-3060", "cpu"]


def capacity(tier_key: str, region: str) -> NodeCapacityIn:
    tier = TIERS[tier_key]
    gpu = None
    if tier_key != "cpu":
        gpu = GpuGroup(model=tier.key, name=tier.name, vram_mib=tier.vram_mib, count=1)
    return NodeCapacityIn(
        gpu=gpu,
        cpu_cores=8 if gpu else 4,
        ram_mib=32768 if gpu else 8192,
        disk_mib=200_000,
        region=region,
        executors=["docker", "wasm"],
        price_floor_wei_per_hour=0,
    )


NOT_WORKLOAD = ("name", "exclude_providers", "spot")
"""Spec fields that do not change what a job computes."""


def workload_of(spec: dict[str, Any]) -> str:
    """What a job computes, as a string: its spec (as JSON, ``JobSpec.model_dump(mode="json")``
    or an assignment's ``spec``) without the fields that do not change the result
    (:data:`NOT_WORKLOAD`), canonical JSON."""
    body = {k: v for k, v in spec.items() if k not in NOT_WORKLOAD}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def right_output(workload: str) -> bytes:
    """The result an honest node delivers for a job computing ``workload`` (:func:`workload_of`):
    the same bytes on every node, so replicas and re-runs of one job agree on its CID."""
    digest = hashlib.sha256(f"computed:{workload}".encode()).hexdigest()
    return f"workload {hashlib.sha256(workload.encode()).hexdigest()}\nresult {digest}\n".encode()


def wrong_output(workload: str, liar: str) -> bytes:
    """A plausible wrong result (same shape as :func:`right_output`, other digest) made up by
    ``liar``: each liar its own bytes, unless they collude and pass the same ``liar`` name."""
    digest = hashlib.sha256(f"made up by {liar}:{workload}".encode()).hexdigest()
    return f"workload {hashlib.sha256(workload.encode()).hexdigest()}\nresult {digest}\n".encode()


def add_output(ipfs: IpfsStore, data: bytes) -> str:
    """Add ``data`` as an output directory holding ``result.txt`` (the agent's output shape);
    its CID. The same bytes give the same CID on every node."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        (out / "result.txt").write_bytes(data)
        return ipfs.add_dir(out)


def submit(
    escrow: EscrowClient,
    ipfs: IpfsStore,
    count: int,
    over_s: float,
    on_verify: bool,
    image: str,
    replicas: int = 1,
) -> None:
    """Fund ``count`` small jobs from the first submitter, spread over ``over_s`` seconds: each
    its own spec, funded with ``createJob`` (the operator in office expected), of ``replicas``
    seats when ``replicas`` >= 2 (one 0.001 ETH bounty per seat)."""
    submitter = Account.from_key(dev_accounts(4)[3])
    share = 10**15
    terms = escrow.default_terms(share, submitter.address, on_verify=on_verify and replicas < 2)
    tag = secrets.token_hex(4)
    for i in range(count):
        spec = JobSpec.model_validate(
            {
                "name": f"fleet load {tag}-{i}",
                "executor": "docker",
                "image": image,
                "command": ["true"],
            }
        )
        spec_cid = ipfs.add_bytes(spec.to_bytes())
        now = int(escrow.w3.eth.get_block("latest")["timestamp"])
        salt = secrets.token_bytes(32)
        if replicas >= 2:
            escrow.create_replicated(
                submitter, salt, spec_cid, now + 3600, share * replicas, replicas, terms
            )
        else:
            escrow.create_job(submitter, salt, spec_cid, now + 3600, share, terms)
        time.sleep(over_s / count)


class Node:
    """One simulated node; ``behaviour`` is ``honest``, ``cheater`` or ``lazy``; a cheater that
    ``collude``s uploads the same wrong bytes as every other colluding cheater. Each result it
    reports is appended to ``reports`` (job id, output CID, whether the scheduler took it).
    Setting ``stopped`` ends its loops (after the current poll or job)."""

    def __init__(
        self, http: httpx.AsyncClient, base: str, account: LocalAccount, name: str,
        cap: NodeCapacityIn, ipfs: IpfsStore, stats: dict[str, int], behaviour: str = "honest",
        collude: bool = False,
    ) -> None:  # fmt: skip
        self.http, self.base, self.account, self.name, self.cap = http, base, account, name, cap
        self.ipfs, self.stats, self.behaviour, self.collude = ipfs, stats, behaviour, collude
        self.node_id = self.token = ""
        self.running: list[str] = []
        self.outputs: list[str] = []
        self.reports: list[tuple[str, str, bool]] = []
        self.stopped = False

    async def accept(self, a: dict[str, Any]) -> bool:
        """Sign the acceptance of the offered job's terms and of the hold it is given (the
        ``holdFor`` the scheduler offers); post it; whether it stands."""
        offered = JobTerms.model_validate(a["terms"])
        terms = offered.as_job()
        job_id = bytes.fromhex(a["job_id"][2:])
        sig = sign_acceptance(
            self.account,
            a["chain_id"],
            a["escrow"],
            job_id,
            a["attempt"],
            terms,
            offered.hold_for,
        )
        try:
            r = await self.http.post(
                self.base + API.ACCEPT.format(node_id=self.node_id, job_id=a["job_id"]),
                json={"attempt": a["attempt"], "signature": "0x" + sig.hex()},
                headers=self.auth,
            )
        except httpx.TransportError:  # the offer lapses; the scheduler offers it again
            self.stats["http_errors"] += 1
            return False
        return r.status_code == 200 and bool(r.json().get("accepted"))

    async def output(self, a: dict[str, Any]) -> str:
        """The CID this node reports: the real result, a plausible wrong one, or a replay (a
        lazy node's first job is done honestly: it has nothing to replay yet)."""
        if self.behaviour == "lazy" and self.outputs:
            self.stats["replayed"] += 1
            return random.choice(self.outputs)  # noqa: S311
        work = workload_of(a["spec"])
        data = right_output(work)
        if self.behaviour == "cheater":
            self.stats["forged"] += 1
            data = wrong_output(work, "colluders" if self.collude else self.name)
        cid = await asyncio.to_thread(add_output, self.ipfs, data)
        self.outputs.append(cid)
        return cid

    async def register(self, chain_id: int, escrow: str) -> None:
        reg = NodeRegistration(
            wallet=self.account.address,
            name=self.name,
            capacity=self.cap,
            agent_version="spawn_fleet",
            nonce=time.time_ns(),
            expiry=int(time.time()) + 300,
        )
        body = RegisterRequest(
            registration=reg, signature=sign_registration(self.account, chain_id, escrow, reg)
        )
        r = await self.http.post(self.base + API.REGISTER, json=body.model_dump(mode="json"))
        r.raise_for_status()
        self.node_id, self.token = r.json()["node_id"], r.json()["token"]

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def heartbeats(self, interval: float, until: float) -> None:
        while time.monotonic() < until and not self.stopped:
            try:
                await self.http.post(
                    self.base + API.HEARTBEAT.format(node_id=self.node_id),
                    json={"running": self.running},
                    headers=self.auth,
                )
                self.stats["heartbeats"] += 1
            except httpx.TransportError:  # a dropped keep-alive connection: beat again later
                self.stats["http_errors"] += 1
            await asyncio.sleep(interval)

    async def work(self, until: float, run_s: float) -> None:
        while time.monotonic() < until and not self.stopped:
            try:
                r = await self.http.post(
                    self.base + API.NEXT_JOB.format(node_id=self.node_id),
                    params={"wait_s": 5},
                    headers=self.auth,
                    timeout=20,
                )
            except httpx.TransportError:  # a dropped keep-alive connection: ask again
                self.stats["http_errors"] += 1
                await asyncio.sleep(0.2)
                continue
            if r.status_code == 204:
                continue
            r.raise_for_status()
            a = r.json()
            if not await self.accept(a):
                self.stats["offers_lost"] += 1
                continue
            self.running.append(a["job_id"])
            self.stats["taken"] += 1
            await asyncio.sleep(run_s * random.uniform(0.5, 1.5))  # noqa: S311
            cid = await self.output(a)
            sig = sign_result(
                self.account,
                a["chain_id"],
                a["escrow"],
                bytes.fromhex(a["job_id"][2:]),
                a["attempt"],
                cid,
            )
            for tries in range(3):  # a dropped keep-alive connection: send it again
                try:
                    r = await self.http.post(
                        self.base + API.RESULT.format(node_id=self.node_id, job_id=a["job_id"]),
                        json={
                            "attempt": a["attempt"],
                            "reason": "succeeded",
                            "exit_code": 0,
                            "duration_s": run_s,
                            "output_cid": cid,
                            "signature": "0x" + sig.hex(),
                        },
                        headers=self.auth,
                    )
                    break
                except httpx.TransportError:
                    self.stats["http_errors"] += 1
                    if tries == 2:
                        raise
            self.running.remove(a["job_id"])
            self.stats["reported" if r.status_code == 202 else "refused"] += 1
            self.reports.append((a["job_id"], cid, r.status_code == 202))


async def fleet(args: argparse.Namespace, grid: dict[str, Any]) -> dict[str, int]:
    deployment = Deployment.load(Path(grid["deployment_file"]))
    w3 = Web3(Web3.HTTPProvider(grid["rpc_url"]))
    escrow = EscrowClient(w3, deployment)
    funder = Account.from_key(dev_accounts(1)[0])
    print(f"funding and registering {args.nodes} wallets on-chain ...", flush=True)
    accounts = await asyncio.to_thread(
        new_providers, escrow, funder, args.nodes, metadata_cid="bafkreisimulatednode"
    )
    ipfs = IpfsStore(grid["ipfs_api"])
    stats = {
        "heartbeats": 0,
        "taken": 0,
        "offers_lost": 0,
        "reported": 0,
        "refused": 0,
        "forged": 0,
        "replayed": 0,
        "http_errors": 0,
    }
    n_cheat = round(args.nodes * args.cheaters / 100)
    n_lazy = round(args.nodes * args.lazy / 100)
    behaviours = ["cheater"] * n_cheat + ["lazy"] * n_lazy
    behaviours += ["honest"] * (args.nodes - len(behaviours))
    regions = sorted(REGIONS)
    limits = httpx.Limits(max_connections=2 * args.nodes + 10)
    async with httpx.AsyncClient(limits=limits, timeout=30) as http:
        info = (await http.get(grid["scheduler_url"] + API.INFO)).json()
        nodes = [
            Node(
                http,
                grid["scheduler_url"],
                acct,
                f"sim-{i:04d}",
                capacity(MIX[i % len(MIX)], regions[i % len(regions)]),
                ipfs,
                stats,
                behaviours[i],
                args.collude,
            )
            for i, acct in enumerate(accounts)
        ]
        await asyncio.gather(*(n.register(info["chain_id"], info["escrow"]) for n in nodes))
        print(
            f"{len(nodes)} nodes registered ({n_cheat} cheaters, {n_lazy} lazy); "
            f"running {args.seconds:.0f} s",
            flush=True,
        )
        until = time.monotonic() + args.seconds
        tasks = [n.heartbeats(info["heartbeat_interval_s"], until) for n in nodes]
        tasks += [n.work(until, args.job_seconds) for n in nodes]
        if args.jobs:
            tasks.append(
                asyncio.to_thread(
                    submit,
                    escrow,
                    ipfs,
                    args.jobs,
                    args.seconds / 2,
                    args.on_verify,
                    grid.get("busybox_image") or BUSYBOX_IMAGE,
                    args.replicas,
                )
            )
        await asyncio.gather(*tasks)
    ipfs.close()
    return stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, default=25)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--jobs", type=int, default=0, help="also fund this many small jobs")
    ap.add_argument("--job-seconds", type=float, default=2.0, help="simulated run time per job")
    ap.add_argument(
        "--cheaters", type=float, default=0, help="percent of nodes uploading wrong outputs"
    )
    ap.add_argument("--collude", action="store_true", help="cheaters upload the same wrong output")
    ap.add_argument("--lazy", type=float, default=0, help="percent of nodes replaying outputs")
    ap.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="fund replicated jobs of this many seats (2..5, createJob replicas); 1: single jobs",
    )
    ap.add_argument(
        "--on-verify", action="store_true", help="fund jobs paid on the scheduler's check"
    )
    ap.add_argument("--grid", type=Path, default=ROOT / ".run" / "grid" / "grid.json")
    args = ap.parse_args()
    if not 0 <= args.cheaters + args.lazy <= 100:
        ap.error("--cheaters plus --lazy must be between 0 and 100 percent")
    if args.replicas != 1 and not 2 <= args.replicas <= 5:
        ap.error(f"--replicas {args.replicas}: 1 (single jobs) or 2..5 seats")
    if args.replicas >= 2 and args.on_verify:
        ap.error("--on-verify is for single jobs: a replicated job is paid by resolve")
    if not args.grid.exists():
        print(f"{args.grid} not found: start the grid first (`make up`)")
        return 1
    grid = json.loads(args.grid.read_text())
    stats = asyncio.run(fleet(args, grid))
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
