"""The mediator follows the chain by block hash (docs/mediator.md "Reorgs"), on a private anvil
and the real js-ipfs daemon: a result and the mediator's ruling of it reorged out leave its state
equal to the chain's, with no check or ruling owed for a result that is gone; the same
transactions mined again fold back in with nothing sent twice; a result mined again later
voids the old ruling and is ruled again; a ruling reorged out before the
mediator folded it, while its result stays, is decided and sent again (the mediator's nonce read
again from the chain); a job funded after the fork is forgotten with its checks; and a state
file from before reorg handling opens."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hexbytes import HexBytes

from devstack.ipfs import IpfsDaemon
from gridmarket.chain import EscrowClient
from gridmarket.eip712 import sign_acceptance
from gridmarket.escrow import JobState, Status
from gridmarket.ipfs import IpfsStore
from gridmarket.wire import JobSpec
from mediator import Mediator, MediatorConfig, MediatorState
from mediator.state import state_to_json

from ..scheduler.chain_support import (
    OwnChain,
    chain_now,
    create_job,
    ensure_provider,
    own_chain_at,
    rpc,
)

BOUNTY = 10**16
HOLD_FOR = 600
SPEC = JobSpec.model_validate({"executor": "docker", "image": "busybox", "command": ["true"]})
BAD_OUTPUT = "not-a-cid"
"""A result whose CID does not decode: the mediator rules it wrong at once."""
CONFIG = MediatorConfig(
    fetch_timeout_s=2.0,
    fetch_attempts=2,
    retry_delay_s=0.3,
    spec_timeout_s=5.0,
    poll_interval_s=0.1,
    window_margin_s=5.0,
)


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[OwnChain]:
    with own_chain_at(tmp_path) as c:
        yield c


@pytest.fixture
def mediator(chain: OwnChain, ipfs_daemon: IpfsDaemon, tmp_path: Path) -> Iterator[Mediator]:
    client = chain.client()
    ensure_provider(client, chain.providers[0], 2 * chain.params.min_stake)
    med = Mediator(
        client, chain.mediator, IpfsStore(ipfs_daemon.api_addr), tmp_path / "m.db", CONFIG
    )
    med.poll_once()
    yield med
    med.close()


def raw_tx(client: EscrowClient, tx_hash: str) -> HexBytes:
    return HexBytes(rpc(client.w3, "eth_getRawTransactionByHash", tx_hash))


def resend(client: EscrowClient, raw: HexBytes) -> None:
    receipt = client.w3.eth.wait_for_transaction_receipt(
        client.w3.eth.send_raw_transaction(raw), timeout=10
    )
    assert receipt["status"] == 1


def assigned_job(chain: OwnChain, client: EscrowClient, spec_cid: str) -> JobState:
    """A job naming the listed mediator (account 10), assigned to the first provider."""
    state, _ = client.create_job(
        chain.submitter,
        os.urandom(32),
        spec_cid,
        chain_now(client.w3) + 86_400,
        BOUNTY,
        client.default_terms(BOUNTY, chain.submitter.address),
    )
    assert state.job.mediator == chain.mediator.address
    provider = chain.providers[0]
    signed = sign_acceptance(
        provider,
        client.deployment.chain_id,
        client.address,
        state.job_id,
        state.job.attempt + 1,
        state.job,
        HOLD_FOR,
    )
    state, _ = client.assign(chain.operator, state, provider.address, HOLD_FOR, signed)
    return state


def until(med: Mediator, done: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        med.poll_once()
        if done():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout} s: {med.decisions}")


def ruled(client: EscrowClient, state: JobState) -> list[bool]:
    """The verdicts of the job's ``Ruled`` events on the chain now."""
    events = client.events(client.deployment.block, "latest", [None, "0x" + state.job_id.hex()])
    return [bool(e.args["upheld"]) for e in events if e.name == "Ruled"]


def same_as_chain(med: Mediator, client: EscrowClient, state: JobState) -> JobState:
    truth = client.job_state(state.job_id)
    mine = med.state.job(state.job_id)
    assert mine is not None
    assert state_to_json(mine) == state_to_json(truth)
    return truth


def open_tasks(med: Mediator, state: JobState) -> list[tuple[int, str]]:
    return [(t.attempt, t.kind) for t in med.state.pending_tasks() if t.job_id == state.job_id]


@dataclass
class Reorged:
    """A result ruled wrong by the mediator, then reorged out with its ruling."""

    client: EscrowClient
    state: JobState
    raw_result: HexBytes
    raw_ruling: HexBytes
    result_time: int  # the result's block time before the reorg


