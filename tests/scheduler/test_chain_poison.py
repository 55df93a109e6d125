"""Poison events against a real anvil: a ``string`` argument of an escrow event that is not
UTF-8, is empty, overlong or not CID-like text is recorded as a problem of that event (its job
can never run) and the watcher moves on; a log that does not decode at all is skipped, logged and
counted. An honest job funded after them is delivered like any other."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from eth_utils.crypto import keccak

from gridmarket.chain import EscrowClient
from gridmarket.escrow import InvalidText, JobState, Status, apply_event
from scheduler.chain import ChainWatcher, TxSender, apply_sent
from tests.hostile import INVALID_UTF8, ODD_128, Forger, create_job_raw, escrow_call

from ..conftest import Devnet
from .chain_support import HOLD, SqliteStore, acceptance, chain_now, create_job, ensure_provider


@pytest.fixture
def client(devnet: Devnet) -> EscrowClient:
    return EscrowClient(devnet.w3, devnet.deployment)


def test_poison_strings_are_recorded_and_the_watcher_moves_on(
    devnet: Devnet, client: EscrowClient, tmp_path: Path
) -> None:
    store = SqliteStore(tmp_path / "store.db")
    start = int(devnet.w3.eth.block_number) + 1
    watcher = ChainWatcher(client, store, store.sink, start_block=start)
    submitter = devnet.submitters[1]
    deadline = chain_now(client.w3) + 86_400

    bad_utf8 = create_job_raw(client, submitter, INVALID_UTF8, deadline, 10**16)
    odd = create_job_raw(client, submitter, ODD_128, deadline, 10**16)
    registered = escrow_call(client, devnet.providers[2], "registerProvider", INVALID_UTF8)
    honest = create_job(client, devnet.submitters[0])

    delivered = watcher.poll_once()
    assert delivered == 4
    assert [name for *_, name in store.stored()] == ["JobCreated"] * 2 + [
        "ProviderRegistered",
        "JobCreated",
    ]
    status = watcher.status()
    assert status.invalid_fields == 3 and status.logs_skipped == 0
    assert status.consecutive_failures == 0 and status.last_error is None

    (created,) = bad_utf8.events
    assert created.problems == {"specCid": "not valid UTF-8 (byte 0xff at offset 4)"}
    spec = created.args["specCid"]
    assert isinstance(spec, InvalidText) and spec.raw == INVALID_UTF8
    assert str(spec) == "invalid specCid: not valid UTF-8 (byte 0xff at offset 4)"
    state = apply_event(None, created.name, created.args)
    assert state.status is Status.FUNDED
    assert state.problem == "specCid not valid UTF-8 (byte 0xff at offset 4)"
    assert type(state.spec_cid) is str and len(state.spec_cid) <= 128

    (created_odd,) = odd.events
    assert created_odd.problems == {"specCid": "character U+202E at 0 (a CID is printable ASCII)"}
    (reg,) = registered.events
    assert reg.problems == {"metadataCid": "not valid UTF-8 (byte 0xff at offset 4)"}
    assert reg.args["metadataDigest"] == keccak(INVALID_UTF8)

    # the honest job after them is delivered whole and untouched
    folded: JobState | None = None
    topic = "0x" + honest.job_id.hex()
    for e in client.events(start, "latest", [None, topic]):
        assert e.problems == {}
        folded = apply_event(folded, e.name, e.args)
    assert folded == honest and folded.problem is None
    assert watcher.poll_once() == 0


def test_an_undecodable_output_cid_keeps_the_digest_the_contract_hashed(
    devnet: Devnet, client: EscrowClient
) -> None:
    """A provider that submits a result whose CID is not UTF-8 can still be ruled wrong (and
    slashed): the folded struct carries keccak256 of the raw bytes, so the contract accepts it
    back."""
    provider = devnet.providers[4]
    ensure_provider(client, provider, 2 * devnet.params.min_stake)
    sender = TxSender(client, devnet.operator)
    state = create_job(client, devnet.submitters[0])
    state = apply_sent(
        state, sender.assign(state, provider.address, HOLD, acceptance(sender, state, provider))
    )
    sent = escrow_call(
        client, provider, "submitResult", state.job_id, state.job.as_tuple(), INVALID_UTF8
    )
    (submitted,) = sent.events
    assert submitted.problems == {"outputCid": "not valid UTF-8 (byte 0xff at offset 4)"}
    state = apply_event(state, submitted.name, submitted.args)
    assert state.status is Status.SUBMITTED
    assert state.output_problem is not None and state.problem is not None
    assert state.job.result_digest == keccak(INVALID_UTF8)
    assert client.call("isCurrent", state.job_id, state.job.as_tuple()) is True
    ruled = escrow_call(
        client, devnet.mediator, "rule", state.job_id, [state.job.as_tuple()], 0, False
    )
    rejected = apply_sent(state, ruled)
    assert rejected.status is Status.FUNDED and rejected.output_problem is None


def test_forged_logs_empty_overlong_and_undecodable_never_stop_the_rest(
    devnet: Devnet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What JobEscrow refuses (empty, overlong) and logs that are not their event's encoding,
    from a contract that emits the escrow's events: each log is decoded on its own."""
    forger = Forger(devnet.w3, devnet.owner, devnet.deployment)
    attacker = devnet.submitters[1]
    deadline = chain_now(devnet.w3) + 3600
    ids = [keccak(bytes([i])) for i in range(5)]
    forger.call(attacker, "jobCreated", ids[0], b"", deadline)
    forger.call(attacker, "jobCreated", ids[1], b"b" * 300, deadline)
    forger.call(attacker, "garbage", ids[2], b"\x01" * 7)  # not even one word
    forger.call(attacker, "garbage", ids[3], (2**255).to_bytes(32, "big") * 7)  # bad offsets
    forger.call(attacker, "providerRegistered", b"")
    forger.call(attacker, "jobCreated", ids[4], b"bafkreihonest", deadline)

    store = SqliteStore(tmp_path / "store.db")
    watcher = ChainWatcher(forger.client, store, store.sink)
    with caplog.at_level(logging.ERROR, logger="gridmarket.chain"):
        assert watcher.poll_once() == 4
    assert watcher.status().logs_skipped == 2
    skipped = [r for r in caplog.records if "does not decode" in r.getMessage()]
    assert len(skipped) == 2 and all(r.levelno == logging.ERROR for r in skipped)
    events = forger.client.events(forger.client.deployment.block)
    assert [e.problems for e in events] == [
        {"specCid": "empty"},
        {"specCid": "300 bytes, over the 128-byte limit"},
        {"metadataCid": "empty"},
        {},
    ]
    assert len(str(events[1].args["specCid"])) <= 128
    assert [bytes(e.args["jobId"]) for e in events if e.name == "JobCreated"] == [
        ids[0],
        ids[1],
        ids[4],
    ]
    assert events[3].args["specCid"] == "bafkreihonest"
    assert forger.client.undecodable_logs == 4  # two by the watcher's poll, two by the read
