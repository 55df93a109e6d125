"""Spot checks at the scheduler (issue 10, ``spot: p``) on real services: anvil (a fresh escrow),
the js-ipfs daemon, the scheduler under uvicorn. A job whose spot policy and on-chain terms
disagree is not offered (``invalid``, the reason says why), nor one whose commitment another job
of its submitter already holds (another wallet's copy blocks nothing); ``GET API.SPOT`` shows
the policy; a reveal is refused while the job (or another job holding its commitment) is not
settled, refused when the seed does not hash to the commitment, and kept once it does; a quote
for a spot policy names the check deposit and the least collateral."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gridmarket import spot
from gridmarket.chain import EscrowClient
from gridmarket.cid import bytes_cid
from gridmarket.escrow import FLAG_SPOT, Status
from gridmarket.ipfs import IpfsStore
from gridmarket.wire import API, JobSpec, SpotCheck
from scheduler.store import Store

from ..conftest import Devnet
from .harness import Server, fresh_escrow, scheduler
from .test_store import SUBMITTER, created, jid, node, offer

BOUNTY = 10**16
P_BPS = 2500
MODULE = bytes_cid(b"a module the spot API tests never run")


def spot_spec(
    devnet: Devnet, seed: bytes, *, name: str = "spot", p_bps: int = P_BPS, commit: bytes = b""
) -> JobSpec:
    """A WASM job checked with probability ``p_bps``: ``seed`` committed and sealed to the
    devnet's mediator (``commit`` overrides the commitment)."""
    policy = SpotCheck(
        p_bps=p_bps,
        commit="0x" + (commit or spot.commit_of(seed, devnet.submitter.address)).hex(),
        sealed="0x"
        + spot.seal(
            seed, spot.public_key_of(bytes(devnet.mediator.key)), devnet.submitter.address
        ).hex(),
    )
    return JobSpec.model_validate(
        {"name": name, "executor": "wasm", "module_cid": MODULE, "spot": policy}
    )


def plain_spec(name: str) -> JobSpec:
    return JobSpec.model_validate({"name": name, "executor": "wasm", "module_cid": MODULE})


def fund(
    client: EscrowClient,
    ipfs: IpfsStore,
    devnet: Devnet,
    spec: JobSpec,
    *,
    flags: int = FLAG_SPOT,
    collateral: int | None = None,
) -> str:
    """Fund ``spec`` with ``flags`` and ``collateral`` (default: the least a spot job with
    :data:`P_BPS` needs); its job id (0x hex)."""
    terms = client.default_terms(BOUNTY, devnet.submitter.address)
    least = max(terms.collateral, spot.min_collateral(BOUNTY, P_BPS))
    terms = replace(terms, flags=flags, collateral=least if collateral is None else collateral)
    now = max(int(time.time()), int(client.w3.eth.get_block("latest")["timestamp"]))
    state, _ = client.create_job(
        devnet.submitter,
        os.urandom(32),
        ipfs.add_bytes(spec.to_bytes()),
        now + 3600,
        BOUNTY,
        terms,
    )
    return "0x" + state.job_id.hex()


@pytest.fixture
def ipfs(ipfs_daemon: Any) -> Iterator[IpfsStore]:
    with IpfsStore(ipfs_daemon.api_addr) as client:
        yield client


@pytest.fixture
def grid(tmp_path: Path, devnet: Devnet, ipfs_daemon: Any) -> Iterator[tuple[Server, EscrowClient]]:
    deployment, client = fresh_escrow(devnet, challenge_window=60, reassign_delay=10)
    with scheduler(tmp_path, deployment, devnet, ipfs_daemon.api_addr) as server:
        yield server, client


def settled_view(server: Server, job_id: str, states: set[str]) -> dict[str, Any]:
    return server.wait_job(job_id, states, timeout=30)


