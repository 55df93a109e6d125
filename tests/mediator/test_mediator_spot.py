"""Spot checks by the mediator (docs/mediator.md "Spot checks") on a real anvil and the real
js-ipfs daemon: a drawn attempt is disputed by the mediator itself and ruled after its re-run
elsewhere (the liar slashed, the check deposit's worth to the mediator); an attempt not drawn is
left to be finalized, and its seed revealed to the (real) scheduler only once the job is
settled; a sealed seed that does not open or does not match the commitment is never charged to
the provider."""

from __future__ import annotations

import os
from pathlib import Path

from eth_account.signers.local import LocalAccount
from hexbytes import HexBytes

from devstack.ipfs import IpfsDaemon
from gridmarket import spot
from gridmarket.chain import Deployment, EscrowClient
from gridmarket.escrow import FLAG_SPOT, JobState, Status
from gridmarket.ipfs import IpfsStore
from gridmarket.wire import API, JobSpec, SpotCheck
from mediator import Mediator

from ..conftest import Devnet
from ..scheduler.harness import advance, register_on_chain, scheduler
from . import test_mediator
from .test_mediator import (
    BOUNTY,
    WASM_SPEC,
    decision,
    mediator,
    status,
    submitted,
    take_rerun,
    until,
)

P_BPS = 2500

# test_mediator's fixtures, shared: a fresh escrow (a listed mediator, two staked providers;
# challenge window 1 h, reassign delay 60 s) and a store on the js-ipfs daemon
escrow = test_mediator.escrow
store = test_mediator.store


def seed_where(attempt_drawn: bool) -> bytes:
    """A seed whose first attempt is drawn for a check at p = 25 % (or not)."""
    while True:
        seed = spot.new_seed()
        if spot.checked(seed, 1, P_BPS) is attempt_drawn:
            return seed


def spot_spec(
    devnet: Devnet, seed: bytes, *, sealed_to: bytes | None = None, commit: bytes | None = None
) -> JobSpec:
    key = sealed_to or spot.public_key_of(bytes(devnet.mediator.key))
    policy = SpotCheck(
        p_bps=P_BPS,
        commit="0x" + (commit or spot.commit_of(seed, devnet.submitter.address)).hex(),
        sealed="0x" + spot.seal(seed, key, devnet.submitter.address).hex(),
    )
    return WASM_SPEC.model_copy(update={"spot": policy, "name": f"spot-{os.urandom(3).hex()}"})


def spot_submitted(
    devnet: Devnet,
    client: EscrowClient,
    store: IpfsStore,
    spec: JobSpec,
    output: str,
    provider: LocalAccount | None = None,
    submitter: LocalAccount | None = None,
) -> JobState:
    """A spot job (FLAG_SPOT, the least collateral p = 25 % needs) funded by ``submitter``
    (default: the devnet's), assigned to ``provider`` with its acceptance, and ``output``
    submitted."""
    terms = client.default_terms(BOUNTY, devnet.submitter.address)
    collateral = max(terms.collateral, spot.min_collateral(BOUNTY, P_BPS))
    spec_cid = store.add_bytes(spec.to_bytes())
    return submitted(
        devnet,
        client,
        spec_cid,
        output,
        provider=provider,
        submitter=submitter,
        flags=FLAG_SPOT,
        collateral=collateral,
    )


