"""The scheduler against hostile or unlucky jobs, on real services (anvil with a fresh escrow per
test, the js-ipfs daemon, uvicorn on loopback; SQLite and PostgreSQL): specs nobody has do not
delay honest jobs, any CID encoding works, one wallet's nodes are one provider for a requeued
job, and a job that fails by its own fault fails fast without touching the node's reputation
(issues 11 and 15)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from multiformats import CID
from sqlalchemy import select

from gridmarket.chain import EscrowClient
from gridmarket.cid import bytes_cid
from gridmarket.escrow import Status
from gridmarket.ipfs import IpfsStore
from gridmarket.wire import API, JobSpec
from scheduler.store import Store
from scheduler.store.tables import outbox

from ..conftest import Devnet
from .harness import (
    Provider,
    Server,
    advance_past_hold,
    fresh_escrow,
    register_on_chain,
    scheduler,
    submit_job,
)

SPEC = JobSpec.model_validate(
    {"executor": "docker", "image": "busybox:1", "command": ["true"], "max_attempts": 3}
)


DELAY = 10
"""The escrow's reassignDelay here: tests move the chain's clock past it (``advance``)."""


@pytest.fixture
def ipfs(ipfs_daemon: Any) -> Iterator[IpfsStore]:
    store = IpfsStore(ipfs_daemon.api_addr)
    yield store
    store.close()


@pytest.fixture
def grid(
    tmp_path: Path, devnet: Devnet, ipfs_daemon: Any, db_url: str
) -> Iterator[tuple[Server, EscrowClient]]:
    deployment, client = fresh_escrow(devnet, reassign_delay=DELAY)
    for p in devnet.providers[:2]:
        register_on_chain(client, p, stake=5 * 10**17)  # several jobs' collateral at once
    with scheduler(
        tmp_path, deployment, devnet, ipfs_daemon.api_addr, database_url=db_url
    ) as server:
        yield server, client


def fund(client: EscrowClient, submitter: Any, spec_cid: str, ttl: int = 3600) -> str:
    """Fund an on-verify job (paid at once once verified) with ``spec_cid`` as given."""
    now = max(int(time.time()), int(client.w3.eth.get_block("latest")["timestamp"]))
    terms = client.default_terms(10**17, submitter.address, on_verify=True)
    state, _ = client.create_job(submitter, os.urandom(32), spec_cid, now + ttl, 10**17, terms)
    return "0x" + state.job_id.hex()


def encoded(cid: str, base: str) -> str:
    return str(CID.decode(cid).set(base=base))


def wait_chain(client: EscrowClient, job_id: str, status: Status, timeout: float = 15) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        state = client.job_state(bytes.fromhex(job_id[2:]))
        if state.status is status:
            return state
        assert time.monotonic() < deadline, f"{job_id} is {state.status.name}, not {status.name}"
        time.sleep(0.05)


def outbox_rows(server: Server, job_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    store = Store(server.settings.database_url)
    try:
        with store.engine.connect() as conn:
            q = (
                select(outbox.c.kind, outbox.c.status, outbox.c.payload)
                .where(outbox.c.job_id == job_id)
                .order_by(outbox.c.id)
            )
            return [(k, s, dict(p)) for k, s, p in conn.execute(q)]
    finally:
        store.close()


def settled_outbox(server: Server, job_id: str, timeout: float = 15) -> list[Any]:
    """The job's outbox rows once none is pending (each sent, or refused: ``failed``)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = outbox_rows(server, job_id)
        if all(s != "pending" for _, s, _ in rows):
            return rows
        assert time.monotonic() < deadline, f"outbox rows still pending: {rows}"
        time.sleep(0.05)


def fail(node: Provider, a: dict[str, Any], reason: str, message: str) -> None:
    body = {"attempt": a["attempt"], "reason": reason, "message": message, "duration_s": 0.5}
    r = node.report(a["job_id"], body)
    assert r.status_code in (200, 202), r.text


def node_view(server: Server, node_id: str) -> dict[str, Any]:
    r = server.get(API.NODE.format(node_id=node_id))
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


# --------------------------------------------------------------------------- spec fetches


