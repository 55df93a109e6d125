"""TxSender against a real anvil: job transitions with real EIP-712 signatures and balances,
reverts decoded and final, nonces under concurrency, and every failure between the sender and
the node (refused connections, lost replies, node restarts, dropped or displaced transactions).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from hexbytes import HexBytes
from web3.exceptions import TransactionNotFound

from gridmarket.chain import ChainError, EscrowClient, Sent
from gridmarket.eip712 import sign_result
from gridmarket.escrow import ZERO_ADDRESS, JobState, Status
from gridmarket.holds import hold_for
from gridmarket.wire import JobSpec, NodeCapacityIn
from scheduler.chain import (
    Call,
    ChainUnavailableError,
    ChainWatcher,
    FeeCapExceededError,
    FeePolicy,
    RetryPolicy,
    TxOutcomeUnknownError,
    TxSender,
    apply_sent,
    nonces,
)
from scheduler.chain.sender import REGISTRY, bumped
from scheduler.service.loops import OutboxLoop
from scheduler.service.outbox_rules import OutboxRules, not_yet
from scheduler.store import Claim, SeatTakenError, Store

from ..conftest import Devnet
from .chain_support import (
    HOLD,
    OwnChain,
    acceptance,
    chain_now,
    create_job,
    ensure_provider,
    fault_proxy,
    make_w3,
    own_chain_at,
    rpc,
    wait_until,
)
from .harness import fresh_escrow

FAST = RetryPolicy(deadline_s=10, initial_delay_s=0.02, max_delay_s=0.2)
CID = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"


@pytest.fixture
def client(devnet: Devnet) -> EscrowClient:
    return EscrowClient(devnet.w3, devnet.deployment)


@pytest.fixture
def sender(devnet: Devnet, client: EscrowClient) -> TxSender:
    return TxSender(client, devnet.operator, retry=FAST)


@pytest.fixture
def own_chain(tmp_path: Path) -> Iterator[OwnChain]:
    with own_chain_at(tmp_path) as chain:
        yield chain


def stake(devnet: Devnet) -> int:
    return 2 * devnet.params.min_stake


def sign(client: EscrowClient, provider: LocalAccount, state: JobState, cid: str = CID) -> bytes:
    return sign_result(
        provider,
        client.deployment.chain_id,
        client.address,
        state.job_id,
        state.job.attempt,
        cid,
    )


def nonce_of(client: EscrowClient, account: LocalAccount) -> int:
    return int(client.w3.eth.get_transaction_count(account.address, "latest"))


def job_events(client: EscrowClient, state: JobState, name: str) -> int:
    topic = "0x" + state.job_id.hex()
    events = client.events(client.deployment.block, "latest", [None, topic])
    return sum(1 for e in events if e.name == name)


# --------------------------------------------------------------------------- job transitions


def test_assign_then_settle_pays_provider_and_fee(
    devnet: Devnet, client: EscrowClient, sender: TxSender
) -> None:
    provider = devnet.providers[0]
    ensure_provider(client, provider, stake(devnet))
    state = create_job(client, devnet.submitters[0], bounty=10**16, on_verify=True)
    paid_before = client.balance_of(provider.address)
    fees_before = int(client.call("feesAccrued"))

    assigned = apply_sent(
        state, sender.assign(state, provider.address, HOLD, acceptance(sender, state, provider))
    )
    assert assigned.status is Status.ASSIGNED
    assert assigned.job.provider == provider.address
    assert assigned.job.attempt == 1
    assert client.call("isCurrent", assigned.job_id, assigned.job.as_tuple()) is True

    sent = sender.settle(assigned, CID, sign(client, provider, assigned))
    settled = apply_sent(assigned, sent)
    assert [e.name for e in sent.events] == ["ResultSubmitted", "JobReleased"]
    assert settled.status is Status.RELEASED
    assert settled.output_cid == CID
    assert settled == client.job_state(state.job_id)  # the fold agrees with the chain's log
    fee = 10**16 * devnet.params.fee_bps // 10_000
    assert client.balance_of(provider.address) - paid_before == 10**16 - fee
    assert int(client.call("feesAccrued")) - fees_before == fee


def test_reassign_after_the_delay_relay_then_finalize_after_the_window(
    devnet: Devnet, sender: TxSender
) -> None:
    _, client = fresh_escrow(devnet, challenge_window=120, reassign_delay=60)
    sender = TxSender(client, devnet.operator, retry=FAST)
    first, second = devnet.providers[0], devnet.providers[1]
    for p in (first, second):
        ensure_provider(client, p, stake(devnet))
    s = create_job(client, devnet.submitters[1])
    state = apply_sent(s, sender.assign(s, first.address, HOLD, acceptance(sender, s, first)))
    stale_signature = sign(client, first, state)

    # the operator takes the job back only reassignDelay after the assignment
    with pytest.raises(ChainError) as err:
        sender.assign(state, second.address, HOLD, acceptance(sender, state, second))
    assert (err.value.reason or "").startswith("JobEscrowTooEarly(")
    rpc(client.w3, "evm_increaseTime", 61)
    rpc(client.w3, "evm_mine")
    # an acceptance signed for another attempt (or other terms) is refused
    with pytest.raises(ChainError) as err:
        sender.assign(state, second.address, HOLD, acceptance(sender, s, second))
    assert (err.value.reason or "").startswith("JobEscrowBadSignature(")
    sent = sender.assign(state, second.address, HOLD, acceptance(sender, state, second))
    (event,) = [e for e in sent.events if e.name == "JobAssigned"]
    assert event.args["previousProvider"] == first.address
    state = apply_sent(state, sent)
    assert (state.job.provider, state.job.attempt) == (second.address, 2)

    # The first provider's signature was for attempt 1 and is void now.
    with pytest.raises(ChainError) as err:
        sender.submit_result_for(state, CID, stale_signature)
    assert err.value.reason is not None
    assert err.value.reason.startswith("JobEscrowBadSignature(")

    paid_before = client.balance_of(second.address)
    state = apply_sent(state, sender.submit_result_for(state, CID, sign(client, second, state)))
    assert state.status is Status.SUBMITTED
    # not an on-verify job: the operator may not pay it, and nobody before the window closes
    with pytest.raises(ChainError) as err:
        sender.release(state)
    assert (err.value.reason or "").startswith("JobEscrowNotAllowed(")
    with pytest.raises(ChainError) as err:
        sender.finalize(state)
    assert (err.value.reason or "").startswith("JobEscrowChallengeWindowOpen(")
    rpc(client.w3, "evm_increaseTime", 121)
    rpc(client.w3, "evm_mine")
    state = apply_sent(state, sender.finalize(state))
    assert state.status is Status.RELEASED
    assert client.balance_of(second.address) - paid_before == state.job.payout
    assert int(client.call("freeCollateralOf", second.address)) >= stake(devnet)


def test_unassign_puts_the_job_back(devnet: Devnet, sender: TxSender) -> None:
    _, client = fresh_escrow(devnet, reassign_delay=30)
    sender = TxSender(client, devnet.operator, retry=FAST)
    provider = devnet.providers[0]
    ensure_provider(client, provider, stake(devnet))
    state = create_job(client, devnet.submitters[0])
    state = apply_sent(
        state, sender.assign(state, provider.address, HOLD, acceptance(sender, state, provider))
    )
    free = int(client.call("freeCollateralOf", provider.address))
    with pytest.raises(ChainError) as err:  # too early: a "retry later", never a refusal
        sender.unassign(state)
    assert not_yet(err.value) is not None
    assert not_yet(err.value).at == state.job.since + 30  # type: ignore[union-attr]
    rpc(client.w3, "evm_increaseTime", 31)
    rpc(client.w3, "evm_mine")
    state = apply_sent(state, sender.unassign(state))
    assert (state.status, state.job.provider) == (Status.FUNDED, ZERO_ADDRESS)
    assert int(client.call("freeCollateralOf", provider.address)) == free + state.job.collateral
    state = apply_sent(
        state, sender.assign(state, provider.address, HOLD, acceptance(sender, state, provider))
    )
    assert (state.status, state.job.attempt) == (Status.ASSIGNED, 2)


def test_an_on_verify_job_is_paid_by_the_operator_and_a_ruling_slashes(
    devnet: Devnet, client: EscrowClient, sender: TxSender
) -> None:
    bad, good = devnet.providers[2], devnet.providers[3]
    for p in (bad, good):
        ensure_provider(client, p, stake(devnet))
    submitter = devnet.submitters[0]
    terms = client.default_terms(10**16, submitter.address, on_verify=True)
    state, _ = client.create_job(
        submitter, os.urandom(32), "bafkreijobspec", chain_now(client.w3) + 86_400, 10**16, terms
    )
    assert state.job.on_verify and state.job.mediator == devnet.mediator.address
    state = apply_sent(
        state, sender.assign(state, good.address, HOLD, acceptance(sender, state, good))
    )
    paid = apply_sent(state, sender.settle(state, CID, sign(client, good, state)))
    assert paid.status is Status.RELEASED and paid.output_cid == CID

    # a result the mediator rules wrong: the provider loses the job's collateral
    state = create_job(client, submitter)
    state = apply_sent(
        state, sender.assign(state, bad.address, HOLD, acceptance(sender, state, bad))
    )
    state = apply_sent(state, sender.submit_result_for(state, CID, sign(client, bad, state)))
    stake_before = int(client.call("providerOf", bad.address)[0])
    refund_before = client.balance_of(submitter.address)
    _, sent = client.rule(devnet.mediator, state, False)
    state = apply_sent(state, sent)
    (ruled,) = [e for e in sent.events if e.name == "Ruled"]
    (slash,) = [e for e in sent.events if e.name == "ProviderSlashed"]
    assert ruled.args["upheld"] is False and ruled.args["provider"] == bad.address
    assert slash.args["amount"] == state.job.collateral > 0
    assert slash.args["submitter"] == submitter.address and slash.args["toMediator"] == 0
    assert int(client.call("providerOf", bad.address)[0]) == stake_before - state.job.collateral
    assert client.balance_of(submitter.address) - refund_before == state.job.collateral
    assert (state.status, state.output_cid, state.job.provider) == (
        Status.FUNDED,
        None,
        ZERO_ADDRESS,
    )
    state = apply_sent(
        state, sender.assign(state, good.address, HOLD, acceptance(sender, state, good))
    )
    assert (state.status, state.job.attempt) == (Status.ASSIGNED, 2)


# --------------------------------------------------------------------------- reverts


def test_revert_is_decoded_and_not_retried(devnet: Devnet, client: EscrowClient) -> None:
    provider = devnet.providers[0]
    ensure_provider(client, provider, stake(devnet))
    with fault_proxy(devnet.url) as proxy:
        sender = TxSender(EscrowClient(make_w3(proxy.url), devnet.deployment), devnet.operator)
        state = create_job(client, devnet.submitters[0])
        state = apply_sent(
            state, sender.assign(state, provider.address, HOLD, acceptance(sender, state, provider))
        )
        nonce = nonce_of(client, devnet.operator)
        stranger = Account.create().address
        cases = [
            (provider.address, f"JobEscrowSameProvider(jobId=0x{state.job_id.hex()}, "),
            (stranger, f"JobEscrowBadSignature(jobId=0x{state.job_id.hex()}, "),
        ]
        for target, reason in cases:
            proxy.counts.clear()
            started = time.monotonic()
            with pytest.raises(ChainError) as err:
                sender.assign(state, target, HOLD, acceptance(client, state, provider))
            assert not isinstance(err.value, ChainUnavailableError)
            assert err.value.reason is not None and err.value.reason.startswith(reason)
            assert time.monotonic() - started < 2
            assert proxy.counts["eth_estimateGas"] == 1  # asked once, not retried
            assert proxy.counts["eth_sendRawTransaction"] == 0
        assert nonce_of(client, devnet.operator) == nonce


def test_deadline_passed_is_final(own_chain: OwnChain) -> None:
    client = own_chain.client()
    sender = TxSender(client, own_chain.operator, retry=FAST)
    provider = own_chain.providers[0]
    ensure_provider(client, provider, 2 * own_chain.params.min_stake)
    state = create_job(client, own_chain.submitter, ttl=own_chain.params.min_duration + 5)
    rpc(client.w3, "evm_increaseTime", own_chain.params.min_duration + 60)
    rpc(client.w3, "evm_mine")
    with pytest.raises(ChainError) as err:
        sender.assign(state, provider.address, HOLD, acceptance(sender, state, provider))
    assert err.value.reason is not None
    assert err.value.reason.startswith(
        f"JobEscrowDeadlinePassed(jobId=0x{state.job_id.hex()}, deadline={state.job.deadline}, "
    )


def test_revert_in_a_mined_transaction_is_decoded(own_chain: OwnChain) -> None:
    """The job changed between the gas estimate and the block: the receipt says 'reverted',
    and the sender replays the call to name the error, then raises without retrying."""
    client = own_chain.client()
    sender = TxSender(client, own_chain.operator, retry=FAST)
    provider = own_chain.providers[0]
    ensure_provider(client, provider, 2 * own_chain.params.min_stake)
    state = create_job(client, own_chain.submitter)
    nonce = nonce_of(client, own_chain.operator)
    rpc(client.w3, "evm_setAutomine", False)
    # The submitter's cancel goes into the pool first, paying a higher tip than the sender's
    # EIP-1559 default so the block orders it first; the assign is estimated on the latest
    # block (still Funded) and follows it into the same block.
    client_submitter = own_chain.client()
    params = client_submitter.prepare(
        own_chain.submitter, "cancel", state.job_id, state.job.as_tuple()
    )
    signed = client_submitter.sign(
        own_chain.submitter,
        params,
        nonce=client.w3.eth.get_transaction_count(own_chain.submitter.address, "pending"),
        gas_price=100 * 10**9,
    )
    client.w3.eth.send_raw_transaction(signed.raw_transaction)
    outcome: list[Any] = []
    worker = threading.Thread(
        target=lambda: outcome.append(
            _capture(
                sender.assign, state, provider.address, HOLD, acceptance(sender, state, provider)
            )
        )
    )
    worker.start()
    wait_until(lambda: int(rpc(client.w3, "txpool_status")["pending"], 16) == 2, what="2 pending")
    rpc(client.w3, "evm_mine")
    worker.join(10)
    (error,) = outcome
    assert isinstance(error, ChainError), error
    assert error.reason == f"JobEscrowWrongStatus(jobId=0x{state.job_id.hex()}, status=5)"
    assert "reverted in tx 0x" in str(error)
    assert nonce_of(client, own_chain.operator) == nonce + 1  # one transaction, not retried


def _capture(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        return exc


# --------------------------------------------------------------------------- nonces


def test_concurrent_sends_keep_nonces_unique(devnet: Devnet, client: EscrowClient) -> None:
    """8 threads over two TxSender instances for the same key: one nonce sequence."""
    providers = devnet.providers[:2]
    for p in providers:
        ensure_provider(client, p, 21 * 10**16)  # 20 jobs' collateral each
    jobs = [create_job(client, devnet.submitters[i % 2]) for i in range(40)]
    senders = [TxSender(client, devnet.operator, retry=FAST) for _ in range(2)]
    start = nonce_of(client, devnet.operator)
    results: dict[bytes, Sent] = {}
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for state in jobs[worker::8]:
                sent = senders[worker % 2].assign(
                    state,
                    providers[worker % 2].address,
                    HOLD,
                    acceptance(client, state, providers[worker % 2]),
                )
                results[state.job_id] = sent
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(results) == 40
    nonces = sorted(
        int(client.w3.eth.get_transaction(HexBytes(s.tx_hash))["nonce"]) for s in results.values()
    )
    assert nonces == list(range(start, start + 40))
    assert nonce_of(client, devnet.operator) == start + 40
    for state in jobs:
        assert apply_sent(state, results[state.job_id]).status is Status.ASSIGNED


def test_stale_nonce_cache_resyncs(devnet: Devnet, client: EscrowClient, sender: TxSender) -> None:
    """Another process used the operator key: 'nonce too low', then a fresh nonce, once."""
    provider = devnet.providers[0]
    ensure_provider(client, provider, stake(devnet))
    first, second = (
        create_job(client, devnet.submitters[0]),
        create_job(client, devnet.submitters[0]),
    )
    sender.assign(
        first, provider.address, HOLD, acceptance(sender, first, provider)
    )  # the sequence now caches the next nonce
    stolen = nonce_of(client, devnet.operator)
    other = devnet.operator.sign_transaction(
        {"to": devnet.treasury.address, "value": 1, "gas": 21_000, "nonce": stolen,
         "gasPrice": client.w3.eth.gas_price, "chainId": devnet.deployment.chain_id}
    )  # fmt: skip
    client.w3.eth.wait_for_transaction_receipt(
        client.w3.eth.send_raw_transaction(other.raw_transaction)
    )
    sent = sender.assign(second, provider.address, HOLD, acceptance(sender, second, provider))
    assert int(client.w3.eth.get_transaction(HexBytes(sent.tx_hash))["nonce"]) == stolen + 1
    assert apply_sent(second, sent).status is Status.ASSIGNED


# --------------------------------------------------------------------------- network faults


def test_lost_reply_is_looked_up_not_resent(devnet: Devnet, client: EscrowClient) -> None:
    provider = devnet.providers[0]
    ensure_provider(client, provider, stake(devnet))
    with fault_proxy(devnet.url) as proxy:
        sender = TxSender(
            EscrowClient(make_w3(proxy.url), devnet.deployment), devnet.operator, retry=FAST
        )
        state = create_job(client, devnet.submitters[0])
        nonce = nonce_of(client, devnet.operator)
        # anvil mines the transaction, then the reply is lost on the way back.
        proxy.fail(1, "eth_sendRawTransaction", status=502, forward=True)
        sent = sender.assign(state, provider.address, HOLD, acceptance(sender, state, provider))
        assert proxy.counts["eth_sendRawTransaction"] == 1  # looked up by hash, not resent
        assert proxy.counts["eth_getTransactionByHash"] >= 1
        assert nonce_of(client, devnet.operator) == nonce + 1
        assert job_events(client, state, "JobAssigned") == 1
        assert apply_sent(state, sent).status is Status.ASSIGNED

        # Refused before reaching the node: looked up (unknown), then sent again, same bytes.
        state = create_job(client, devnet.submitters[0])
        proxy.counts.clear()
        proxy.fail(2, "eth_sendRawTransaction", status=503)
        sent = sender.assign(state, provider.address, HOLD, acceptance(sender, state, provider))
        assert proxy.counts["eth_sendRawTransaction"] == 3
        assert proxy.counts["eth_getTransactionByHash"] >= 2
        assert nonce_of(client, devnet.operator) == nonce + 2
        assert job_events(client, state, "JobAssigned") == 1


def test_transient_errors_are_retried_until_the_deadline(
    devnet: Devnet, client: EscrowClient
) -> None:
    provider = devnet.providers[0]
    ensure_provider(client, provider, stake(devnet))
    with fault_proxy(devnet.url) as proxy:
        sender = TxSender(
            EscrowClient(make_w3(proxy.url), devnet.deployment), devnet.operator, retry=FAST
        )
        state = create_job(client, devnet.submitters[0])
        proxy.fail(4, status=503)  # whatever the sender asks first
        assert (
            apply_sent(
                state,
                sender.assign(state, provider.address, HOLD, acceptance(sender, state, provider)),
            ).status
            is Status.ASSIGNED
        )

        state = create_job(client, devnet.submitters[0])
        # a deadline of 2 s leaves room for several tries even when one request takes most
        # of a second on a loaded machine (0.5 s once saw a single try in CI)
        impatient = TxSender(
            sender.client, devnet.operator, retry=RetryPolicy(deadline_s=2.0, initial_delay_s=0.05)
        )
        proxy.counts.clear()
        proxy.fail(10_000, status=500)
        started = time.monotonic()
        with pytest.raises(ChainUnavailableError, match=r"RPC unreachable, gave up after 2\.0s"):
            impatient.assign(state, provider.address, HOLD, acceptance(impatient, state, provider))
        assert time.monotonic() - started < 8
        assert sum(proxy.counts.values()) > 2, proxy.counts  # retried (web3 asks chainId first)
        assert proxy.counts["eth_sendRawTransaction"] == 0


def test_sender_rides_out_a_node_restart(own_chain: OwnChain) -> None:
    """anvil stops; the call keeps retrying; anvil restarts on the same port from its state
    file; the call succeeds and the chain still has everything from before."""
    client = own_chain.client(timeout=2)
    sender = TxSender(client, own_chain.operator, retry=RetryPolicy(deadline_s=60, max_delay_s=0.5))
    provider = own_chain.providers[0]
    ensure_provider(client, provider, 2 * own_chain.params.min_stake)
    state = create_job(client, own_chain.submitter)
    head = client.w3.eth.block_number

    own_chain.stop()
    impatient = TxSender(
        client, own_chain.operator, retry=RetryPolicy(deadline_s=0.3, initial_delay_s=0.05)
    )
    with pytest.raises(ChainUnavailableError):
        impatient.assign(state, provider.address, HOLD, acceptance(impatient, state, provider))
    outcome: list[Any] = []
    worker = threading.Thread(
        target=lambda: outcome.append(
            _capture(
                sender.assign, state, provider.address, HOLD, acceptance(sender, state, provider)
            )
        )
    )
    worker.start()
    time.sleep(1.5)
    assert worker.is_alive()  # still retrying
    own_chain.start()
    worker.join(30)
    (sent,) = outcome
    assert isinstance(sent, Sent), sent
    assert sent.block == head + 1  # the state file kept every block
    assert apply_sent(state, sent) == client.job_state(state.job_id)
    assert apply_sent(state, sent).status is Status.ASSIGNED


def test_dropped_transaction_is_rebroadcast_not_rebuilt(own_chain: OwnChain) -> None:
    client = own_chain.client()
    sender = TxSender(client, own_chain.operator, retry=FAST, pool_check_s=0.2)
    provider = own_chain.providers[0]
    ensure_provider(client, provider, 2 * own_chain.params.min_stake)
    state = create_job(client, own_chain.submitter)
    nonce = nonce_of(client, own_chain.operator)
    rpc(client.w3, "evm_setAutomine", False)
    outcome: list[Any] = []
    worker = threading.Thread(
        target=lambda: outcome.append(
            _capture(
                sender.assign, state, provider.address, HOLD, acceptance(sender, state, provider)
            )
        )
    )
    worker.start()
    wait_until(lambda: _pending(client) == 1, what="the assign in the pool")
    (pooled,) = _pool_hashes(client)
    rpc(client.w3, "anvil_dropAllTransactions")  # e.g. a node restarted with an empty pool
    assert _pending(client) == 0
    wait_until(lambda: _pending(client) == 1, what="the re-broadcast")
    assert _pool_hashes(client) == [pooled]  # the same signed bytes
    rpc(client.w3, "evm_mine")
    worker.join(10)
    (sent,) = outcome
    assert isinstance(sent, Sent), sent
    assert sent.tx_hash == pooled
    assert nonce_of(client, own_chain.operator) == nonce + 1


def test_displaced_transaction_is_rebuilt_with_a_new_nonce(own_chain: OwnChain) -> None:
    """Only when the node proves the first transaction can never be mined (another took its
    nonce) does the sender sign a new one."""
    client = own_chain.client()
    sender = TxSender(client, own_chain.operator, retry=FAST, pool_check_s=0.2)
    provider = own_chain.providers[0]
    ensure_provider(client, provider, 2 * own_chain.params.min_stake)
    state = create_job(client, own_chain.submitter)
    nonce = nonce_of(client, own_chain.operator)
    rpc(client.w3, "evm_setAutomine", False)
    outcome: list[Any] = []
    worker = threading.Thread(
        target=lambda: outcome.append(
            _capture(
                sender.assign, state, provider.address, HOLD, acceptance(sender, state, provider)
            )
        )
    )
    worker.start()
    wait_until(lambda: _pending(client) == 1, what="the assign in the pool")
    (first,) = _pool_hashes(client)
    rpc(client.w3, "anvil_dropAllTransactions")
    intruder = own_chain.operator.sign_transaction(
        {"to": own_chain.accounts[2].address, "value": 1, "gas": 21_000, "nonce": nonce,
         "gasPrice": client.w3.eth.gas_price, "chainId": own_chain.deployment.chain_id}
    )  # fmt: skip
    client.w3.eth.send_raw_transaction(intruder.raw_transaction)
    rpc(client.w3, "evm_mine")  # the intruder takes the nonce
    rpc(client.w3, "evm_setAutomine", True)  # from now on, mine whatever arrives
    worker.join(15)
    (sent,) = outcome
    assert isinstance(sent, Sent), sent
    assert sent.tx_hash != first
    assert int(client.w3.eth.get_transaction(HexBytes(sent.tx_hash))["nonce"]) == nonce + 1
    assert apply_sent(state, sent).status is Status.ASSIGNED
    assert job_events(client, state, "JobAssigned") == 1


def _pending(client: EscrowClient) -> int:
    return int(rpc(client.w3, "txpool_status")["pending"], 16)


def _pool_hashes(client: EscrowClient) -> list[str]:
    content = rpc(client.w3, "txpool_content")["pending"]
    return [str(tx["hash"]) for by_nonce in content.values() for tx in by_nonce.values()]


def test_escrow_client_send_resyncs_a_stale_nonce(devnet: Devnet) -> None:
    """gridmarket.chain.EscrowClient.send (used by submitters, providers, the demo): a nonce
    cached before another client used the key is refused as 'nonce too low'; it reads the
    nonce again and signs once more."""
    submitter = devnet.submitters[1]
    mine, other = (EscrowClient(devnet.w3, devnet.deployment) for _ in range(2))
    create_job(mine, submitter)  # `mine` now caches the next nonce
    create_job(other, submitter)  # ...which `other` uses
    before = nonce_of(mine, submitter)
    state = create_job(mine, submitter)
    assert state.status is Status.FUNDED
    assert nonce_of(mine, submitter) == before + 1


def test_pending_transaction_lost_in_a_node_restart_is_rebroadcast(own_chain: OwnChain) -> None:
    """anvil keeps blocks across a restart (--state) but not its pool: the sender notices its
    pending transaction is gone and broadcasts the same signed bytes to the new process."""
    client = own_chain.client(timeout=1)
    sender = TxSender(client, own_chain.operator, retry=FAST, pool_check_s=0.2)
    provider = own_chain.providers[0]
    ensure_provider(client, provider, 2 * own_chain.params.min_stake)
    state = create_job(client, own_chain.submitter)
    nonce = nonce_of(client, own_chain.operator)
    rpc(client.w3, "evm_setAutomine", False)
    outcome: list[Any] = []
    worker = threading.Thread(
        target=lambda: outcome.append(
            _capture(
                sender.assign, state, provider.address, HOLD, acceptance(sender, state, provider)
            )
        )
    )
    worker.start()
    wait_until(lambda: _pending(client) == 1, what="the assign in the pool")
    (pooled,) = _pool_hashes(client)
    own_chain.stop()
    own_chain.start()  # empty pool, automine back on
    worker.join(15)
    (sent,) = outcome
    assert isinstance(sent, Sent), sent
    assert sent.tx_hash == pooled  # the same transaction, not a new one
    assert nonce_of(client, own_chain.operator) == nonce + 1
    assert apply_sent(state, sent).status is Status.ASSIGNED


# --------------------------------------------------------------------------- fees


def metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def pooled(client: EscrowClient, account: LocalAccount, nonce: int) -> dict[str, Any] | None:
    """The node's pending transaction of ``account`` with ``nonce``, if any."""
    pending = rpc(client.w3, "txpool_content")["pending"]
    for sender, txs in pending.items():
        if sender.lower() == account.address.lower():
            tx = txs.get(str(nonce))
            return dict(tx) if tx is not None else None
    return None