def test_a_drawn_attempt_is_disputed_by_the_mediator_and_ruled_after_the_rerun(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    store: IpfsStore,
    tmp_path: Path,
) -> None:
    """The liar's plausible wrong output passes integrity; attempt 1 is drawn, so the mediator
    disputes it (sending nothing), funds a re-run excluding the liar and the submitter (no
    spot policy on it); the re-run differs, and so does the tie-break (run 2) the same way:
    ruled wrong, the liar pays the mediator the check deposit's worth, and the job is Funded
    again with its deposit kept."""
    deployment, client = escrow
    register_on_chain(client, devnet.providers[2])
    seed = seed_where(attempt_drawn=True)
    wrong = store.add_bytes(b"mean=41.0\n" + os.urandom(4))
    right = store.add_bytes(b"mean=42.5\n" + os.urandom(4))
    job = spot_submitted(devnet, client, store, spot_spec(devnet, seed), wrong)
    liar, honest = devnet.providers[0], devnet.providers[1]
    mediator_before = client.balance_of(devnet.mediator.address)
    with mediator(devnet, deployment, ipfs_daemon, tmp_path / "m.db") as med:
        until(med, lambda: decision(med, job) is not None, what="the spot check")
        d = decision(med, job)
        assert d is not None and d.verdict == "disputed" and d.tx_hash is not None, d
        assert f"spot check drawn (p={P_BPS} bps, attempt 1)" in d.reason, d.reason
        receipt = client.w3.eth.get_transaction_receipt(HexBytes(d.tx_hash))
        assert receipt["from"] == devnet.mediator.address
        assert client.w3.eth.get_transaction(HexBytes(d.tx_hash))["value"] == 0
        assert status(client, job) is Status.DISPUTED
        kept = med.state.spot(job.job_id)
        assert kept is not None and kept.seed == seed
        until(med, lambda: bool(med.state.reruns()), what="the re-run")
        (rerun,) = med.state.reruns()
        rerun_spec = JobSpec.from_bytes(store.cat(rerun.spec_cid, max_bytes=1 << 16))
        assert rerun_spec.exclude_providers == [liar.address, devnet.submitter.address]
        assert rerun_spec.spot is None
        assert client.job_state(rerun.rerun_id).job.flags == 0
        take_rerun(devnet, client, rerun.rerun_id, honest, right)
        until(med, lambda: len(med.state.reruns()) == 2, what="the tie-break")
        tie = med.state.rerun(job.job_id, 1, run=2)
        assert tie is not None and tie.status == "funded"
        take_rerun(devnet, client, tie.rerun_id, devnet.providers[2], right)
        until(med, lambda: decision(med, job, "dispute") is not None, what="the ruling")
        ruling = decision(med, job, "dispute")
        assert ruling is not None and ruling.verdict == "not upheld", ruling
        assert ruling.reason.startswith(f"spot check drawn (p={P_BPS} bps, attempt 1): ")
        assert "different CID" in ruling.reason
    after = client.job_state(job.job_id)
    assert after.status is Status.FUNDED  # to be done again: attempt 2 is drawn afresh
    receipt = client.w3.eth.get_transaction_receipt(HexBytes(ruling.tx_hash or ""))
    (slashed,) = [e for e in client.decode_logs(receipt["logs"]) if e.name == "ProviderSlashed"]
    assert slashed.args["provider"] == liar.address
    # min(collateral, two check deposits): the liar pays the re-run and its tie-break
    assert slashed.args["toMediator"] == 2 * BOUNTY
    # the mediator paid two re-runs' bounties and got both back from the liar's collateral, and
    # the deposit of its hold on the first re-run (upheld: 2 of 3 agree with it)
    hold = int(client.call("depositOf", client.job_state(rerun.rerun_id).job.as_tuple()))
    assert client.balance_of(devnet.mediator.address) - mediator_before == 2 * BOUNTY + hold


def test_an_attempt_not_drawn_is_left_to_be_finalized_and_revealed_once_settled(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    store: IpfsStore,
    tmp_path: Path,
) -> None:
    """No dispute, no ruling: the result is paid after the window by whoever finalizes it;
    the seed reaches the scheduler only then (the mediator tries while it is Submitted and
    the scheduler stays without it), and the scheduler checks it against the commitment."""
    deployment, client = escrow
    seed = seed_where(attempt_drawn=False)
    output = store.add_bytes(b"mean=42.5\n" + os.urandom(4))
    spec = spot_spec(devnet, seed)
    addr = ipfs_daemon.api_addr
    with scheduler(tmp_path, deployment, devnet, addr) as server:
        job = spot_submitted(devnet, client, store, spec, output)
        job_id = "0x" + job.job_id.hex()
        with mediator(
            devnet,
            deployment,
            ipfs_daemon,
            tmp_path / "m.db",
            scheduler_url=server.url,
            reveal_retry_s=0.2,
        ) as med:
            until(med, lambda: decision(med, job) is not None, what="the check")
            d = decision(med, job)
            assert d is not None and d.verdict == "no ruling" and d.tx_hash is None, d
            assert "paid after the challenge window" in d.reason
            assert f"spot check not drawn (p={P_BPS} bps, attempt 1)" in d.reason
            for _ in range(5):
                med.poll_once()
            assert status(client, job) is Status.SUBMITTED
            assert server.get(API.SPOT.format(job_id=job_id)).json()["seed"] is None
            advance(client.w3, 3601)
            client.call_job(devnet.providers[1], "finalize", client.job_state(job.job_id))
            assert status(client, job) is Status.RELEASED
            until(med, lambda: revealed(med, job), what="the reveal")
        view = server.get(API.SPOT.format(job_id=job_id)).json()
    assert view["seed"] == "0x" + seed.hex() and view["checked_attempts"] == []
    assert view["attempts"] == 1
    assert [d.kind for d in med.decisions if d.job_id == job.job_id] == ["check"]


