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
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
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
from devstack.providers import new_providers
from gridmarket import holds, spot
from gridmarket.chain import ChainError, EscrowClient
from gridmarket.cid import path_cid
from gridmarket.eip712 import recover_acceptance_signer
from gridmarket.escrow import FLAG_SPOT, JobState, Status, Terms
from gridmarket.keystore import create_keystore
from gridmarket.token import ETH_TOKEN, tokens_of
from gridmarket.wire import (
    AcceptAck,
    AcceptRequest,
    Assignment,
    ExecutorKind,
    HeartbeatResponse,
    JobLimits,
    JobSpec,
    RegisterResponse,
    ResultAck,
    ResultReport,
    SchedulerInfo,
    offered_price_wei_per_hour,
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
        "terms": job_terms(state, holds.hold_for(spec.limits.timeout_s)),
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
    # the listed mediator funding a job that names itself: its re-run of a dispute
    mediator = chain.mediator
    assert chain.escrow.call("isListedMediator", mediator.address)
    rerun, _ = chain.escrow.create_job(
        mediator,
        os.urandom(32),
        SPEC_CID,
        chain.now() + 7200,
        10**16,
        Terms(mediator=mediator.address, collateral=chain.min_collateral(10**16)),
    )
    decision = policy.decide(offer(chain, rerun))
    assert decision.accept and "the mediator's own job" in decision.reason, decision.reason
    elsewhere = AcceptancePolicy(
        provider.address, chain=facts, accepted_mediators=[chain.accounts[9].address]
    )
    decision = elsewhere.decide(offer(chain, rerun))  # a node that does not accept it
    assert not decision.accept and "is the job's submitter" in decision.reason

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


def test_policy_refuses_a_hold_that_does_not_cover_the_run(chain: Chain) -> None:
    """The hold an offer signs (``terms.hold_for``) must cover the spec's timeout and the time
    to post the result (``holds.HOLD_MARGIN_S``), or reach the deadline: otherwise the operator
    could take the job back from the node while it runs. Refused like the other terms, with
    the reason; what the scheduler offers (``holds.hold_for``) is accepted."""
    (provider,) = new_providers(chain.escrow, chain.accounts[0], 1, stake_wei=5 * 10**16)
    facts = EscrowFacts(chain.escrow)
    policy = AcceptancePolicy(provider.address, chain=facts)
    state = chain.fund(10**16)
    spec = JobSpec(executor=ExecutorKind.WASM, module_cid=SPEC_CID)  # timeout 600 s
    assert holds.hold_for(600) == 900

    def with_hold(hold: int, spec: JobSpec = spec) -> Assignment:
        proposal = offer(chain, state, spec)
        terms = proposal.terms.model_copy(update={"hold_for": hold})
        return proposal.model_copy(update={"terms": terms})

    decision = policy.decide(with_hold(900))
    assert decision.accept, decision.reason
    assert policy.decide(with_hold(600 + holds.HOLD_MARGIN_S)).accept  # just enough
    for short in (600 + holds.HOLD_MARGIN_S - 1, 600, 0):
        decision = policy.decide(with_hold(short))
        assert not decision.accept
        assert decision.reason == (
            f"the hold of {short} s does not cover the run: 600 s of timeout and "
            f"{holds.HOLD_MARGIN_S} s to post the result need 900 s"
        )
    # a longer run needs a longer hold: what covers 600 s does not cover an hour
    hour = JobSpec(
        executor=ExecutorKind.WASM, module_cid=SPEC_CID, limits=JobLimits(timeout_s=3600)
    )
    decision = policy.decide(with_hold(900, hour))
    assert not decision.accept and "need 3900 s" in decision.reason
    assert policy.decide(with_hold(holds.hold_for(3600), hour)).accept
    # close to the deadline a hold up to it is enough (no result counts after it)
    near = AcceptancePolicy(provider.address, chain=facts, clock=lambda: state.job.deadline - 100)
    assert near.decide(with_hold(100)).accept
    decision = near.decide(with_hold(99))
    assert not decision.accept and "need 100 s" in decision.reason
    # the offer's own hold is what the node signs: another hold is another acceptance
    proposal = with_hold(900)
    signed = bytes.fromhex(acceptance_request(provider, proposal).signature[2:])
    args = (proposal.chain_id, proposal.escrow, state.job_id, 1, terms_job(proposal.terms))
    assert recover_acceptance_signer(signed, *args, 900) == provider.address
    assert recover_acceptance_signer(signed, *args, 899) != provider.address


def test_the_default_mediator_policy_and_each_of_its_branches(chain: Chain) -> None:
    """Which mediators a node accepts, each branch with the rule its refusal states: by default
    the deployment's listed mediators (the deployment file's, or listed on-chain), never the
    job's own submitter (who could rule an honest result wrong and take the collateral) unless
    ``accept_self_mediated`` (or the submitter is a mediator the node accepts: a dispute's
    re-run); ``accepted_mediators`` replaces the default with its own list."""
    (provider,) = new_providers(chain.escrow, chain.accounts[0], 1, stake_wei=5 * 10**16)
    facts = EscrowFacts(chain.escrow)
    default = AcceptancePolicy(provider.address, chain=facts)
    bounty = 10**16
    stranger = chain.accounts[9].address  # not a listed mediator
    listed = chain.fund(bounty)
    own = chain.fund(bounty, chain.self_mediated(bounty))
    # the escrow funds a job whose mediator is unlisted only when it is the submitter itself
    # (that is `own`): an offer naming another unlisted mediator is a scheduler's lie, which
    # the policy refuses as it would a real one
    moved = job_terms(listed).model_copy(update={"mediator": stranger})
    unlisted = offer(chain, listed, terms=moved)

    # default: the listed mediator yes, an unlisted one no, the submitter no
    decision = default.decide(offer(chain, listed))
    assert decision.accept and decision.reason.endswith("is listed on-chain")
    decision = default.decide(unlisted)
    assert not decision.accept
    assert decision.reason == (
        f"mediator {stranger} is not listed on-chain (by default this node accepts only the "
        "deployment's listed mediators; accepted_mediators lists others)"
    )
    decision = default.decide(offer(chain, own))
    assert not decision.accept
    assert decision.reason == (
        f"the mediator {chain.submitter.address} is the job's submitter, who could rule an "
        "honest result wrong and take the collateral: refused unless accept_self_mediated is "
        "set or the submitter is a mediator this node accepts"
    )
    # the deployment file's mediator is accepted without asking the chain
    deployed = AcceptancePolicy(
        provider.address, chain=facts, deployment_mediator=chain.mediator.address
    )
    assert deployed.decide(offer(chain, listed)).reason.endswith("is the deployment's")
    # opting in: accept_self_mediated takes the submitter as mediator (and only that)
    opted = AcceptancePolicy(provider.address, chain=facts, accept_self_mediated=True)
    decision = opted.decide(offer(chain, own))
    assert decision.accept and "accept_self_mediated" in decision.reason
    assert not opted.decide(unlisted).accept
    # an allow-list is the whole list: an unlisted mediator on it is taken, the listed one not
    allow = AcceptancePolicy(provider.address, chain=facts, accepted_mediators=[stranger])
    decision = allow.decide(unlisted)
    assert decision.accept and "is in accepted_mediators" in decision.reason
    decision = allow.decide(offer(chain, listed))
    assert not decision.accept
    assert decision.reason == (
        f"mediator {chain.mediator.address} is not in accepted_mediators "
        "(the only mediators this node accepts)"
    )
    # a submitter on the allow-list funding a job it mediates: taken (a dispute's re-run);
    # by default that submitter is not listed, so its self-mediated job is refused
    rerun = chain.escrow.create_job(
        chain.accounts[9],
        os.urandom(32),
        SPEC_CID,
        chain.now() + 7200,
        bounty,
        Terms(mediator=stranger, collateral=chain.min_collateral(bounty)),
    )[0]
    decision = allow.decide(offer(chain, rerun))
    assert decision.accept and "the mediator's own job" in decision.reason
    decision = default.decide(offer(chain, rerun))
    assert not decision.accept and "refused unless accept_self_mediated" in decision.reason


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
        proposal.terms.hold_for,
    )
    assert signer == provider.address
    # the contract agrees: the operator assigns with it, for the hold it was signed over
    hold = proposal.terms.hold_for
    with pytest.raises(ChainError, match="BadSignature"):  # a hold cut short is not the node's
        chain.escrow.assign(chain.operator, state, provider.address, hold - 1, signature)
    state, sent = chain.escrow.assign(chain.operator, state, provider.address, hold, signature)
    assert state.status is Status.ASSIGNED and state.job.provider == provider.address
    mined_at = chain.w3.eth.get_block(sent.block)["timestamp"]
    assert state.job.hold_until == mined_at + hold
    assert chain.escrow.job_state(state.job_id).job.hold_until == state.job.hold_until
    # a signature over other terms (a higher collateral) is refused by the contract
    other = chain.fund(10**16)
    worse = offer(chain, other)
    worse = worse.model_copy(
        update={"terms": worse.terms.model_copy(update={"collateral_wei": 2 * 10**16})}
    )
    bad = bytes.fromhex(acceptance_request(provider, worse).signature[2:])
    with pytest.raises(ChainError, match="BadSignature"):
        chain.escrow.assign(chain.operator, other, provider.address, worse.terms.hold_for, bad)


