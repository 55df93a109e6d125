"""Checkpoint reports over HTTP against a real scheduler (uvicorn, a fresh escrow on anvil, the
session's js-ipfs daemon as the scheduler's node): every refusal with its code and message, a
repost no-op, the keeper keeping the report, ``GET /v1/jobs/{id}/checkpoints`` in its documented
shape, the job view's ``progress``, and the next attempt's assignment resuming from the kept
checkpoint once the first node is lost."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account.signers.local import LocalAccount

from gridmarket.checkpoints import JOB_CHECKPOINTS, NODE_CHECKPOINTS, sign_checkpoint
from gridmarket.ipfs import IpfsStore
from gridmarket.wire import API, JobSpec

from ..conftest import Devnet
from .harness import Provider, Server, fresh_escrow, register_on_chain, scheduler, submit_job

MAX_BYTES = 1024 * 1024
SPEC = JobSpec.model_validate(
    {
        "executor": "docker",
        "image": "busybox:1",
        "command": ["true"],
        "max_attempts": 3,
        "checkpoint": {"interval_s": 30, "max_bytes": MAX_BYTES},
    }
)
# no checkpoint policy, and a region no test node is in (it is never offered to them)
PLAIN = JobSpec.model_validate(
    {
        "executor": "docker",
        "image": "busybox:1",
        "command": ["true"],
        "resources": {"region": "eu-west"},
    }
)


@pytest.fixture
def ipfs(ipfs_daemon: Any) -> Iterator[IpfsStore]:
    store = IpfsStore(ipfs_daemon.api_addr)
    yield store
    store.close()


def post(
    server: Server,
    node: Provider,
    job_id: str,
    cid: str,
    *,
    seq: int = 1,
    attempt: int = 1,
    size: int = 5000,
    signer: LocalAccount | None = None,
    step: int = 0,
) -> httpx.Response:
    """``node`` reports a checkpoint signed by ``signer`` (its own wallet by default)."""
    info = server.get(API.INFO).json()
    job = bytes.fromhex(job_id[2:]) if len(job_id) == 66 else b"\0" * 32
    sig = sign_checkpoint(
        signer or node.account, info["chain_id"], info["escrow"], job, attempt, seq, cid, size
    )
    body = {
        "attempt": attempt,
        "seq": seq,
        "cid": cid,
        "size": size,
        "files": 2,
        "progress": {"step": step, "total": 1000, "metrics": {"loss": 0.5}} if step else None,
        "final": False,
        "taken_at": time.time(),
        "signature": "0x" + sig.hex(),
    }
    return server.http.post(
        NODE_CHECKPOINTS.format(node_id=node.node_id, job_id=job_id), json=body, headers=node.auth
    )


def detail(r: httpx.Response) -> str:
    return str(r.json()["detail"])


def test_reports_are_checked_kept_shown_and_resumed_from(
    tmp_path: Path, devnet: Devnet, ipfs_daemon: Any, ipfs: IpfsStore
) -> None:
    deployment, client = fresh_escrow(devnet, challenge_window=60, reassign_delay=10)
    for p in devnet.providers[:2]:
        register_on_chain(client, p)
    with scheduler(tmp_path, deployment, devnet, ipfs_daemon.api_addr) as server:
        a = Provider(devnet.providers[0], server, name="a")
        b = Provider(devnet.providers[1], server, name="b")
        assert a.register().status_code == 200 and b.register().status_code == 200
        job_id = submit_job(client, ipfs, devnet.submitters[0], SPEC, on_verify=True)
        first = a.take()
        assert first["job_id"] == job_id and first["resume"] is None  # nothing to resume yet
        plain = submit_job(client, ipfs, devnet.submitters[0], PLAIN, on_verify=True)
        server.wait_job(plain, {"queued"})
        state = tmp_path / "ckpt"
        (state / "weights").mkdir(parents=True)
        (state / "weights" / "w.bin").write_bytes(b"\x01" * 4000)
        (state / "progress.json").write_text('{"step": 700, "total": 1000}')
        cid = ipfs.add_dir(state)
        checkpoints = JOB_CHECKPOINTS.format(job_id=job_id)

        # refusals, each with its code and a message naming why
        r = post(server, a, "0x12", cid)
        assert r.status_code == 400 and "64 hex digits" in detail(r)
        r = server.http.post(
            NODE_CHECKPOINTS.format(node_id=a.node_id, job_id=job_id), json={"attempt": 1}
        )
        assert r.status_code == 401
        r = post(server, a, "0x" + "ee" * 32, cid)
        assert r.status_code == 404
        r = post(server, a, plain, cid)
        assert r.status_code == 409 and "no checkpoint policy" in detail(r), r.text
        r = post(server, a, job_id, cid, size=MAX_BYTES + 1)
        assert r.status_code == 413 and "checkpoint.max_bytes" in detail(r), r.text
        r = post(server, a, job_id, cid, signer=b.account)
        assert r.status_code == 403 and f"not by node {a.node_id}'s wallet" in detail(r), r.text
        r = post(server, b, job_id, cid)
        assert r.status_code == 403 and f"not leased to node {b.node_id}" in detail(r), r.text
        assert a.heartbeat([job_id]).status_code in (200, 204)

        # accepted once; a repost of the same (job, attempt, seq) changes nothing
        r = post(server, a, job_id, cid, step=700)
        assert r.status_code == 202 and r.json() == {"stored": True}, r.text
        r = post(server, a, job_id, cid, step=999)
        assert r.status_code == 202 and r.json() == {"stored": False}, r.text

        # a node posting faster than one report a second past its burst of 20
        codes = [post(server, b, job_id, cid).status_code for _ in range(40)]
        assert 429 in codes and set(codes) <= {403, 429}, codes
        r = post(server, b, job_id, cid)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert "faster than one every 1 s" in detail(r)

        # the keeper keeps it on the scheduler's node; the job shows its progress
        deadline = time.monotonic() + 20
        while (view := server.get(checkpoints).json())["resume"] is None:
            assert time.monotonic() < deadline, view
            a.heartbeat([job_id])
            time.sleep(0.2)
        assert set(view) == {"job_id", "policy", "latest", "resume", "points", "keep_points"}
        assert view["job_id"] == job_id and view["keep_points"] == 500
        assert view["policy"] == {"interval_s": 30, "max_bytes": MAX_BYTES}
        latest = view["latest"]
        assert latest == view["resume"]
        assert latest == {
            "attempt": 1,
            "seq": 1,
            "cid": cid,
            "size": 5000,
            "files": 2,
            "node_id": a.node_id,
            "wallet": a.account.address,
            "taken_at": latest["taken_at"],
            "final": False,
            "kept": True,
            "progress": {"step": 700, "total": 1000, "metrics": {"loss": 0.5}},
        }
        assert view["points"] == [
            {
                "attempt": 1,
                "seq": 1,
                "step": 700,
                "total": 1000,
                "metrics": {"loss": 0.5},
                "taken_at": latest["taken_at"],
                "final": False,
            }
        ]
        assert server.job(job_id)["progress"] == {
            "step": 700,
            "total": 1000,
            "metrics": {"loss": 0.5},
            "fraction": 0.7,
        }
        assert server.job(plain)["progress"] is None
        plain_view = server.get(JOB_CHECKPOINTS.format(job_id=plain)).json()
        assert plain_view["policy"] is None and plain_view["latest"] is None
        assert plain_view["points"] == []
        assert server.get(JOB_CHECKPOINTS.format(job_id="0x12")).status_code == 400
        assert server.get(JOB_CHECKPOINTS.format(job_id="0x" + "ee" * 32)).status_code == 404

        # `a` goes silent: its lease expires and the next attempt resumes from the checkpoint
        r = b.next_job(wait_s=20)
        assert r.status_code == 200, r.text
        second = r.json()
        assert second["job_id"] == job_id and second["attempt"] == 2
        resume = second["resume"]
        assert {k: resume[k] for k in ("cid", "size", "attempt", "seq")} == {
            "cid": cid,
            "size": 5000,
            "attempt": 1,
            "seq": 1,
        }
        assert resume["wallet"] == a.account.address
        assert resume["progress"] == {"step": 700, "total": 1000, "metrics": {"loss": 0.5}}
        attempts = server.job(job_id)["attempts"]
        assert [(x["attempt"], x["resume_cid"]) for x in attempts] == [(1, None), (2, cid)]
        # the lost node's late reports for its ended attempt are refused after LATE_S only;
        # a report for the new attempt from it is not its to make
        r = post(server, a, job_id, cid, attempt=2, seq=1)
        assert r.status_code == 403 and "not leased" in detail(r)
