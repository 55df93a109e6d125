"""Checkpoints of long jobs: a node reports each checkpoint of the attempt it runs
(``POST /v1/nodes/{node_id}/jobs/{job_id}/checkpoints``, :data:`NODE_CHECKPOINTS`), anyone who
may read the job reads the newest one, the one the next attempt resumes from and the progress
so far (``GET /v1/jobs/{job_id}/checkpoints``, :data:`JOB_CHECKPOINTS`; job details are public
on this scheduler). The keeper (``scheduler/service/checkpoints.py``) copies the newest report
of each job to the scheduler's IPFS node; docs/scheduler.md, "Checkpoints".

A report is hostile input: it must come from the node the attempt was leased to (its token),
be signed by that node's registered wallet (EIP-712 ``Checkpoint``), be no larger than the
job's ``max_bytes``, and a node may post at most :data:`NODE_RATE` reports a second on average
(burst :data:`NODE_BURST`; 429 with ``Retry-After`` past it). A job keeps its newest
:data:`KEEP_ROWS` reports.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, HTTPException, status

from gridmarket.checkpoints import (
    JOB_CHECKPOINTS,
    NODE_CHECKPOINTS,
    CheckpointReport,
    recover_checkpoint_signer,
)
from scheduler.store import ConflictError, NotFoundError, Store
from scheduler.store.logs import NotAssigneeError

from .deps import GridDep, NodeDep, StoreDep
from .logs import _Buckets, _job_id

router = APIRouter(tags=["checkpoints"])

KEEP_ROWS = 500
"""Reports kept per job (every attempt together): the oldest go, never the one kept pinned."""
KEEP_POINTS = 500
"""Progress points ``GET`` answers at most (the newest, oldest first)."""
NODE_RATE = 1.0
"""Reports per second one node may post on average, all its jobs together: ten jobs at the
shortest interval (10 s)."""
NODE_BURST = 20
"""The bucket of :data:`NODE_RATE`: a node's reports of several jobs at once, a last copy."""

buckets = _Buckets(NODE_RATE, NODE_BURST)


@router.post(NODE_CHECKPOINTS, status_code=status.HTTP_202_ACCEPTED)
async def post_checkpoint(
    job_id: str,
    body: CheckpointReport,
    store: StoreDep,
    grid: GridDep,
    node: NodeDep,
) -> dict[str, Any]:
    """Store a checkpoint report of the attempt ``body.attempt`` this node runs. 400: a
    malformed job id; 404: no such job; 409: the job's spec has no checkpoint policy, or the
    attempt ended over a minute ago; 403: the attempt is not this node's, or the signature is
    not its wallet's; 413: larger than the policy's ``max_bytes``; 429: the node reports
    faster than it may. ``stored`` is false for a repost of a ``seq`` already stored."""
    job_id = _job_id(job_id)
    wait = buckets.take(node.node_id, 1)
    if wait:
        raise HTTPException(
            429,
            f"node {node.node_id} reports checkpoints faster than one every "
            f"{1 / NODE_RATE:g} s on average",
            headers={"Retry-After": f"{max(1, round(wait))}"},
        )
    try:
        job = await asyncio.to_thread(store.job, job_id)
    except NotFoundError as exc:
        raise HTTPException(404, str(exc)) from None
    policy = job.spec.checkpoint if job.spec is not None else None
    if policy is None:
        raise HTTPException(409, f"job {job_id} has no checkpoint policy (spec.checkpoint)")
    if body.size > policy.max_bytes:
        raise HTTPException(
            413,
            f"size: {body.size} bytes is over the job's checkpoint.max_bytes ({policy.max_bytes})",
        )
    try:
        signer = recover_checkpoint_signer(
            bytes.fromhex(body.signature[2:]),
            grid.chain_id,
            grid.escrow,
            bytes.fromhex(job_id[2:]),
            body.attempt,
            body.seq,
            body.cid,
            body.size,
        )
    except ValueError as exc:
        raise HTTPException(403, f"signature: not a valid signature ({exc})") from None
    if signer.lower() != node.wallet.lower():
        raise HTTPException(
            403,
            f"signature: signed by {signer}, not by node {node.node_id}'s wallet {node.wallet}",
        )
    try:
        stored = await asyncio.to_thread(
            store.add_checkpoint, job_id, node.node_id, node.wallet, body, keep_rows=KEEP_ROWS
        )
    except NotAssigneeError as exc:
        raise HTTPException(403, str(exc)) from None
    except ConflictError as exc:
        raise HTTPException(409, str(exc)) from None
    return {"stored": stored}


@router.get(JOB_CHECKPOINTS)
async def get_checkpoints(job_id: str, store: StoreDep) -> dict[str, Any]:
    """The job's checkpoint policy, its newest report (``latest``), the newest one the
    scheduler keeps (``resume``: what the next attempt starts from) and its progress points,
    oldest first (at most ``keep_points``, only reports that carried progress)."""
    job_id = _job_id(job_id)
    try:
        job = await asyncio.to_thread(store.job, job_id)
    except NotFoundError as exc:
        raise HTTPException(404, str(exc)) from None
    policy = job.spec.checkpoint if job.spec is not None else None
    seen = await asyncio.to_thread(store.checkpoints_of, job_id, KEEP_POINTS)
    return {
        "job_id": job_id,
        "policy": policy.model_dump(mode="json") if policy is not None else None,
        "latest": seen["latest"],
        "resume": seen["resume"],
        "points": seen["points"],
        "keep_points": KEEP_POINTS,
    }


async def progress_view(store: Store, job_id: str) -> dict[str, Any] | None:
    """The ``progress`` of a job's detail view: its latest :class:`Progress` as JSON and
    ``fraction`` (step/total; None without a total), or None when it reported none."""
    progress = await asyncio.to_thread(store.latest_progress, job_id)
    if progress is None:
        return None
    return {**progress.model_dump(mode="json"), "fraction": progress.fraction}