def test_a_spot_job_is_taken_within_the_nodes_collateral_limits(chain: Chain) -> None:
    """A spot-checked job (``FLAG_SPOT``: the flag the node signs, its collateral at least
    ``spot.min_collateral``) is no different to the policy: taken while the collateral is
    within the node's cap and free stake, declined otherwise; the acceptance the node signs
    over its flags is the one ``assign`` takes."""
    bounty = 10**16
    collateral = spot.min_collateral(bounty, 2500)  # 3 x the bounty + 1 wei at p = 25 %
    (provider,) = new_providers(chain.escrow, chain.accounts[0], 1, stake_wei=collateral)
    base = chain.escrow.default_terms(bounty, chain.submitter.address)
    job = chain.fund(bounty, replace(base, collateral=collateral, flags=FLAG_SPOT))
    assert job.job.flags == FLAG_SPOT
    facts = EscrowFacts(chain.escrow)
    policy = AcceptancePolicy(provider.address, chain=facts)
    proposal = offer(chain, job)
    assert proposal.terms.flags == FLAG_SPOT
    decision = policy.decide(proposal)
    assert decision.accept and "listed on-chain" in decision.reason, decision.reason
    capped = AcceptancePolicy(provider.address, chain=facts, max_collateral_wei=collateral - 1)
    decision = capped.decide(proposal)
    assert not decision.accept and "over the cap" in decision.reason
    bigger = chain.fund(bounty, replace(base, collateral=collateral + 1, flags=FLAG_SPOT))
    decision = policy.decide(offer(chain, bigger))
    assert not decision.accept and "free stake" in decision.reason
    signature = bytes.fromhex(acceptance_request(provider, proposal).signature[2:])
    state, _ = chain.escrow.assign(
        chain.operator, job, provider.address, proposal.terms.hold_for, signature
    )
    assert state.status is Status.ASSIGNED and state.job.collateral == collateral