def revealed(med: Mediator, job: JobState) -> bool:
    kept = med.state.spot(job.job_id)
    return kept is not None and kept.revealed == "revealed"


def test_a_sealed_seed_that_does_not_open_or_match_is_never_charged_to_the_provider(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    store: IpfsStore,
    tmp_path: Path,
) -> None:
    """A seed sealed to another key, and one that opens but is not the committed one: the
    submitter's mistakes. No check is opened (even on a wrong output), the decision says why,
    and nothing is revealed."""
    deployment, client = escrow
    drawn = seed_where(attempt_drawn=True)
    stranger = spot.public_key_of(os.urandom(32))
    other_key = spot_spec(devnet, drawn, sealed_to=stranger)
    mismatch = spot_spec(
        devnet, drawn, commit=spot.commit_of(spot.new_seed(), devnet.submitter.address)
    )
    wrong = store.add_bytes(b"mean=0\n" + os.urandom(4))
    jobs = [spot_submitted(devnet, client, store, s, wrong) for s in (other_key, mismatch)]
    with mediator(devnet, deployment, ipfs_daemon, tmp_path / "m.db") as med:
        until(med, lambda: all(decision(med, j) for j in jobs), what="the checks")
        for job, why in zip(
            jobs,
            ("does not open with this key", "does not match the spec's commitment"),
            strict=True,
        ):
            d = decision(med, job)
            assert d is not None and d.verdict == "no ruling" and d.tx_hash is None, d
            assert f"no spot check: the sealed seed {why}" in d.reason, d.reason
            assert "never charged to the provider" in d.reason
            assert status(client, job) is Status.SUBMITTED
            kept = med.state.spot(job.job_id)
            assert kept is not None and kept.seed is None
        assert med.state.reruns() == []
        advance(client.w3, 3601)
        for job in jobs:
            client.call_job(devnet.providers[1], "finalize", client.job_state(job.job_id))
        for _ in range(5):
            med.poll_once()
        tasks = {t.job_id: t for t in med.state.pending_tasks()}
        assert not any(j.job_id in tasks for j in jobs)  # the reveals ended: nothing to reveal
    for job in jobs:
        events = client.events(deployment.block, "latest", [None, "0x" + job.job_id.hex()])
        assert "ProviderSlashed" not in [e.name for e in events]
        assert "ResultDisputed" not in [e.name for e in events]


def test_a_copied_commitment_neither_opens_nor_leaves_the_original_unchecked(
    devnet: Devnet,
    escrow: tuple[Deployment, EscrowClient],
    ipfs_daemon: IpfsDaemon,
    store: IpfsStore,
    tmp_path: Path,
) -> None:
    """Issue 32, item 7, at the mediator: an attacker copies a victim's spot policy (commitment
    and sealed seed, from the mempool) into a job of its own, whose result the mediator reads
    first. The copy's seed does not open (it was sealed for the victim's address); the victim's
    job is still drawn on (the copy's commitment used to count as a reuse: the victim's job went
    unchecked); the victim reusing its own commitment in a later job is still not drawn on."""
    deployment, client = escrow
    victim, attacker = devnet.submitters
    seed = seed_where(attempt_drawn=False)
    spec = spot_spec(devnet, seed)
    output = store.add_bytes(b"mean=42.5\n" + os.urandom(4))
    copied = spec.model_copy(update={"name": "copied"})
    copy = spot_submitted(devnet, client, store, copied, output, submitter=attacker)
    with mediator(devnet, deployment, ipfs_daemon, tmp_path / "m.db") as med:
        until(med, lambda: decision(med, copy) is not None, what="the copy's draw")
        d = decision(med, copy)
        assert d is not None and "does not open with this key for submitter" in d.reason, d
        job = spot_submitted(devnet, client, store, spec, output, submitter=victim)
        until(med, lambda: decision(med, job) is not None, what="the victim's draw")
        d = decision(med, job)
        assert d is not None, d
        assert f"spot check not drawn (p={P_BPS} bps, attempt 1)" in d.reason, d.reason
        kept = med.state.spot(job.job_id)
        assert kept is not None and kept.seed == seed
        assert med.state.spot_sharing(job.job_id, kept.commit) == []
        reused = spec.model_copy(update={"name": "reused"})
        again = spot_submitted(devnet, client, store, reused, output, submitter=victim)
        until(med, lambda: decision(med, again) is not None, what="the reuse's draw")
        d = decision(med, again)
        assert d is not None, d
        assert f"is also job 0x{job.job_id.hex()}'s: a reused seed is never drawn on" in d.reason
