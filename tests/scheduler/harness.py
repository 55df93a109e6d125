"""A real scheduler for tests: uvicorn on loopback, a fresh escrow on the session's anvil, the
session's IPFS daemon, and provider helpers that speak the wire protocol over HTTP."""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from eth_account.signers.local import LocalAccount

from devstack.anvil import free_port
from gridmarket.chain import Deployment, EscrowClient
from gridmarket.deploy import EscrowParams, deploy_escrow
from gridmarket.eip712 import sign_acceptance, sign_result
from gridmarket.wire import (
    API,
    JobSpec,
    JobTerms,
    NodeCapacityIn,
    NodeRegistration,
    RegisterRequest,
    sign_registration,
)
from scheduler.app import create_app
from scheduler.settings import Settings

from ..conftest import Devnet

STAKE = 10**17


def fresh_escrow(devnet: Devnet, **params: Any) -> tuple[Deployment, EscrowClient]:
    """A new JobEscrow on the shared anvil (tests do not see each other's jobs)."""
    p = EscrowParams(
        operator=devnet.operator.address,
        treasury=devnet.treasury.address,
        **{"mediator": devnet.mediator.address, **params},
    )
    deployment = deploy_escrow(devnet.w3, devnet.owner, p)
    return deployment, EscrowClient(devnet.w3, deployment)


def register_on_chain(client: EscrowClient, provider: LocalAccount, stake: int = STAKE) -> None:
    client.send(provider, "registerProvider", "bafkreiprovidermeta", value=stake)