def test_a_spot_job_whose_terms_disagree_with_its_policy_is_not_offered(
    grid: tuple[Server, EscrowClient], devnet: Devnet, ipfs: IpfsStore
) -> None:
    server, client = grid
    flag_only = fund(client, ipfs, devnet, plain_spec("flag-only"))
    policy_only = fund(client, ipfs, devnet, spot_spec(devnet, spot.new_seed()), flags=0)
    cheap = fund(
        client,
        ipfs,
        devnet,
        spot_spec(devnet, spot.new_seed(), name="cheap"),
        collateral=spot.min_collateral(BOUNTY, P_BPS) - 1,
    )
    seed = spot.new_seed()
    good = fund(client, ipfs, devnet, spot_spec(devnet, seed, name="good"))
    reused = fund(client, ipfs, devnet, spot_spec(devnet, seed, name="reused"))

    view = settled_view(server, flag_only, {"invalid"})
    assert "carries FLAG_SPOT" in view["reason"] and "no spot policy" in view["reason"]
    view = settled_view(server, policy_only, {"invalid"})
    assert "lacks FLAG_SPOT" in view["reason"], view["reason"]
    view = settled_view(server, cheap, {"invalid"})
    need = spot.min_collateral(BOUNTY, P_BPS)
    assert f"collateral {need - 1} is under {need}" in view["reason"], view["reason"]
    assert settled_view(server, good, {"queued"})["reason"] == "waiting for a node"
    view = settled_view(server, reused, {"invalid"})
    commit = "0x" + spot.commit_of(seed, devnet.submitter.address).hex()
    # the job created first holds the commitment, whichever spec was read first
    assert f"commitment {commit} is" in view["reason"] and good in view["reason"], view
    assert "a seed is never used twice" in view["reason"]
    for job_id in (flag_only, policy_only, cheap, reused):  # none was ever offered
        assert server.job(job_id)["attempts"] == []

    # GET: the policy of a spot job; 404 for a job that is none, 400 for a malformed id
    r = server.get(API.SPOT.format(job_id=good))
    assert r.status_code == 200, r.text
    assert r.json() == {
        "job_id": good,
        "p_bps": P_BPS,
        "commit": commit,
        "attempts": 0,
        "seed": None,
        "checked_attempts": None,
    }
    r = server.get(API.SPOT.format(job_id=flag_only))
    assert r.status_code == 404 and "FLAG_SPOT but its spec has no spot policy" in r.text
    r = server.get(API.SPOT.format(job_id="0x" + "ab" * 32))
    assert r.status_code == 404 and "no job" in r.text
    assert server.get(API.SPOT.format(job_id="0x1234")).status_code == 400


def test_a_reveal_is_kept_only_once_the_job_is_settled_and_the_seed_is_the_committed_one(
    grid: tuple[Server, EscrowClient], devnet: Devnet, ipfs: IpfsStore
) -> None:
    server, client = grid
    seed = spot.new_seed()
    job_id = fund(client, ipfs, devnet, spot_spec(devnet, seed))
    twin = fund(client, ipfs, devnet, spot_spec(devnet, seed, name="twin"))
    settled_view(server, job_id, {"queued"})
    settled_view(server, twin, {"invalid"})
    body = {"seed": "0x" + seed.hex()}
    url = API.SPOT.format(job_id=job_id)

    r = server.http.post(url, json=body)  # Funded: an attempt could still be drawn
    assert r.status_code == 409 and "not settled" in r.text, r.text
    # the twin is refunded, but the job holding its commitment is not settled: 409
    state = client.job_state(bytes.fromhex(twin[2:]))
    client.call_job(devnet.submitter, "cancel", state)
    settled_view(server, twin, {"refunded"})
    r = server.http.post(API.SPOT.format(job_id=twin), json=body)
    assert r.status_code == 409 and f"job {job_id} holds the same commitment" in r.text, r.text

    state = client.job_state(bytes.fromhex(job_id[2:]))
    state, _ = client.call_job(devnet.submitter, "cancel", state)
    assert state.status is Status.REFUNDED
    settled_view(server, job_id, {"refunded"})
    commit = "0x" + spot.commit_of(seed, devnet.submitter.address).hex()
    r = server.http.post(url, json={"seed": "0x" + spot.new_seed().hex()})
    assert r.status_code == 422 and f"commitment {commit}" in r.text, r.text
    assert server.http.post(url, json={"seed": "0x12"}).status_code == 422  # not 32 bytes
    assert server.get(url).json()["seed"] is None  # nothing kept
    r = server.http.post(API.SPOT.format(job_id="0x" + "cd" * 32), json=body)
    assert r.status_code == 404

    r = server.http.post(url, json=body)
    assert r.status_code == 200, r.text
    revealed = r.json()
    assert revealed["seed"] == "0x" + seed.hex() and revealed["checked_attempts"] == []
    assert server.get(url).json() == revealed
    assert server.http.post(url, json=body).json() == revealed  # again: as it stands
    # and now the twin's reveal (its commitment's other holder is settled)
    r = server.http.post(API.SPOT.format(job_id=twin), json=body)
    assert r.status_code == 200 and r.json()["seed"] == "0x" + seed.hex(), r.text
    audit = [a["event"] for a in server.job(job_id)["audit"]]
    assert "spot_revealed" in audit