# --------------------------------------------------------------------------- tokens


def token_policy(chain: Chain, provider: str, **kwargs: Any) -> AcceptancePolicy:
    """The policy a node with ``kwargs`` builds (assembly.chain_duties), reading the chain."""
    return AcceptancePolicy(
        provider,
        chain=EscrowFacts(chain.escrow),
        token_of=lambda a: (
            tokens_of(chain.escrow.deployment.tokens)["tUSD"]
            if a == chain.token_address
            else ETH_TOKEN
        ),
        **kwargs,
    )


def test_token_jobs_need_a_floor_the_price_and_free_collateral_in_the_token(chain: Chain) -> None:
    provider = chain.accounts[8]
    chain.stake(provider, 5 * 10**16)
    chain.escrow.stake_token(provider, chain.token_address, 3 * 10**6)  # 3 tUSD
    job = chain.fund_token(2 * 10**6)  # 2 tUSD, timeout 600 s: 12 tUSD an hour
    proposal = offer(chain, job)
    assert proposal.terms.token == chain.token_address
    assert offered_price_wei_per_hour(job.job.bounty, proposal.spec) == 12 * 10**6

    decision = token_policy(chain, provider.address).decide(proposal)
    assert not decision.accept and "no floor for tUSD" in decision.reason
    greedy = token_policy(chain, provider.address, token_floors={chain.token_address: 13 * 10**6})
    decision = greedy.decide(proposal)
    assert not decision.accept
    assert decision.reason == "pays 12 tUSD per hour, under the floor of 13 tUSD per hour"
    # a floor in ETH says nothing of tUSD; a floor in tUSD nothing of ETH
    eth_only = token_policy(chain, provider.address, price_floor_wei_per_hour=1)
    assert "no floor for tUSD" in eth_only.decide(proposal).reason
    fair = token_policy(
        chain,
        provider.address,
        token_floors={chain.token_address: 12 * 10**6},
        max_collateral_wei=0,  # wei: does not cap a tUSD job's collateral
    )
    decision = fair.decide(proposal)
    assert decision.accept, decision.reason

    # collateral 4 tUSD against 3 tUSD of free tUSD stake (and plenty of free ETH stake)
    heavy = chain.fund_token(2 * 10**6, collateral=4 * 10**6)
    decision = fair.decide(offer(chain, heavy))
    assert not decision.accept
    assert decision.reason == "collateral 4 tUSD is more than the free stake in tUSD (3 tUSD)"

    # the ETH floor is checked too: 0.01 ETH over 600 s pays 0.06 ETH an hour
    eth_job = chain.fund(10**16)
    picky = token_policy(chain, provider.address, price_floor_wei_per_hour=6 * 10**16 + 1)
    decision = picky.decide(offer(chain, eth_job))
    assert not decision.accept and "under the floor of 60000000000000001 wei" in decision.reason
    assert (
        token_policy(chain, provider.address, price_floor_wei_per_hour=6 * 10**16)
        .decide(offer(chain, eth_job))
        .accept
    )


