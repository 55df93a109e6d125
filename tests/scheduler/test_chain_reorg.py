"""Reorgs on a private anvil, with the scheduler's real store behind the watcher: a job's funding,
assignment and payment reorged out (``evm_revert`` to a snapshot, then other blocks mined, or
``anvil_reorg``) leave the store's fold equal to the chain's, and the same transactions sent
again fold back in; a reorg deeper than the kept checkpoints stops the watcher with a clear
error and leaves the store as it was."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hexbytes import HexBytes

from gridmarket.chain import EscrowClient
from gridmarket.eip712 import sign_result
from gridmarket.escrow import Status
from gridmarket.holds import hold_for
from gridmarket.watcher import ChainWatcher, ReorgTooDeepError
from gridmarket.wire import JobSpec, NodeCapacityIn
from scheduler.chain import TxSender
from scheduler.service.outbox_rules import OutboxRules
from scheduler.store import Claim, NotFoundError, Store
from scheduler.store.rows import job_to_json

from .chain_support import (
    HOLD,
    OwnChain,
    acceptance,
    create_job,
    ensure_provider,
    own_chain_at,
    rpc,
)

CID = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
SPEC = JobSpec.model_validate({"executor": "docker", "image": "busybox:1", "command": ["true"]})
CAP = NodeCapacityIn(
    cpu_cores=8, ram_mib=16384, disk_mib=100_000, region="us", executors=["docker"]
)


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[OwnChain]:
    with own_chain_at(tmp_path) as c:
        yield c


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """The scheduler's store on SQLite and on PostgreSQL (tests/scheduler/conftest.py)."""
    s = Store(db_url)
    s.migrate()
    yield s
    s.close()


class Cursor:
    def __init__(self, store: Store) -> None:
        self.store = store

    def load(self) -> int | None:
        return self.store.chain_cursor()


def watcher_for(client: EscrowClient, store: Store, **kw: Any) -> ChainWatcher:
    return ChainWatcher(client, Cursor(store), store.apply_chain_events, reorgs=store, **kw)


def raw_tx(client: EscrowClient, tx_hash: str) -> HexBytes:
    """The signed bytes of a mined transaction, to send the very same one again later."""
    return HexBytes(rpc(client.w3, "eth_getRawTransactionByHash", tx_hash))


def resend(client: EscrowClient, raw: HexBytes) -> None:
    receipt = client.w3.eth.wait_for_transaction_receipt(
        client.w3.eth.send_raw_transaction(raw), timeout=10
    )
    assert receipt["status"] == 1


def matches_chain(store: Store, client: EscrowClient, job_id: str) -> Status:
    """The store's fold of ``job_id`` is the chain's (rebuilt from eth_getLogs); its status."""
    truth = client.job_state(bytes.fromhex(job_id[2:]))
    row = store.job(job_id)
    assert row.chain.status is truth.status
    assert job_to_json(row.chain) == job_to_json(truth)
    return truth.status


