"""The node's own chain duties on a real anvil (its own: these tests move the clock), jobs driven
by hand (fund with terms, register and stake, signed acceptance, operator assign, submitResult,
rulings, time travel): the result guard, finalize, ``earnings``, ``withdraw`` and ``unstake``.
The duties go through the daemon's light client (``chain.light``: JSON-RPC, no web3), the set-up
through web3's; the light client's reads, reverts and nonce handling are checked against web3's
on the same chain."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account.signers.local import LocalAccount

from agent.acceptance import EscrowFacts
from agent.earnings import NothingToWithdrawError, earnings, eth, withdraw
from agent.onchain import (
    GRACE_S,
    Finalizer,
    OnChainSubmitter,
    ResultGuard,
    TimeLeft,
    guard_delay,
    seat_ids,
)
from devstack.providers import new_providers
from gridmarket import abicodec
from gridmarket import escrow as escrow_model
from gridmarket.chain import ChainError, Deployment
from gridmarket.eip712 import sign_result
from gridmarket.escrow import JobState, Status
from gridmarket.ethsig import sign_transaction
from gridmarket.jsonrpc import BadAnswerError, JsonRpc, RpcError
from gridmarket.keystore import create_keystore
from gridmarket.wire import ResultReport, RunReason
from tests.agent.chain_support import Chain, own_chain
from tests.agent.test_cli import HEAVY

ROOT = Path(__file__).resolve().parents[2]
WINDOW = 600  # the challenge window of this chain
CID_A = "bafkreigks6arfsq3xxfpvqrrwonchxcnu6do76auprhhfomao6c273sixm"  # bytes_cid(b"a")
CID_B = "bafkreib6epubmabzlffdhckpmvsodmjuro6xuaei2qwevs3t52xnlhaatu"  # bytes_cid(b"b")


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    with own_chain(
        tmp_path_factory.mktemp("onchain"), challenge_window=WINDOW, reassign_delay=300
    ) as chain:
        yield chain


def submitted(chain: Chain, state: JobState, provider: LocalAccount, cid: str) -> JobState:
    state, _ = chain.escrow.call_job(provider, "submitResult", state, cid)
    return state


def report(state: JobState, provider: LocalAccount, chain: Chain, cid: str) -> ResultReport:
    signature = sign_result(
        provider,
        chain.escrow.deployment.chain_id,
        chain.escrow.address,
        state.job_id,
        state.job.attempt,
        cid,
    )
    return ResultReport(
        attempt=state.job.attempt,
        reason=RunReason.SUCCEEDED,
        duration_s=1.0,
        output_cid=cid,
        signature="0x" + signature.hex(),
    )


def test_guard_delay_defaults(chain: Chain) -> None:
    deployment = Deployment.load(chain.deployment_file)
    assert guard_delay(None, deployment) == 150.0  # half the reassign delay
    assert guard_delay(7.0, deployment) == 7.0
    assert guard_delay(None, None) == 60.0


def test_guard_checks_before_the_take_back_window_opens() -> None:
    """reassignDelay 600 s, delay 300 s: a result ready soon after the acceptance is checked
    300 s before the operator may take the job back; one ready after a long run (the window is
    open already) after the grace of 10 s; without the acceptance time, after the delay."""

    def never(job_id: str, report: ResultReport) -> str | None:
        raise AssertionError("not called")

    guard = ResultGuard(never, delay_s=300, take_back_s=600)
    assert guard.due(ready=1000 + 60, accepted=1000) == 1000 + 300
    assert guard.due(ready=1000 + 250, accepted=1000) == 1000 + 300
    assert guard.due(ready=1000 + 2000, accepted=1000) == 1000 + 2000 + GRACE_S
    assert guard.due(ready=1000 + 60) == 1000 + 60 + 300
    short = ResultGuard(never, delay_s=1, take_back_s=600)
    assert short.due(ready=1000, accepted=1000) == 1001  # never later than the delay


def test_guard_checks_before_the_hold_ends_and_the_deadline() -> None:
    """With the job's hold and deadline read from the chain (``TimeLeft``, seconds from the
    read), the check is no later than ``margin_s`` before the hold ends, nor before the
    deadline; with no grace when that is near, and no change once the hold is over."""

    def never(job_id: str, report: ResultReport) -> str | None:
        raise AssertionError("not called")

    guard = ResultGuard(never, delay_s=300, margin_s=60)
    assert guard.due(ready=1000, left=TimeLeft(hold_s=200, deadline_s=5000)) == 1000 + 140
    assert guard.due(ready=1000, left=TimeLeft(hold_s=900, deadline_s=5000)) == 1000 + 300
    assert guard.due(ready=1000, left=TimeLeft(hold_s=30, deadline_s=5000)) == 1000  # at once
    assert guard.due(ready=1000, left=TimeLeft(hold_s=900, deadline_s=100)) == 1000 + 40
    assert guard.due(ready=1000, left=TimeLeft(hold_s=-5, deadline_s=5000)) == 1000 + 300
    # read later than the result was ready: counted from the read
    left = TimeLeft(hold_s=200, deadline_s=5000)
    assert guard.due(ready=1000, left=left, now=1010) == 1010 + 140
    # with the reassign delay: the take-back opens when both are over (the later of the two)
    both = ResultGuard(never, delay_s=300, take_back_s=600, margin_s=60)
    assert both.due(ready=1060, accepted=1000, left=TimeLeft(900, 5000)) == 1060 + 300
    assert both.due(ready=1060, accepted=1000, left=TimeLeft(100, 5000)) == 1060 + 40
    # a run longer than the reassign delay: without the hold the window is open (10 s of
    # grace); with 800 s of hold left the scheduler still gets its delay
    assert both.due(ready=2000, accepted=1000) == 2000 + GRACE_S
    assert both.due(ready=2000, accepted=1000, left=TimeLeft(800, 5000)) == 2000 + 300
    assert both.due(ready=2000, accepted=1000, left=TimeLeft(-1, 5000)) == 2000 + GRACE_S


def test_guard_puts_an_unrelayed_result_on_chain_before_the_hold_ends(chain: Chain) -> None:
    """A job whose relay never comes (the scheduler would get an hour): the guard reads the
    job's ``holdUntil`` (the JobAssigned fold) and its own ``submitResult`` is mined before it,
    ``margin_s`` ahead, from the provider's wallet, while nobody else can take the job back."""
    (provider,) = new_providers(chain.escrow, chain.accounts[0], 1, stake_wei=10**17)
    submitter = OnChainSubmitter(chain.light, provider)
    hold, margin = 20, 8
    guard = ResultGuard(
        submitter.submit, delay_s=3600, time_left=submitter.time_left, margin_s=margin
    ).start()
    try:
        state = chain.assign(chain.fund(), provider, hold_for=hold)
        assert state.job.hold_until == chain.now() + hold  # the assign's block is the latest
        job_id = "0x" + state.job_id.hex()
        left = submitter.time_left(job_id, report(state, provider, chain, CID_A))
        assert left is not None and 0 < left.hold_s <= hold
        guard.watch(job_id, report(state, provider, chain, CID_A))
        deadline = time.monotonic() + hold + 30
        while job_id not in guard.sent and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        guard.stop(flush_s=0)
    assert job_id in guard.sent, "the guard did not submit before the hold ended"
    done = chain.escrow.job_state(state.job_id)
    assert done.status is Status.SUBMITTED and done.output_cid == CID_A
    receipt = chain.w3.eth.get_transaction_receipt(guard.sent[job_id])  # type: ignore[arg-type]
    mined_at = chain.w3.eth.get_block(receipt["blockNumber"])["timestamp"]
    assert mined_at < state.job.hold_until  # before the operator could take it back
    assert mined_at >= state.job.hold_until - margin - 3  # not at once: the relay had its time
    tx = chain.w3.eth.get_transaction(guard.sent[job_id])  # type: ignore[arg-type]
    assert tx["from"] == provider.address
    # no longer assigned: nothing left to wait for
    assert submitter.time_left(job_id, report(state, provider, chain, CID_A)) is None


