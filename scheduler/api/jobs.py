"""Job endpoints (read-only: jobs are created on-chain, by the submitter's own transaction),
and a spot job's seed, revealed by anyone once the job is settled (``API.SPOT``)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from fastapi import APIRouter, HTTPException, Query

from gridmarket import spot
from gridmarket.escrow import FLAG_SPOT
from gridmarket.token import ETH, ETH_TOKEN, Token, by_address
from gridmarket.wire import API, SpotReveal, SpotStatus
from scheduler.lifecycle import State
from scheduler.spot import SETTLED, spot_status
from scheduler.store import JobRow, NotFoundError, Store

from .checkpoints import progress_view
from .deps import GridDep, StoreDep

router = APIRouter(tags=["jobs"])

_JOB_ID = re.compile(r"^0x[0-9a-f]{64}$")
STATES = "|".join(s.value for s in State)


def job_view(job: JobRow, tokens: dict[str, Token] | None = None) -> dict[str, Any]:
    """A job as the API shows it. Amounts are in the job's token (``token``: its address, the
    zero address for ETH; ``token_symbol`` and ``token_decimals`` from the deployment's listed
    ``tokens``):
    ``bounty_wei`` and ``collateral`` in its smallest units (the name ``bounty_wei`` is kept for
    the clients that read it), ``bounty`` and ``collateral_display`` written with the symbol."""
    result = job.result.model_dump(mode="json") if job.result else None
    chain = job.chain.job
    token = by_address(tokens or {ETH: ETH_TOKEN}, chain.token)
    return {
        "job_id": job.job_id,
        "state": job.state,
        "reason": job.reason,
        "submitter": job.submitter,
        "token": token.address,
        "token_symbol": token.symbol,
        "token_decimals": token.decimals,
        "bounty_wei": str(job.bounty_wei),
        "bounty": token.fmt(job.bounty_wei),
        "collateral": str(chain.collateral),
        "collateral_display": token.fmt(chain.collateral),
        "fee_bps": job.fee_bps,
        "deadline": job.deadline,
        "spec_cid": job.spec_cid,
        "spec": job.spec.model_dump(mode="json") if job.spec else None,
        "chain_status": job.chain.status.name.lower(),
        "provider": job.chain.job.provider,
        "attempt": job.attempt,
        "node_id": job.node_id,
        "lease_expires": job.lease_expires,
        "output_cid": job.output_cid,
        "failures": job.failures,
        "excluded_nodes": list(job.excluded),
        "result": result,
        "created_block": job.created_block,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
    }


@router.get(API.JOBS)
async def list_jobs(
    store: StoreDep,
    grid: GridDep,
    state: str | None = Query(None, pattern=f"^({STATES})$"),
    submitter: str | None = Query(None, pattern=r"^0x[0-9a-fA-F]{40}$"),
    node_id: str | None = Query(None, max_length=24),
    limit: int = Query(100, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=10**9),
) -> dict[str, Any]:
    """Jobs, newest first, with counts by state."""
    rows = await asyncio.to_thread(
        store.jobs, state=state, submitter=submitter, node_id=node_id, limit=limit, offset=offset
    )
    counts = await asyncio.to_thread(store.job_counts)
    tokens = grid.tokens
    return {"counts": counts, "jobs": [job_view(j, tokens) for j in rows]}


@router.get(API.JOB)
async def get_job(job_id: str, store: StoreDep, grid: GridDep) -> dict[str, Any]:
    """One job: its state and why, the on-chain struct, every attempt and the audit trail,
    and the progress its checkpoints reported (``progress``: step, total, metrics, fraction;
    null for a job that reported none)."""
    job_id = job_id.lower()
    if not _JOB_ID.match(job_id):
        raise HTTPException(400, f"job_id {job_id!r} must be 0x and 64 hex digits")
    try:
        job = await asyncio.to_thread(store.job, job_id)
    except NotFoundError as exc:
        raise HTTPException(404, str(exc)) from None
    view = job_view(job, grid.tokens)
    view["attempts"] = await asyncio.to_thread(store.attempts_of, job_id)
    view["audit"] = await asyncio.to_thread(store.audit_of, job_id)
    view["progress"] = await progress_view(store, job_id)  # a checkpointing job's, else None
    return view


async def _spot_job(store: Store, job_id: str) -> JobRow:
    """The spot job ``job_id``: 400 for a malformed id, 404 for an unknown job or one that is
    not a spot job (no ``spot`` in its spec)."""
    job_id = job_id.lower()
    if not _JOB_ID.match(job_id):
        raise HTTPException(400, f"job_id {job_id!r} must be 0x and 64 hex digits")
    try:
        job = await asyncio.to_thread(store.job, job_id)
    except NotFoundError as exc:
        raise HTTPException(404, str(exc)) from None
    if job.spec is None or job.spec.spot is None:
        flagged = job.chain.job.flags & FLAG_SPOT
        why = (
            "it carries FLAG_SPOT but its spec has no spot policy"
            if flagged and job.spec is not None
            else "its spec is not read yet"
            if job.spec is None and job.state == State.PENDING_SPEC
            else "its spec has no spot policy"
        )
        raise HTTPException(404, f"job {job_id} is not a spot job: {why}")
    return job


@router.get(API.SPOT, response_model=SpotStatus)
async def get_spot(job_id: str, store: StoreDep) -> SpotStatus:
    """A spot job's policy (``p``, the commitment), its attempts so far, and once revealed its
    seed and the attempts that seed draws for a check (anyone can recompute them)."""
    job = await _spot_job(store, job_id)
    assert job.spec is not None
    return spot_status(job.job_id, job.spec, job.chain.job.attempt, job.spot_seed)


@router.post(API.SPOT, response_model=SpotStatus)
async def reveal_spot(job_id: str, body: SpotReveal, store: StoreDep) -> SpotStatus:
    """Reveal a settled spot job's seed (anyone may: the submitter's client, the mediator).
    404: unknown job, or not a spot job; 409: the job is not settled on-chain (Released or
    Refunded), or another job holding the same commitment is not; 422: the seed does not hash
    to the spec's commitment. A seed already revealed is answered as it stands (the first
    stays: only one seed hashes to the commitment)."""
    job = await _spot_job(store, job_id)
    spec = job.spec
    assert spec is not None and spec.spot is not None
    commit = spec.spot.commit.lower()
    seed = body.seed.lower()
    if job.chain.status not in SETTLED:
        raise HTTPException(
            409,
            f"job {job.job_id} is {job.chain.status.name} on-chain, not settled (Released or "
            "Refunded): its seed is revealed only once no attempt can be assigned again",
        )
    for other, status in await asyncio.to_thread(store.spot_sharing, job.job_id, commit):
        if status not in SETTLED:
            raise HTTPException(
                409, f"job {other} holds the same commitment {commit} and is not settled"
            )
    submitter = job.chain.job.submitter
    if not spot.verify_reveal(bytes.fromhex(seed[2:]), bytes.fromhex(commit[2:]), submitter):
        raise HTTPException(
            422,
            f"seed: {seed} does not hash to the spec's commitment {commit} "
            f'(keccak256("gridmarket.spot.v1" || submitter {submitter} || seed))',
        )
    if job.spot_seed is None:
        await asyncio.to_thread(store.set_spot_seed, job.job_id, seed)
        job = await asyncio.to_thread(store.job, job.job_id)
    return spot_status(job.job_id, spec, job.chain.job.attempt, job.spot_seed)