def ruled_then_reorged(chain: OwnChain, mediator: Mediator, ipfs_daemon: IpfsDaemon) -> Reorged:
    """An assigned job's result is posted, ruled wrong and folded; then a reorg back to before
    the result drops both, and three blocks are mined before the result's time. The ruling
    names the result's time (the job's ``since``), so the clock is set: the result 600 s after
    the assignment, the filler blocks just after it (at wall-clock speed a loaded machine could
    cross a second anywhere in between)."""
    client = chain.client()
    w3 = client.w3
    with IpfsStore(ipfs_daemon.api_addr) as ipfs:
        spec_cid = ipfs.add_bytes(SPEC.to_bytes())
    state = assigned_job(chain, client, spec_cid)
    mediator.poll_once()
    before_result = rpc(w3, "evm_snapshot")
    assign_time = w3.eth.get_block("latest")["timestamp"]
    result_time = assign_time + 600
    rpc(w3, "evm_setNextBlockTimestamp", result_time)
    state, sent = client.call_job(chain.providers[0], "submitResult", state, BAD_OUTPUT)
    assert w3.eth.get_block(sent.block)["timestamp"] == result_time
    until(mediator, lambda: ruled(client, state) == [False], "the ruling")
    ruling = mediator.state.ruling(state.job_id, state.job.attempt)
    assert ruling is not None and ruling.tx_hash is not None
    until(
        mediator,
        lambda: getattr(mediator.state.ruling(state.job_id, 1), "outcome", "") == "confirmed",
        "the Ruled event folded",
    )
    assert same_as_chain(mediator, client, state).status is Status.FUNDED
    reorged = Reorged(
        client, state, raw_tx(client, sent.tx_hash), raw_tx(client, ruling.tx_hash),
        result_time,
    )  # fmt: skip

    assert rpc(w3, "evm_revert", before_result)
    for k in (1, 2, 3):
        rpc(w3, "evm_setNextBlockTimestamp", assign_time + k)
        rpc(w3, "evm_mine")
    mediator.poll_once()
    assert mediator.watcher.status().reorgs == 1
    assert same_as_chain(mediator, client, state).status is Status.ASSIGNED
    assert mediator.state.ruling(state.job_id, 1) is None
    assert open_tasks(mediator, state) == []
    assert mediator.counters["reorgs"] == 1
    return reorged


def ruled_again(mediator: Mediator, r: Reorged, what: str) -> None:
    """Until the mediator holds a confirmed ruling of the result and owes nothing; one Ruled
    event on the chain now, the job funded again."""
    until(
        mediator,
        lambda: (
            getattr(mediator.state.ruling(r.state.job_id, 1), "outcome", "") == "confirmed"
            and not open_tasks(mediator, r.state)
        ),
        what,
    )
    assert same_as_chain(mediator, r.client, r.state).status is Status.FUNDED
    assert ruled(r.client, r.state) == [False]


def test_a_result_and_its_ruling_reorged_out_and_mined_again_are_not_ruled_twice(
    chain: OwnChain, mediator: Mediator, ipfs_daemon: IpfsDaemon
) -> None:
    r = ruled_then_reorged(chain, mediator, ipfs_daemon)
    w3 = r.client.w3
    # the same two transactions mined again in the same second (as a node's pool would):
    # folded back in, and the mediator sends nothing of its own (its check of the result finds
    # the job ruled)
    nonce = w3.eth.get_transaction_count(chain.mediator.address)
    rpc(w3, "evm_setNextBlockTimestamp", r.result_time)
    resend(r.client, r.raw_result)
    assert w3.eth.get_block("latest")["timestamp"] == r.result_time
    resend(r.client, r.raw_ruling)
    ruled_again(mediator, r, "the same ruling folded back in")
    assert w3.eth.get_transaction_count(chain.mediator.address) == nonce + 1  # the resent one