def make_dearer(client: EscrowClient, than: int) -> None:
    """Mine one block after which the base fee is ``than + 1``: a transaction offering at most
    ``than`` per gas cannot be included any more."""
    rpc(client.w3, "anvil_setNextBlockBaseFeePerGas", hex(than + 1))
    rpc(client.w3, "evm_mine")


def test_stuck_transaction_is_replaced_with_higher_fees_and_mined_once(
    own_chain: OwnChain,
) -> None:
    client = own_chain.client()
    provider = own_chain.providers[0]
    ensure_provider(client, provider, 2 * own_chain.params.min_stake)
    state = create_job(client, own_chain.submitter)
    nonce = nonce_of(client, own_chain.operator)
    before = {
        m: metric(m)
        for m in (
            "gridmarket_tx_replacements_total",
            "gridmarket_tx_stuck_total",
            "gridmarket_tx_fees_paid_wei_total",
            "gridmarket_tx_gas_used_total",
        )
    }
    sender = TxSender(
        client,
        own_chain.operator,
        retry=FAST,
        pool_check_s=0.2,
        fees=FeePolicy(priority_fee=10**9, replace_after_s=0.5),
    )
    rpc(client.w3, "evm_setAutomine", False)
    try:
        outcome: list[Any] = []
        worker = threading.Thread(
            target=lambda: outcome.append(
                _capture(
                    sender.assign,
                    state,
                    provider.address,
                    HOLD,
                    acceptance(sender, state, provider),
                )
            )
        )
        worker.start()
        wait_until(lambda: pooled(client, own_chain.operator, nonce) is not None, what="in pool")
        first = pooled(client, own_chain.operator, nonce)
        assert first is not None and int(first["type"], 16) == 2  # EIP-1559
        first_max = int(first["maxFeePerGas"], 16)
        make_dearer(client, than=first_max)  # the first version cannot be mined now
        assert client.w3.eth.get_transaction_count(own_chain.operator.address) == nonce
        wait_until(
            lambda: (pooled(client, own_chain.operator, nonce) or first)["hash"] != first["hash"],
            what="a replacement",
        )
        second = pooled(client, own_chain.operator, nonce)
        assert second is not None
        assert int(second["maxFeePerGas"], 16) >= first_max * 9 // 8
        assert int(second["maxPriorityFeePerGas"], 16) >= int(first["maxPriorityFeePerGas"], 16)
        make_dearer(client, than=first_max)  # still too dear for the first, fine for the second
        worker.join(15)
    finally:
        rpc(client.w3, "evm_setAutomine", True)
    (sent,) = outcome
    assert isinstance(sent, Sent), sent
    assert sent.tx_hash == second["hash"]
    assert apply_sent(state, sent).status is Status.ASSIGNED
    # one nonce used, the first version never mined, one assignment on-chain
    assert nonce_of(client, own_chain.operator) == nonce + 1
    with pytest.raises(TransactionNotFound):
        client.w3.eth.get_transaction_receipt(first["hash"])
    assert job_events(client, state, "JobAssigned") == 1
    # what it cost is counted
    receipt = client.w3.eth.get_transaction_receipt(sent.tx_hash)
    assert (
        metric("gridmarket_tx_replacements_total") == before["gridmarket_tx_replacements_total"] + 1
    )
    assert metric("gridmarket_tx_stuck_total") == before["gridmarket_tx_stuck_total"] + 1
    assert metric("gridmarket_tx_gas_used_total") == before["gridmarket_tx_gas_used_total"] + int(
        receipt["gasUsed"]
    )
    assert metric("gridmarket_tx_fees_paid_wei_total") == before[
        "gridmarket_tx_fees_paid_wei_total"
    ] + int(receipt["gasUsed"]) * int(receipt["effectiveGasPrice"])