def test_the_signed_acceptance_of_a_token_job_names_its_token(chain: Chain) -> None:
    provider = chain.accounts[8]
    if not chain.escrow.call("providerOf", provider.address)[3]:
        chain.stake(provider, 5 * 10**16)
    chain.escrow.stake_token(provider, chain.token_address, 2 * 10**6)
    state = chain.fund_token(2 * 10**6)
    proposal = offer(chain, state)
    signature = bytes.fromhex(acceptance_request(provider, proposal).signature[2:])
    signed = terms_job(proposal.terms)
    assert signed.token == chain.token_address
    assert (
        recover_acceptance_signer(
            signature,
            proposal.chain_id,
            proposal.escrow,
            state.job_id,
            1,
            signed,
            proposal.terms.hold_for,
        )
        == provider.address
    )
    # the same terms in ETH are another acceptance: the contract refuses it for this job
    as_eth = proposal.terms.model_copy(update={"token": "0x" + "00" * 20})
    wrong = bytes.fromhex(
        acceptance_request(provider, proposal.model_copy(update={"terms": as_eth})).signature[2:]
    )
    hold = proposal.terms.hold_for
    with pytest.raises(ChainError, match="BadSignature"):
        chain.escrow.assign(chain.operator, state, provider.address, hold, wrong)
    free = chain.escrow.free_collateral_of(provider.address, chain.token_address)
    state, _ = chain.escrow.assign(chain.operator, state, provider.address, hold, signature)
    assert state.status is Status.ASSIGNED and state.job.token == chain.token_address
    locked = free - chain.escrow.free_collateral_of(provider.address, chain.token_address)
    assert locked == state.job.collateral  # locked from the tUSD stake