def test_a_result_mined_again_later_voids_the_old_ruling_and_is_ruled_again(
    chain: OwnChain, mediator: Mediator, ipfs_daemon: IpfsDaemon
) -> None:
    """After the reorg the result is mined again a few seconds later (as on a real chain):
    its time is the job's new ``since``, so the old ruling, replayed, reverts (it names the old
    time) and the mediator decides the result again and sends one ruling of its own."""
    r = ruled_then_reorged(chain, mediator, ipfs_daemon)
    w3 = r.client.w3
    nonce = w3.eth.get_transaction_count(chain.mediator.address)
    rpc(w3, "evm_setNextBlockTimestamp", r.result_time + 5)  # five seconds later than before
    resend(r.client, r.raw_result)
    replayed = w3.eth.wait_for_transaction_receipt(
        w3.eth.send_raw_transaction(r.raw_ruling), timeout=10
    )
    assert replayed["status"] == 0  # the old ruling names the old time: refused
    ruled_again(mediator, r, "a new ruling of the result mined again")
    # the replayed ruling (reverted) and the mediator's new one
    assert w3.eth.get_transaction_count(chain.mediator.address) == nonce + 2


def test_a_ruling_reorged_out_while_its_result_stays_is_sent_again(
    chain: OwnChain, mediator: Mediator, ipfs_daemon: IpfsDaemon
) -> None:
    client = chain.client()
    w3 = client.w3
    with IpfsStore(ipfs_daemon.api_addr) as ipfs:
        spec_cid = ipfs.add_bytes(SPEC.to_bytes())
    state = assigned_job(chain, client, spec_cid)
    state, _ = client.call_job(chain.providers[0], "submitResult", state, BAD_OUTPUT)
    before_ruling = rpc(w3, "evm_snapshot")  # the mediator has not seen the result yet
    until(mediator, lambda: ruled(client, state) == [False], "the ruling")
    first = mediator.state.ruling(state.job_id, 1)
    assert first is not None

    assert rpc(w3, "evm_revert", before_ruling)  # the ruling is gone; the result is not
    rpc(w3, "anvil_mine", "0x2")
    assert ruled(client, state) == []
    # the mediator never saw its ruling's block, so no checkpoint of it changed: it finds its
    # sent ruling unknown to the node, checks again and rules again with the chain's nonce
    until(mediator, lambda: ruled(client, state) == [False], "the second ruling", timeout=60)
    assert mediator.counters["rulings_lost"] == 1
    second = mediator.state.ruling(state.job_id, 1)
    assert second is not None and second.tx_hash != first.tx_hash
    until(
        mediator,
        lambda: getattr(mediator.state.ruling(state.job_id, 1), "outcome", "") == "confirmed",
        "the second Ruled event folded",
    )
    assert same_as_chain(mediator, client, state).status is Status.FUNDED
    assert not open_tasks(mediator, state)
    assert [d.verdict for d in mediator.decisions if d.job_id == state.job_id] == [
        "not upheld",
        "not upheld",
    ]


def test_a_job_funded_after_the_fork_is_forgotten_with_its_checks(
    chain: OwnChain, mediator: Mediator, ipfs_daemon: IpfsDaemon
) -> None:
    client = chain.client()
    w3 = client.w3
    with IpfsStore(ipfs_daemon.api_addr) as ipfs:
        spec_cid = ipfs.add_bytes(SPEC.to_bytes())
    before = rpc(w3, "evm_snapshot")
    mediator.poll_once()
    state = assigned_job(chain, client, spec_cid)
    mediator.poll_once()
    assert mediator.state.job(state.job_id) is not None

    assert rpc(w3, "evm_revert", before)
    rpc(w3, "anvil_mine", "0x5")
    mediator.poll_once()
    assert mediator.state.job(state.job_id) is None
    assert open_tasks(mediator, state) == []
    assert client.call("statusOf", state.job_id) == Status.NONE


def test_a_state_file_from_before_reorg_handling_opens_and_keeps_its_jobs(
    chain: OwnChain, tmp_path: Path
) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE jobs (job_id TEXT PRIMARY KEY, state TEXT NOT NULL);"
    )
    client = chain.client()
    state = create_job(client, chain.submitter)
    body = state_to_json(state).replace(
        ', "token": "0x0000000000000000000000000000000000000000"', ""
    )
    assert '"token"' not in body  # what a version-3 mediator wrote
    owner = f"{client.deployment.chain_id}:{client.address.lower()}"
    old.execute("INSERT INTO meta VALUES ('escrow', ?)", (owner,))
    old.execute("INSERT INTO jobs VALUES (?, ?)", (state.job_id.hex(), body))
    old.commit()
    old.close()
    st = MediatorState(path, escrow=client.address, chain_id=client.deployment.chain_id)
    try:
        loaded = st.job(state.job_id)
        assert loaded is not None and state_to_json(loaded) == state_to_json(state)
        assert st.checkpoints() == []
    finally:
        st.close()