def test_base_fee_above_the_cap_sends_nothing(
    own_chain: OwnChain, caplog: pytest.LogCaptureFixture
) -> None:
    client = own_chain.client()
    provider = own_chain.providers[0]
    ensure_provider(client, provider, 2 * own_chain.params.min_stake)
    state = create_job(client, own_chain.submitter)
    nonce = nonce_of(client, own_chain.operator)
    cap = 20 * 10**9
    sender = TxSender(client, own_chain.operator, retry=FAST, fees=FeePolicy(max_fee_per_gas=cap))
    capped = metric("gridmarket_tx_fee_cap_hits_total")
    make_dearer(client, than=50 * 10**9)
    with pytest.raises(FeeCapExceededError, match="above the cap") as excinfo:
        sender.assign(state, provider.address, HOLD, acceptance(sender, state, provider))
    assert isinstance(excinfo.value, ChainUnavailableError)  # the outbox retries it later
    assert nonce_of(client, own_chain.operator) == nonce
    assert rpc(client.w3, "txpool_status")["pending"] == "0x0"
    assert metric("gridmarket_tx_fee_cap_hits_total") == capped + 1
    assert "above the cap max_fee_per_gas=20000000000" in caplog.text
    assert metric("gridmarket_tx_fee_cap_wei") == cap
    # cheaper again: it goes through, offering no more than the cap
    rpc(client.w3, "anvil_setNextBlockBaseFeePerGas", hex(10**9))
    rpc(client.w3, "evm_mine")
    sent = sender.assign(state, provider.address, HOLD, acceptance(sender, state, provider))
    tx = client.w3.eth.get_transaction(HexBytes(sent.tx_hash))
    assert tx["type"] == 2 and int(tx["maxFeePerGas"]) <= cap


