"""The scheduler end to end on real services: anvil (fresh escrow per test), the js-ipfs
daemon, uvicorn on loopback. Providers speak the wire protocol over HTTP and sign with their
wallets; the on-chain outcome and balances are asserted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gridmarket.chain import EscrowClient
from gridmarket.cid import bytes_cid
from gridmarket.escrow import ZERO_ADDRESS, Status
from gridmarket.holds import hold_for
from gridmarket.ipfs import IpfsStore
from gridmarket.wire import API, JobSpec
from scheduler.service import Replica
from scheduler.settings import Settings
from scheduler.store import Store
from scheduler.store.tables import outbox

from ..conftest import Devnet
from .harness import (
    Provider,
    Server,
    accept,
    advance,
    advance_past_hold,
    fresh_escrow,
    register_on_chain,
    scheduler,
    submit_job,
)

SPEC = JobSpec.model_validate(
    {"executor": "docker", "image": "busybox:1", "command": ["true"], "max_attempts": 3}
)


WINDOW = 60
DELAY = 10


def chain_status(client: EscrowClient, job_id: str) -> Status:
    return client.job_state(bytes.fromhex(job_id[2:])).status


def wait_chain(client: EscrowClient, job_id: str, want: Status, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while (got := chain_status(client, job_id)) is not want:
        assert time.monotonic() < deadline, f"job {job_id} is {got.name} on-chain, not {want.name}"
        time.sleep(0.05)


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
    """A scheduler on a fresh escrow, once on SQLite and once on PostgreSQL (``db_url``), with
    a short challenge window and reassign delay (tests move the chain's clock past them)."""
    deployment, client = fresh_escrow(devnet, challenge_window=WINDOW, reassign_delay=DELAY)
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


def test_long_poll_offer_accept_verify_and_settle(
    grid: tuple[Server, EscrowClient], devnet: Devnet, ipfs: IpfsStore, tmp_path: Path
) -> None:
    server, client = grid
    node = Provider(devnet.providers[0], server)
    assert node.register().status_code == 200
    submitter = devnet.submitters[0]
    job_id = submit_job(client, ipfs, submitter, SPEC, on_verify=True)
    t0 = time.monotonic()
    r = node.next_job(wait_s=20)
    waited = time.monotonic() - t0
    assert r.status_code == 200, r.text
    a = r.json()
    assert a["job_id"] == job_id and a["attempt"] == 1 and a["spec"]["image"] == "busybox:1"
    assert waited < 5, f"dispatch took {waited:.2f}s"
    # the offer carries the job's on-chain terms, and nothing goes on-chain before the node
    # accepts them
    chain = client.job_state(bytes.fromhex(job_id[2:])).job
    assert a["terms"] == {
        "bounty_wei": chain.bounty,
        "fee_bps": chain.fee_bps,
        "deadline": chain.deadline,
        "collateral_wei": chain.collateral,
        "mediator": chain.mediator,
        "flags": 1,
        "operator": devnet.operator.address,
        "token": ZERO_ADDRESS,  # paid in ETH
        "hold_for": hold_for(SPEC.limits.timeout_s),  # nobody takes it back before it passes
    }
    time.sleep(0.5)
    assert chain_status(client, job_id) is Status.FUNDED
    assert accept(server, node, a)["message"]
    wait_chain(client, job_id, Status.ASSIGNED)
    before = client.balance_of(devnet.providers[0].address)
    cid = output(ipfs, tmp_path, "hello")
    r = node.succeed(a, cid)
    assert r.status_code == 202, r.text
    job = server.wait_job(job_id, {"released"}, timeout=30)  # on-verify: settled at once
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


def test_a_result_is_relayed_and_finalized_after_the_challenge_window(
    grid: tuple[Server, EscrowClient], devnet: Devnet, ipfs: IpfsStore, tmp_path: Path
) -> None:
    server, client = grid
    node = Provider(devnet.providers[0], server)
    assert node.register().status_code == 200
    job_id = submit_job(client, ipfs, devnet.submitters[0], SPEC)
    a = node.take()
    wait_chain(client, job_id, Status.ASSIGNED)
    before = client.balance_of(devnet.providers[0].address)
    cid = output(ipfs, tmp_path, "relayed")
    assert node.succeed(a, cid).status_code == 202
    wait_chain(client, job_id, Status.SUBMITTED)  # relayed; the window runs
    job = server.wait_job(job_id, {"settling"})
    assert "challenge window" in job["reason"]
    assert node.heartbeat().status_code == 200
    assert server.get(API.NODES).json()["nodes"][0]["running"] == 0  # its work is done
    time.sleep(1.0)
    advance(client.w3, WINDOW // 2)
    time.sleep(1.0)
    assert chain_status(client, job_id) is Status.SUBMITTED  # not before the window closes
    advance(client.w3, WINDOW // 2 + 1)
    job = server.wait_job(job_id, {"released"}, timeout=30)
    state = client.job_state(bytes.fromhex(job_id[2:]))
    assert state.status is Status.RELEASED and state.output_cid == cid == job["output_cid"]
    assert client.balance_of(devnet.providers[0].address) - before == state.job.payout
    assert [x["outcome"] for x in job["attempts"]] == ["success"]


def test_accept_checks_the_signer_the_attempt_and_the_lease(
    grid: tuple[Server, EscrowClient], devnet: Devnet, ipfs: IpfsStore
) -> None:
    server, client = grid
    node = Provider(devnet.providers[0], server, name="a")
    other = Provider(devnet.providers[1], server, name="b")
    assert node.register().status_code == 200 and other.register().status_code == 200
    assert other.heartbeat().status_code == 200
    job_id = submit_job(client, ipfs, devnet.submitters[0], SPEC)
    a = node.next_job(wait_s=20).json()
    # signed by another wallet: 401 naming both, and the offer stays
    r = node.accept(a, signer=devnet.providers[3])
    assert r.status_code == 401, r.text
    assert devnet.providers[3].address in r.json()["detail"]
    assert devnet.providers[0].address in r.json()["detail"]
    assert server.job(job_id)["state"] == "leased" and server.job(job_id)["node_id"] == node.node_id
    # another attempt: 409
    r = node.accept(a, attempt=a["attempt"] + 1)
    assert r.status_code == 409 and "stale" in r.json()["detail"]
    # another node's offer: 409
    r = other.accept(a, signer=devnet.providers[1])
    assert r.status_code == 409 and "not offered" in r.json()["detail"]
    time.sleep(0.3)
    assert chain_status(client, job_id) is Status.FUNDED  # nothing sent for any of them
    # the good one, twice (idempotent)
    accept(server, node, a)
    accept(server, node, a)
    wait_chain(client, job_id, Status.ASSIGNED)
    assert client.job_state(bytes.fromhex(job_id[2:])).job.provider == node.account.address
    outbox = server.job(job_id)["audit"]
    assert [e["event"] for e in outbox].count("accepted") == 1

    # an offer not accepted within the lease TTL (3 s) is lost like a lease: stale afterwards
    second = submit_job(client, ipfs, devnet.submitters[0], SPEC)
    b = other.next_job(wait_s=20).json()
    assert b["job_id"] == second
    job = server.wait_job(second, {"queued"}, timeout=20)
    assert other.node_id in job["excluded_nodes"]
    r = other.accept(b)
    assert r.status_code == 409 and "not offered" in r.json()["detail"]
    assert chain_status(client, second) is Status.FUNDED


def test_an_offer_to_a_wallet_short_of_collateral_is_withdrawn_without_a_fault(
    grid: tuple[Server, EscrowClient], devnet: Devnet, ipfs: IpfsStore
) -> None:
    server, client = grid
    poor = devnet.providers[4]
    register_on_chain(client, poor, stake=devnet.params.min_stake)  # eligible, but short
    node = Provider(poor, server, name="poor")
    assert node.register().status_code == 200
    job_id = submit_job(client, ipfs, devnet.submitters[0], SPEC, bounty=10**17)
    a = node.next_job(wait_s=20).json()
    r = node.accept(a)
    assert r.status_code == 200, r.text
    ack = r.json()
    assert ack["accepted"] is False and "free collateral" in ack["message"]
    job = server.job(job_id)
    assert job["state"] == "queued" and "free collateral" in job["reason"]
    n = server.get(API.NODE.format(node_id=node.node_id)).json()
    assert (n["jobs_failed"], n["running"]) == (0, 0)
    assert chain_status(client, job_id) is Status.FUNDED
    assert node.next_job(wait_s=0.5).status_code == 204  # never offered to that wallet again


def test_forged_output_cid_is_not_relayed_and_the_job_is_taken_back(
    grid: tuple[Server, EscrowClient], devnet: Devnet, ipfs: IpfsStore, tmp_path: Path
) -> None:
    server, client = grid
    cheat = Provider(devnet.providers[0], server, name="cheat")
    honest = Provider(devnet.providers[1], server, name="honest")
    assert cheat.register().status_code == 200
    job_id = submit_job(client, ipfs, devnet.submitters[0], SPEC, on_verify=True)
    a = cheat.take()
    assert honest.register().status_code == 200
    wait_chain(client, job_id, Status.ASSIGNED)
    # a CID the cheat never produced (no such content anywhere)
    forged = "bafkreie7q3iidccmpvszul7kudcvvuavuo7u6gzlbobczuk5nqk3b4akba"
    stake_before = client.call("providerOf", devnet.providers[0].address)[0]
    assert cheat.succeed(a, forged).status_code == 202
    job = server.wait_job(job_id, {"queued", "leased"}, timeout=40)
    assert cheat.node_id in job["excluded_nodes"] and "not relayed" in job["reason"]
    assert [x["outcome"] for x in job["attempts"]] == ["rejected"]
    cheat_view = server.get(API.NODE.format(node_id=cheat.node_id)).json()
    assert cheat_view["jobs_failed"] == 1  # a node fault
    # never relayed, nobody slashed; the take-back waits for the hold to end
    assert chain_status(client, job_id) is Status.ASSIGNED
    assert client.call("providerOf", devnet.providers[0].address)[0] == stake_before
    assert honest.heartbeat().status_code == 200  # silent past the timeout: offline till now
    b = honest.take()
    assert b["attempt"] == 2
    advance_past_hold(client, job_id)
    assert honest.succeed(b, output(ipfs, tmp_path, "real")).status_code == 202
    server.wait_job(job_id, {"released"}, timeout=30)
    state = client.job_state(bytes.fromhex(job_id[2:]))
    assert (state.job.provider, state.job.attempt) == (devnet.providers[1].address, 2)
    assert client.call("providerOf", devnet.providers[0].address)[0] == stake_before
    assert client.call("freeCollateralOf", devnet.providers[0].address) == stake_before


def test_an_output_unreachable_for_a_while_is_tried_again_not_charged_to_the_node(
    grid: tuple[Server, EscrowClient], devnet: Devnet, ipfs: IpfsStore
) -> None:
    """The verifier cannot fetch a reported output at first (the provider's node restarting, a
    blip between the nodes): the job stays verifying and says it tries again; once the bytes
    can be fetched (well within ``verify_patience_s``) the same attempt is paid. A forged
    CID is still rejected once the patience is spent (the test above)."""
    server, client = grid
    node = Provider(devnet.providers[0], server, name="late")
    assert node.register().status_code == 200
    job_id = submit_job(client, ipfs, devnet.submitters[0], SPEC, on_verify=True)
    a = node.take()
    wait_chain(client, job_id, Status.ASSIGNED)
    data = b"an output its node serves a few seconds late " + job_id.encode()
    cid = bytes_cid(data)
    assert node.succeed(a, cid).status_code == 202
    deadline = time.monotonic() + 20
    while "trying again" not in (view := server.get(f"/v1/jobs/{job_id}").json())["reason"]:
        assert view["state"] == "verifying", view
        assert time.monotonic() < deadline, view
        time.sleep(0.1)
    assert "not retrievable" in view["reason"] and "miss 1" in view["reason"], view["reason"]
    assert ipfs.add_bytes(data) == cid
    job = server.wait_job(job_id, {"released"}, timeout=30)
    assert [(x["attempt"], x["outcome"]) for x in job["attempts"]] == [(1, "success")], job
    assert server.get(API.NODE.format(node_id=node.node_id)).json()["jobs_failed"] == 0
    state = client.job_state(bytes.fromhex(job_id[2:]))
    assert (state.job.provider, state.output_cid) == (devnet.providers[0].address, cid)


def test_one_unreachable_output_holds_up_no_other_verdict(
    tmp_path: Path, devnet: Devnet, ipfs_daemon: Any, ipfs: IpfsStore, db_url: str
) -> None:
    """Outputs are fetched concurrently: while the verifier waits on an output nobody serves
    (given ``verify_timeout_s`` = 30 s), another node's result is verified and paid within
    seconds, and the first job is still on its first fetch (not rejected, not retried)."""
    deployment, client = fresh_escrow(devnet, challenge_window=WINDOW, reassign_delay=DELAY)
    for p in devnet.providers[:2]:
        register_on_chain(client, p)
    with scheduler(
        tmp_path,
        deployment,
        devnet,
        ipfs_daemon.api_addr,
        database_url=db_url,
        verify_timeout_s=30.0,
        verify_patience_s=120.0,
    ) as server:
        slow = Provider(devnet.providers[0], server, name="slow")
        fast = Provider(devnet.providers[1], server, name="fast")
        assert slow.register().status_code == 200
        job_a = submit_job(client, ipfs, devnet.submitters[0], SPEC, on_verify=True)
        a = slow.take()
        assert fast.register().status_code == 200
        job_b = submit_job(client, ipfs, devnet.submitters[0], SPEC, on_verify=True)
        b = fast.take()
        assert {a["job_id"], b["job_id"]} == {job_a, job_b}
        wait_chain(client, a["job_id"], Status.ASSIGNED)
        wait_chain(client, b["job_id"], Status.ASSIGNED)
        missing = bytes_cid(b"an output nobody serves " + job_a.encode())
        assert slow.succeed(a, missing).status_code == 202
        time.sleep(1.0)  # the verifier is now waiting on the missing output
        t0 = time.monotonic()
        assert fast.succeed(b, output(ipfs, tmp_path, "served")).status_code == 202
        server.wait_job(b["job_id"], {"released"}, timeout=25)
        took = time.monotonic() - t0
        assert took < 15, f"the served output waited {took:.1f} s behind the missing one"
        view = server.get(f"/v1/jobs/{a['job_id']}").json()
        assert view["state"] == "verifying" and "trying again" not in view["reason"], view
        wait_chain(client, b["job_id"], Status.RELEASED)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_the_duties_run_in_replicas_of_their_own_and_move_when_one_stops(
    tmp_path: Path, devnet: Devnet, ipfs_daemon: Any, ipfs: IpfsStore, db_url: str
) -> None:
    """``duties``: one replica holds the chain duty (watcher, outbox, specs), another the
    verify duty, a third takes neither while both are held; when the verifier's replica stops,
    the third takes its duty and the next output is verified and paid."""
    deployment, client = fresh_escrow(devnet, challenge_window=WINDOW, reassign_delay=DELAY)
    register_on_chain(client, devnet.providers[0])
    addr = ipfs_daemon.api_addr

    def held(server: Server) -> list[str]:
        return list(server.get(API.HEALTH).json()["duties"])

    def run_one(node: Provider, submitter: Any, text: str) -> None:
        job_id = submit_job(client, ipfs, submitter, SPEC, on_verify=True)
        r = node.next_job(wait_s=20)
        assert r.status_code == 200, r.text
        a = r.json()
        assert a["job_id"] == job_id
        accept(server_chain, node, a)
        wait_chain(client, job_id, Status.ASSIGNED)
        assert node.succeed(a, output(ipfs, tmp_path, text)).status_code == 202
        server_chain.wait_job(job_id, {"released"}, timeout=30)

    with (
        scheduler(
            tmp_path, deployment, devnet, addr, database_url=db_url, duties=["chain"]
        ) as server_chain,
        scheduler(
            tmp_path, deployment, devnet, addr, database_url=db_url, duties=["verify"]
        ) as server_verify,
        scheduler(tmp_path, deployment, devnet, addr, database_url=db_url) as spare,
    ):
        deadline = time.monotonic() + 10
        while (held(server_chain), held(server_verify)) != (["chain"], ["verify"]):
            assert time.monotonic() < deadline, (held(server_chain), held(server_verify))
            time.sleep(0.1)
        assert held(spare) == []  # both duties are held elsewhere
        metrics = server_verify.get(API.METRICS).text
        assert 'gridmarket_duty{duty="verify"} 1.0' in metrics
        node = Provider(devnet.providers[0], server_chain)
        assert node.register().status_code == 200
        run_one(node, devnet.submitters[0], "verified by the verify replica")
        # the verify replica stops: the spare takes the duty (tried every 2 s)
        server_verify.server.should_exit = True
        server_verify.thread.join(timeout=15)
        deadline = time.monotonic() + 15
        while held(spare) != ["verify"]:
            assert time.monotonic() < deadline, held(spare)
            time.sleep(0.2)
        assert held(server_chain) == ["chain"]
        run_one(node, devnet.submitters[1], "verified by the spare")


def test_split_duties_are_refused_on_sqlite(tmp_path: Path, devnet: Devnet) -> None:
    deployment, _ = fresh_escrow(devnet, challenge_window=WINDOW, reassign_delay=DELAY)
    deployment.save(tmp_path / "deployment.json")
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'one.db'}",
        rpc_url=devnet.url,
        deployment_file=tmp_path / "deployment.json",
        duties=["verify"],
    )
    with pytest.raises(ValueError, match="on SQLite the one replica takes every duty"):
        Replica(settings)


def test_lease_loss_reassigns_to_another_node_once_the_hold_is_over(
    grid: tuple[Server, EscrowClient], devnet: Devnet, ipfs: IpfsStore, tmp_path: Path
) -> None:
    """A node that dies loses its lease at once (the job goes to another node), but the chain
    keeps the job for it until the hold it signed for is over (``holdUntil``, here far past
    ``since + reassignDelay``): only then does the outbox take it back and reassign it."""
    server, client = grid
    lost = Provider(devnet.providers[0], server, name="lost")
    other = Provider(devnet.providers[1], server, name="other")
    assert lost.register().status_code == 200
    job_id = submit_job(client, ipfs, devnet.submitters[0], SPEC, on_verify=True)
    a = lost.take()
    wait_chain(client, job_id, Status.ASSIGNED)
    assert other.register().status_code == 200
    # `lost` never heartbeats: lease (3 s) expires, the job goes to `other`, never back to `lost`
    r = other.next_job(wait_s=20)
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["job_id"] == job_id and b["attempt"] == a["attempt"] + 1
    accept(server, other, b)
    # the stale attempt's result is refused
    assert lost.succeed(a, output(ipfs, tmp_path, "late")).status_code in (404, 409)
    # the chain holds it for `lost` until its hold is over, not only until reassignDelay
    held = client.job_state(bytes.fromhex(job_id[2:])).job
    assert a["terms"]["hold_for"] == hold_for(SPEC.limits.timeout_s) > DELAY + 60
    assert held.provider == lost.account.address
    assert held.hold_until == held.since + a["terms"]["hold_for"]
    advance(client.w3, DELAY + 60)  # past since + reassignDelay, short of holdUntil
    time.sleep(1.5)  # outbox passes (every 0.2 s): nothing goes out
    held = client.job_state(bytes.fromhex(job_id[2:])).job
    assert (held.provider, held.attempt) == (lost.account.address, 1)
    assert server.job(job_id)["state"] == "leased"  # the scheduler moved on already
    # the take-back waits for the hold's end, and the new node's assign behind it
    assert unassign_rows(server, job_id) == [("pending", float(held.hold_until))]
    advance_past_hold(client, job_id)
    deadline = time.monotonic() + 15
    while client.job_state(bytes.fromhex(job_id[2:])).job.provider != other.account.address:
        assert time.monotonic() < deadline, "never reassigned on-chain"
        time.sleep(0.05)
    assert other.succeed(b, output(ipfs, tmp_path, "ok")).status_code == 202
    server.wait_job(job_id, {"released"}, timeout=30)
    state = client.job_state(bytes.fromhex(job_id[2:]))
    assert state.job.provider == devnet.providers[1].address and state.job.attempt == 2


def unassign_rows(server: Server, job_id: str) -> list[tuple[str, float | None]]:
    """``(status, not_before)`` of the job's ``unassign`` outbox rows."""
    store = Store(server.settings.database_url)
    try:
        with store.engine.connect() as conn:
            q = select(outbox.c.status, outbox.c.not_before).where(
                outbox.c.job_id == job_id, outbox.c.kind == "unassign"
            )
            return [(st, nb) for st, nb in conn.execute(q)]
    finally:
        store.close()


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


def test_a_dispute_waits_for_the_mediator_and_a_ruling_against_requeues_elsewhere(
    grid: tuple[Server, EscrowClient], devnet: Devnet, ipfs: IpfsStore, tmp_path: Path
) -> None:
    """The watcher folds the submitter's dispute (the job waits for the mediator: no finalize)
    and the mediator's ruling against the result (the provider slashed, the job queued for
    another wallet, the ruled-against node charged a node fault)."""
    server, client = grid
    wrong = Provider(devnet.providers[0], server, name="wrong")
    right = Provider(devnet.providers[1], server, name="right")
    assert wrong.register().status_code == 200
    submitter = devnet.submitters[0]
    job_id = submit_job(client, ipfs, submitter, SPEC)
    jid = bytes.fromhex(job_id[2:])
    a = wrong.take()
    assert wrong.succeed(a, output(ipfs, tmp_path, "plausible but wrong")).status_code == 202
    wait_chain(client, job_id, Status.SUBMITTED)
    server.wait_job(job_id, {"settling"})
    stake_before = client.call("providerOf", wrong.account.address)[0]
    job_tuple = client.job_state(jid).job.as_tuple()
    deposit = int(client.call("depositOf", job_tuple))  # the job's bounty
    client.send(submitter, "dispute", jid, job_tuple, value=deposit)
    job = server.wait_job(job_id, {"disputed"})
    assert devnet.mediator.address in job["reason"]
    advance(client.w3, WINDOW + 1)  # past the challenge window: a disputed job is not paid
    time.sleep(1.5)
    assert chain_status(client, job_id) is Status.DISPUTED
    assert server.job(job_id)["state"] == "disputed"
    state = client.job_state(jid)
    client.rule(devnet.mediator, state, False)
    job = server.wait_job(job_id, {"queued", "leased"}, timeout=20)
    assert wrong.node_id in job["excluded_nodes"] and "slashed" in job["reason"]
    assert [x["outcome"] for x in job["attempts"]] == ["ruled_against"]
    events = [e["event"] for e in job["audit"]]
    assert "chain:ResultDisputed" in events and "chain:Ruled" in events
    assert "chain:ProviderSlashed" in events and "chain:Credited" in events
    view = server.get(API.NODE.format(node_id=wrong.node_id)).json()
    assert view["jobs_failed"] == 1 and view["running"] == 0
    assert client.call("providerOf", wrong.account.address)[0] == (
        stake_before - state.job.collateral
    )
    # another wallet takes it: the chain is Funded at attempt 1, the offer is attempt 2
    assert right.register().status_code == 200
    b = right.take()
    assert (b["job_id"], b["attempt"]) == (job_id, 2)
    wait_chain(client, job_id, Status.ASSIGNED)
    assert client.job_state(jid).job.provider == right.account.address