def test_a_quote_for_a_spot_policy_names_the_check_deposit_and_the_least_collateral(
    grid: tuple[Server, EscrowClient],
) -> None:
    server, client = grid
    plain = server.http.post(API.QUOTE, json={"duration_s": 3600}).json()["quotes"]
    assert all("spot" not in q for q in plain)
    r = server.http.post(API.QUOTE, json={"duration_s": 3600, "spot_p_bps": P_BPS})
    assert r.status_code == 200, r.text
    for q in r.json()["quotes"]:
        total = int(q["total_wei"])
        assert q["spot"] == {
            "p_bps": P_BPS,
            "check_deposit_wei": str(total),
            "funding_wei": str(2 * total),
            "min_collateral_wei": str(
                max(client.min_collateral(total), spot.min_collateral(total, P_BPS))
            ),
        }
    r = server.http.post(API.QUOTE, json={"duration_s": 3600, "spot_p_bps": 0})
    assert r.status_code == 422 and "spot_p_bps" in r.text


def test_the_job_created_first_holds_a_commitment_whichever_spec_is_read_first(
    store: Store,
) -> None:
    """In the store (SQLite and PostgreSQL): the later job's spec, read first, is queued; the
    earlier one's, read next, takes the commitment and the later one goes ``invalid`` unoffered.
    Once a holder has been offered, it keeps the commitment and an earlier job is refused."""
    seed = spot.new_seed()
    policy = SpotCheck(
        p_bps=P_BPS,
        commit="0x" + spot.commit_of(seed, "0x" + "22" * 20).hex(),
        sealed="0x" + "11" * 93,
    )
    spec = JobSpec.model_validate(
        {"executor": "wasm", "module_cid": MODULE, "spot": policy.model_dump()}
    )
    cid = bytes_cid(spec.to_bytes())  # its own CID: specs are cached by CID process-wide
    events = [created(n, block=9 + n, flags=FLAG_SPOT, spec_cid=cid) for n in (1, 2, 3, 4)]
    store.apply_chain_events(events, through_block=13)
    assert store.set_spec(jid(2), spec) == "queued"
    assert store.set_spec(jid(1), spec) == "queued"
    later = store.job(jid(2))
    assert later.state == "invalid" and f"is job {jid(1)}'s, created before" in later.reason
    # the holder offered (leased): it keeps the commitment, against an earlier or a later job
    offer(store, jid(1), node(store), accept=False)
    assert store.set_spec(jid(4), spec) == "invalid"
    assert f"already job {jid(1)}'s" in store.job(jid(4)).reason
    assert store.spot_sharing(jid(4), policy.commit) == [(jid(1), int(Status.FUNDED))]


def test_a_copy_of_a_commitment_in_another_wallets_earlier_job_blocks_nothing(
    store: Store,
) -> None:
    """Issue 32, item 7, in the store (SQLite and PostgreSQL): an attacker copies a victim's
    spot commitment and sealed seed from the mempool into a job of its own created first on
    chain. The commitment hashes the victim's address in, so the copy is no reuse: the victim's
    job is still queued (it was ``invalid``, "already job X's"), and the copy holds back none of
    its reveals. The victim reusing its own commitment in a later job is still refused."""
    attacker = "0x15d34AAf54267DB7D7c367839AAf71A00a2C6A65"
    seed = spot.new_seed()
    policy = SpotCheck(
        p_bps=P_BPS, commit="0x" + spot.commit_of(seed, SUBMITTER).hex(), sealed="0x" + "11" * 93
    )
    specs = [
        JobSpec.model_validate(
            {"name": name, "executor": "wasm", "module_cid": MODULE, "spot": policy.model_dump()}
        )
        for name in ("copy", "victim", "reuse")
    ]
    events = [
        created(20 + n, block=20 + n, flags=FLAG_SPOT, spec_cid=bytes_cid(s.to_bytes()))
        for n, s in enumerate(specs)
    ]
    events[0].args["submitter"] = attacker  # the copy: the attacker's job, mined first
    store.apply_chain_events(events, through_block=22)
    copy, victim, reuse = jid(20), jid(21), jid(22)
    assert store.job(copy).chain.job.submitter == attacker
    assert store.set_spec(copy, specs[0]) == "queued"
    assert store.set_spec(victim, specs[1]) == "queued", store.job(victim).reason
    assert store.job(copy).state == "queued"  # (its seed never opens: the mediator's matter)
    assert store.spot_sharing(victim, policy.commit) == []
    assert store.spot_sharing(copy, policy.commit) == []
    # the same submitter reusing its own commitment: refused as before
    assert store.set_spec(reuse, specs[2]) == "invalid"
    assert f"already job {victim}'s" in store.job(reuse).reason
    assert store.spot_sharing(reuse, policy.commit) == [(victim, int(Status.FUNDED))]