@pytest.mark.parametrize("restart", [True, False], ids=["new-process", "same-process"])
def test_restart_settles_in_flight_transactions_before_sending(
    own_chain: OwnChain, restart: bool
) -> None:
    """A scheduler stopped with an assign in the pool: the restarted one finds it there, replaces
    it when it is stuck, and only then estimates the step again, which the chain now refuses:
    the assignment is made once, and nothing is queued behind the stuck nonce. The same holds in
    one process after the wait ended in TxOutcomeUnknownError (the outbox retries the row)."""
    client = own_chain.client()
    provider = own_chain.providers[0]
    ensure_provider(client, provider, 2 * own_chain.params.min_stake)
    state = create_job(client, own_chain.submitter)
    nonce = nonce_of(client, own_chain.operator)
    fees = FeePolicy(priority_fee=10**9, replace_after_s=0.5)
    rpc(client.w3, "evm_setAutomine", False)
    try:
        first = TxSender(
            client,
            own_chain.operator,
            retry=FAST,
            receipt_timeout_s=1,
            fees=FeePolicy(priority_fee=10**9, replace_after_s=60),
        )
        with pytest.raises(TxOutcomeUnknownError) as excinfo:
            first.assign(
                state, provider.address, HOLD, acceptance(first, state, provider)
            )  # the process "dies" waiting
        old = pooled(client, own_chain.operator, nonce)
        assert old is not None and old["hash"] == excinfo.value.tx_hash
        if restart:
            nonces.SEQUENCES.clear()  # a new process: no nonce state carried over
        restarted = TxSender(
            own_chain.client(), own_chain.operator, retry=FAST, pool_check_s=0.2, fees=fees
        )
        outcome: list[Any] = []
        worker = threading.Thread(
            target=lambda: outcome.append(
                _capture(
                    restarted.assign,
                    state,
                    provider.address,
                    HOLD,
                    acceptance(restarted, state, provider),
                )
            )
        )
        worker.start()
        wait_until(
            lambda: (pooled(client, own_chain.operator, nonce) or old)["hash"] != old["hash"],
            what="the in-flight assign replaced",
        )
        replacement = pooled(client, own_chain.operator, nonce)
        assert replacement is not None
        assert int(replacement["maxFeePerGas"], 16) >= bumped(int(old["maxFeePerGas"], 16))
        assert pooled(client, own_chain.operator, nonce + 1) is None  # nothing queued behind
        rpc(client.w3, "evm_mine")
        worker.join(15)
    finally:
        rpc(client.w3, "evm_setAutomine", True)
    (result,) = outcome
    # the step was already on-chain: the estimate refuses the stale state; nothing was sent
    assert isinstance(result, ChainError) and result.reason, result
    assert result.reason.startswith("JobEscrowJobMismatch"), result.reason
    assert nonce_of(client, own_chain.operator) == nonce + 1
    assert client.w3.eth.get_transaction_receipt(replacement["hash"])["status"] == 1
    with pytest.raises(TransactionNotFound):
        client.w3.eth.get_transaction_receipt(old["hash"])
    assert job_events(client, state, "JobAssigned") == 1
    # and the restarted sender goes on from the next nonce
    assigned = client.job_state(state.job_id)
    sent = restarted.submit_result_for(assigned, CID, sign(client, provider, assigned))
    assert client.w3.eth.get_transaction(HexBytes(sent.tx_hash))["nonce"] == nonce + 1