def stake_in(chain: Chain, provider: str) -> int:
    return int(chain.escrow.call("stakeOf", provider, chain.token_address)[0])


def test_register_stakes_tokens_and_run_tops_them_up(
    chain: Chain, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`register --stake` stakes ETH and each stake_tokens entry (permit + stakeToken in one
    transaction); `run` (build_agent) tops a stake below its target up at start, and sends
    nothing when it is there."""
    provider = chain.accounts[9]
    stand_in = StandIn(chain, provider.address)
    url, server, thread = serve(stand_in.app())
    keystore = tmp_path / "keystore.json"
    create_keystore(keystore, "pw", private_key=bytes(provider.key), iterations=2**10)
    settings = tmp_path / "agent.yaml"
    settings.write_text(
        f"deployment: {chain.deployment_file}\nrpc_url: {chain.url}\nscheduler_url: {url}\n"
        f"keystore: {keystore}\npassword: pw\nregion: us\nexecutors: [wasm]\n"
        f"work_dir: {tmp_path / 'work'}\nipfs_api: /ip4/127.0.0.1/tcp/{free_port()}/http\n"
        "price_floors: {tUSD: '0.5'}\nstake_tokens: {tUSD: '100'}\n"
    )
    held = chain.erc20.balance_of(provider.address)
    try:
        done = agent_cli("--config", str(settings), "register", "--stake", "0.05")
        assert done.returncode == 0, done.stderr
        assert stake_in(chain, provider.address) == 100 * 10**6
        assert chain.erc20.balance_of(provider.address) == held - 100 * 10**6
        assert "staked 100 tUSD: tUSD stake 0 tUSD -> 100 tUSD (tx 0x" in done.stdout
        assert done.stdout.strip().splitlines()[-1] == "n-standin"
        again = agent_cli("--config", str(settings), "register")
        assert again.returncode == 0, again.stderr
        assert "tUSD stake 100 tUSD (target 100 tUSD): nothing to add" in again.stdout
        assert stake_in(chain, provider.address) == 100 * 10**6

        # a slash (here: an unstake) takes the stake under its target; the next run tops it up
        chain.escrow.send(provider, "requestUnstakeToken", chain.token_address, 40 * 10**6)
        assert stake_in(chain, provider.address) == 60 * 10**6
        caplog.set_level(logging.INFO, logger="agent")
        config = load_config(settings)
        build_agent(config, provider)
        assert stake_in(chain, provider.address) == 100 * 10**6
        assert "staked 40 tUSD: tUSD stake 60 tUSD -> 100 tUSD" in caplog.text
        block = chain.w3.eth.block_number
        build_agent(config, provider)  # at the target: nothing sent
        assert chain.w3.eth.block_number == block
        assert "tUSD stake 100 tUSD (target 100 tUSD): nothing to add" in caplog.text

        # more than the wallet holds: register says so; run logs it and serves on
        rich = load_config(settings, stake_tokens={"tUSD": "10000000"})
        build_agent(rich, provider)
        assert "token stake not topped up: stake_tokens.tUSD: the wallet holds" in caplog.text
        env = {"GRIDMARKET_AGENT_STAKE_TOKENS": '{"tUSD": "10000000"}'}
        done = agent_cli("--config", str(settings), "register", env=env)
        assert done.returncode == 1
        assert "stake_tokens.tUSD: the wallet holds" in done.stderr
        assert done.stderr.count("\n") == 1
    finally:
        server.should_exit = True
        thread.join(15)


def test_register_refuses_token_stakes_of_an_unregistered_wallet(
    chain: Chain, tmp_path: Path
) -> None:
    provider = chain.accounts[4]  # holds tUSD, never registered
    keystore = tmp_path / "keystore.json"
    create_keystore(keystore, "pw", private_key=bytes(provider.key), iterations=2**10)
    env = {
        "GRIDMARKET_AGENT_DEPLOYMENT": str(chain.deployment_file),
        "GRIDMARKET_AGENT_RPC_URL": chain.url,
        "GRIDMARKET_AGENT_KEYSTORE": str(keystore),
        "GRIDMARKET_AGENT_PASSWORD": "pw",
        "GRIDMARKET_AGENT_STAKE_TOKENS": '{"tUSD": "1"}',
        "GRIDMARKET_AGENT_WORK_DIR": str(tmp_path / "work"),
        "GRIDMARKET_AGENT_EXECUTORS": '["wasm"]',
    }
    done = agent_cli("register", "--region", "us", env=env)
    assert done.returncode == 1 and "is not registered on-chain" in done.stderr, done.stderr
    no_rpc = {k: v for k, v in env.items() if k != "GRIDMARKET_AGENT_RPC_URL"}
    done = agent_cli("register", "--region", "us", env=no_rpc)
    assert done.returncode == 1 and "stake_tokens needs the chain" in done.stderr, done.stderr


def agent_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRIDMARKET_AGENT_")}
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**base, **(env or {})},
        timeout=120,
        check=False,
    )


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
    holds: dict[str, int] = field(default_factory=dict)  # the hold offered with each job
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
                    got = self.offers.pop(0)
                    self.holds[got.job_id] = got.terms.hold_for
                    return got
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
                self.holds[job_id],
            )
            if signer != self.wallet or body.attempt != state.job.attempt + 1:
                self.errors.append(f"bad acceptance of {job_id} by {signer}")
                return AcceptAck(job_id=job_id, accepted=False, message="bad signature")
            if job_id in self.withdraw:
                return AcceptAck(job_id=job_id, accepted=False, message="lease lost")
            escrow.assign(self.chain.operator, state, signer, self.holds[job_id], signature)
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
    """One node, four offers: a self-mediated job (declined by the default policy: handed
    back, never signed), one whose hold does not cover its run (declined the same way), a job
    whose offer the scheduler withdraws (accepted: false: not run),
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
    short = chain.fund(10**16)  # offered with a hold shorter than its run
    gone = chain.fund(10**16)
    good = chain.fund(10**16)
    offers = [offer(chain, s, spec) for s in (own, short, gone, good)]
    offers[1] = offers[1].model_copy(
        update={"terms": offers[1].terms.model_copy(update={"hold_for": 60})}
    )
    for state, proposal in zip((own, short, gone, good), offers, strict=True):
        stand_in.states[proposal.job_id] = state
    stand_in.withdraw.add(offers[2].job_id)
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
    good_id = offers[3].job_id
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
    # declined: handed back, never signed
    assert stand_in.handed_back == [offers[0].job_id, offers[1].job_id]
    assert stand_in.accepted == [good_id]  # the withdrawn offer was not assigned
    assert agent.declined == 3 and agent.completed == 1
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
    assert chain.escrow.job_state(short.job_id).status is Status.FUNDED
    assert state.job.hold_until == 0  # submitted: the hold is over
    log = caplog.text
    assert "declined (the mediator" in log and "is the job's submitter" in log
    assert "declined (the hold of 60 s does not cover the run: 600 s of timeout" in log
    assert "the scheduler withdrew the offer: lease lost" in log
    assert "had not put the result on-chain; submitted it" in log
    assert "finalized" in log


def test_daemon_takes_a_tusd_job_and_is_paid_in_tusd(
    chain: Chain,
    ipfs_daemon: IpfsDaemon,
    ipfs_client: ipfshttpclient.Client,
    storage: AgentIpfsStore,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A node with a tUSD floor and stake (topped up by `run`'s start from nothing): a tUSD
    offer under its floor is handed back unsigned; a fair one is accepted with the token in the
    signed terms, assigned on-chain (its collateral locked from the tUSD stake), run, guarded
    onto the chain and finalized; the payout is the wallet's tUSD balance in the escrow."""
    caplog.set_level(logging.INFO, logger="agent")
    (provider,) = new_providers(chain.escrow, chain.accounts[0], 1, stake_wei=10**17)
    chain.erc20.send(chain.accounts[0], "mint", provider.address, 50 * 10**6)
    stand_in = StandIn(chain, provider.address)
    data = tmp_path / "data"
    data.mkdir()
    (data / "data.txt").write_text("hello gridmarket\n")
    data_cid = storage.add_dir(data)
    module = wat.build(wat.UPPERCASE, tmp_path / "upper.wasm")
    module_cid = ipfs_client.add(str(module), cid_version=1, raw_leaves=True)["Hash"]
    spec = JobSpec(executor=ExecutorKind.WASM, module_cid=module_cid, dataset_cid=data_cid)
    cheap = chain.fund_token(10**5)  # 0.1 tUSD over 600 s: 0.6 tUSD an hour
    fair = chain.fund_token(2 * 10**6)  # 12 tUSD an hour
    offers = [offer(chain, s, spec) for s in (cheap, fair)]
    for state, proposal in zip((cheap, fair), offers, strict=True):
        stand_in.states[proposal.job_id] = state
    stand_in.offers.extend(offers)

    url, server, thread = serve(stand_in.app())
    config = load_config(
        None,
        scheduler_url=url,
        ipfs_api=ipfs_daemon.api_addr,
        region="us",
        name="token-test",
        executors=["wasm"],
        work_dir=tmp_path / "work",
        keystore=tmp_path / "unused.json",
        poll_wait_s=1,
        backoff_cap_s=1,
        rpc_url=chain.url,
        deployment=chain.deployment_file,
        guard_delay_s=1,
        finalize_interval_s=0.5,
        price_floors={"tUSD": "1"},
        stake_tokens={"tUSD": "5"},
    )
    agent: Agent = build_agent(config, provider)  # stakes 5 tUSD
    assert stake_in(chain, provider.address) == 5 * 10**6
    runner = threading.Thread(target=lambda: agent.run(install_signals=False))
    runner.start()
    fair_id = offers[1].job_id
    try:
        assert agent.ready.wait(30)
        wait_for("the result reported", lambda: stand_in.results.get(fair_id))
        state = wait_for(
            "the guard's submission",
            lambda: (s := chain.escrow.job_state(fair.job_id)).status is Status.SUBMITTED and s,
        )
        assert state.job.token == chain.token_address
        free = chain.escrow.free_collateral_of(provider.address, chain.token_address)
        assert free == 5 * 10**6 - state.job.collateral  # locked from the tUSD stake
        chain.warp(600 + 1)
        state = wait_for(
            "the node's finalize",
            lambda: (s := chain.escrow.job_state(fair.job_id)).status is Status.RELEASED and s,
        )
    finally:
        agent.stop()
        runner.join(60)
        server.should_exit = True
        thread.join(15)
    assert not stand_in.errors
    assert stand_in.handed_back == [offers[0].job_id]
    assert stand_in.accepted == [fair_id]
    assert "pays 0.6 tUSD per hour, under the floor of 1 tUSD per hour" in caplog.text
    assert chain.escrow.balance_of(provider.address, chain.token_address) == state.job.payout
    assert chain.escrow.balance_of(provider.address) == 0  # nothing paid in ETH
    assert chain.escrow.job_state(cheap.job_id).status is Status.FUNDED


def path_cid_of(tmp: Path, upper: bytes) -> str:
    folder = tmp / "expected" / "output"
    folder.mkdir(parents=True)
    (folder / "upper.txt").write_bytes(upper)
    return path_cid(folder)
