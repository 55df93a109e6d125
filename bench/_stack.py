"""Shared set-up of the scheduler benches: anvil + escrow, N providers registered on-chain with
their own keys, a database (SQLite file or a fresh PostgreSQL database), scheduler replicas as
child processes, and queued jobs written straight into the store (synthetic JobCreated events:
the benches measure the scheduler, not the chain)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

from devstack.anvil import Anvil, dev_accounts, free_port
from devstack.postgres import fresh_database
from devstack.providers import new_providers
from devstack.scheduler import SchedulerProcess
from gridmarket.chain import Deployment, EscrowClient, Event
from gridmarket.deploy import EscrowParams, deploy_escrow
from gridmarket.wire import (
    API,
    JobSpec,
    NodeCapacityIn,
    NodeRegistration,
    RegisterRequest,
    sign_registration,
)
from scheduler.store import Store

SPEC = JobSpec.model_validate({"executor": "docker", "image": "busybox:1", "command": ["true"]})


@dataclass
class Stack:
    anvil: Anvil
    deployment: Deployment
    deployment_file: Path
    providers: list[LocalAccount]
    db_url: str
    replicas: list[SchedulerProcess]


@contextlib.contextmanager
def stack(
    work: Path, *, providers: int, db: str, replicas: int = 1, **settings: str
) -> Iterator[Stack]:
    """Everything up; torn down when the block ends. ``db``: ``sqlite`` or ``postgresql``."""
    work.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as es:
        anvil = es.enter_context(Anvil(log_file=work / "anvil.log"))
        w3 = Web3(Web3.HTTPProvider(anvil.url))
        keys = [Account.from_key(k) for k in dev_accounts(3)]
        params = EscrowParams(operator=keys[1].address, treasury=keys[2].address)
        deployment = deploy_escrow(w3, keys[0], params)
        dep_file = work / "deployment.json"
        deployment.save(dep_file)
        client = EscrowClient(w3, deployment)
        accounts = new_providers(client, keys[0], providers, metadata_cid="bafkreibenchnode")
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
            "ipfs_api": "/ip4/127.0.0.1/tcp/9/http",  # unused by these benches
        }
        common.update(settings)
        procs = []
        for i in range(replicas):
            proc = SchedulerProcess(
                work, free_port(), {**common, "replica_id": f"r{i}"}, name=f"scheduler-{i}"
            )
            es.enter_context(proc)
            procs.append(proc)
        yield Stack(anvil, deployment, dep_file, accounts, db_url, procs)


def queue_jobs(db_url: str, n: int) -> list[str]:
    """``n`` queued jobs, as the watcher would have written them after ``n`` createJob."""
    store = Store(db_url)
    now = int(time.time())
    events = [
        Event(
            name="JobCreated",
            args={
                "jobId": i.to_bytes(32, "big"),
                "submitter": "0x90F79bf6EB2c4f870365E785982E1f101E93b906",
                "bounty": 10**17,
                "deadline": now + 3600,
                "feeBps": 250,
                "salt": b"\x00" * 32,
                "specCid": "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy",
            },
            block=1,
            tx_hash="0x" + "00" * 32,
            log_index=i,
        )
        for i in range(1, n + 1)
    ]
    store.apply_chain_events(events, through_block=0)
    ids = ["0x" + i.to_bytes(32, "big").hex() for i in range(1, n + 1)]
    for job_id in ids:
        store.set_spec(job_id, SPEC)
    store.close()
    return ids


async def register(
    http: httpx.AsyncClient,
    base: str,
    account: LocalAccount,
    chain_id: int,
    escrow: str,
    slots: int,
) -> tuple[str, str]:
    """Sign and send a registration; (node id, token)."""
    cap = NodeCapacityIn(
        cpu_cores=64,
        ram_mib=512 * 1024,
        disk_mib=10**6,
        region="us",
        executors=["docker"],
        slots=slots,
    )
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