def test_fee_policy_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="max_fee_per_gas"):
        FeePolicy(max_fee_per_gas=0)
    with pytest.raises(ValueError, match="priority_fee"):
        FeePolicy(max_fee_per_gas=10, priority_fee=11)
    with pytest.raises(ValueError, match="replace_after_s"):
        FeePolicy(replace_after_s=0)
    assert bumped(8) == 10 and bumped(10**9) >= 10**9 * 1.125


def test_stuck_transaction_at_the_cap_waits_instead_of_overpaying(
    own_chain: OwnChain, caplog: pytest.LogCaptureFixture
) -> None:
    client = own_chain.client()
    provider = own_chain.providers[0]
    ensure_provider(client, provider, 2 * own_chain.params.min_stake)
    state = create_job(client, own_chain.submitter)
    nonce = nonce_of(client, own_chain.operator)
    base = int(client.w3.eth.get_block("latest")["baseFeePerGas"])
    cap = base + 10**9  # below base x 2 + tip: the first offer is the cap itself
    sender = TxSender(
        client,
        own_chain.operator,
        retry=FAST,
        pool_check_s=0.2,
        fees=FeePolicy(max_fee_per_gas=cap, priority_fee=10**9, replace_after_s=0.3),
    )
    capped = metric("gridmarket_tx_fee_cap_hits_total")
    replaced = metric("gridmarket_tx_replacements_total")
    rpc(client.w3, "evm_setAutomine", False)
    try:
        outcome: list[Any] = []
        worker = threading.Thread(
            target=lambda: outcome.append(
                _capture(
                    sender.assign,
                    state,
                    provider.address,
                    HOLD,
                    acceptance(sender, state, provider),
                )
            )
        )
        worker.start()
        wait_until(lambda: pooled(client, own_chain.operator, nonce) is not None, what="in pool")
        first = pooled(client, own_chain.operator, nonce)
        assert first is not None and int(first["maxFeePerGas"], 16) == cap
        make_dearer(client, than=cap)
        wait_until(
            lambda: metric("gridmarket_tx_fee_cap_hits_total") > capped, what="a refused bump"
        )
        assert pooled(client, own_chain.operator, nonce) == first  # not replaced
        rpc(client.w3, "anvil_setNextBlockBaseFeePerGas", hex(base))
        rpc(client.w3, "evm_mine")
        worker.join(15)
    finally:
        rpc(client.w3, "evm_setAutomine", True)
    (sent,) = outcome
    assert isinstance(sent, Sent), sent
    assert sent.tx_hash == first["hash"]
    assert metric("gridmarket_tx_replacements_total") == replaced
    assert f"above the cap max_fee_per_gas={cap}: waiting at the cap" in caplog.text