def test_funding_assignment_and_payment_reorged_out_and_back(
    chain: OwnChain, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    client = chain.client()
    w3 = client.w3
    provider = chain.providers[0]
    ensure_provider(client, provider, 2 * chain.params.min_stake)
    watcher = watcher_for(client, store)
    watcher.poll_once()
    sender = TxSender(client, chain.operator)

    # funding
    before_funding = rpc(w3, "evm_snapshot")
    state = create_job(client, chain.submitter, on_verify=True)
    job_id = "0x" + state.job_id.hex()
    funding = client.events(w3.eth.block_number, w3.eth.block_number)[0].tx_hash
    raw_funding = raw_tx(client, funding)
    watcher.poll_once()
    assert matches_chain(store, client, job_id) is Status.FUNDED

    with caplog.at_level(logging.WARNING, logger="gridmarket.watcher"):
        assert rpc(w3, "evm_revert", before_funding)
        rpc(w3, "anvil_mine", "0x3")  # a longer chain without the funding
        watcher.poll_once()
    with pytest.raises(NotFoundError):
        store.job(job_id)
    assert watcher.status().reorgs == 1
    assert [r for r in caplog.records if "chain reorg" in r.getMessage()], caplog.records
    assert f"1 jobs affected: {job_id}" in (watcher.status().last_reorg or "")

    resend(client, raw_funding)  # the same transaction, mined again
    watcher.poll_once()
    assert matches_chain(store, client, job_id) is Status.FUNDED
    assert store.job(job_id).state == "pending_spec"

    # assignment
    before_assign = rpc(w3, "evm_snapshot")
    state = client.job_state(state.job_id)
    sent = sender.assign(state, provider.address, HOLD, acceptance(sender, state, provider))
    raw_assign = raw_tx(client, sent.tx_hash)
    watcher.poll_once()
    assert matches_chain(store, client, job_id) is Status.ASSIGNED

    assert rpc(w3, "evm_revert", before_assign)
    rpc(w3, "anvil_mine", "0x1")  # same height as before: only the hash tells
    watcher.poll_once()
    assert matches_chain(store, client, job_id) is Status.FUNDED
    assert store.job(job_id).chain.job.attempt == 0
    assert watcher.status().reorgs == 2

    resend(client, raw_assign)
    watcher.poll_once()
    assert matches_chain(store, client, job_id) is Status.ASSIGNED

    # payment (settle: result and release in one transaction)
    before_pay = rpc(w3, "evm_snapshot")
    state = client.job_state(state.job_id)
    signature = sign_result(
        provider, chain.deployment.chain_id, client.address, state.job_id, state.job.attempt, CID
    )
    sent = sender.settle(state, CID, signature)
    raw_pay = raw_tx(client, sent.tx_hash)
    rpc(w3, "anvil_mine", "0x2")
    watcher.poll_once()
    assert matches_chain(store, client, job_id) is Status.RELEASED

    assert rpc(w3, "evm_revert", before_pay)
    rpc(w3, "anvil_mine", "0x4")
    watcher.poll_once()
    assert matches_chain(store, client, job_id) is Status.ASSIGNED
    assert watcher.status().reorgs == 3

    resend(client, raw_pay)
    watcher.poll_once()
    assert matches_chain(store, client, job_id) is Status.RELEASED
    assert store.chain_cursor() == w3.eth.block_number
    assert store.checkpoints()[-1] == (
        w3.eth.block_number,
        "0x" + bytes(w3.eth.get_block("latest")["hash"]).hex(),
    )


def test_anvil_reorg_replaces_the_blocks_with_others(chain: OwnChain, store: Store) -> None:
    """``anvil_reorg``: the last blocks replaced by as many others (here, with no transaction):
    the job created in them is gone from the store."""
    client = chain.client()
    w3 = client.w3
    watcher = watcher_for(client, store)
    watcher.poll_once()
    fork = w3.eth.block_number
    state = create_job(client, chain.submitter)
    job_id = "0x" + state.job_id.hex()
    rpc(w3, "anvil_mine", "0x2")
    watcher.poll_once()
    assert matches_chain(store, client, job_id) is Status.FUNDED
    head = w3.eth.block_number

    rpc(w3, "anvil_reorg", 3, [])
    assert w3.eth.block_number == head
    watcher.poll_once()
    with pytest.raises(NotFoundError):
        store.job(job_id)
    assert watcher.status().reorgs == 1
    assert f"rolled back to block {fork}" in (watcher.status().last_reorg or "")
    assert store.chain_cursor() == head


def test_a_reorg_deeper_than_the_checkpoints_raises_and_changes_nothing(
    chain: OwnChain, store: Store
) -> None:
    client = chain.client()
    w3 = client.w3
    watcher = watcher_for(client, store)
    snapshot = rpc(w3, "evm_snapshot")
    rpc(w3, "anvil_mine", "0x1")
    watcher.poll_once()  # the first checkpoint is after the snapshot
    state = create_job(client, chain.submitter)
    job_id = "0x" + state.job_id.hex()
    watcher.poll_once()
    rpc(w3, "anvil_mine", "0x1")
    watcher.poll_once()
    kept = store.checkpoints()
    cursor = store.chain_cursor()
    assert len(kept) == 3

    assert rpc(w3, "evm_revert", snapshot)
    rpc(w3, "anvil_mine", "0x5")
    with pytest.raises(ReorgTooDeepError, match="deeper than the 3 kept checkpoints"):
        watcher.poll_once()
    assert store.job(job_id).chain.status is Status.FUNDED  # left alone, not guessed at
    assert store.checkpoints() == kept
    assert store.chain_cursor() == cursor


def test_safe_and_finalized_heads_on_anvil(chain: OwnChain, store: Store) -> None:
    """anvil 1.x answers ``safe`` = latest - 32 and ``finalized`` = latest - 64 (0 below)."""
    client = chain.client()
    rpc(client.w3, "anvil_mine", "0x50")
    head = client.w3.eth.block_number
    assert watcher_for(client, store, head_tag="safe").tagged_head() == head - 32
    watcher = watcher_for(client, store, head_tag="finalized")
    assert watcher.tagged_head() == head - 64
    watcher.poll_once()
    assert store.chain_cursor() == head - 64
    with pytest.raises(ValueError):
        watcher_for(client, store, head_tag="safe", confirmations=2)


def test_a_reorged_out_assign_is_not_sent_twice(chain: OwnChain, store: Store) -> None:
    """The outbox's assign, mined and then reorged out: the store's fold goes back to Funded,
    the outbox row stays done (nothing is sent again: the operator's nonce says so), the lease
    says why; the same transaction mined again folds back in."""
    client = chain.client()
    w3 = client.w3
    provider = chain.providers[0]
    ensure_provider(client, provider, 2 * chain.params.min_stake)
    watcher = watcher_for(client, store)
    state = create_job(client, chain.submitter, on_verify=True)
    job_id = "0x" + state.job_id.hex()
    watcher.poll_once()
    assert store.set_spec(job_id, SPEC) == "queued"
    node_id = store.register_node(
        wallet=provider.address, name="gpu0", capacity=CAP, tier="cpu", agent_version="t", nonce=1
    ).node_id
    won = store.dispatch(lambda rows: [Claim(job_id, node_id)], limit=8, lease_ttl=300.0)
    assert [c.job.job_id for c in won] == [job_id]
    signature = "0x" + acceptance(client, state, provider, hold_for(SPEC.limits.timeout_s)).hex()
    assert store.accept(job_id, node_id, won[0].job.attempt, signature) == "leased"

    snapshot = rpc(w3, "evm_snapshot")
    nonce = w3.eth.get_transaction_count(chain.operator.address)
    rules = OutboxRules(store, lambda _: None)
    sender = TxSender(client, chain.operator)
    [item] = store.outbox_pending()
    rules.send(sender, item)
    [row] = store.outbox_of(job_id)
    raw_assign = raw_tx(client, row["tx_hash"])
    watcher.poll_once()
    assert matches_chain(store, client, job_id) is Status.ASSIGNED

    assert rpc(w3, "evm_revert", snapshot)
    rpc(w3, "anvil_mine", "0x2")
    watcher.poll_once()
    assert matches_chain(store, client, job_id) is Status.FUNDED
    job = store.job(job_id)
    assert (job.state, job.node_id, job.attempt) == ("leased", node_id, 1)
    assert "was reorged out" in job.reason
    assert store.outbox_pending() == []
    assert [r["status"] for r in store.outbox_of(job_id)] == ["done"]
    assert w3.eth.get_transaction_count(chain.operator.address) == nonce

    resend(client, raw_assign)
    watcher.poll_once()
    assert matches_chain(store, client, job_id) is Status.ASSIGNED
    assert store.outbox_pending() == []
    assert w3.eth.get_transaction_count(chain.operator.address) == nonce + 1