def test_specs_nobody_has_do_not_delay_an_honest_job(
    grid: tuple[Server, EscrowClient], devnet: Devnet, ipfs: IpfsStore
) -> None:
    """100 funded jobs whose spec CIDs nobody has, then an honest one: it is queued at once."""
    server, client = grid
    submitter = devnet.submitters[0]
    missing = [bytes_cid(os.urandom(48)) for _ in range(100)]
    # the precondition that made jobs wait: IPFS hangs on a CID nobody has
    t0 = time.monotonic()
    with pytest.raises(OSError, match="timed out"):
        ipfs.cat(missing[0], max_bytes=1024, timeout_s=1.0)
    assert time.monotonic() - t0 >= 0.9
    stuck = [fund(client, submitter, cid) for cid in missing]
    honest_cid = ipfs.add_bytes(SPEC.to_bytes())
    t0 = time.monotonic()
    honest = fund(client, submitter, honest_cid)
    job = server.wait_job(honest, {"queued"}, timeout=30)
    waited = time.monotonic() - t0
    assert waited < 5.0, f"the honest job waited {waited:.1f} s behind 100 unfetchable specs"
    assert job["reason"] == "waiting for a node"
    # the unfetchable ones wait in backoff, saying why; none is given up yet (120 s)
    deadline = time.monotonic() + 15
    while True:
        views = [server.job(j) for j in stuck[:10]]
        if all("waiting for the job spec" in v["reason"] for v in views):
            break
        assert time.monotonic() < deadline, [v["reason"] for v in views]
        time.sleep(0.2)
    assert {v["state"] for v in views} == {"pending_spec"}
    assert "not retrievable from IPFS" in views[0]["reason"]
    # another honest job funded now, with all 100 in backoff, is as quick
    t0 = time.monotonic()
    second = fund(client, submitter, ipfs.add_bytes(SPEC.model_copy().to_bytes() + b" "))
    server.wait_job(second, {"queued", "invalid"}, timeout=30)
    assert time.monotonic() - t0 < 3.0


@pytest.mark.parametrize("base", ["base32", "base58btc", "base16"])
def test_any_cid_encoding_works_for_spec_and_output(
    grid: tuple[Server, EscrowClient],
    devnet: Devnet,
    ipfs: IpfsStore,
    tmp_path: Path,
    base: str,
) -> None:
    """A spec CID and an output CID in base32 (``bafk...``), base58btc (``zb2...``) or base16
    (``f01...``): the same binary CIDs, so the job is queued, verified and paid."""
    server, client = grid
    node = Provider(devnet.providers[0], server)
    assert node.register().status_code == 200
    spec_cid = encoded(ipfs.add_bytes(SPEC.to_bytes()), base)
    assert spec_cid[0] == {"base32": "b", "base58btc": "z", "base16": "f"}[base]
    job_id = fund(client, devnet.submitters[0], spec_cid)
    job = server.wait_job(job_id, {"queued", "invalid"}, timeout=20)
    assert job["state"] == "queued", job["reason"]
    a = node.take()
    assert a["job_id"] == job_id and a["spec_cid"] == spec_cid
    out = tmp_path / "out"
    out.mkdir()
    (out / "result.txt").write_text(f"hello in {base}")
    output_cid = encoded(ipfs.add_dir(out), base)
    assert node.succeed(a, output_cid).status_code == 202
    done = server.wait_job(job_id, {"released", "failed", "queued"}, timeout=30)
    assert done["state"] == "released", done["reason"]
    assert client.job_state(bytes.fromhex(job_id[2:])).output_cid == output_cid


# --------------------------------------------------------------------------- one wallet


