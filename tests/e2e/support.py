"""Helpers of the end-to-end tests: fund jobs like a submitter, follow them through the
scheduler's API (which may be down for a while), read their on-chain record, count money, and
drive a cheating provider over the scheduler's HTTP wire protocol.

Everything here talks to the real grid of :mod:`devstack.grid`; nothing is mocked.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import wasmtime
from eth_account.signers.local import LocalAccount
from web3 import Web3

from devstack.grid import AgentProcess, LocalGrid
from devstack.images import BUSYBOX_IMAGE
from gridmarket.chain import Event
from gridmarket.cid import bytes_cid
from gridmarket.eip712 import sign_acceptance, sign_result
from gridmarket.escrow import ZERO_ADDRESS, JobState
from gridmarket.wire import (
    API,
    JobSpec,
    JobTerms,
    NodeCapacityIn,
    NodeRegistration,
    RegisterRequest,
    sign_registration,
)

ROOT = Path(__file__).resolve().parents[2]
DATASET = ROOT / "examples" / "datasets" / "gpu-hours"
CSVSTATS = ROOT / "examples" / "wasm" / "csvstats.wat"
BOUNTY = 10**16
FEE_BPS = 250  # run_grid deploys with EscrowParams' default fee
FEE = BOUNTY * FEE_BPS // 10_000
PAYOUT = BOUNTY - FEE
FINAL = frozenset({"released", "failed", "invalid", "refunded", "expired"})
SMALL = {"cpu_cores": 1, "ram_mib": 256, "disk_mib": 64}


# --------------------------------------------------------------------------- jobs


FAST = {
    "heartbeat_interval_s": "1",
    "node_timeout_s": "5",
    "lease_ttl_s": "5",
    "sweep_interval_s": "0.5",
    "long_poll_max_s": "5",
    "chain_poll_s": "0.1",
    "dispatch_tick_s": "0.1",
    "verify_timeout_s": "4",
    "verify_patience_s": "30",
}
"""Liveness in seconds instead of tens of seconds: heartbeats every 1 s, a node silent for 5 s
is offline, a lease not renewed for 5 s is lost, a fetch of an output gives up after 4 s
and an output still unreachable 30 s after the first miss is rejected."""


FAST_ESCROW = {"challenge_window": 12, "reassign_delay": 6}
"""A result nobody disputes is paid 12 s after it is posted (time for the mediator to find an
output missing: it fetches for 4 s); the operator may take a job back from a silent node 6 s
after assigning it (a lease is lost after 5 s)."""


def docker_spec(
    name: str,
    script: str,
    *,
    dataset_cid: str | None = None,
    image: str = BUSYBOX_IMAGE,
    timeout_s: int = 60,
) -> JobSpec:
    """A busybox job running ``sh -c script`` with small resources (``image``: the local tag
    every engine of the grid has, or the grid's pinned ``busybox_image`` to be pulled).
    ``timeout_s`` also sets how long a node holds the job on chain: the timeout plus the
    devnet's hold margin (gridmarket/holds.py), after which a dead node's job moves on."""
    return JobSpec.model_validate(
        {
            "name": name,
            "executor": "docker",
            "image": image,
            "command": ["sh", "-c", script],
            "dataset_cid": dataset_cid,
            "resources": SMALL,
            "limits": {"timeout_s": timeout_s, "output_max_bytes": 1 << 20},
        }
    )


def wasm_spec(name: str, module_cid: str, dataset_cid: str) -> JobSpec:
    """The demo's csvstats module on a dataset."""
    return JobSpec.model_validate(
        {
            "name": name,
            "executor": "wasm",
            "module_cid": module_cid,
            "dataset_cid": dataset_cid,
            "resources": SMALL,
            "limits": {"timeout_s": 60, "output_max_bytes": 1 << 20},
        }
    )


@dataclass(frozen=True)
class Inputs:
    """Content on the grid's IPFS: the demo's dataset and its WASM module."""

    dataset_cid: str
    module_cid: str


def add_inputs(grid: LocalGrid) -> Inputs:
    dataset = grid.ipfs.add_dir(DATASET)
    module = grid.ipfs.add_bytes(bytes(wasmtime.wat2wasm(CSVSTATS.read_text())))
    return Inputs(dataset, module)


@dataclass(frozen=True)
class Funded:
    """A job funded on-chain by a submitter (its ``createJob`` receipt is in)."""

    job_id: str  # 0x + 64 hex
    spec: JobSpec
    submitter: LocalAccount
    bounty: int
    tx_hash: str
    block: int

    @property
    def id_bytes(self) -> bytes:
        return bytes.fromhex(self.job_id[2:])


def chain_now(grid: LocalGrid) -> int:
    return int(grid.w3.eth.get_block("latest")["timestamp"])


def add_spec(grid: LocalGrid, spec: JobSpec) -> str:
    """Put the spec on IPFS (what a submitter does before funding)."""
    return grid.ipfs.add_bytes(spec.to_bytes())


def fund(
    grid: LocalGrid,
    spec: JobSpec,
    *,
    submitter: LocalAccount | None = None,
    bounty: int = BOUNTY,
    ttl: int = 1800,
    spec_cid: str | None = None,
    on_verify: bool = False,
    token: str = ZERO_ADDRESS,
) -> Funded:
    """Add ``spec`` to IPFS (unless ``spec_cid`` is given) and fund it with ``createJob`` on the
    deployment's default terms: the devnet's mediator, the least collateral, and payment after
    the challenge window (or at once on the scheduler's check: ``on_verify``). With ``token``,
    the job is paid in that ERC-20 (``bounty`` in its units), funded with a permit in one
    transaction."""
    who = submitter or grid.submitters[0]
    cid = spec_cid or add_spec(grid, spec)
    now = max(int(time.time()), chain_now(grid))
    terms = grid.escrow.default_terms(bounty, who.address, on_verify=on_verify, token=token)
    state, sent = grid.escrow.create_job(who, os.urandom(32), cid, now + ttl, bounty, terms)
    return Funded("0x" + state.job_id.hex(), spec, who, bounty, sent.tx_hash, sent.block)


def job_view(grid: LocalGrid, job_id: str) -> dict[str, Any] | None:
    """GET /v1/jobs/{id}; None while the scheduler does not know it or does not answer."""
    try:
        r = httpx.get(grid.scheduler.url + API.JOB.format(job_id=job_id), timeout=5)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    data: dict[str, Any] = r.json()
    return data


def wait_for(what: str, check: Callable[[], Any], timeout: float, every: float = 0.1) -> Any:
    """Poll ``check`` until it returns something truthy; AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def wait_job(
    grid: LocalGrid, job: Funded | str, states: Iterable[str], timeout: float = 60
) -> dict[str, Any]:
    """Until the scheduler reports the job in one of ``states``; the last view otherwise."""
    job_id = job if isinstance(job, str) else job.job_id
    wanted = set(states)
    last: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = job_view(grid, job_id)
        if view is not None:
            last = view
            if view["state"] in wanted:
                return view
            if view["state"] in FINAL - wanted:
                break
        time.sleep(0.1)
    raise AssertionError(
        f"job {job_id} not in {sorted(wanted)} after {timeout:.0f} s: state "
        f"{last.get('state')!r} ({last.get('reason')!r}); attempts {last.get('attempts')}"
    )


def wait_log(agent: AgentProcess, text: str, timeout: float = 30) -> None:
    """Until the agent's log contains ``text`` (e.g. a job's ``running (docker)`` step)."""
    wait_for(
        f"{text!r} in {agent.log_path}",
        lambda: text in agent.log_path.read_text(errors="replace"),
        timeout,
        every=0.05,
    )


def agent_of(grid: LocalGrid, node_id: str) -> AgentProcess:
    for a in grid.agents:
        if a.node_id == node_id:
            return a
    raise LookupError(f"node {node_id} is none of the grid's agents")


# --------------------------------------------------------------------------- chain


def job_events(grid: LocalGrid, job: Funded) -> list[Event]:
    """Every escrow event about the job, ProviderSlashed included, in chain order."""
    return [
        e
        for e in grid.escrow.events(job.block)
        if "jobId" in e.args and bytes(e.args["jobId"]) == job.id_bytes
    ]


def names(events: Iterable[Event]) -> list[str]:
    return [e.name for e in events]


def job_state(grid: LocalGrid, job: Funded) -> JobState:
    return grid.escrow.job_state(job.id_bytes)


def assert_paid_once(grid: LocalGrid, job: Funded, provider: str | None = None) -> Event:
    """Exactly one JobReleased for the job, paying bounty minus the fee (to ``provider``)."""
    events = job_events(grid, job)
    released = [e for e in events if e.name == "JobReleased"]
    counts = Counter(names(events))
    assert len(released) == 1, f"job {job.job_id}: {len(released)} JobReleased in {counts}"
    assert counts["JobRefunded"] == 0, counts
    ev = released[0]
    assert int(ev.args["payout"]) == job.bounty - job.bounty * FEE_BPS // 10_000
    assert int(ev.args["fee"]) == job.bounty * FEE_BPS // 10_000
    if provider is not None:
        assert ev.args["provider"] == provider, (ev.args["provider"], provider)
    state = job_state(grid, job)
    assert state.status.name == "RELEASED", state.status
    return ev


@dataclass(frozen=True)
class Money:
    """Who holds what in the escrow at one moment (exact integers, wei)."""

    balances: dict[str, int]  # balanceOf, by address
    stakes: dict[str, int]  # providerOf(...).stake
    fees: int  # feesAccrued
    held: int  # the contract's ETH

    def delta(self, later: Money) -> dict[str, int]:
        """Non-zero changes from this snapshot to ``later``, keyed ``balance:<addr>`` etc."""
        out: dict[str, int] = {}
        for addr, before in self.balances.items():
            if later.balances[addr] != before:
                out[f"balance:{addr}"] = later.balances[addr] - before
        for addr, before in self.stakes.items():
            if later.stakes[addr] != before:
                out[f"stake:{addr}"] = later.stakes[addr] - before
        if later.fees != self.fees:
            out["fees"] = later.fees - self.fees
        if later.held != self.held:
            out["held"] = later.held - self.held
        return out


def money(grid: LocalGrid) -> Money:
    """balanceOf of every dev account, every provider's stake, accrued fees, the ETH held."""
    addrs = [a.address for a in grid.accounts]
    provs = grid.providers
    return Money(
        balances={a: grid.escrow.balance_of(a) for a in addrs},
        stakes={p.address: int(grid.escrow.call("providerOf", p.address)[0]) for p in provs},
        fees=int(grid.escrow.call("feesAccrued")),
        held=int(grid.w3.eth.get_balance(Web3.to_checksum_address(grid.deployment.escrow))),
    )