def test_guard_submits_only_what_nobody_relayed(chain: Chain) -> None:
    provider = chain.accounts[5]
    chain.stake(provider, 10**17)
    submitter = OnChainSubmitter(chain.light, provider)
    guard = ResultGuard(submitter.submit, delay_s=0.5, retry_s=0.2).start()

    sat_on = chain.assign(chain.fund(), provider)  # the scheduler keeps the result to itself
    relayed = chain.assign(chain.fund(), provider)  # the scheduler relays it in time
    taken = chain.assign(chain.fund(), provider)  # handed back before the guard looks
    r_sat, r_relayed, r_taken = (
        report(s, provider, chain, CID_A) for s in (sat_on, relayed, taken)
    )
    guard.watch("0x" + sat_on.job_id.hex(), r_sat)
    guard.watch("0x" + relayed.job_id.hex(), r_relayed)
    guard.watch("0x" + taken.job_id.hex(), r_taken)
    relay = chain.accounts[2]  # anyone may relay a signed result
    assert r_relayed.signature is not None
    chain.escrow.call_job(
        relay, "submitResultFor", relayed, CID_A, bytes.fromhex(r_relayed.signature[2:])
    )
    chain.escrow.call_job(provider, "unassign", taken)
    deadline = time.monotonic() + 20
    while guard.pending and time.monotonic() < deadline:
        time.sleep(0.1)
    guard.stop(flush_s=5)
    assert not guard.pending
    assert list(guard.sent) == ["0x" + sat_on.job_id.hex()]  # one transaction, the right one
    state = chain.escrow.job_state(sat_on.job_id)
    assert state.status is Status.SUBMITTED and state.output_cid == CID_A
    tx = chain.w3.eth.get_transaction(guard.sent["0x" + sat_on.job_id.hex()])  # type: ignore[arg-type]
    assert tx["from"] == provider.address
    assert chain.escrow.job_state(relayed.job_id).status is Status.SUBMITTED
    assert chain.escrow.job_state(taken.job_id).status is Status.FUNDED


def test_guard_checks_everything_at_once_when_stopped(chain: Chain) -> None:
    provider = chain.accounts[6]
    chain.stake(provider, 10**17)
    guard = ResultGuard(OnChainSubmitter(chain.light, provider).submit, delay_s=3600).start()
    state = chain.assign(chain.fund(), provider)
    guard.watch("0x" + state.job_id.hex(), report(state, provider, chain, CID_B))
    guard.stop(flush_s=10)  # the node leaves: nobody else would submit it
    assert chain.escrow.job_state(state.job_id).output_cid == CID_B
    # a failed run is never watched
    guard = ResultGuard(OnChainSubmitter(chain.light, provider).submit, delay_s=0)
    guard.watch("0x" + "00" * 32, ResultReport(attempt=1, reason=RunReason.TIMEOUT, duration_s=1))
    assert guard.pending == []


