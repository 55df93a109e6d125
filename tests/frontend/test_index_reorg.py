"""The explorer's index across reorgs on a private anvil: a job's funding, assignment and payment
reorged out (``evm_revert`` and other blocks, ``anvil_reorg``) disappear from the index, and come
back when the same transactions are mined again; a reorg past every kept block rebuilds it."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hexbytes import HexBytes

from frontend_api.index import ChainIndex
from frontend_api.records import NotFoundError
from gridmarket.chain import EscrowClient
from gridmarket.deploy import deploy_test_token, list_token
from gridmarket.eip712 import sign_result
from gridmarket.escrow import Status
from gridmarket.token import TokenClient
from scheduler.chain import TxSender
from tests.scheduler.chain_support import (
    HOLD,
    OwnChain,
    acceptance,
    create_job,
    ensure_provider,
    own_chain_at,
    rpc,
)

CID = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[OwnChain]:
    with own_chain_at(tmp_path) as c:
        yield c


def raw_tx(client: EscrowClient, tx_hash: str) -> HexBytes:
    return HexBytes(rpc(client.w3, "eth_getRawTransactionByHash", tx_hash))


def resend(client: EscrowClient, raw: HexBytes) -> None:
    tx = client.w3.eth.send_raw_transaction(raw)
    assert client.w3.eth.wait_for_transaction_receipt(tx, timeout=10)["status"] == 1


def same_as_fresh(index: ChainIndex, client: EscrowClient) -> None:
    """The index after its rollbacks says what an index built now from the chain says."""
    fresh = ChainIndex(client, min_interval_s=0)
    fresh.refresh(force=True)
    assert [(e.tx_hash, e.log_index, e.name) for e in index.events()] == [
        (e.tx_hash, e.log_index, e.name) for e in fresh.events()
    ]
    assert index.job_counts() == fresh.job_counts()
    assert index.payouts() == fresh.payouts()
    assert index.providers() == fresh.providers()


def test_index_follows_reorgs(chain: OwnChain, caplog: pytest.LogCaptureFixture) -> None:
    client = chain.client()
    w3 = client.w3
    provider = chain.providers[0]
    ensure_provider(client, provider, 2 * chain.params.min_stake)
    sender = TxSender(client, chain.operator)
    index = ChainIndex(client, min_interval_s=0)
    index.refresh(force=True)

    # funding
    snap = rpc(w3, "evm_snapshot")
    state = create_job(client, chain.submitter, on_verify=True)
    job_id = "0x" + state.job_id.hex()
    raw_fund = raw_tx(client, client.events(w3.eth.block_number, w3.eth.block_number)[0].tx_hash)
    index.refresh(force=True)
    assert index.job(job_id)[0].status is Status.FUNDED
    with caplog.at_level(logging.WARNING, logger="frontend_api.index"):
        assert rpc(w3, "evm_revert", snap)
        rpc(w3, "anvil_mine", "0x2")
        index.refresh(force=True)
    with pytest.raises(NotFoundError):
        index.job(job_id)
    assert index.reorgs == 1
    assert any("chain reorg" in r.getMessage() for r in caplog.records)
    same_as_fresh(index, client)
    resend(client, raw_fund)
    index.refresh(force=True)
    assert index.job(job_id)[0].status is Status.FUNDED

    # assignment
    snap = rpc(w3, "evm_snapshot")
    state = client.job_state(state.job_id)
    raw_assign = raw_tx(
        client,
        sender.assign(state, provider.address, HOLD, acceptance(sender, state, provider)).tx_hash,
    )
    index.refresh(force=True)
    assert index.job(job_id)[0].status is Status.ASSIGNED
    assert rpc(w3, "evm_revert", snap)
    rpc(w3, "anvil_mine", "0x1")  # same height, another block
    index.refresh(force=True)
    assert index.job(job_id)[0].status is Status.FUNDED
    same_as_fresh(index, client)
    resend(client, raw_assign)
    index.refresh(force=True)
    assert index.job(job_id)[0].status is Status.ASSIGNED

    # payment
    snap = rpc(w3, "evm_snapshot")
    state = client.job_state(state.job_id)
    signature = sign_result(
        provider, chain.deployment.chain_id, client.address, state.job_id, state.job.attempt, CID
    )
    raw_pay = raw_tx(client, sender.settle(state, CID, signature).tx_hash)
    index.refresh(force=True)
    assert index.job(job_id)[0].status is Status.RELEASED
    assert len(index.payouts()) == 1
    assert rpc(w3, "evm_revert", snap)
    rpc(w3, "anvil_mine", "0x3")
    index.refresh(force=True)
    assert index.job(job_id)[0].status is Status.ASSIGNED
    assert index.payouts() == []
    same_as_fresh(index, client)
    resend(client, raw_pay)
    index.refresh(force=True)
    assert index.job(job_id)[0].status is Status.RELEASED
    assert index.reorgs == 3
    same_as_fresh(index, client)

    # anvil_reorg: the last 2 blocks (the payment and an empty one) replaced by empty ones
    rpc(w3, "anvil_mine", "0x1")
    index.refresh(force=True)
    rpc(w3, "anvil_reorg", 2, [])
    index.refresh(force=True)
    assert index.job(job_id)[0].status is Status.ASSIGNED
    assert index.reorgs == 4
    same_as_fresh(index, client)


def test_a_reorg_past_every_kept_block_rebuilds(chain: OwnChain) -> None:
    client = chain.client()
    w3 = client.w3
    index = ChainIndex(client, min_interval_s=0, keep_blocks=2)
    snap = rpc(w3, "evm_snapshot")
    job_ids = []
    for _ in range(3):
        job_ids.append("0x" + create_job(client, chain.submitter).job_id.hex())
        index.refresh(force=True)
    assert rpc(w3, "evm_revert", snap)
    rpc(w3, "anvil_mine", "0x5")
    index.refresh(force=True)
    assert index.reorgs == 1
    assert "rebuilding from block" in (index.last_reorg or "")
    for job_id in job_ids:
        with pytest.raises(NotFoundError):
            index.job(job_id)
    same_as_fresh(index, client)


def test_token_amounts_follow_a_reorg(chain: OwnChain) -> None:
    """A tUSD job's funding reorged out takes its tUSD amounts with it (and never touches the
    ETH ones); mined again, they come back, as an index built afresh says."""
    client = chain.client()
    w3 = client.w3
    owner, submitter = chain.accounts[0], chain.submitter
    token = deploy_test_token(w3, owner)
    client.deployment = list_token(w3, owner, client.deployment, token)
    TokenClient(w3, token).send(owner, "mint", submitter.address, 100 * 10**6)
    index = ChainIndex(client, min_interval_s=0)
    index.refresh(force=True)
    eth_funded = index.stats(submitter.address).funded

    snap = rpc(w3, "evm_snapshot")
    amount = 5 * 10**6
    terms = replace(client.default_terms(amount, submitter.address), token=token)
    deadline = int(w3.eth.get_block("latest")["timestamp"]) + 3600
    state, sent = client.create_job(
        submitter, os.urandom(32), "bafkreitoken", deadline, amount, terms
    )
    raw_fund = raw_tx(client, sent.tx_hash)
    index.refresh(force=True)
    stats = index.stats(submitter.address)
    assert stats.tokens[token].funded == amount and stats.funded == eth_funded
    assert index.job("0x" + state.job_id.hex())[0].job.token == token
    assert rpc(w3, "evm_revert", snap)
    rpc(w3, "anvil_mine", "0x2")
    index.refresh(force=True)
    assert index.reorgs == 1
    assert token not in index.stats(submitter.address).tokens
    same_as_fresh(index, client)
    resend(client, raw_fund)
    index.refresh(force=True)
    assert index.stats(submitter.address).tokens[token].funded == amount
    fresh = ChainIndex(client, min_interval_s=0)
    fresh.refresh(force=True)
    assert fresh.stats(submitter.address).tokens == index.stats(submitter.address).tokens
