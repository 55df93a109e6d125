"""Job endpoints (read-only: jobs are created on-chain, by the submitter's own transaction)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from fastapi import APIRouter, HTTPException, Query

from gridmarket.token import ETH, ETH_TOKEN, Token, by_address
from gridmarket.wire import API
from scheduler.lifecycle import State
from scheduler.store import JobRow, NotFoundError

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
    """One job: its state and why, the on-chain struct, every attempt and the audit trail."""
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
    return view