def test_finalize_earnings_and_withdraw(chain: Chain, tmp_path: Path) -> None:
    provider = chain.accounts[8]
    stake = 10**17
    chain.stake(provider, stake)
    escrow = chain.escrow
    # A: paid after the window (finalized by the node); D: the mediator rules it wrong
    a = submitted(chain, chain.assign(chain.fund(10**16), provider), provider, CID_A)
    d = submitted(chain, chain.assign(chain.fund(2 * 10**16), provider), provider, CID_B)
    d, _ = escrow.rule(chain.mediator, d, False)
    assert d.status is Status.FUNDED
    finalizer = Finalizer(chain.light, provider)
    assert finalizer.run_once() == []  # the window is open
    chain.warp(WINDOW + 1)
    sent = finalizer.run_once()
    assert len(sent) == 1 and escrow.job_state(a.job_id).status is Status.RELEASED
    assert finalizer.run_once() == [] and Finalizer(chain.light, provider).run_once() == []
    # B: pending (window open); C: running; E: handed back
    b = submitted(chain, chain.assign(chain.fund(3 * 10**16), provider), provider, CID_B)
    c = chain.assign(chain.fund(10**16), provider)
    e = chain.assign(chain.fund(10**16), provider)
    escrow.call_job(provider, "unassign", e)

    got = earnings(escrow, provider.address)
    by_id = {j.job_id: j for j in got.jobs}
    jobs = {"a": a, "b": b, "c": c, "d": d, "e": e}
    state_of = {key: by_id["0x" + s.job_id.hex()].state for key, s in jobs.items()}
    assert state_of == {
        "a": "released",
        "b": "pending",
        "c": "running",
        "d": "lost",
        "e": "lost",
    }
    payout_a = a.job.payout
    assert got.earned_wei == payout_a == by_id["0x" + a.job_id.hex()].payout_wei
    assert got.pending_wei == b.job.payout
    assert got.slashed_wei == d.job.collateral == by_id["0x" + d.job_id.hex()].slashed_wei
    released_at = by_id["0x" + a.job_id.hex()].released_at
    assert released_at is not None
    day = datetime.fromtimestamp(released_at, UTC).strftime("%Y-%m-%d")
    assert got.per_day == {day: payout_a} and got.jobs_per_day == {day: 1}
    assert got.stake_wei == stake - d.job.collateral
    assert got.locked_wei == b.job.collateral + c.job.collateral
    assert got.free_wei == got.stake_wei - got.locked_wei
    assert got.withdrawable_wei == payout_a

    # the command line: JSON for machines, plain lines for a pipe
    keystore = tmp_path / "keystore.json"
    create_keystore(keystore, "pw", private_key=bytes(provider.key), iterations=2**10)
    env = {
        "GRIDMARKET_AGENT_RPC_URL": chain.url,
        "GRIDMARKET_AGENT_DEPLOYMENT": str(chain.deployment_file),
        "GRIDMARKET_AGENT_KEYSTORE": str(keystore),
        "GRIDMARKET_AGENT_PASSWORD": "pw",
    }
    done = cli(env, "earnings", "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["wallet"] == provider.address and body["earned_wei"] == str(payout_a)
    assert body["per_day_wei"] == {day: str(payout_a)} and body["withdrawable_wei"] == str(payout_a)
    assert {j["job_id"]: j["state"] for j in body["jobs"]}["0x" + b.job_id.hex()] == "pending"
    text = cli(env, "earnings").stdout
    lines = text.splitlines()
    assert f"earned        {eth(payout_a)} (1 job)" in lines
    assert f"  {day}  {eth(payout_a)}  (1 job)" in lines
    for job in (a, b, c, d, e):  # each job on one line, its id whole
        assert sum(1 for line in lines if "0x" + job.job_id.hex() in line) == 1

    stranger = cli(env, "earnings", "--wallet", chain.accounts[9].address.lower())
    assert stranger.returncode == 0, stranger.stderr
    assert "none assigned to this wallet yet" in stranger.stdout
    assert f"wallet        {chain.accounts[9].address}" in stranger.stdout
    assert "--wallet: not a 0x address" in cli(env, "earnings", "--wallet", "0x12").stderr

    recipient = chain.accounts[9].address
    before = int(chain.w3.eth.get_balance(recipient))
    done = cli(env, "withdraw", "--to", recipient)
    assert done.returncode == 0, done.stderr
    assert f"withdrew {eth(payout_a)} to {recipient}" in done.stdout
    assert f"escrow balance  {eth(payout_a)} -> 0 ETH" in done.stdout
    assert int(chain.w3.eth.get_balance(recipient)) == before + payout_a
    again = cli(env, "withdraw")
    assert again.returncode == 1 and "nothing to withdraw" in again.stderr
    assert again.stderr.count("\n") == 1  # one line, no traceback

    # B's window passes: `finalize` pays it; withdraw to the wallet itself, gas accounted
    chain.warp(WINDOW + 1)
    done = cli(env, "finalize")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 1 and escrow.job_state(b.job_id).status is Status.RELEASED
    out = withdraw(escrow, provider)
    assert out.amount_wei == b.job.payout and out.escrow_after_wei == 0
    assert out.to_after_wei == out.to_before_wei + out.amount_wei - out.gas_wei
    with pytest.raises(NothingToWithdrawError):
        withdraw(escrow, provider)


def test_earnings_and_withdraw_per_token(chain: Chain, tmp_path: Path) -> None:
    """tUSD jobs next to an ETH job: each total in its own currency (the ETH lines count ETH
    jobs only), a tUSD block with the tUSD stake and balance, per day and per job in tUSD; then
    `withdraw --token tUSD` moves the tUSD balance out (the recipient's tUSD checked)."""
    (provider,) = new_providers(chain.escrow, chain.accounts[0], 1, stake_wei=10**17)
    chain.erc20.send(chain.accounts[0], "mint", provider.address, 100 * 10**6)
    escrow, tusd = chain.escrow, chain.tusd
    escrow.stake_token(provider, chain.token_address, 10 * 10**6)
    # P: paid (finalized after the window); Q: pending; R: an ETH job running
    p = submitted(chain, chain.assign(chain.fund_token(2 * 10**6), provider), provider, CID_A)
    chain.warp(WINDOW + 1)
    assert len(Finalizer(chain.light, provider).run_once()) == 1
    q = submitted(chain, chain.assign(chain.fund_token(3 * 10**6), provider), provider, CID_B)
    r = chain.assign(chain.fund(10**16), provider)

    got = earnings(escrow, provider.address)
    by_id = {j.job_id: j for j in got.jobs}
    paid = by_id["0x" + p.job_id.hex()]
    assert paid.state == "released" and paid.symbol == "tUSD" and paid.token == tusd.address
    assert paid.payout_wei == p.job.payout and paid.bounty_wei == 2 * 10**6
    assert by_id["0x" + r.job_id.hex()].symbol == "ETH"
    # the ETH totals are ETH's alone
    assert got.earned_wei == 0 and got.pending_wei == 0 and got.withdrawable_wei == 0
    assert got.locked_wei == r.job.collateral and got.per_day == {}
    (t,) = got.tokens
    assert (t.symbol, t.address, t.decimals) == ("tUSD", tusd.address, 6)
    assert t.earned_wei == p.job.payout and t.pending_wei == q.job.payout
    assert t.stake_wei == 10 * 10**6 and t.locked_wei == q.job.collateral
    assert t.free_wei == t.stake_wei - t.locked_wei and t.withdrawable_wei == p.job.payout
    assert paid.day is not None and t.per_day == {paid.day: p.job.payout}

    keystore = tmp_path / "keystore.json"
    create_keystore(keystore, "pw", private_key=bytes(provider.key), iterations=2**10)
    env = {
        "GRIDMARKET_AGENT_RPC_URL": chain.url,
        "GRIDMARKET_AGENT_DEPLOYMENT": str(chain.deployment_file),
        "GRIDMARKET_AGENT_KEYSTORE": str(keystore),
        "GRIDMARKET_AGENT_PASSWORD": "pw",
    }
    done = cli(env, "earnings", "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["earned_wei"] == "0" and body["stake_wei"] == str(10**17)
    entry = body["tokens"]["tUSD"]
    assert entry["address"] == tusd.address and entry["earned_wei"] == str(p.job.payout)
    assert entry["withdrawable_wei"] == str(p.job.payout) and entry["stake_wei"] == "10000000"
    assert entry["per_day_wei"] == {paid.day: str(p.job.payout)}
    jobs = {j["job_id"]: j for j in body["jobs"]}
    assert jobs["0x" + q.job_id.hex()]["symbol"] == "tUSD"
    assert jobs["0x" + q.job_id.hex()]["payout_wei"] == str(q.job.payout)
    lines = cli(env, "earnings").stdout.splitlines()
    assert "earned        0 ETH (0 jobs)" in lines
    assert f"tUSD ({tusd.address})" in lines
    assert f"earned        {tusd.fmt(p.job.payout)} (1 job)" in lines
    assert (
        f"pending       {tusd.fmt(q.job.payout)} (1 result in the challenge window, 0 disputed)"
        in lines
    )
    assert "stake         10 tUSD" in lines
    assert f"withdrawable  {tusd.fmt(p.job.payout)}" in lines
    assert f"  {paid.day}  {tusd.fmt(p.job.payout)}  (1 job)" in lines
    (line,) = [x for x in lines if "0x" + p.job_id.hex() in x]
    assert line.endswith(f"released  {paid.day}  {tusd.fmt(p.job.payout)}")

    recipient = chain.accounts[9].address
    before = chain.erc20.balance_of(recipient)
    eth_before = escrow.balance_of(provider.address)
    done = cli(env, "withdraw", "--token", "tUSD", "--to", recipient, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["symbol"] == "tUSD" and out["token"] == tusd.address
    assert out["amount_wei"] == str(p.job.payout) and out["escrow_after_wei"] == "0"
    assert chain.erc20.balance_of(recipient) == before + p.job.payout
    assert int(out["to_after_wei"]) == before + p.job.payout
    assert escrow.balance_of(provider.address, chain.token_address) == 0
    assert escrow.balance_of(provider.address) == eth_before  # ETH untouched
    again = cli(env, "withdraw", "--token", tusd.address.lower())
    assert again.returncode == 1
    assert "nothing to withdraw from the escrow in tUSD" in again.stderr
    unknown = cli(env, "withdraw", "--token", "USDC")
    assert unknown.returncode == 1 and "--token 'USDC' is not a token" in unknown.stderr

    # Q's window passes: finalized, withdrawn to the wallet itself (plain lines)
    chain.warp(WINDOW + 1)
    assert len(Finalizer(chain.light, provider).run_once()) == 1
    held = chain.erc20.balance_of(provider.address)
    done = cli(env, "withdraw", "--token", "tusd")
    assert done.returncode == 0, done.stderr
    assert f"withdrew {tusd.fmt(q.job.payout)} to {provider.address}" in done.stdout
    assert f"escrow balance  {tusd.fmt(q.job.payout)} -> 0 tUSD" in done.stdout
    assert chain.erc20.balance_of(provider.address) == held + q.job.payout
    with pytest.raises(NothingToWithdrawError):
        withdraw(escrow, provider, token=tusd)


def provider_env(chain: Chain, provider: LocalAccount, tmp_path: Path) -> dict[str, str]:
    keystore = tmp_path / "keystore.json"
    create_keystore(keystore, "pw", private_key=bytes(provider.key), iterations=2**10)
    return {
        "GRIDMARKET_AGENT_RPC_URL": chain.url,
        "GRIDMARKET_AGENT_DEPLOYMENT": str(chain.deployment_file),
        "GRIDMARKET_AGENT_KEYSTORE": str(keystore),
        "GRIDMARKET_AGENT_PASSWORD": "pw",
    }


def utc(timestamp: int) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def test_unstake_eth(chain: Chain, tmp_path: Path) -> None:
    """`unstake AMOUNT` takes free ETH stake out (refusing more than free, or a bad amount,
    with nothing sent); `unstake --complete` refuses before the delay and then moves the
    pending amount to the withdrawable balance; the minStake warning."""
    (provider,) = new_providers(chain.escrow, chain.accounts[0], 1, stake_wei=10**17)
    escrow, w3, delay = chain.escrow, chain.w3, chain.params.unstake_delay
    job = chain.assign(chain.fund(10**16), provider)  # locks 0.01 ETH of the 0.1
    assert job.job.collateral == 10**16
    env = provider_env(chain, provider, tmp_path)
    nonce = w3.eth.get_transaction_count(provider.address)

    refused = {
        ("unstake", "0.1"): "cannot unstake 0.1 ETH: more than the free stake "
        "(stake 0.1 ETH, 0.01 ETH locked by jobs, 0.09 ETH free)",
        ("unstake", "0"): "AMOUNT '0' must be more than 0 ETH",
        ("unstake", "--", "-1"): "AMOUNT '-1' is not an amount of ETH",
        ("unstake", "lots"): "AMOUNT 'lots' is not an amount of ETH",
        ("unstake", "0.0000000000000000001"): "has more than 18 decimals",
        ("unstake",): "give AMOUNT to unstake",
        ("unstake", "1", "--complete"): "either AMOUNT (request an unstake) or --complete",
        ("unstake", "--complete"): f"{provider.address} has no unstake pending in ETH",
    }
    for args, message in refused.items():
        done = cli(env, *args)
        assert done.returncode == 1 and message in done.stderr, (args, done.stderr)
        assert done.stderr.count("\n") == 1 and done.stdout == ""
    assert w3.eth.get_transaction_count(provider.address) == nonce  # nothing sent

    # request part of the free stake: JSON
    done = cli(env, "unstake", "0.05", "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # 0.05 left: above minStake
    body = json.loads(done.stdout)
    ready = chain.now() + delay
    assert body["amount_wei"] == str(5 * 10**16) and body["symbol"] == "ETH"
    assert body["stake_before_wei"] == str(10**17) and body["stake_after_wei"] == str(5 * 10**16)
    assert body["pending_wei"] == str(5 * 10**16) and body["locked_wei"] == str(10**16)
    assert body["available_at"] == ready and body["available_at_utc"] == utc(ready)
    assert body["below_min_stake"] is False
    stake, locked, unstake_at, _, pending = escrow.call("providerOf", provider.address)
    assert (stake, locked, unstake_at, pending) == (5 * 10**16, 10**16, ready, 5 * 10**16)

    # complete before the delay: refused with the time, nothing sent
    nonce = w3.eth.get_transaction_count(provider.address)
    early = cli(env, "unstake", "--complete")
    assert early.returncode == 1
    assert f"can be completed at {utc(ready)} (in " in early.stderr
    assert w3.eth.get_transaction_count(provider.address) == nonce

    # a second request, plain text: adds to the pending one and restarts the delay
    done = cli(env, "unstake", "0.035")
    assert done.returncode == 0, done.stderr
    ready = chain.now() + delay
    lines = done.stdout.splitlines()
    assert lines[0].startswith("requested unstake of 0.035 ETH (tx 0x")
    assert lines[1:] == [
        "stake         0.05 ETH -> 0.015 ETH (0.01 ETH locked, 0.005 ETH free)",
        "unstaking     0.085 ETH (with 0.05 ETH requested earlier: its delay restarted)",
        f"ready         {utc(ready)} (in 7 days)",
        "then run `gridmarket-agent unstake --complete` and `gridmarket-agent withdraw`",
    ]
    # the job handed back: its collateral is free again; 'all' takes it, below minStake: warned
    escrow.call_job(provider, "unassign", job)
    done = cli(env, "unstake", "all")
    assert done.returncode == 0, done.stderr
    assert "requested unstake of 0.015 ETH" in done.stdout
    assert (
        "warning: the ETH stake left, 0 ETH, is below the escrow's minStake of 0.01 ETH: "
        "this node is no longer eligible for work"
    ) in done.stderr
    assert not escrow.call("isEligible", provider.address)
    nothing = cli(env, "unstake", "all")
    assert nothing.returncode == 1 and "no free stake in ETH to unstake" in nothing.stderr

    # past the delay: complete moves exactly the pending amount to the withdrawable balance
    chain.warp(delay + 1)
    before = escrow.balance_of(provider.address)
    done = cli(env, "unstake", "--complete")
    assert done.returncode == 0, done.stderr
    assert escrow.balance_of(provider.address) == before + 10**17
    lines = done.stdout.splitlines()
    assert lines[0].startswith("moved 0.1 ETH of unstaked stake to the withdrawable balance (tx 0x")
    assert lines[1:] == [
        f"withdrawable  {eth(before)} -> {eth(before + 10**17)}",
        "stake         0 ETH",
        "send it out with `gridmarket-agent withdraw`",
    ]
    assert escrow.call("providerOf", provider.address)[4] == 0
    again = cli(env, "unstake", "--complete")
    assert again.returncode == 1 and "has no unstake pending in ETH" in again.stderr


def test_unstake_token(chain: Chain, tmp_path: Path) -> None:
    """The same for a tUSD stake (`--token`): requestUnstakeToken / completeUnstakeToken, the
    ETH stake untouched, no minStake warning (that floor is ETH's)."""
    (provider,) = new_providers(chain.escrow, chain.accounts[0], 1, stake_wei=10**17)
    escrow, w3, delay, tusd = chain.escrow, chain.w3, chain.params.unstake_delay, chain.tusd
    chain.erc20.send(chain.accounts[0], "mint", provider.address, 100 * 10**6)
    escrow.stake_token(provider, chain.token_address, 10 * 10**6)
    env = provider_env(chain, provider, tmp_path)

    nonce = w3.eth.get_transaction_count(provider.address)
    over = cli(env, "unstake", "10.5", "--token", "tUSD")
    assert over.returncode == 1
    assert (
        "cannot unstake 10.5 tUSD: more than the free stake "
        "(stake 10 tUSD, 0 tUSD locked by jobs, 10 tUSD free)"
    ) in over.stderr
    digits = cli(env, "unstake", "0.0000001", "--token", "tUSD")
    assert digits.returncode == 1 and "has more than 6 decimals" in digits.stderr
    assert w3.eth.get_transaction_count(provider.address) == nonce

    done = cli(env, "unstake", "4", "--token", "tusd", "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    body = json.loads(done.stdout)
    ready = chain.now() + delay
    assert body["symbol"] == "tUSD" and body["token"] == tusd.address and body["decimals"] == 6
    assert body["amount_wei"] == "4000000" and body["stake_after_wei"] == "6000000"
    assert body["available_at"] == ready and body["below_min_stake"] is False
    stake, _, unstake_at, _, pending = escrow.call("stakeOf", provider.address, tusd.address)
    assert (stake, unstake_at, pending) == (6 * 10**6, ready, 4 * 10**6)
    assert escrow.call("providerOf", provider.address)[0] == 10**17  # ETH untouched

    early = cli(env, "unstake", "--complete", "--token", "tUSD")
    assert early.returncode == 1 and f"can be completed at {utc(ready)} (in 7 days)" in early.stderr
    none_in_eth = cli(env, "unstake", "--complete")
    assert none_in_eth.returncode == 1 and "no unstake pending in ETH" in none_in_eth.stderr

    chain.warp(delay + 1)
    before = escrow.balance_of(provider.address, tusd.address)
    eth_before = escrow.balance_of(provider.address)
    done = cli(env, "unstake", "--complete", "--token", "tUSD", "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["amount_wei"] == "4000000" and body["stake_wei"] == "6000000"
    assert body["withdrawable_before_wei"] == str(before)
    assert body["withdrawable_after_wei"] == str(before + 4 * 10**6)
    assert escrow.balance_of(provider.address, tusd.address) == before + 4 * 10**6
    assert escrow.balance_of(provider.address) == eth_before
    text = cli(env, "withdraw", "--token", "tUSD")
    assert text.returncode == 0 and f"withdrew {tusd.fmt(before + 4 * 10**6)}" in text.stdout


def test_finalize_pays_a_dispute_the_mediator_left_unruled(chain: Chain) -> None:
    provider = chain.accounts[7]
    chain.stake(provider, 10**17)
    state = submitted(chain, chain.assign(chain.fund(), provider), provider, CID_A)
    deposit = int(chain.escrow.call("depositOf", state.job.as_tuple()))  # its bounty
    chain.escrow.send(chain.submitter, "dispute", state.job_id, state.job.as_tuple(), value=deposit)
    finalizer = Finalizer(chain.light, provider)
    chain.warp(WINDOW + 1)
    assert finalizer.run_once() == []  # disputed: the mediation window counts now
    assert earnings(chain.escrow, provider.address).jobs[0].state == "disputed"
    chain.warp(chain.params.mediation_window + 1)
    assert len(finalizer.run_once()) == 1
    assert chain.escrow.job_state(state.job_id).status is Status.RELEASED


def test_earnings_needs_the_chain(tmp_path: Path) -> None:
    done = cli({"GRIDMARKET_AGENT_KEYSTORE": str(tmp_path / "none.json")}, "earnings")
    assert done.returncode == 1 and "needs the chain" in done.stderr


def test_submitter_refuses_a_job_that_is_not_ours(chain: Chain) -> None:
    provider, other = chain.accounts[5], chain.accounts[4]
    chain.stake(other, 10**17)
    state = chain.assign(chain.fund(), other)
    with pytest.raises(ChainError, match="is assigned to"):
        OnChainSubmitter(chain.light, provider).submit(
            "0x" + state.job_id.hex(), report(state, provider, chain, CID_A)
        )


# --------------------------------------------------------------------------- the light client


def test_the_light_client_reads_what_web3_reads(chain: Chain) -> None:
    """The daemon's client (JSON-RPC, its own ABI codec) against web3's on one chain: every
    escrow event (a result whose CID is not UTF-8 among them: decoded as the same InvalidText,
    with the same problem), each job's state, views, the free collateral, and the acceptance
    policy's reads (EscrowFacts over either client)."""
    (provider,) = new_providers(chain.escrow, chain.accounts[0], 1, stake_wei=10**17)
    light, escrow = chain.light, chain.escrow
    state = chain.assign(chain.fund(), provider)
    token_job = chain.fund_token()
    hostile = b"bafy\xff\xfe not utf-8"  # the contract takes any bytes as a string
    data = escrow.encode("submitResult", state.job_id, state.job.as_tuple(), "x")[:4]
    data += abicodec.encode(
        ["bytes32", abicodec.canonical_type(_job_param(chain)), "bytes"],
        [state.job_id, state.job.as_tuple(), hostile],
    )
    tx = chain.w3.eth.send_raw_transaction(
        sign_transaction(
            provider,
            {
                "chainId": escrow.deployment.chain_id,
                "nonce": chain.w3.eth.get_transaction_count(provider.address, "pending"),
                "gas": 500_000,
                "maxFeePerGas": 10**11,
                "maxPriorityFeePerGas": 10**9,
                "to": escrow.address,
                "data": data,
            },
        ).raw_transaction
    )
    assert chain.w3.eth.wait_for_transaction_receipt(tx)["status"] == 1
    escrow.forget_nonce(provider.address)

    start = escrow.deployment.block
    events = light.events(start)
    assert events == escrow.events(start) and len(events) > 10
    (odd,) = [e for e in events if e.name == "ResultSubmitted" and e.args["jobId"] == state.job_id]
    assert set(odd.problems) == {"outputCid"}
    for job in (state, token_job):
        assert light.job_state(job.job_id) == escrow.job_state(job.job_id)
    assert light.job_state(state.job_id).status is Status.SUBMITTED
    for name, args in (
        ("providerOf", [provider.address]),
        ("stakeOf", [provider.address, chain.token_address]),
        ("challengeWindow", []),
        ("isListedMediator", [chain.mediator.address]),
        ("depositOf", [state.job.as_tuple()]),
    ):
        assert light.call(name, *args) == escrow.call(name, *args), name
    assert light.free_collateral_of(provider.address) == escrow.free_collateral_of(provider.address)
    assert light.token_balance_of(chain.token_address, chain.submitter.address) == (
        chain.erc20.balance_of(chain.submitter.address)
    )
    reads, facts = EscrowFacts(light), EscrowFacts(escrow)
    for mediator in (chain.mediator.address, provider.address):
        assert reads.is_listed_mediator(mediator) == facts.is_listed_mediator(mediator)
    assert reads.submitter_of(state.job_id) == facts.submitter_of(state.job_id)
    for token in (escrow_model.ZERO_ADDRESS, chain.token_address):
        assert reads.free_collateral_of(provider.address, token) == facts.free_collateral_of(
            provider.address, token
        )
    assert light.block_number() == chain.w3.eth.block_number
    assert light.timestamp() == chain.now()


def mined_revert(chain: Chain, provider: LocalAccount) -> tuple[Any, str, Any]:
    """A ``submitResult`` estimated, then beaten by another one and mined anyway (status 0):
    its params, transaction hash and receipt (as the light client reads it)."""
    light, escrow = chain.light, chain.escrow
    state = chain.assign(chain.fund(), provider)
    params = light.prepare(provider, "submitResult", state.job_id, state.job.as_tuple(), CID_A)
    escrow.call_job(provider, "submitResult", state, CID_B)  # first, after the estimate
    signed = sign_transaction(
        provider,
        {
            "chainId": escrow.deployment.chain_id,
            "nonce": chain.w3.eth.get_transaction_count(provider.address, "pending"),
            "gas": int(params["gas"], 16),
            "to": escrow.address,
            "data": params["data"],
            **light.fees(),
        },
    )
    tx = light.rpc.request("eth_sendRawTransaction", ["0x" + signed.raw_transaction.hex()])
    return params, tx, light.wait_for_receipt(bytes.fromhex(tx[2:]), 30)


def test_the_light_client_names_a_revert_as_web3_does(chain: Chain) -> None:
    """A transaction that would revert is refused before it is sent, with the contract's custom
    error decoded by name and arguments, word for word as the web3 client says it; one that
    reverts once mined (the state changed after the estimate) is decoded by replaying it on its
    block."""
    (provider,) = new_providers(chain.escrow, chain.accounts[0], 1, stake_wei=10**17)
    light, escrow = chain.light, chain.escrow
    funded = chain.fund()
    args = (funded.job_id, funded.job.as_tuple(), CID_A)
    with pytest.raises(ChainError) as light_error:
        light.send(provider, "submitResult", *args)
    with pytest.raises(ChainError) as web3_error:
        escrow.send(provider, "submitResult", *args)
    assert str(light_error.value) == str(web3_error.value)
    assert light_error.value.reason == web3_error.value.reason
    assert str(light_error.value).startswith(
        f"submitResult would revert: JobEscrowWrongStatus(jobId=0x{funded.job_id.hex()}, "
    )

    params, _tx, receipt = mined_revert(chain, provider)
    with pytest.raises(ChainError, match=r"submitResult reverted in tx 0x[0-9a-f]{64}: ") as mined:
        light.sent_from_receipt("submitResult", params, receipt)
    assert mined.value.reason is not None
    assert mined.value.reason.startswith("JobEscrowWrongStatus(jobId=")


def test_a_mined_revert_on_a_node_without_past_states_is_named_unknown(tmp_path: Path) -> None:
    """A node that keeps no state at the reverted transaction's block (anvil
    ``--prune-history``; geth past its 128 recent states) cannot replay it: both clients say
    the transaction reverted and that why is unknown, instead of retrying a read that cannot
    succeed."""
    with own_chain(tmp_path, prune_history=True) as chain:
        (provider,) = new_providers(chain.escrow, chain.accounts[0], 1, stake_wei=10**17)
        light, escrow = chain.light, chain.escrow
        params, tx, receipt = mined_revert(chain, provider)
        chain.rpc("evm_mine")  # the block after: the reverted one's state is gone
        unknown = (
            r"submitResult reverted in tx 0x[0-9a-f]{64} \(why is unknown: the node keeps no state"
        )
        with pytest.raises(ChainError, match=unknown) as mined:
            light.sent_from_receipt("submitResult", params, receipt)
        assert mined.value.reason is None
        assert "BlockOutOfRange" in str(mined.value)
        web3_receipt = chain.w3.eth.get_transaction_receipt(tx)
        with pytest.raises(ChainError, match=unknown) as mined_web3:
            escrow.sent_from_receipt("submitResult", params, web3_receipt)  # type: ignore[arg-type]
        assert mined_web3.value.reason is None


def test_the_light_client_recovers_a_stale_nonce(chain: Chain) -> None:
    """Another sender of the same key (here the web3 client) makes the light client's cached
    nonce stale: 'nonce too low' reads it again and re-signs once. The transaction is EIP-1559
    (type 2); a legacy EIP-155 one signed by gridmarket.ethsig is mined too."""
    (provider,) = new_providers(chain.escrow, chain.accounts[0], 1, stake_wei=10**17)
    light, escrow = chain.light, chain.escrow
    sent = light.send(provider, "stake", value=1)
    assert chain.w3.eth.get_transaction(sent.tx_hash)["type"] == 2  # type: ignore[arg-type]
    assert [e.name for e in sent.events] == ["Staked"]
    escrow.forget_nonce(provider.address)
    escrow.send(provider, "stake", value=1)
    light.send(provider, "stake", value=1)  # its cached nonce was used by web3's
    assert escrow.call("providerOf", provider.address)[0] == 10**17 + 3

    legacy = sign_transaction(
        provider,
        {
            "chainId": escrow.deployment.chain_id,
            "nonce": chain.w3.eth.get_transaction_count(provider.address, "pending"),
            "gasPrice": chain.w3.eth.gas_price,
            "gas": 100_000,
            "to": escrow.address,
            "value": 1,
            "data": escrow.encode("stake"),
        },
    )
    tx = chain.w3.eth.send_raw_transaction(legacy.raw_transaction)
    assert bytes(tx) == legacy.hash
    assert chain.w3.eth.wait_for_transaction_receipt(tx)["status"] == 1
    assert escrow.call("providerOf", provider.address)[0] == 10**17 + 4


def test_finalizer_resolves_a_replicated_job(chain: Chain) -> None:
    """A seat's provider resolves its replicated job (``resolve`` with every seat's struct)
    once every seat has a result; not before."""
    one, two = new_providers(chain.escrow, chain.accounts[0], 2, stake_wei=10**17)
    spec = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
    group, seats, _ = chain.escrow.create_replicated(
        chain.submitter, os.urandom(32), spec, chain.now() + 7200, 2 * 10**16, 2
    )
    assert seat_ids(group, 2) == escrow_model.seat_ids(group, 2) == [s.job_id for s in seats]
    submitted(chain, chain.assign(seats[0], one), one, CID_A)
    finalizer = Finalizer(chain.light, one)
    assert finalizer.run_once() == []  # the other seat is still open
    submitted(chain, chain.assign(seats[1], two), two, CID_A)
    assert len(finalizer.run_once()) == 1
    assert [chain.escrow.job_state(s.job_id).status for s in seats] == [Status.RELEASED] * 2
    assert finalizer.run_once() == []


class Flaky(httpx.BaseTransport):
    """Refuses the first ``refusals`` connections, then forwards to the real node."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.methods: list[str] = []
        self.inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.methods.append(json.loads(request.read())["method"])
        if self.refusals > 0:
            self.refusals -= 1
            raise httpx.ConnectError("connection refused", request=request)
        return self.inner.handle_request(request)


def test_the_json_rpc_client_retries_reads_as_web3_does(chain: Chain) -> None:
    """A read that fails in transport is tried 5 times in all (web3's HTTPProvider default),
    a raw transaction once; an error answer is an RpcError with the node's code; an answer over
    the size cap is refused."""
    flaky = Flaky(refusals=4)
    rpc = JsonRpc(chain.url, backoff_s=0.01, transport=flaky)
    assert int(rpc.request("eth_blockNumber", []), 16) == chain.w3.eth.block_number
    assert flaky.methods == ["eth_blockNumber"] * 5
    flaky.refusals, flaky.methods = 5, []
    with pytest.raises(httpx.ConnectError):
        rpc.request("eth_chainId", [])
    assert flaky.methods == ["eth_chainId"] * 5
    flaky.refusals, flaky.methods = 1, []
    with pytest.raises(httpx.ConnectError):
        rpc.request("eth_sendRawTransaction", ["0x00"])
    assert flaky.methods == ["eth_sendRawTransaction"]
    with pytest.raises(RpcError) as refused:
        rpc.request("eth_sendRawTransaction", ["0x00"])
    assert refused.value.code is not None and refused.value.method == "eth_sendRawTransaction"
    small = JsonRpc(chain.url, max_bytes=64)
    with pytest.raises(BadAnswerError, match="over 64 bytes"):
        small.request("eth_getBlockByNumber", ["latest", False])
    for client in (rpc, small):
        client.close()


PROBE = """
import json, os, sys, threading, time
from pathlib import Path
from agent.cli import main

def probe():
    time.sleep(float(sys.argv[2]))
    from agent.acceptance import EscrowFacts
    from agent.onchain import Finalizer
    from gridmarket.deployment import Deployment
    from gridmarket.ethsig import KeyAccount
    from gridmarket.lightchain import LightEscrowClient

    signer = KeyAccount(bytes.fromhex(sys.argv[3]))  # the duties the daemon runs, run here
    light = LightEscrowClient.connect(sys.argv[4], Deployment.load(Path(sys.argv[5])))
    Finalizer(light, signer).run_once()
    reads = EscrowFacts(light)
    reads.free_collateral_of(signer.address)
    reads.is_listed_mediator(signer.address)
    light.send(signer, "stake", value=1)
    loaded = sorted(m for m, module in sys.modules.items() if module is not None)
    print("MODULES " + json.dumps(loaded), flush=True)
    os._exit(0)

threading.Thread(target=probe, daemon=True).start()
main(["--config", sys.argv[1], "run"])
"""

WEB3_STACK = ("rlp", "eth_rlp", "eth_hash", "aiohttp", "websockets", "ckzg", "parsimonious")


def test_the_daemon_with_rpc_url_loads_no_web3(chain: Chain, tmp_path: Path) -> None:
    """The run path with ``rpc_url`` (docs/agent.md, "Footprint"): the daemon connects to the
    chain, tops its tUSD stake up at start (permit + stakeToken, sent), then the finalizer, the
    acceptance reads and a transaction run in the same process, and none of web3, eth-account,
    eth-abi or their stack is loaded."""
    (provider,) = new_providers(chain.escrow, chain.accounts[0], 1, stake_wei=10**17)
    chain.erc20.send(chain.accounts[0], "mint", provider.address, 10 * 10**6)
    keystore = tmp_path / "keystore.json"
    create_keystore(keystore, "pw", private_key=bytes(provider.key), kdf="pbkdf2", iterations=10)
    settings = tmp_path / "agent.yaml"
    settings.write_text(
        json.dumps(
            {
                "scheduler_url": "http://127.0.0.1:9",
                "ipfs_api": "/ip4/127.0.0.1/tcp/9/http",
                "keystore": str(keystore),
                "password": "pw",
                "region": "eu-west",
                "work_dir": str(tmp_path / "work"),
                "executors": ["wasm"],
                "rpc_url": chain.url,
                "deployment": str(chain.deployment_file),
                "stake_tokens": {"tUSD": "2"},
            }
        )
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            PROBE,
            str(settings),
            "8",
            bytes(provider.key).hex(),
            chain.url,
            str(chain.deployment_file),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("GRIDMARKET_AGENT_")},
        timeout=90,
        check=False,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("MODULES ")), None)
    assert line is not None, (done.stdout, done.stderr)
    modules = set(json.loads(line.removeprefix("MODULES ")))
    assert "gridmarket.lightchain" in modules and "agent.daemon" in modules
    assert "registration" in done.stderr  # it got as far as trying to register
    assert "staked 2 tUSD" in done.stderr, done.stderr  # the top-up at start, sent
    assert chain.escrow.call("stakeOf", provider.address, chain.token_address)[0] == 2 * 10**6
    assert chain.escrow.call("providerOf", provider.address)[0] == 10**17 + 1
    heavy = (*HEAVY, *WEB3_STACK)
    assert sorted(m for m in modules if m.split(".")[0] in heavy) == []


def _job_param(chain: Chain) -> dict[str, Any]:
    """The ABI parameter of the Job struct (submitResult's second)."""
    (fn,) = [f for f in chain.escrow.deployment.abi if f.get("name") == "submitResult"]
    return dict(fn["inputs"][1])


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRIDMARKET_AGENT_")}
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**base, **env},
        timeout=120,
        check=False,
    )
