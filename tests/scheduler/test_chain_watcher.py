"""ChainWatcher against a real anvil, with a real (sqlite) store behind its sink: every escrow
event delivered once and in order, across watcher restarts, failed commits, confirmations,
small batches and an RPC outage with the node restarted from its state file."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from gridmarket.chain import EscrowClient
from gridmarket.eip712 import sign_result
from gridmarket.escrow import JobState, Status, apply_event
from scheduler.chain import ChainWatcher, RetryPolicy, TxSender, apply_sent

from ..conftest import Devnet
from .chain_support import (
    HOLD,
    OwnChain,
    SqliteStore,
    acceptance,
    create_job,
    ensure_provider,
    make_w3,
    own_chain_at,
    rpc,
    wait_until,
)

CID = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"


@pytest.fixture
def client(devnet: Devnet) -> EscrowClient:
    return EscrowClient(devnet.w3, devnet.deployment)


@pytest.fixture
def sender(devnet: Devnet, client: EscrowClient) -> TxSender:
    """The operator's sender, with the provider :func:`job_life` uses registered up front (so
    each life emits exactly 4 events)."""
    ensure_provider(client, devnet.providers[4], 2 * devnet.params.min_stake)
    return TxSender(client, devnet.operator)


@pytest.fixture
def own_chain(tmp_path: Path) -> Iterator[OwnChain]:
    with own_chain_at(tmp_path) as chain:
        yield chain


def truth(client: EscrowClient, through: int) -> list[tuple[str, int, int, str]]:
    """What the chain says happened, straight from eth_getLogs."""
    return [
        (e.tx_hash, e.log_index, e.block, e.name)
        for e in client.events(client.deployment.block, through)
    ]


def job_life(client: EscrowClient, devnet: Devnet, sender: TxSender) -> JobState:
    """Create, assign and settle one job: JobCreated, JobAssigned, ResultSubmitted,
    JobReleased."""
    provider = devnet.providers[4]
    ensure_provider(client, provider, 2 * devnet.params.min_stake)
    state = create_job(client, devnet.submitters[0], on_verify=True)
    state = apply_sent(
        state, sender.assign(state, provider.address, HOLD, acceptance(sender, state, provider))
    )
    signature = sign_result(
        provider, devnet.deployment.chain_id, client.address, state.job_id, state.job.attempt, CID
    )
    return apply_sent(state, sender.settle(state, CID, signature))


def assert_once(store: SqliteStore, *others: SqliteStore) -> None:
    deliveries = Counter(store.deliveries + [d for o in others for d in o.deliveries])
    assert [d for d, n in deliveries.items() if n > 1] == []


def test_delivers_every_event_once_in_order(
    devnet: Devnet, client: EscrowClient, sender: TxSender, tmp_path: Path
) -> None:
    store = SqliteStore(tmp_path / "store.db")
    watcher = ChainWatcher(client, store, store.sink)
    state = job_life(client, devnet, sender)

    delivered = watcher.poll_once()
    head = watcher.head()
    assert store.load() == head
    assert delivered == len(truth(client, head)) > 0
    assert store.stored() == truth(client, head)
    assert [d[:2] for d in store.stored()] == store.deliveries  # in (block, log_index) order
    assert watcher.status().lag_blocks == 0

    # The job's events fold to the state the sender returned.
    folded: JobState | None = None
    topic = "0x" + state.job_id.hex()
    for e in client.events(client.deployment.block, head, [None, topic]):
        folded = apply_event(folded, e.name, e.args)
    assert folded == state and folded.status is Status.RELEASED

    calls = len(store.calls)
    assert watcher.poll_once() == 0  # nothing new: the sink is not called
    assert len(store.calls) == calls

    job_life(client, devnet, sender)
    new = watcher.poll_once()
    assert new >= 4
    assert store.stored() == truth(client, watcher.head())
    assert_once(store)


def test_restart_resumes_from_the_persisted_cursor(
    devnet: Devnet, client: EscrowClient, sender: TxSender, tmp_path: Path
) -> None:
    path = tmp_path / "store.db"
    first = SqliteStore(path)
    job_life(client, devnet, sender)
    ChainWatcher(client, first, first.sink).poll_once()
    cursor = first.load()
    assert cursor is not None

    job_life(client, devnet, sender)  # happens while no watcher runs
    second = SqliteStore(path)  # a new process: same database, fresh objects
    watcher = ChainWatcher(
        EscrowClient(make_w3(devnet.url), devnet.deployment), second, second.sink
    )
    assert watcher.poll_once() == 4
    assert min(block for _, block in second.calls) > cursor
    assert second.stored() == truth(client, watcher.head())
    assert_once(first, second)


def test_a_failed_commit_redelivers_the_batch(
    devnet: Devnet, client: EscrowClient, sender: TxSender, tmp_path: Path
) -> None:
    """Events committed but the cursor not (a sink that is not atomic, or a crash between the
    two): the batch comes again, and upserting by (tx_hash, log_index) keeps one copy."""
    store = SqliteStore(tmp_path / "store.db")
    watcher = ChainWatcher(client, store, store.sink)
    watcher.poll_once()
    before = store.load()

    job_life(client, devnet, sender)
    store.crash_before_cursor = 1
    with pytest.raises(RuntimeError, match="before the cursor was committed"):
        watcher.poll_once()
    assert store.load() == before  # the watcher did not move on

    assert watcher.poll_once() == 4  # the same batch, again
    repeated = [d for d, n in Counter(store.deliveries).items() if n > 1]
    assert len(repeated) == 4
    assert store.stored() == truth(client, watcher.head())  # one copy each


def test_batches_never_exceed_batch_blocks(
    devnet: Devnet, client: EscrowClient, sender: TxSender, tmp_path: Path
) -> None:
    job_life(client, devnet, sender)
    store = SqliteStore(tmp_path / "store.db")
    watcher = ChainWatcher(client, store, store.sink, batch_blocks=3)
    watcher.poll_once()
    ends = [block for _, block in store.calls]
    starts = [devnet.deployment.block - 1, *ends[:-1]]
    assert all(0 < end - start <= 3 for start, end in zip(starts, ends, strict=True))
    assert ends[-1] == watcher.head()
    assert store.stored() == truth(client, watcher.head())
    assert_once(store)


def test_confirmations_hold_back_recent_blocks(own_chain: OwnChain, tmp_path: Path) -> None:
    client = own_chain.client()
    store = SqliteStore(tmp_path / "store.db")
    watcher = ChainWatcher(client, store, store.sink, confirmations=2)
    for _ in range(3):  # room above the deployment block
        rpc(client.w3, "evm_mine")
    state = create_job(client, own_chain.submitter)
    created_at = watcher.head()

    watcher.poll_once()
    assert store.load() == created_at - 2
    assert all(name != "JobCreated" for *_, name in store.stored())

    rpc(client.w3, "evm_mine")
    assert watcher.wait_for_block(created_at + 1) == created_at + 1
    watcher.poll_once()
    assert store.load() == created_at - 1
    assert all(name != "JobCreated" for *_, name in store.stored())

    rpc(client.w3, "evm_mine")
    assert watcher.poll_once() == 1  # two blocks on top of it now
    ((_, _, block, name),) = [row for row in store.stored() if row[3] == "JobCreated"]
    assert (block, name) == (created_at, "JobCreated")
    assert store.load() == created_at
    assert watcher.status().lag_blocks == 0
    assert client.job_state(state.job_id).status is Status.FUNDED


def test_run_survives_an_rpc_outage_and_node_restart(
    own_chain: OwnChain, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gridmarket.watcher")
    client = own_chain.client(timeout=1)
    store = SqliteStore(tmp_path / "store.db")
    watcher = ChainWatcher(
        client,
        store,
        store.sink,
        poll_interval_s=0.05,
        backoff=RetryPolicy(initial_delay_s=0.05, max_delay_s=0.3),
    )
    stop = threading.Event()
    runner = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
    runner.start()
    try:
        for _ in range(2):
            create_job(client, own_chain.submitter)
        head = watcher.head()
        wait_until(lambda: store.load() == head, what="the watcher to catch up")

        own_chain.stop()
        wait_until(lambda: watcher.status().consecutive_failures >= 3, what="failed polls")
        assert watcher.status().last_error is not None
        assert runner.is_alive()
        time.sleep(1.0)  # the node stays away for a while
        own_chain.start()  # same port, state file
        for _ in range(2):
            create_job(client, own_chain.submitter)
        head = watcher.head()
        wait_until(lambda: store.load() == head, timeout=15, what="the watcher to resume")
        assert watcher.status().consecutive_failures == 0
    finally:
        stop.set()
        runner.join(10)
    assert not runner.is_alive()
    assert store.stored() == truth(client, head)
    assert sum(1 for *_, name in store.stored() if name == "JobCreated") == 4
    assert_once(store)
    messages = [r.getMessage() for r in caplog.records]
    assert any("unreachable" in m and "retrying with backoff" in m for m in messages), messages
    assert any(m.startswith("chain watcher: recovered after") for m in messages), messages


def test_start_block_and_bad_settings(own_chain: OwnChain, tmp_path: Path) -> None:
    client = own_chain.client()
    store = SqliteStore(tmp_path / "store.db")
    create_job(client, own_chain.submitter)
    head = client.w3.eth.block_number
    watcher = ChainWatcher(client, store, store.sink, start_block=head)
    assert watcher.poll_once() == 1  # only the head block's JobCreated
    assert store.calls == [(1, head)]
    for field, value in [
        ("confirmations", -1),
        ("batch_blocks", 0),
        ("start_block", -5),
        ("poll_interval_s", 0.0),
    ]:
        with pytest.raises(ValueError, match=f"^{field} must be"):
            ChainWatcher(client, store, store.sink, **{field: value})  # type: ignore[arg-type]
