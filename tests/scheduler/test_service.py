"""The scheduler end to end on real services: anvil (fresh escrow per test), the js-ipfs
daemon, uvicorn on loopback. Providers speak the wire protocol over HTTP and sign with their
wallets; the on-chain outcome and balances are asserted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gridmarket.chain import EscrowClient
from gridmarket.escrow import Status
from gridmarket.ipfs import IpfsStore
from gridmarket.wire import API, JobSpec

from ..conftest import Devnet
from .harness import Provider, Server, fresh_escrow, register_on_chain, scheduler, submit_job

SPEC = JobSpec.model_validate(
    {"executor": "docker", "image": "busybox:1", "command": ["true"], "max_attempts": 3}
)


@pytest.fixture
def ipfs(ipfs_daemon) -> Iterator[IpfsStore]:  # type: ignore[no-untyped-def]
    store = IpfsStore(ipfs_daemon.api_addr)
    yield store
    store.close()


@pytest.fixture
def grid(
    tmp_path: Path,
    devnet: Devnet,
    ipfs_daemon: Any,
    ipfs: IpfsStore,
    db_url: str,
) -> Iterator[tuple[Server, EscrowClient]]:
    """A scheduler on a fresh escrow, once on SQLite and once on PostgreSQL (``db_url``)."""
    deployment, client = fresh_escrow(devnet)
    for p in devnet.providers[:4]:
        register_on_chain(client, p)
    addr = ipfs_daemon.api_addr
    with scheduler(tmp_path, deployment, devnet, addr, database_url=db_url) as server:
        yield server, client


def output(ipfs: IpfsStore, tmp_path: Path, text: str) -> str:
    out = tmp_path / f"out-{time.time_ns()}"
    out.mkdir()
    (out / "result.txt").write_text(text)
    return ipfs.add_dir(out)


# --------------------------------------------------------------------------- registration


def test_registration_rejects_forged_replayed_expired_and_unregistered(
    grid: tuple[Server, EscrowClient], devnet: Devnet
) -> None:
    server, _ = grid
    good = Provider(devnet.providers[0], server)
    # signed by another key
    forged = Provider(devnet.providers[1], server)
    info = server.get(API.INFO).json()
    reg = good.registration()
    from gridmarket.wire import sign_registration

    sig = sign_registration(devnet.providers[1], info["chain_id"], info["escrow"], reg)
    r = server.http.post(
        API.REGISTER, json={"registration": reg.model_dump(mode="json"), "signature": sig}
    )
    assert r.status_code == 401 and "not by registration.wallet" in r.json()["detail"]
    # expired, too long-lived
    assert "has passed" in good.register(expiry=int(time.time()) - 1).json()["detail"]
    assert "ahead" in good.register(expiry=int(time.time()) + 100_000).json()["detail"]
    # unknown region names the field
    bad_region = good.capacity.model_copy(update={"region": "mars"})
    assert "region" in good.register(capacity=bad_region).json()["detail"]
    # good, then the same signed body replayed
    r = good.register(nonce=42)
    assert r.status_code == 200, r.text
    assert good.register(nonce=42).status_code == 409
    # not registered on-chain
    stranger = Provider(devnet.providers[4], server)
    r = stranger.register()
    assert r.status_code == 403 and "registerProvider" in r.json()["detail"]
    # a token for one node does not work for another
    forged.register()
    r = server.http.post(
        API.HEARTBEAT.format(node_id=good.node_id), json={"running": []}, headers=forged.auth
    )
    assert r.status_code == 403
    r = server.http.post(
        API.HEARTBEAT.format(node_id=good.node_id),
        json={"running": []},
        headers={"Authorization": "Bearer " + good.token[:-2] + "xx"},
    )
    assert r.status_code == 401


# --------------------------------------------------------------------------- the happy path


def test_long_poll_dispatch_verify_and_settle(
    grid: tuple[Server, EscrowClient], devnet: Devnet, ipfs: IpfsStore, tmp_path: Path
) -> None:
    server, client = grid
    node = Provider(devnet.providers[0], server)
    assert node.register().status_code == 200
    submitter = devnet.submitters[0]
    job_id = submit_job(client, ipfs, submitter, SPEC)
    t0 = time.monotonic()
    r = node.next_job(wait_s=20)
    waited = time.monotonic() - t0
    assert r.status_code == 200, r.text
    a = r.json()
    assert a["job_id"] == job_id and a["attempt"] == 1 and a["spec"]["image"] == "busybox:1"
    assert waited < 5, f"dispatch took {waited:.2f}s"
    # the assignment reaches the chain
    deadline = time.monotonic() + 10
    while client.job_state(bytes.fromhex(job_id[2:])).status is not Status.ASSIGNED:
        assert time.monotonic() < deadline, "assign never reached the chain"
        time.sleep(0.05)
    before = client.balance_of(devnet.providers[0].address)
    cid = output(ipfs, tmp_path, "hello")
    r = node.succeed(a, cid)
    assert r.status_code == 202, r.text
    job = server.wait_job(job_id, {"released"}, timeout=30)
    assert job["output_cid"] == cid
    state = client.job_state(bytes.fromhex(job_id[2:]))
    assert state.status is Status.RELEASED and state.output_cid == cid
    assert client.balance_of(devnet.providers[0].address) - before == state.job.payout
    assert [x["outcome"] for x in job["attempts"]] == ["success"]
    nodes = server.get(API.NODES).json()["nodes"]
    assert nodes[0]["jobs_done"] == 1 and nodes[0]["running"] == 0
    # idle now: 204 with advice
    advice = []
    for _ in range(4):
        r = node.next_job(wait_s=0.1)
        assert r.status_code == 204
        advice.append(float(r.headers["Retry-After"]))
    assert 0 < advice[0] < advice[-1]  # backs off while the grid stays idle


def test_forged_output_cid_is_rejected_slashed_and_redone(
    grid: tuple[Server, EscrowClient], devnet: Devnet, ipfs: IpfsStore, tmp_path: Path
) -> None:
    server, client = grid
    cheat = Provider(devnet.providers[0], server, name="cheat")
    honest = Provider(devnet.providers[1], server, name="honest")
    assert cheat.register().status_code == 200
    job_id = submit_job(client, ipfs, devnet.submitters[0], SPEC)
    a = cheat.next_job(wait_s=20).json()
    assert honest.register().status_code == 200
    # a CID the cheat never produced (no such content anywhere)
    forged = "bafkreie7q3iidccmpvszul7kudcvvuavuo7u6gzlbobczuk5nqk3b4akba"
    stake_before = client.call("providerOf", devnet.providers[0].address)[0]
    assert cheat.succeed(a, forged).status_code == 202
    job = server.wait_job(job_id, {"queued", "leased"}, timeout=40)
    assert cheat.node_id in job["excluded_nodes"]
    assert client.call("providerOf", devnet.providers[0].address)[0] < stake_before  # slashed
    assert honest.heartbeat().status_code == 200  # silent past the timeout: offline till now
    r = honest.next_job(wait_s=20)
    assert r.status_code == 200
    b = r.json()
    assert b["attempt"] == 2
    assert honest.succeed(b, output(ipfs, tmp_path, "real")).status_code == 202
    server.wait_job(job_id, {"released"}, timeout=30)
    assert client.job_state(bytes.fromhex(job_id[2:])).job.provider == devnet.providers[1].address


def test_lease_loss_reassigns_to_another_node(
    grid: tuple[Server, EscrowClient], devnet: Devnet, ipfs: IpfsStore, tmp_path: Path
) -> None:
    server, client = grid
    lost = Provider(devnet.providers[0], server, name="lost")
    other = Provider(devnet.providers[1], server, name="other")
    assert lost.register().status_code == 200
    job_id = submit_job(client, ipfs, devnet.submitters[0], SPEC)
    a = lost.next_job(wait_s=20).json()
    assert other.register().status_code == 200
    # `lost` never heartbeats: lease (3 s) expires, the job goes to `other`, never back to `lost`
    r = other.next_job(wait_s=20)
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["job_id"] == job_id and b["attempt"] == a["attempt"] + 1
    # the stale attempt's result is refused
    assert lost.succeed(a, output(ipfs, tmp_path, "late")).status_code in (404, 409)
    assert other.succeed(b, output(ipfs, tmp_path, "ok")).status_code == 202
    server.wait_job(job_id, {"released"}, timeout=30)
    state = client.job_state(bytes.fromhex(job_id[2:]))
    assert state.job.provider == devnet.providers[1].address and state.job.attempt == 2


def test_bad_input_is_named(grid: tuple[Server, EscrowClient], devnet: Devnet) -> None:
    server, _ = grid
    r = server.http.post(API.REGISTER, json={"registration": {"wallet": "nope"}})
    assert r.status_code == 422
    assert any("wallet" in str(e["loc"]) for e in r.json()["detail"])
    assert server.get(API.JOB.format(job_id="0x12")).status_code == 400
    assert server.get(API.JOB.format(job_id="0x" + "0" * 64)).status_code == 404
    assert server.get(API.JOBS, params={"state": "bogus"}).status_code == 422
    q = server.http.post(API.QUOTE, json={"region": "us", "gpu_count": 1, "min_vram_mib": 20000})
    assert q.status_code == 200 and q.json()["quotes"]
    assert server.http.post(API.QUOTE, json={"region": "atlantis"}).status_code == 422