@dataclass
class Server:
    url: str
    settings: Settings
    server: uvicorn.Server
    thread: threading.Thread
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.http.get(path, **kw)

    def job(self, job_id: str) -> dict[str, Any]:
        r = self.http.get(API.JOB.format(job_id=job_id))
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data

    def wait_job(self, job_id: str, states: set[str], timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            r = self.http.get(API.JOB.format(job_id=job_id))
            if r.status_code == 200:
                last = r.json()
                if last["state"] in states:
                    return last
            time.sleep(0.05)
        raise AssertionError(
            f"job {job_id} not in {states} after {timeout}s: {last.get('state')} "
            f"({last.get('reason')})"
        )


@contextmanager
def scheduler(
    tmp: Path,
    deployment: Deployment,
    devnet: Devnet,
    ipfs_api: str,
    *,
    node_fast_path: bool = True,
    **overrides: Any,
) -> Iterator[Server]:
    """Run the scheduler app under uvicorn in a thread until the block ends
    (``node_fast_path``: as ``create_app``'s; production's is on)."""
    dep_file = tmp / f"deployment-{secrets.token_hex(3)}.json"
    deployment.save(dep_file)
    values: dict[str, Any] = {
        "database_url": f"sqlite:///{tmp / ('sched-' + secrets.token_hex(3) + '.db')}",
        "rpc_url": devnet.url,
        "deployment_file": dep_file,
        "operator_key": "0x" + bytes(devnet.operator.key).hex(),
        "ipfs_api": ipfs_api,
        "heartbeat_interval_s": 0.5,
        "node_timeout_s": 3.0,
        "lease_ttl_s": 3.0,
        "sweep_interval_s": 0.2,
        "chain_poll_s": 0.1,
        "dispatch_tick_s": 0.05,
        "verify_timeout_s": 5.0,
        "verify_patience_s": 8.0,
        "work_dir": tmp / "sched-work",
    }
    values.update(overrides)
    settings = Settings(**values)
    port = free_port()
    config = uvicorn.Config(
        create_app(settings, node_fast_path=node_fast_path),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + API.HEALTH, timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if not thread.is_alive():
            raise RuntimeError("the scheduler exited during start-up")
        time.sleep(0.05)
    else:
        raise RuntimeError("the scheduler did not answer /healthz within 20 s")
    s = Server(url, settings, server, thread)
    try:
        yield s
    finally:
        s.http.close()
        server.should_exit = True
        thread.join(timeout=15)


CPU_CAP = NodeCapacityIn(
    cpu_cores=4, ram_mib=8192, disk_mib=50_000, region="us", executors=["docker", "wasm"]
)


@dataclass
class Provider:
    """A provider node speaking the scheduler's wire protocol (what the agent does)."""

    account: LocalAccount
    server: Server
    name: str = "node0"
    capacity: NodeCapacityIn = CPU_CAP
    node_id: str = ""
    token: str = ""

    def registration(self, **over: Any) -> NodeRegistration:
        values: dict[str, Any] = {
            "wallet": self.account.address,
            "name": self.name,
            "capacity": self.capacity,
            "agent_version": "test",
            "nonce": time.time_ns(),
            "expiry": int(time.time()) + 120,
        }
        values.update(over)
        return NodeRegistration(**values)

    def register(self, **over: Any) -> httpx.Response:
        info = self.server.get(API.INFO).json()
        reg = self.registration(**over)
        sig = sign_registration(self.account, info["chain_id"], info["escrow"], reg)
        body = RegisterRequest(registration=reg, signature=sig)
        r = self.server.http.post(API.REGISTER, json=body.model_dump(mode="json"))
        if r.status_code == 200:
            self.node_id = r.json()["node_id"]
            self.token = r.json()["token"]
        return r

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def heartbeat(self, running: list[str] | None = None) -> httpx.Response:
        return self.server.http.post(
            API.HEARTBEAT.format(node_id=self.node_id),
            json={"running": running or []},
            headers=self.auth,
        )

    def next_job(self, wait_s: float = 5.0) -> httpx.Response:
        return self.server.http.post(
            API.NEXT_JOB.format(node_id=self.node_id),
            params={"wait_s": wait_s},
            headers=self.auth,
            timeout=wait_s + 10,
        )

    def accept(
        self,
        assignment: dict[str, Any],
        *,
        signer: LocalAccount | None = None,
        attempt: int | None = None,
    ) -> httpx.Response:
        """Sign the EIP-712 acceptance of ``assignment`` from its terms (what the agent does)
        and post it; ``signer`` / ``attempt`` override the wallet and the attempt signed."""
        terms = JobTerms.model_validate(assignment["terms"])
        n = assignment["attempt"] if attempt is None else attempt
        sig = sign_acceptance(
            signer or self.account,
            assignment["chain_id"],
            assignment["escrow"],
            bytes.fromhex(assignment["job_id"][2:]),
            n,
            terms.as_job(),  # its token included
            terms.hold_for,
        )
        return self.server.http.post(
            API.ACCEPT.format(node_id=self.node_id, job_id=assignment["job_id"]),
            json={"attempt": n, "signature": "0x" + sig.hex()},
            headers=self.auth,
        )

    def take(self, wait_s: float = 20.0) -> dict[str, Any]:
        """Poll for an offer and accept it; the assignment."""
        r = self.next_job(wait_s=wait_s)
        assert r.status_code == 200, (r.status_code, r.text)
        assignment: dict[str, Any] = r.json()
        accept(self.server, self, assignment)
        return assignment

    def report(self, job_id: str, body: dict[str, Any]) -> httpx.Response:
        return self.server.http.post(
            API.RESULT.format(node_id=self.node_id, job_id=job_id), json=body, headers=self.auth
        )

    def succeed(self, assignment: dict[str, Any], output_cid: str) -> httpx.Response:
        sig = sign_result(
            self.account,
            assignment["chain_id"],
            assignment["escrow"],
            bytes.fromhex(assignment["job_id"][2:]),
            assignment["attempt"],
            output_cid,
        )
        return self.report(
            assignment["job_id"],
            {
                "attempt": assignment["attempt"],
                "reason": "succeeded",
                "exit_code": 0,
                "duration_s": 0.1,
                "output_cid": output_cid,
                "output_bytes": 10,
                "signature": "0x" + sig.hex(),
            },
        )


def accept(server: Server, node: Provider, assignment: dict[str, Any]) -> dict[str, Any]:
    """``node`` accepts the offer ``assignment`` (signed by its wallet); the AcceptAck, which
    must say accepted."""
    r = node.accept(assignment)
    assert r.status_code == 200, (r.status_code, r.text)
    ack: dict[str, Any] = r.json()
    assert ack["accepted"] is True and ack["job_id"] == assignment["job_id"], ack
    return ack


def take_back_at(client: EscrowClient, job_id: str) -> int:
    """The chain time from which the operator may take the Assigned job ``job_id`` back:
    ``max(since + reassignDelay, holdUntil)``, the end of the hold its provider signed for."""
    job = client.job_state(bytes.fromhex(job_id[2:])).job
    return max(job.since + int(client.call("reassignDelay")), job.hold_until)


def advance_past_hold(client: EscrowClient, job_id: str) -> None:
    """Move the chain's clock past the time the operator may take ``job_id`` back."""
    now = int(client.w3.eth.get_block("latest")["timestamp"])
    advance(client.w3, max(1, take_back_at(client, job_id) - now + 1))


def advance(w3: Any, seconds: int) -> None:
    """Move the chain's clock ``seconds`` ahead and mine a block (anvil): time-gated steps
    (finalize after the challenge window, a take-back after reassignDelay) read the latest
    block's time."""
    for method, params in (("evm_increaseTime", [seconds]), ("evm_mine", [])):
        response = w3.provider.make_request(method, params)
        assert "error" not in response, response


def submit_job(
    client: EscrowClient,
    ipfs: Any,
    submitter: LocalAccount,
    spec: JobSpec,
    *,
    bounty: int = 10**17,
    ttl: int = 3600,
    on_verify: bool = False,
) -> str:
    """Add ``spec`` to IPFS and fund it on-chain on the deployment's default terms
    (``on_verify``: the operator pays it at once on its own check); the job id (0x hex)."""
    spec_cid = ipfs.add_bytes(spec.to_bytes())
    now = max(int(time.time()), int(client.w3.eth.get_block("latest")["timestamp"]))
    terms = client.default_terms(bounty, submitter.address, on_verify=on_verify)
    state, _ = client.create_job(submitter, os.urandom(32), spec_cid, now + ttl, bounty, terms)
    return "0x" + state.job_id.hex()