def test_one_wallet_s_nodes_are_one_provider_for_a_requeued_job(
    grid: tuple[Server, EscrowClient], devnet: Devnet, ipfs: IpfsStore
) -> None:
    server, client = grid
    wallet_a = [Provider(devnet.providers[0], server, name=f"a{i}") for i in range(6)]
    b = Provider(devnet.providers[1], server, name="b0")
    for p in wallet_a:
        assert p.register().status_code == 200
    job_id = submit_job(client, ipfs, devnet.submitters[0], SPEC)
    first = wallet_a[0].take()
    wait_chain(client, job_id, Status.ASSIGNED)
    # a node-side failure: requeued, and no node of wallet A is offered the job again
    fail(wallet_a[0], first, "agent_error", "the IPFS daemon is down (output)")
    job = server.wait_job(job_id, {"queued"}, timeout=10)
    assert wallet_a[0].node_id in job["excluded_nodes"]
    codes: list[int] = []

    def poll(p: Provider) -> None:
        codes.append(p.next_job(wait_s=2.0).status_code)

    threads = [threading.Thread(target=poll, args=(p,)) for p in wallet_a[1:]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [204] * 5, codes
    assert b.register().status_code == 200
    second = b.take()
    assert second["job_id"] == job_id and second["attempt"] == 2
    advance_past_hold(client, job_id)  # A's assignment is taken back once its hold is over
    deadline = time.monotonic() + 15
    while client.job_state(bytes.fromhex(job_id[2:])).job.attempt < 2:
        assert time.monotonic() < deadline, "the second assign never reached the chain"
        time.sleep(0.05)
    assert client.job_state(bytes.fromhex(job_id[2:])).job.provider == b.account.address
    # every assign sent was taken: none refused and withdrawn
    rows = settled_outbox(server, job_id)
    assigns = [(s, p["provider"]) for k, s, p in rows if k == "assign"]
    assert assigns == [("done", wallet_a[0].account.address), ("done", b.account.address)]
    assert all(s == "done" for _, s, _ in rows), rows
    assert [k for k, _, _ in rows] == ["assign", "unassign", "assign"]
    # a hand-back is no fault: the assignment is undone on-chain (the escrow would refuse B
    # again while it holds the job for B), then B's other node may take it
    r = server.http.post(API.HAND_BACK.format(node_id=b.node_id, job_id=job_id), headers=b.auth)
    assert r.status_code in (200, 202), r.text
    advance_past_hold(client, job_id)
    wait_chain(client, job_id, Status.FUNDED)
    b2 = Provider(devnet.providers[1], server, name="b1")
    assert b2.register().status_code == 200
    assert wallet_a[1].next_job(wait_s=1.0).status_code == 204  # A stays excluded
    third = b2.take()
    assert third["job_id"] == job_id and third["attempt"] == 3
    deadline = time.monotonic() + 15
    while client.job_state(bytes.fromhex(job_id[2:])).job.attempt < 3:
        assert time.monotonic() < deadline, "the third assign never reached the chain"
        time.sleep(0.05)
    rows = settled_outbox(server, job_id)
    assert [k for k, _, _ in rows] == ["assign", "unassign", "assign", "unassign", "assign"]
    assert all(s == "done" for _, s, _ in rows), rows  # none refused


# --------------------------------------------------------------------------- whose fault


def test_a_job_that_fails_by_its_own_fault_fails_fast_and_spares_the_node(
    grid: tuple[Server, EscrowClient], devnet: Devnet, ipfs: IpfsStore
) -> None:
    server, client = grid
    node = Provider(devnet.providers[0], server, name="n0")
    other = Provider(devnet.providers[1], server, name="o0")
    assert node.register().status_code == 200
    assert other.register().status_code == 200
    before = node_view(server, node.node_id)
    submitter = devnet.submitters[0]
    job_id = submit_job(client, ipfs, submitter, SPEC)
    a = node.take()
    wait_chain(client, job_id, Status.ASSIGNED)
    fail(node, a, "exit_code", "exited with code 3")
    job = server.wait_job(job_id, {"failed"}, timeout=10)
    # the submitter reads why, and that it can cancel
    assert "exit_code: exited with code 3" in job["reason"] and "cancel" in job["reason"]
    # the node keeps its reputation; no other node is offered the job
    after = node_view(server, node.node_id)
    assert after["reputation"] == before["reputation"]
    assert after["jobs_failed"] == 0 and after["running"] == 0
    assert other.next_job(wait_s=1.5).status_code == 204
    # the refund path: the outbox unassigns on-chain (once the node's hold is over), then the
    # submitter cancels
    advance_past_hold(client, job_id)
    state = wait_chain(client, job_id, Status.FUNDED)
    balance = client.balance_of(submitter.address)
    client.call_job(submitter, "cancel", state)
    assert client.balance_of(submitter.address) - balance == state.job.bounty
    assert server.wait_job(job_id, {"refunded"}, timeout=10)["state"] == "refunded"


def test_a_node_s_own_failure_costs_it_and_a_timeout_once_the_job_is_done_elsewhere(
    grid: tuple[Server, EscrowClient], devnet: Devnet, ipfs: IpfsStore, tmp_path: Path
) -> None:
    server, client = grid
    broken = Provider(devnet.providers[0], server, name="broken")
    slow = Provider(devnet.providers[0], server, name="slow")
    fast = Provider(devnet.providers[1], server, name="fast")
    for p in (broken, slow, fast):
        assert p.register().status_code == 200
    start = node_view(server, broken.node_id)["reputation"]
    # an agent error is the node's: it costs at once
    first = submit_job(client, ipfs, devnet.submitters[0], SPEC, on_verify=True)
    a = broken.take()
    assert a["job_id"] == first
    fail(broken, a, "agent_error", "the IPFS daemon is down (output)")
    server.wait_job(first, {"queued"}, timeout=10)
    assert node_view(server, broken.node_id)["reputation"] < start
    # a timeout costs nothing yet: a job that runs forever would time out anywhere
    second = submit_job(client, ipfs, devnet.submitters[0], SPEC, on_verify=True)
    b = slow.take()
    assert b["job_id"] == second
    fail(slow, b, "timeout", "killed at the time limit of 600 s")
    server.wait_job(second, {"queued"}, timeout=10)
    assert node_view(server, slow.node_id)["reputation"] == start
    # ... until another wallet does the job in time: then it fitted, and the slow node pays
    got = {}
    for _ in range(2):
        c = fast.take()
        got[c["job_id"]] = c
        advance_past_hold(client, c["job_id"])  # the failed node's assignment is taken back
        wait_chain_attempt(client, c["job_id"], c["attempt"])
        out = tmp_path / f"out-{len(got)}"
        out.mkdir()
        (out / "result.txt").write_text(c["job_id"])
        assert fast.succeed(c, ipfs.add_dir(out)).status_code == 202
        server.wait_job(c["job_id"], {"released"}, timeout=30)
    assert set(got) == {first, second}
    assert node_view(server, slow.node_id)["reputation"] < start
    assert node_view(server, slow.node_id)["jobs_failed"] == 1


def wait_chain_attempt(client: EscrowClient, job_id: str, attempt: int) -> None:
    deadline = time.monotonic() + 15
    while client.job_state(bytes.fromhex(job_id[2:])).job.attempt < attempt:
        assert time.monotonic() < deadline, f"attempt {attempt} of {job_id} never reached the chain"
        time.sleep(0.05)