def fetch_output(grid: LocalGrid, cid: str, dest: Path) -> dict[str, str]:
    """The output's files (verified against the CID by the fetch), name -> text."""
    path = grid.ipfs.fetch(cid, dest, 1 << 20)
    return {str(f.relative_to(path)): f.read_text() for f in sorted(path.rglob("*")) if f.is_file()}


# --------------------------------------------------------------------------- a cheater


@dataclass
class WireProvider:
    """A provider node that speaks the scheduler's wire protocol itself (as the agent does),
    here to cheat: it takes a job and reports an output CID it never produced."""

    grid: LocalGrid
    account: LocalAccount
    name: str
    capacity: NodeCapacityIn
    node_id: str = ""
    token: str = ""
    http: httpx.Client = field(init=False)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.http = httpx.Client(base_url=self.grid.scheduler.url, timeout=30)

    def close(self) -> None:
        self._stop.set()
        self.http.close()

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def register(self) -> None:
        info = self.http.get(API.INFO).json()
        reg = NodeRegistration(
            wallet=self.account.address,
            name=self.name,
            capacity=self.capacity,
            agent_version="e2e-cheater",
            nonce=time.time_ns(),
            expiry=int(time.time()) + 120,
        )
        sig = sign_registration(self.account, info["chain_id"], info["escrow"], reg)
        body = RegisterRequest(registration=reg, signature=sig)
        r = self.http.post(API.REGISTER, json=body.model_dump(mode="json"))
        assert r.status_code == 200, r.text
        self.node_id, self.token = r.json()["node_id"], r.json()["token"]

    def heartbeat(self, running: list[str]) -> None:
        r = self.http.post(
            API.HEARTBEAT.format(node_id=self.node_id), json={"running": running}, headers=self.auth
        )
        assert r.status_code == 200, r.text

    def next_job(self, wait_s: float = 10) -> dict[str, Any] | None:
        r = self.http.post(
            API.NEXT_JOB.format(node_id=self.node_id),
            params={"wait_s": wait_s},
            headers=self.auth,
            timeout=wait_s + 10,
        )
        if r.status_code == 204:
            return None
        assert r.status_code == 200, r.text
        data: dict[str, Any] = r.json()
        return data

    def accept(self, assignment: dict[str, Any]) -> None:
        """Sign the acceptance of the offered job's terms and post it, as the agent does."""
        offered = JobTerms.model_validate(assignment["terms"])
        sig = sign_acceptance(
            self.account,
            assignment["chain_id"],
            assignment["escrow"],
            bytes.fromhex(assignment["job_id"][2:]),
            assignment["attempt"],
            offered.as_job(),
            offered.hold_for,  # the time the scheduler offers: signed as it is
        )
        r = self.http.post(
            API.ACCEPT.format(node_id=self.node_id, job_id=assignment["job_id"]),
            json={"attempt": assignment["attempt"], "signature": "0x" + sig.hex()},
            headers=self.auth,
        )
        assert r.status_code == 200 and r.json()["accepted"], r.text

    def report_forged(self, assignment: dict[str, Any]) -> str:
        """Report success with a CID of bytes it never ran nor uploaded; returns that CID."""
        forged = bytes_cid(os.urandom(64))  # CIDv1 raw: valid, on no IPFS node
        self.report_result(assignment, forged)
        return forged

    def report_result(self, assignment: dict[str, Any], forged: str) -> None:
        """Report success with output ``forged`` (signed by this wallet) without running."""
        sig = sign_result(
            self.account,
            assignment["chain_id"],
            assignment["escrow"],
            bytes.fromhex(assignment["job_id"][2:]),
            assignment["attempt"],
            forged,
        )
        r = self.http.post(
            API.RESULT.format(node_id=self.node_id, job_id=assignment["job_id"]),
            json={
                "attempt": assignment["attempt"],
                "reason": "succeeded",
                "exit_code": 0,
                "duration_s": 0.1,
                "output_cid": forged,
                "output_bytes": 64,
                "signature": "0x" + sig.hex(),
            },
            headers=self.auth,
        )
        assert r.status_code in (200, 202), r.text