# --------------------------------------------------------------------------- batches (multicall)


def count_estimates(client: Any) -> list[str]:
    """The functions ``client.prepare`` estimates from now on, in order (a spy: the real
    estimate runs)."""
    estimated: list[str] = []
    prepare = client.prepare

    def counted(account: Any, fn_name: str, *args: Any, **kw: Any) -> Any:
        estimated.append(fn_name)
        return prepare(account, fn_name, *args, **kw)

    client.prepare = counted
    return estimated


def _assigns(sender: TxSender, states: list[JobState], providers: list[LocalAccount]) -> list[Call]:
    return [
        Call.assign(st, p.address, HOLD, acceptance(sender, st, p))
        for st, p in zip(states, providers, strict=True)
    ]


def test_ready_calls_go_in_one_transaction(devnet: Devnet, sender: TxSender) -> None:
    """Three jobs' assigns, then their settles: two transactions (one nonce each), each job's
    events folded from the batch to what the chain stored, every provider paid. A batch that
    passes as a whole is estimated once, as the multicall, not call by call."""
    _, client = fresh_escrow(devnet)
    sender = TxSender(client, devnet.operator, retry=FAST)
    providers = devnet.providers[:3]
    for p in providers:
        ensure_provider(client, p, stake(devnet))
    states = [create_job(client, devnet.submitters[0], on_verify=True) for _ in providers]
    nonce = nonce_of(client, devnet.operator)
    batched_before = metric("gridmarket_tx_batched_calls_total")
    estimated = count_estimates(client)
    outcomes = sender.send_many(_assigns(sender, states, providers))
    assert estimated == ["multicall"]
    assert all(isinstance(o, Sent) for o in outcomes), outcomes
    assert len({o.tx_hash for o in outcomes if isinstance(o, Sent)}) == 1  # one transaction
    assert nonce_of(client, devnet.operator) == nonce + 1
    assigned = [apply_sent(st, o) for st, o in zip(states, outcomes, strict=True)]  # type: ignore[arg-type]
    for st, p in zip(assigned, providers, strict=True):
        assert st.status is Status.ASSIGNED and st.job.provider == p.address
        assert st == client.job_state(st.job_id)

    settles = [
        Call.job("settle", st, CID, sign(client, p, st))
        for st, p in zip(assigned, providers, strict=True)
    ]
    outcomes = sender.send_many(settles)
    sent = outcomes[0]
    assert isinstance(sent, Sent) and all(o == sent for o in outcomes), outcomes
    assert len(outcomes) == 3 and nonce_of(client, devnet.operator) == nonce + 2
    assert [e.name for e in sent.events] == 3 * ["ResultSubmitted", "JobReleased"]
    for st, p in zip(assigned, providers, strict=True):
        done = apply_sent(st, sent)
        assert done.status is Status.RELEASED and done == client.job_state(st.job_id)
        assert client.balance_of(p.address) > 0
    assert metric("gridmarket_tx_batched_calls_total") - batched_before == 6


def test_more_calls_than_a_batch_holds_are_estimated_a_batch_at_a_time(devnet: Devnet) -> None:
    """Three assigns with room for two a batch: the first two are estimated and sent as one
    multicall, the last alone (preflighted, then sent as itself): two transactions."""
    _, client = fresh_escrow(devnet)
    sender = TxSender(client, devnet.operator, retry=FAST)
    providers = devnet.providers[:3]
    for p in providers:
        ensure_provider(client, p, stake(devnet))
    states = [create_job(client, devnet.submitters[0]) for _ in providers]
    nonce = nonce_of(client, devnet.operator)
    estimated = count_estimates(client)
    first, second, third = sender.send_many(_assigns(sender, states, providers), max_calls=2)
    assert estimated == ["multicall", "assign", "assign"]
    assert isinstance(first, Sent) and isinstance(third, Sent) and first == second
    assert third.tx_hash != first.tx_hash and nonce_of(client, devnet.operator) == nonce + 2
    for st in states:
        assert client.job_state(st.job_id).status is Status.ASSIGNED


def test_a_call_that_would_revert_is_refused_alone_and_the_others_go(
    devnet: Devnet, sender: TxSender
) -> None:
    """A call whose preflight reverts gets its own decoded error and never joins the batch;
    the others go in one transaction."""
    _, client = fresh_escrow(devnet)
    sender = TxSender(client, devnet.operator, retry=FAST)
    providers = devnet.providers[:3]
    for p in providers:
        ensure_provider(client, p, stake(devnet))
    states = [create_job(client, devnet.submitters[0]) for _ in providers]
    calls = _assigns(sender, states, providers)
    # the middle one carries the acceptance of another provider: BadSignature
    calls[1] = Call.assign(
        states[1], providers[1].address, HOLD, acceptance(sender, states[1], providers[2])
    )
    nonce = nonce_of(client, devnet.operator)
    first, refused, third = sender.send_many(calls)
    assert isinstance(refused, ChainError) and refused.reason, refused
    assert refused.reason.startswith("JobEscrowBadSignature"), refused.reason
    assert isinstance(first, Sent) and isinstance(third, Sent)
    assert first.tx_hash == third.tx_hash
    assert nonce_of(client, devnet.operator) == nonce + 1
    assert client.job_state(states[0].job_id).status is Status.ASSIGNED
    assert client.job_state(states[1].job_id).status is Status.FUNDED
    assert client.job_state(states[2].job_id).status is Status.ASSIGNED


def test_a_call_the_batch_skips_is_settled_alone(devnet: Devnet) -> None:
    """Two assigns to a provider whose free collateral covers one: each passes alone, the
    batch does not. They go out in one ``tryMulticall``: the first takes effect, the second is
    skipped (the batch does not revert), and the second is then answered as a single send: its
    estimate refuses it with its own error, and nothing more is sent."""
    _, client = fresh_escrow(devnet)
    sender = TxSender(client, devnet.operator, retry=FAST)
    provider = devnet.providers[0]
    bounty = stake(devnet)  # default terms: collateral = bounty = the whole stake
    ensure_provider(client, provider, bounty)
    states = [create_job(client, devnet.submitters[0], bounty=bounty) for _ in range(2)]
    nonce = nonce_of(client, devnet.operator)
    skipped = metric("gridmarket_tx_batch_skipped_calls_total")
    first, second = sender.send_many(_assigns(sender, states, [provider, provider]))
    assert isinstance(first, Sent), first
    assert isinstance(second, ChainError) and second.reason, second
    assert second.reason.startswith("ProviderRegistryInsufficientCollateral"), second.reason
    assert metric("gridmarket_tx_batch_skipped_calls_total") - skipped == 1
    assert nonce_of(client, devnet.operator) == nonce + 1  # the batch alone went out
    receipt = client.w3.eth.get_transaction_receipt(HexBytes(first.tx_hash))
    assert receipt["status"] == 1
    assert (
        bytes(client.w3.eth.get_transaction(HexBytes(first.tx_hash))["input"])[:4]
        == bytes(client.encode("tryMulticall", []))[:4]
    )
    assert apply_sent(states[0], first) == client.job_state(states[0].job_id)
    assert client.job_state(states[1].job_id).status is Status.FUNDED


