"""Accepting a job (escrow version 2): the policy, the signed acceptance, the accept call and
the theft defence, on a real anvil with a fresh escrow (a mediator listed).

The scheduler's accept endpoint is not on this branch yet: the daemon test runs against a small
stand-in scheduler (FastAPI under uvicorn on loopback) that speaks the wire (``gridmarket.wire``)
and does what the real one is specified to do with an acceptance: check the signer, then
``assign`` on-chain with it. It never relays results (a scheduler sitting on them), so the
node's result guard must put the result on-chain itself; then the node finalizes it after the
challenge window. ``tests/agent/test_daemon.py`` runs the same daemon against the real
scheduler once its accept endpoint is merged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import ipfshttpclient
import pytest
import uvicorn
from fastapi import FastAPI, Response
from web3 import Web3

from agent.acceptance import (
    AcceptancePolicy,
    EscrowFacts,
    acceptance_request,
    terms_job,
)
from agent.assembly import build_agent
from agent.config import load_config
from agent.daemon import Agent
from agent.storage.ipfs import AgentIpfsStore
from devstack.anvil import free_port
from devstack.ipfs import IpfsDaemon
from gridmarket.chain import ChainError, EscrowClient
from gridmarket.cid import path_cid
from gridmarket.eip712 import recover_acceptance_signer
from gridmarket.escrow import JobState, Status
from gridmarket.wire import (
    AcceptAck,
    AcceptRequest,
    Assignment,
    ExecutorKind,
    HeartbeatResponse,
    JobSpec,
    RegisterResponse,
    ResultAck,
    ResultReport,
    SchedulerInfo,
)
from tests.agent import wat
from tests.agent.chain_support import Chain, job_terms, own_chain


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    with own_chain(tmp_path_factory.mktemp("accept-chain"), challenge_window=600) as chain:
        yield chain


def offer(chain: Chain, state: JobState, spec: JobSpec | None = None, **changes: Any) -> Assignment:
    """What a scheduler offers for ``state`` (its next attempt, its on-chain terms)."""
    spec = spec or JobSpec(executor=ExecutorKind.WASM, module_cid=SPEC_CID)
    values: dict[str, Any] = {
        "job_id": "0x" + state.job_id.hex(),
        "attempt": state.job.attempt + 1,
        "spec_cid": state.spec_cid,
        "spec": spec,
        "bounty_wei": state.job.bounty,
        "deadline": state.job.deadline,
        "lease_expires_at": time.time() + 30,
        "chain_id": chain.escrow.deployment.chain_id,
        "escrow": chain.escrow.address,
        "terms": job_terms(state),
    }
    values.update(changes)
    return Assignment(**values)


SPEC_CID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"


# --------------------------------------------------------------------------- policy


def test_policy_reads_the_chain(chain: Chain) -> None:
    provider = chain.accounts[5]
    chain.stake(provider, 5 * 10**16)
    facts = EscrowFacts(chain.escrow)
    expected = (chain.escrow.deployment.chain_id, chain.escrow.address)
    policy = AcceptancePolicy(provider.address, chain=facts, expected=lambda: expected)

    listed = chain.fund(10**16)
    decision = policy.decide(offer(chain, listed))
    assert decision.accept and "listed on-chain" in decision.reason

    own = chain.fund(10**16, chain.self_mediated(10**16))
    decision = policy.decide(offer(chain, own))
    assert not decision.accept and "is the job's submitter" in decision.reason
    permissive = AcceptancePolicy(provider.address, chain=facts, accept_self_mediated=True)
    assert permissive.decide(offer(chain, own)).accept

    big = chain.fund(10**17)  # collateral 100 % of the bounty: more than the 0.05 ETH staked
    decision = policy.decide(offer(chain, big))
    assert not decision.accept and "free stake" in decision.reason

    capped = AcceptancePolicy(provider.address, chain=facts, max_collateral_wei=10**16 - 1)
    decision = capped.decide(offer(chain, listed))
    assert not decision.accept and "over the cap" in decision.reason

    other = chain.accounts[9].address
    picky = AcceptancePolicy(provider.address, chain=facts, accepted_mediators=[other])
    decision = picky.decide(offer(chain, listed))
    assert not decision.accept and "not in accepted_mediators" in decision.reason

    # an offer for another escrow, or whose terms disagree with it, or out of time
    decision = policy.decide(offer(chain, listed, escrow="0x" + "ee" * 20))
    assert not decision.accept and "not the scheduler's" in decision.reason
    decision = policy.decide(offer(chain, listed, bounty_wei=listed.job.bounty + 1))
    assert not decision.accept and "disagree" in decision.reason
    late = AcceptancePolicy(provider.address, chain=facts, clock=lambda: 2.0**40)
    assert not late.decide(offer(chain, listed)).accept


def test_policy_without_a_chain(chain: Chain) -> None:
    provider = chain.accounts[5]
    listed = chain.fund(10**16)
    own = chain.fund(10**16, chain.self_mediated(10**16))
    knows = AcceptancePolicy(provider.address, deployment_mediator=chain.mediator.address)
    assert knows.decide(offer(chain, listed)).reason.endswith("is the deployment's")
    # without an RPC URL a self-mediating submitter cannot be told from a listed mediator
    decision = knows.decide(offer(chain, own))
    assert decision.accept and "unchecked" in decision.reason
    trusting = AcceptancePolicy(provider.address, accepted_mediators=[chain.mediator.address])
    assert trusting.decide(offer(chain, listed)).accept
    assert not trusting.decide(offer(chain, own)).accept
    # the node is the mediator, the mediator is the operator: never
    me = AcceptancePolicy(chain.mediator.address)
    assert "this node is the job's mediator" in me.decide(offer(chain, listed)).reason
    terms = job_terms(listed).model_copy(update={"mediator": listed.job.operator})
    decision = knows.decide(offer(chain, listed, terms=terms))
    assert not decision.accept and "is its operator" in decision.reason


def test_policy_declines_when_the_chain_does_not_answer(chain: Chain) -> None:
    nobody = Web3(Web3.HTTPProvider(f"http://127.0.0.1:{free_port()}"))
    dead = EscrowClient(nobody, chain.escrow.deployment)
    policy = AcceptancePolicy(chain.accounts[5].address, chain=EscrowFacts(dead))
    decision = policy.decide(offer(chain, chain.fund(10**16)))
    assert not decision.accept and decision.reason.startswith("cannot check the terms")


def test_the_signed_acceptance_is_what_assign_takes(chain: Chain) -> None:
    provider = chain.accounts[6]
    chain.stake(provider, 5 * 10**16)
    state = chain.fund(10**16)
    proposal = offer(chain, state)
    request = acceptance_request(provider, proposal)
    assert request.attempt == 1
    signature = bytes.fromhex(request.signature[2:])
    signer = recover_acceptance_signer(
        signature,
        proposal.chain_id,
        proposal.escrow,
        state.job_id,
        1,
        terms_job(proposal.terms),
    )
    assert signer == provider.address
    # the contract agrees: the operator assigns with it
    state, _ = chain.escrow.call_job(chain.operator, "assign", state, provider.address, signature)
    assert state.status is Status.ASSIGNED and state.job.provider == provider.address
    # a signature over other terms (a higher collateral) is refused by the contract
    other = chain.fund(10**16)
    worse = offer(chain, other)
    worse = worse.model_copy(
        update={"terms": worse.terms.model_copy(update={"collateral_wei": 2 * 10**16})}
    )
    bad = bytes.fromhex(acceptance_request(provider, worse).signature[2:])
    with pytest.raises(ChainError, match="BadSignature"):
        chain.escrow.call_job(chain.operator, "assign", other, provider.address, bad)


# --------------------------------------------------------------------------- the daemon


@dataclass
class StandIn:
    """The scheduler's node API, as much as the daemon uses, with the accept step as specified
    (check the signer is the node's wallet, then ``assign`` on-chain with the signature).
    Results are taken and never relayed."""

    chain: Chain
    wallet: str
    offers: list[Assignment] = field(default_factory=list)
    states: dict[str, JobState] = field(default_factory=dict)
    withdraw: set[str] = field(default_factory=set)  # answer accepted: false for these
    accepted: list[str] = field(default_factory=list)
    handed_back: list[str] = field(default_factory=list)
    results: dict[str, ResultReport] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def app(self) -> FastAPI:
        api = FastAPI()
        escrow = self.chain.escrow

        @api.get("/v1/info")
        def info() -> SchedulerInfo:
            return SchedulerInfo(
                chain_id=escrow.deployment.chain_id,
                escrow=escrow.address,
                operator=self.chain.operator.address,
                require_stake=True,
                heartbeat_interval_s=1.0,
                lease_ttl_s=30.0,
                long_poll_max_s=1.0,
                fee_bps=250,
                version="stand-in",
            )

        @api.post("/v1/nodes/register")
        def register() -> RegisterResponse:
            return RegisterResponse(
                node_id="n-standin",
                token="t",
                token_expires_at=time.time() + 3600,
                heartbeat_interval_s=1.0,
                lease_ttl_s=30.0,
            )

        @api.post("/v1/nodes/{node_id}/heartbeat")
        def heartbeat() -> HeartbeatResponse:
            return HeartbeatResponse(leases={}, cancel=[], next_heartbeat_s=1.0)

        @api.post("/v1/nodes/{node_id}/next-job", response_model=None)
        def next_job() -> Assignment | Response:
            with self.lock:
                if self.offers:
                    return self.offers.pop(0)
            time.sleep(0.2)
            return Response(status_code=204, headers={"Retry-After": "0.2"})

        @api.post("/v1/nodes/{node_id}/jobs/{job_id}/accept")
        def accept(job_id: str, body: AcceptRequest) -> AcceptAck:
            state = self.states[job_id]
            signature = bytes.fromhex(body.signature[2:])
            signer = recover_acceptance_signer(
                signature,
                escrow.deployment.chain_id,
                escrow.address,
                state.job_id,
                body.attempt,
                state.job,
            )
            if signer != self.wallet or body.attempt != state.job.attempt + 1:
                self.errors.append(f"bad acceptance of {job_id} by {signer}")
                return AcceptAck(job_id=job_id, accepted=False, message="bad signature")
            if job_id in self.withdraw:
                return AcceptAck(job_id=job_id, accepted=False, message="lease lost")
            escrow.call_job(self.chain.operator, "assign", state, signer, signature)
            self.accepted.append(job_id)
            return AcceptAck(job_id=job_id, accepted=True)

        @api.post("/v1/nodes/{node_id}/jobs/{job_id}/result", status_code=202)
        def result(job_id: str, body: ResultReport) -> ResultAck:
            self.results[job_id] = body  # kept, never relayed
            return ResultAck(job_id=job_id, accepted=True, status="verifying", message="")

        @api.post("/v1/nodes/{node_id}/jobs/{job_id}/hand-back", status_code=204)
        def hand_back(job_id: str) -> Response:
            self.handed_back.append(job_id)
            return Response(status_code=204)

        return api


def serve(app: FastAPI) -> tuple[str, uvicorn.Server, threading.Thread]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(url + "/v1/info", timeout=1)
            return url, server, thread
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError("the stand-in scheduler did not start")


def wait_for(what: str, check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout} s")


def test_daemon_accepts_declines_guards_and_finalizes(
    chain: Chain,
    ipfs_daemon: IpfsDaemon,
    ipfs_client: ipfshttpclient.Client,
    storage: AgentIpfsStore,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One node, three offers: a self-mediated job (declined by the default policy: handed
    back, never signed), a job whose offer the scheduler withdraws (accepted: false: not run),
    and a good one (accepted, assigned on-chain with the node's signature, run). The stand-in
    never relays the result: the guard submits it from the node's wallet; after the challenge
    window the node finalizes it and the pay is the wallet's."""
    caplog.set_level(logging.INFO, logger="agent")
    provider = chain.accounts[7]
    chain.stake(provider, 10**17)
    stand_in = StandIn(chain, provider.address)

    data = tmp_path / "data"
    data.mkdir()
    (data / "data.txt").write_text("hello gridmarket\n")
    data_cid = storage.add_dir(data)
    module = wat.build(wat.UPPERCASE, tmp_path / "upper.wasm")
    module_cid = ipfs_client.add(str(module), cid_version=1, raw_leaves=True)["Hash"]
    spec = JobSpec(executor=ExecutorKind.WASM, module_cid=module_cid, dataset_cid=data_cid)

    own = chain.fund(10**16, chain.self_mediated(10**16))
    gone = chain.fund(10**16)
    good = chain.fund(10**16)
    offers = [offer(chain, s, spec) for s in (own, gone, good)]
    for state, proposal in zip((own, gone, good), offers, strict=True):
        stand_in.states[proposal.job_id] = state
    stand_in.withdraw.add(offers[1].job_id)
    stand_in.offers.extend(offers)

    url, server, thread = serve(stand_in.app())
    config = load_config(
        None,
        scheduler_url=url,
        ipfs_api=ipfs_daemon.api_addr,
        region="us",
        name="accept-test",
        executors=["wasm"],
        work_dir=tmp_path / "work",
        keystore=tmp_path / "unused.json",
        poll_wait_s=1,
        backoff_cap_s=1,
        rpc_url=chain.url,
        deployment=chain.deployment_file,
        guard_delay_s=1,
        finalize_interval_s=0.5,
    )
    agent: Agent = build_agent(config, provider)
    runner = threading.Thread(target=lambda: agent.run(install_signals=False))
    runner.start()
    good_id = offers[2].job_id
    try:
        assert agent.ready.wait(30)
        report = wait_for("the result reported", lambda: stand_in.results.get(good_id))
        state = wait_for(
            "the guard's submission",
            lambda: (s := chain.escrow.job_state(good.job_id)).status is Status.SUBMITTED and s,
        )
        chain.warp(600 + 1)
        state = wait_for(
            "the node's finalize",
            lambda: (s := chain.escrow.job_state(good.job_id)).status is Status.RELEASED and s,
        )
    finally:
        agent.stop()
        runner.join(60)
        server.should_exit = True
        thread.join(15)
    assert not stand_in.errors
    assert stand_in.handed_back == [offers[0].job_id]  # declined: handed back, never signed
    assert stand_in.accepted == [good_id]  # the withdrawn offer was not assigned
    assert agent.declined == 2 and agent.completed == 1
    want = path_cid_of(tmp_path, b"HELLO GRIDMARKET\n")
    assert report.output_cid == want and state.output_cid == want
    assert state.job.provider == provider.address
    # the result went on-chain from the node's own wallet, not relayed
    submitted = [
        e
        for e in chain.escrow.events(chain.escrow.deployment.block)
        if e.name == "ResultSubmitted" and bytes(e.args["jobId"]) == good.job_id
    ]
    assert len(submitted) == 1
    sender = chain.w3.eth.get_transaction(submitted[0].tx_hash)["from"]  # type: ignore[arg-type]
    assert sender == provider.address
    assert int(chain.escrow.call("balanceOf", provider.address)) == state.job.payout
    assert chain.escrow.job_state(own.job_id).status is Status.FUNDED  # nobody took it
    assert chain.escrow.job_state(gone.job_id).status is Status.FUNDED
    log = caplog.text
    assert "declined (the mediator" in log and "is the job's submitter" in log
    assert "the scheduler withdrew the offer: lease lost" in log
    assert "had not put the result on-chain; submitted it" in log
    assert "finalized" in log


def path_cid_of(tmp: Path, upper: bytes) -> str:
    folder = tmp / "expected" / "output"
    folder.mkdir(parents=True)
    (folder / "upper.txt").write_bytes(upper)
    return path_cid(folder)