def test_restart_with_a_batch_in_flight_sends_nothing_twice(own_chain: OwnChain) -> None:
    """A scheduler stopped with a batch of assigns in the pool: a batch is one nonce, so the
    restarted sender finds it there and waits for it before preflighting anything; the calls
    are then refused by their preflights (the chain has them) and nothing is sent."""
    client = own_chain.client()
    providers = own_chain.providers[:3]
    for p in providers:
        ensure_provider(client, p, 2 * own_chain.params.min_stake)
    states = [create_job(client, own_chain.submitter) for _ in providers]
    nonce = nonce_of(client, own_chain.operator)
    slow = FeePolicy(priority_fee=10**9, replace_after_s=60)
    rpc(client.w3, "evm_setAutomine", False)
    try:
        first = TxSender(client, own_chain.operator, retry=FAST, receipt_timeout_s=1, fees=slow)
        calls = _assigns(first, states, providers)
        with pytest.raises(TxOutcomeUnknownError) as excinfo:
            first.send_many(calls)  # the process "dies" waiting
        old = pooled(client, own_chain.operator, nonce)
        assert old is not None and old["hash"] == excinfo.value.tx_hash
        nonces.SEQUENCES.clear()  # a new process: no nonce state carried over
        restarted = TxSender(
            own_chain.client(), own_chain.operator, retry=FAST, pool_check_s=0.2, fees=slow
        )
        outcome: list[Any] = []
        worker = threading.Thread(
            target=lambda: outcome.append(_capture(restarted.send_many, calls))
        )
        worker.start()
        time.sleep(1.0)
        assert pooled(client, own_chain.operator, nonce + 1) is None  # nothing sent behind it
        rpc(client.w3, "evm_mine")
        worker.join(15)
    finally:
        rpc(client.w3, "evm_setAutomine", True)
    (results,) = outcome
    assert isinstance(results, list) and len(results) == 3, results
    for r in results:
        assert isinstance(r, ChainError) and r.reason, r
        assert r.reason.startswith("JobEscrowJobMismatch"), r.reason
    assert nonce_of(client, own_chain.operator) == nonce + 1
    assert client.w3.eth.get_transaction_receipt(old["hash"])["status"] == 1
    for st in states:
        assert job_events(client, st, "JobAssigned") == 1


# --------------------------------------------------------------------------- the outbox, batched

SPEC = JobSpec.model_validate({"executor": "docker", "image": "busybox:1", "command": ["true"]})
CAP = NodeCapacityIn(
    cpu_cores=8, ram_mib=16384, disk_mib=100_000, region="us", executors=["docker"]
)


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """The scheduler's store on SQLite and on PostgreSQL (tests/scheduler/conftest.py)."""
    s = Store(db_url)
    s.migrate()
    yield s
    s.close()


def _accepted(
    store: Store, client: EscrowClient, watcher: ChainWatcher, own_chain: OwnChain, n: int
) -> list[tuple[str, LocalAccount]]:
    """``n`` jobs funded, each offered to its own provider's node and accepted: ``n`` assign
    rows in the outbox. The second carries a bad acceptance (another provider's signature)."""
    out = []
    for i in range(n):
        provider = own_chain.providers[i]
        ensure_provider(client, provider, 2 * own_chain.params.min_stake)
        state = create_job(client, own_chain.submitter, on_verify=True)
        job_id = "0x" + state.job_id.hex()
        watcher.poll_once()
        assert store.set_spec(job_id, SPEC) == "queued"
        node_id = store.register_node(
            wallet=provider.address,
            name=f"gpu{i}",
            capacity=CAP,
            tier="cpu",
            agent_version="t",
            nonce=1,
        ).node_id
        won = store.dispatch(
            lambda rows, j=job_id, nd=node_id: [Claim(j, nd)], limit=8, lease_ttl=300.0
        )
        signer = own_chain.providers[n] if i == 1 else provider
        signature = "0x" + acceptance(client, state, signer, hold_for(SPEC.limits.timeout_s)).hex()
        assert store.accept(job_id, node_id, won[0].job.attempt, signature) == "leased"
        out.append((job_id, provider))
    return out


def test_the_outbox_sends_ready_rows_in_one_transaction(own_chain: OwnChain, store: Store) -> None:
    """Three assign rows ready at once: the two good ones go in one multicall transaction (one
    nonce), each row done with that hash and its job's fold as the chain's; the one that would
    revert is refused alone (failed with its error, the lease ended) without sinking them."""
    client = own_chain.client()
    watcher = ChainWatcher(client, _Cursor(store), store.apply_chain_events, reorgs=store)
    jobs = _accepted(store, client, watcher, own_chain, 3)
    assert [i.kind for i in store.outbox_pending()] == ["assign"] * 3
    nonce = nonce_of(client, own_chain.operator)
    loop = OutboxLoop(store, client, own_chain.operator, OutboxRules(store, lambda _: None))
    assert loop.once() == 3
    assert nonce_of(client, own_chain.operator) == nonce + 1
    rows = [store.outbox_of(job_id)[0] for job_id, _ in jobs]
    assert [r["status"] for r in rows] == ["done", "failed", "done"]
    assert rows[0]["tx_hash"] == rows[2]["tx_hash"] is not None
    assert rows[1]["error"].startswith("JobEscrowBadSignature"), rows[1]["error"]
    tx = client.w3.eth.get_transaction(HexBytes(rows[0]["tx_hash"]))
    assert bytes(tx["input"])[:4] == bytes(client.encode("tryMulticall", []))[:4]
    for (job_id, provider), want in zip(
        jobs, (Status.ASSIGNED, Status.FUNDED, Status.ASSIGNED), strict=True
    ):
        truth = client.job_state(bytes.fromhex(job_id[2:]))
        assert truth.status is want
        assert store.job(job_id).chain == truth  # folded from the batch's receipt at once
        if want is Status.ASSIGNED:
            assert truth.job.provider == provider.address
    assert store.job(jobs[1][0]).state != "leased"  # the refused acceptance ended that lease
    assert store.outbox_pending() == []
    assert loop.once() == 0  # nothing left, nothing sent again
    assert nonce_of(client, own_chain.operator) == nonce + 1


def test_the_outbox_keeps_its_batches_within_outbox_batch_calls(
    own_chain: OwnChain, store: Store
) -> None:
    """OUTBOX_BATCH_CALLS=2 and four ready assigns (the second would revert): no transaction
    carries more than two calls. Jobs 3 and 4 pass whole as one multicall; jobs 1 and 2 do
    not, so each is preflighted, and job 1 goes alone, as a plain ``assign``."""
    client = own_chain.client()
    watcher = ChainWatcher(client, _Cursor(store), store.apply_chain_events, reorgs=store)
    jobs = _accepted(store, client, watcher, own_chain, 4)
    nonce = nonce_of(client, own_chain.operator)
    rules = OutboxRules(store, lambda _: None)
    loop = OutboxLoop(store, client, own_chain.operator, rules, batch_calls=2)
    assert loop.once() == 4
    assert nonce_of(client, own_chain.operator) == nonce + 2
    rows = [store.outbox_of(job_id)[0] for job_id, _ in jobs]
    assert [r["status"] for r in rows] == ["done", "failed", "done", "done"]
    assert rows[2]["tx_hash"] == rows[3]["tx_hash"] != rows[0]["tx_hash"]
    multicall = bytes(client.encode("tryMulticall", []))[:4]

    def selector(row: dict[str, Any]) -> bytes:
        return bytes(client.w3.eth.get_transaction(HexBytes(row["tx_hash"]))["input"])[:4]

    assert selector(rows[2]) == multicall != selector(rows[0])


class _Cursor:
    def __init__(self, store: Store) -> None:
        self.store = store

    def load(self) -> int | None:
        return self.store.chain_cursor()


def test_a_step_someone_else_took_first_is_skipped_not_fatal(
    own_chain: OwnChain, store: Store
) -> None:
    """Three relay rows ready together; while the outbox's batch is on its way (between its
    estimate and its block), the provider of the second job posts its own result. The batch
    does not revert: the other two relays land in it, and the second row, whose call the
    ``tryMulticall`` skipped, is neither sent again nor failed: it waits for the watcher, then
    finds the result on-chain and goes on to ``finalize``, like a relay that was never
    needed."""
    client = own_chain.client()
    watcher = ChainWatcher(client, _Cursor(store), store.apply_chain_events, reorgs=store)
    sender = TxSender(client, own_chain.operator, retry=FAST)
    providers = own_chain.providers[:3]
    states = []
    for p in providers:
        ensure_provider(client, p, 2 * own_chain.params.min_stake)
        state = create_job(client, own_chain.submitter)
        sent = sender.assign(state, p.address, HOLD, acceptance(client, state, p))
        states.append(apply_sent(state, sent))
    watcher.poll_once()
    job_ids = ["0x" + st.job_id.hex() for st in states]
    for job_id, st, p in zip(job_ids, states, providers, strict=True):
        assert store.job(job_id).chain == st
        sig = "0x" + sign(client, p, st).hex()
        store.outbox_add(job_id, "relay", {"output_cid": CID, "signature": sig})
    raced = states[1]
    prepare = client.prepare
    estimated: list[str] = []

    def racing(account: Any, fn_name: str, *args: Any, **kw: Any) -> Any:
        estimated.append(fn_name)
        params = prepare(account, fn_name, *args, **kw)
        if fn_name == "multicall" and estimated.count("multicall") == 1:
            # the batch passed its estimate; the provider is faster
            own = own_chain.client()
            own.send(providers[1], "submitResult", raced.job_id, raced.job.as_tuple(), CID)
        return params

    client.prepare = racing  # type: ignore[method-assign]
    nonce = nonce_of(client, own_chain.operator)
    skipped = metric("gridmarket_tx_batch_skipped_calls_total")
    loop = OutboxLoop(store, client, own_chain.operator, OutboxRules(store, lambda _: None))
    assert loop.once() == 2
    # one transaction, not reverted; the raced row's single-send estimate refused it, so
    # nothing else was sent
    assert nonce_of(client, own_chain.operator) == nonce + 1
    assert estimated == ["multicall", "submitResultFor"]
    assert metric("gridmarket_tx_batch_skipped_calls_total") - skipped == 1
    rows = [store.outbox_of(job_id)[0] for job_id in job_ids]
    assert [r["status"] for r in rows] == ["done", "pending", "done"]
    assert rows[0]["tx_hash"] == rows[2]["tx_hash"] is not None
    tx = HexBytes(rows[0]["tx_hash"])
    assert client.w3.eth.get_transaction_receipt(tx)["status"] == 1
    assert (
        bytes(client.w3.eth.get_transaction(tx)["input"])[:4]
        == bytes(client.encode("tryMulticall", []))[:4]
    )
    for st in states:
        truth = client.job_state(st.job_id)
        assert truth.status is Status.SUBMITTED and truth.output_cid == CID
        assert job_events(client, st, "ResultSubmitted") == 1
    assert store.job(job_ids[0]).chain == client.job_state(states[0].job_id)  # from the batch
    # the watcher brings the provider's own submission; the row then sends nothing
    watcher.poll_once()
    assert loop.once() == 1
    assert nonce_of(client, own_chain.operator) == nonce + 1
    row = store.outbox_of(job_ids[1])[0]
    assert (row["status"], row["tx_hash"]) == ("done", None)
    window = int(client.call("challengeWindow"))
    for job_id, st in zip(job_ids, states, strict=True):
        kinds = [(r["kind"], r["status"], r["not_before"]) for r in store.outbox_of(job_id)]
        since = client.job_state(st.job_id).job.since
        assert [k[:2] for k in kinds] == [("relay", "done"), ("finalize", "pending")], kinds
        assert kinds[1][2] == since + window
    assert loop.once() == 0  # the finalizes wait for the window: nothing sent
    assert nonce_of(client, own_chain.operator) == nonce + 1


def test_a_seat_is_assigned_by_its_group_and_a_wallet_gets_one_seat(
    own_chain: OwnChain, store: Store
) -> None:
    """A replicated job's seat is assigned as ``assign(groupId, seat, ...)`` through the
    outbox. A wallet seen holding a seat on-chain (here one assigned outside this store) is
    kept off the group's other seats: never offered them, and its acceptance of one is
    withdrawn (the escrow would revert ``JobEscrowSeatTaken``)."""
    client = own_chain.client()
    watcher = ChainWatcher(client, _Cursor(store), store.apply_chain_events, reorgs=store)
    sender = TxSender(client, own_chain.operator, retry=FAST)
    a, b = own_chain.providers[:2]
    for p in (a, b):
        ensure_provider(client, p, 2 * own_chain.params.min_stake)
    group, seats, _ = client.create_replicated(
        own_chain.submitter,
        os.urandom(32),
        "bafkreijobspec",
        chain_now(client.w3) + 86_400,
        3 * 10**16,
        3,
    )
    watcher.poll_once()
    ids = ["0x" + st.job_id.hex() for st in seats]
    assert [r.job_id for r in store.seats("0x" + group.hex())] == ids
    # seat 0 goes to A outside this store (another scheduler's database, say)
    sent = sender.assign(seats[0], a.address, HOLD, acceptance(client, seats[0], a))
    assert [bytes(e.args["jobId"]) for e in sent.events if e.name == "JobAssigned"] == [
        seats[0].job_id
    ]
    watcher.poll_once()
    for job_id in ids[1:]:
        assert a.address.lower() in store.job(job_id).excluded_wallets
    # seat 1 offered to A's node anyway (a stale offer): the acceptance is withdrawn
    hold = hold_for(SPEC.limits.timeout_s)
    nodes = {}
    for name, p in (("a", a), ("b", b)):
        nodes[name] = store.register_node(
            wallet=p.address, name=name, capacity=CAP, tier="cpu", agent_version="t", nonce=1
        ).node_id
    for job_id in ids[1:]:
        assert store.set_spec(job_id, SPEC) == "queued"
    won = store.dispatch(lambda rows: [Claim(ids[1], nodes["a"])], limit=8, lease_ttl=300.0)
    signature = "0x" + acceptance(client, seats[1], a, hold).hex()
    with pytest.raises(SeatTakenError):
        store.accept(ids[1], nodes["a"], won[0].job.attempt, signature)
    # B takes seat 2: the outbox assigns it by the group id and the seat index
    won = store.dispatch(lambda rows: [Claim(ids[2], nodes["b"])], limit=8, lease_ttl=300.0)
    signature = "0x" + acceptance(client, seats[2], b, hold).hex()
    assert store.accept(ids[2], nodes["b"], won[0].job.attempt, signature) == "leased"
    [item] = [i for i in store.outbox_pending() if i.job_id == ids[2]]
    assert item.payload["hold_for"] == hold
    OutboxRules(store, lambda _: None).send(sender, item)
    truth = client.job_state(seats[2].job_id)
    assert (truth.status, truth.job.provider) == (Status.ASSIGNED, b.address)
    assert truth.job.hold_until == truth.job.since + hold
    assert store.job(ids[2]).chain == truth
    [row] = store.outbox_of(ids[2])
    tx = client.w3.eth.get_transaction(HexBytes(row["tx_hash"]))
    want = client.encode(
        "assign", group, 2, seats[2].job.as_tuple(), b.address, hold, bytes.fromhex(signature[2:])
    )
    assert bytes(tx["input"]) == want
