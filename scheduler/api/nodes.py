"""Node endpoints: signed registration, heartbeats, long-poll for work (an offer), its signed
acceptance, results, hand-back."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request, Response, status

from gridmarket.chain import ChainError
from gridmarket.eip712 import recover_acceptance_signer, recover_result_signer
from gridmarket.tiers import REGIONS, classify_gpu
from gridmarket.wire import (
    API,
    AcceptAck,
    AcceptRequest,
    Assignment,
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
    RegisterResponse,
    ResultAck,
    ResultReport,
    RunReason,
    checksum,
    recover_registration_signer,
)
from scheduler.auth import issue
from scheduler.dispatch import Dispatcher, hold_of
from scheduler.service import Replica
from scheduler.store import (
    ConflictError,
    NodeRow,
    NotFoundError,
    OfferRefusedError,
    ReplayError,
    ShortOfCollateralError,
    Store,
)

from .deps import DispatcherDep, GridDep, NodeDep, StoreDep

router = APIRouter(tags=["nodes"])


def _bad(message: str, code: int = status.HTTP_400_BAD_REQUEST) -> HTTPException:
    return HTTPException(code, message)


@router.post(API.REGISTER, response_model=RegisterResponse)
async def register(
    body: RegisterRequest, grid: GridDep, dispatcher: DispatcherDep, request: Request
) -> RegisterResponse:
    """Register (or re-register) a node. The registration must be signed (EIP-712
    ``NodeRegistration``) by its wallet, be unexpired, carry a nonce above the wallet's last one,
    and the wallet must be a registered (and, if required, staked) provider on-chain."""
    reg = body.registration
    s = grid.settings
    now = time.time()
    if reg.expiry <= now:
        raise _bad(f"registration.expiry {reg.expiry} has passed (now {int(now)})")
    if reg.expiry > now + s.registration_max_ttl_s:
        raise _bad(
            f"registration.expiry is more than {int(s.registration_max_ttl_s)} s ahead: "
            "sign a short-lived registration"
        )
    if reg.capacity.region not in REGIONS:
        raise _bad(
            f"registration.capacity.region {reg.capacity.region!r} is unknown; "
            f"use one of {', '.join(sorted(REGIONS))}"
        )
    try:
        signer = recover_registration_signer(grid.chain_id, grid.escrow, reg, body.signature)
    except ValueError as exc:
        raise _bad(f"signature: {exc}", status.HTTP_401_UNAUTHORIZED) from None
    wallet = checksum(reg.wallet)
    if signer != wallet:
        raise _bad(
            f"signature is by {signer}, not by registration.wallet {wallet}",
            status.HTTP_401_UNAUTHORIZED,
        )
    try:
        provider = await asyncio.to_thread(grid.chain.call, "providerOf", wallet)
        eligible = await asyncio.to_thread(grid.chain.call, "isEligible", wallet)
    except ChainError as exc:
        raise _bad(f"chain unavailable: {exc}", status.HTTP_503_SERVICE_UNAVAILABLE) from None
    if not provider[3]:
        raise _bad(
            f"{wallet} is not a registered provider on-chain: call registerProvider first",
            status.HTTP_403_FORBIDDEN,
        )
    if s.require_stake and not eligible:
        raise _bad(
            f"{wallet} is not eligible on-chain (stake below the minimum, or unstaking)",
            status.HTTP_403_FORBIDDEN,
        )
    gpu = reg.capacity.gpu
    tier = classify_gpu(gpu.name or gpu.model, gpu.vram_mib).key if gpu else "cpu"
    try:
        node = await asyncio.to_thread(
            grid.store.register_node,
            wallet=wallet,
            name=reg.name,
            capacity=reg.capacity,
            tier=tier,
            agent_version=reg.agent_version,
            nonce=reg.nonce,
        )
    except ReplayError as exc:
        raise _bad(str(exc), status.HTTP_409_CONFLICT) from None
    request.app.state.node_cache.pop(node.node_id, None)
    dispatcher.advertise(node.node_id, reg.capacity.images)  # newer than any heartbeat's
    grid.count("registrations")
    token, expires = issue(s.token_secret.get_secret_value().encode(), node.node_id, s.token_ttl_s)
    return RegisterResponse(
        node_id=node.node_id,
        token=token,
        token_expires_at=expires,
        heartbeat_interval_s=s.heartbeat_interval_s,
        lease_ttl_s=s.lease_ttl_s,
    )


@router.post(API.HEARTBEAT, response_model=HeartbeatResponse)
async def heartbeat(
    body: HeartbeatRequest,
    node: NodeDep,
    grid: GridDep,
    store: StoreDep,
    dispatcher: DispatcherDep,
    request: Request,
) -> Any:
    """Keep the node online and renew the leases of the jobs it runs (written behind, in
    batches: scheduler/heartbeats.py). ``images``, when given, replaces the images the node
    advertised (kept in this replica's memory: matching prefers a node that has a job's image;
    a replica that has not heard it uses the registration's list).

    Served by the node fast path (``scheduler/api/fastpath.py``) whenever it can be
    answered from memory: this route answers the rest (a node back from offline, jobs this
    replica does not know leased to the node, every error) and documents the body."""
    state = request.app.state
    answer = beat_from_memory(state, node, body)
    if answer is not None:
        return Response(answer, media_type="application/json")
    _pulse(grid, dispatcher, node, body)
    if node.status != "online":  # back from offline: written at once, so it can poll at once
        state.node_cache.pop(node.node_id, None)
        try:
            leases, cancel = await asyncio.to_thread(
                store.heartbeat, node.node_id, body.running, grid.settings.lease_ttl_s
            )
        except NotFoundError as exc:
            raise _bad(str(exc), status.HTTP_404_NOT_FOUND) from None
        return HeartbeatResponse(
            leases=leases, cancel=cancel, next_heartbeat_s=grid.settings.heartbeat_interval_s
        )
    leased, cancel = await asyncio.to_thread(store.leases_of, node.node_id, body.running)
    return Response(_renewed(state, node.node_id, leased, cancel), media_type="application/json")


def beat_from_memory(state: Any, node: NodeRow, body: HeartbeatRequest) -> bytes | None:
    """The heartbeat's JSON answer when it needs no I/O (the node is online, and this replica
    knows every job it lists leased to it: ``Store.leases_known``), with its effects (counted,
    images advertised, the pulse buffered); None, with no effect, when the caller must read or
    write (the route does). ``state``: the app's state (grid, dispatcher, heartbeats)."""
    if node.status != "online":
        return None
    leased: list[str] = []
    if body.running:
        # the jobs this replica knows leased to the node are answered from memory (no thread
        # hop, no read); the flush reconciles them with the database (scheduler/heartbeats.py)
        known = state.grid.store.leases_known(node.node_id, body.running)
        if known is None:
            return None
        leased = known
    _pulse(state.grid, state.dispatcher, node, body)
    return _renewed(state, node.node_id, leased, [])


def _pulse(grid: Replica, dispatcher: Dispatcher, node: NodeRow, body: HeartbeatRequest) -> None:
    grid.count("heartbeats")
    if body.images is not None:
        dispatcher.advertise(node.node_id, body.images)


def _renewed(state: Any, node_id: str, leased: list[str], cancel: list[str]) -> bytes:
    """Buffer the pulse (``HeartbeatBuffer.beat``) and answer: the leases run ``lease_ttl_s``
    from it."""
    settings = state.grid.settings
    seen = state.heartbeats.beat(node_id, leased)
    expires = seen + settings.lease_ttl_s
    answer = HeartbeatResponse(
        leases={j: expires for j in leased},
        cancel=cancel,
        next_heartbeat_s=settings.heartbeat_interval_s,
    )
    return answer.__pydantic_serializer__.to_json(answer)  # model_dump_json's bytes


@router.post(
    API.NEXT_JOB,
    response_model=Assignment,
    responses={204: {"description": "no job within wait_s; see the Retry-After header"}},
)
async def next_job(
    node: NodeDep,
    request: Request,
    wait_s: float = Query(20.0, ge=0, le=120, description="hold the request open this long"),
) -> Any:
    """Long-poll for work: answered as soon as a job matches this node, else after ``wait_s``
    with 204 and a ``Retry-After`` (seconds) that grows while the grid is idle.

    Served by the node fast path (``scheduler/api/fastpath.py``) when the node's row is cached
    and its token valid; both run :func:`poll`."""
    got = await poll(request.app.state, node, wait_s)
    if isinstance(got, float):
        return Response(status_code=204, headers={"Retry-After": f"{got:.2f}"})
    return Response(got, media_type="application/json")


async def poll(state: Any, node: NodeRow, wait_s: float) -> bytes | float:
    """A ``next-job`` long poll of the authenticated ``node``: the offer's JSON, or the
    seconds to wait before asking again (no job within ``wait_s``). Raises ``HTTPException``
    (409) when the node is not online. ``state``: the app's state (grid, dispatcher, the
    node-row cache)."""
    grid: Replica = state.grid
    dispatcher: Dispatcher = state.dispatcher
    s = grid.settings
    if node.status != "online":  # the cached row may be 2 s old: ask the database
        state.node_cache.pop(node.node_id, None)
        node = await asyncio.to_thread(grid.store.node, node.node_id)
        if node.status != "online":
            raise _bad(f"node {node.node_id} is {node.status}: heartbeat first", 409)
    got = await dispatcher.next_job(node, min(wait_s, s.long_poll_max_s))
    if got is None:
        return _idle_advice(grid, dispatcher, node, min(wait_s, s.long_poll_max_s))
    grid.count("claims")
    # built and validated once here, where FastAPI's response_model handling would dump it,
    # validate the dump again (the spec: every CID re-parsed) and serialise it
    return got.__pydantic_serializer__.to_json(got)


LONG_POLL_S = 5.0
"""Polls that waited at least this long are told to come back at once (no doubling)."""


def _idle_advice(grid: Replica, dispatcher: Dispatcher, node: NodeRow, waited_s: float) -> float:
    """When to ask again after an empty poll. A long poll (``waited_s`` >= 5 s) was the wait
    already: come back at once, so an idle node is always parked here and gets new work within
    milliseconds. Short polls back off: doubling with each empty poll in a row (with jitter, so
    a fleet does not come back in step), up to ``idle_retry_max_s``."""
    s = grid.settings
    streak = dispatcher.idle_streak(node.node_id)
    if streak <= 1 or waited_s >= LONG_POLL_S:  # a long poll is its own backoff: come back
        return s.idle_retry_min_s
    delay = min(s.idle_retry_max_s, max(s.idle_retry_min_s, 0.5) * (1 << min(streak - 1, 10)))
    return delay * random.uniform(0.8, 1.0)  # noqa: S311 - spreading retries, not security


@router.post(API.ACCEPT, response_model=AcceptAck)
async def accept(
    job_id: str,
    body: AcceptRequest,
    node: NodeDep,
    grid: GridDep,
    dispatcher: DispatcherDep,
) -> AcceptAck:
    """Accept an offer (:func:`accept_offer`; the node fast path, ``scheduler/api/fastpath.py``,
    serves it the same way when the node's row is cached, its token valid and the body valid).

    ``body.signature`` is the node's EIP-712 ``Acceptance`` of attempt
    ``body.attempt`` of the job on its on-chain terms (the Assignment's ``terms``). The
    scheduler checks that the lease is the node's current one with that attempt and that the
    wallet signed it, that the wallet has the job's collateral free on-chain, stores the
    signature and assigns the job on-chain with it (outbox). Run the job only after
    ``accepted: true``.

    A signature that is not the wallet's (or not over these terms) is refused with 401 and
    the offer kept until its lease TTL (the node may post a correct one); a stale attempt or a
    lease that is not the node's is 409. Free collateral below the job's ends the offer
    (``accepted: false``; the job goes to another wallet, no fault of the node).

    The offer this replica delivered is checked from memory (the dispatcher's
    :meth:`~scheduler.dispatch.Dispatcher.offered`); ``store.accept`` checks the lease, the
    attempt and the signed terms again under the row's lock."""
    return await accept_offer(job_id, body, node, grid, dispatcher)


async def accept_offer(
    job_id: str, body: AcceptRequest, node: NodeRow, grid: Replica, dispatcher: Dispatcher
) -> AcceptAck:
    """The acceptance route's work (see :func:`accept`); errors raise ``HTTPException``."""
    store = grid.store
    row = dispatcher.offered(job_id)
    if row is None or row.node_id != node.node_id or row.attempt != body.attempt:
        try:
            row = await asyncio.to_thread(store.job, job_id)
        except NotFoundError as exc:
            raise _bad(str(exc), 404) from None
    if row.node_id != node.node_id or row.state != "leased":
        raise _bad(f"job {job_id} is not offered to node {node.node_id} (it is {row.state})", 409)
    if body.attempt != row.attempt:
        raise _bad(f"attempt {body.attempt} is stale: the offer is attempt {row.attempt}", 409)
    if row.spec is not None and row.spec.excludes(node.wallet):
        raise _bad(f"job {job_id}'s spec excludes provider {node.wallet}", 409)
    chain = row.chain.job
    if chain.attempt + 1 != body.attempt:
        raise _bad(
            f"job {job_id}: the chain is at attempt {chain.attempt}, the offer was attempt "
            f"{body.attempt}: ask for work again",
            409,
        )
    try:
        hold = hold_of(row, dispatcher.hold_margin_s)
    except ValueError as exc:
        raise _bad(str(exc), 409) from None
    try:
        signer = recover_acceptance_signer(
            bytes.fromhex(body.signature[2:]),
            grid.chain_id,
            grid.escrow,
            row.chain.job_id,
            body.attempt,
            chain,
            hold,
        )
    except Exception as exc:
        raise _bad(f"signature does not recover: {exc}", 401) from None
    if signer != node.wallet:
        raise _bad(
            f"signature is by {signer}, not by the node's wallet {node.wallet}: sign the "
            f"Acceptance of attempt {body.attempt} on the offer's terms (bounty "
            f"{chain.bounty}, feeBps {chain.fee_bps}, deadline {chain.deadline}, collateral "
            f"{chain.collateral}, mediator {chain.mediator}, flags {chain.flags}, token "
            f"{chain.token}, holdFor {hold}), chain "
            f"{grid.chain_id}, escrow {grid.escrow}",
            401,
        )
    free: int | None = None
    as_of: int | None = None
    remembered = False
    if row.acceptance is None:
        free, as_of, remembered = await _free_collateral(grid, node.wallet, chain.token)

    def accept_with(free: int | None, as_of: int | None) -> str:
        return store.accept(
            job_id,
            node.node_id,
            body.attempt,
            body.signature,
            free,
            as_of,
            signed=chain,
            hold_for=hold,
        )

    try:
        try:
            await asyncio.to_thread(accept_with, free, as_of)
        except ShortOfCollateralError:
            if not remembered:
                raise
            # the remembered value may predate a release or a stake: never refuse on it
            free, as_of, _ = await _free_collateral(grid, node.wallet, chain.token, fresh=True)
            await asyncio.to_thread(accept_with, free, as_of)
    except NotFoundError as exc:
        raise _bad(str(exc), 404) from None
    except OfferRefusedError as exc:
        dispatcher.settle_offer(job_id)
        why = str(exc)
        await asyncio.to_thread(store.offer_refused, job_id, node.node_id, body.attempt, why)
        grid.count(
            "offers_short_of_collateral"
            if isinstance(exc, ShortOfCollateralError)
            else "offers_seat_taken"
        )
        return AcceptAck(job_id=job_id, accepted=False, message=why)
    except ConflictError as exc:
        raise _bad(str(exc), 409) from None
    dispatcher.settle_offer(job_id)
    grid.wake("outbox")
    grid.count("acceptances")
    return AcceptAck(job_id=job_id, accepted=True, message="accepted; assigning on-chain")


async def _free_collateral(
    grid: Replica, wallet: str, token: str, *, fresh: bool = False
) -> tuple[int, int, bool]:
    """``(free, block, remembered)`` of ``wallet`` in ``token`` for the acceptance check: from
    the replica's :class:`~scheduler.collateral.CollateralView` (no thread hop when it is
    remembered), else read from the chain in a worker thread. 503 when the chain is down."""
    view = grid.collateral
    if not fresh:
        hit = view.peek(wallet, token)
        if hit is not None:
            return hit[0], hit[1], True
    try:
        return await asyncio.to_thread(view.get, wallet, token, fresh=fresh)
    except ChainError as exc:
        raise _bad(f"chain unavailable: {exc}", status.HTTP_503_SERVICE_UNAVAILABLE) from None


@router.post(API.RESULT, response_model=ResultAck, status_code=202)
async def result(
    job_id: str, body: ResultReport, node: NodeDep, grid: GridDep, store: StoreDep
) -> ResultAck:
    """A run ended. A success must carry the output CID signed by the node's wallet for this
    job and attempt; it is verified (IPFS, CID, size) before the escrow pays."""
    return await record_run(job_id, body, node, grid, store)


async def record_run(
    job_id: str, body: ResultReport, node: NodeRow, grid: Replica, store: Store
) -> ResultAck:
    """The result route's work (see :func:`result`); errors raise ``HTTPException``."""
    if body.reason is RunReason.SUCCEEDED:
        assert body.output_cid is not None and body.signature is not None
        try:
            jid = bytes.fromhex(job_id.removeprefix("0x"))
        except ValueError:
            raise _bad(f"job_id {job_id!r} is not hex") from None
        try:
            signer = recover_result_signer(
                bytes.fromhex(body.signature[2:]),
                grid.chain_id,
                grid.escrow,
                jid,
                body.attempt,
                body.output_cid,
            )
        except Exception as exc:
            raise _bad(f"signature does not recover: {exc}", 401) from None
        if signer != node.wallet:
            raise _bad(f"signature is by {signer}, not by the node's wallet {node.wallet}", 401)
    try:
        state = await asyncio.to_thread(store.record_result, job_id, node.node_id, body)
        grid.wake("verifier" if state == "verifying" else "outbox")
    except NotFoundError as exc:
        raise _bad(str(exc), 404) from None
    except ConflictError as exc:
        raise _bad(str(exc), 409) from None
    grid.count(f"results_{body.reason.value}")
    return ResultAck(
        job_id=job_id,
        accepted=True,
        status=state,
        message="verifying the output" if state == "verifying" else f"job is {state}",
    )


@router.post(API.HAND_BACK)
async def hand_back(job_id: str, node: NodeDep, store: StoreDep) -> dict[str, str]:
    """Give an unfinished job back (the agent is shutting down): it is queued again."""
    try:
        state = await asyncio.to_thread(store.hand_back, job_id, node.node_id)
    except NotFoundError as exc:
        raise _bad(str(exc), 404) from None
    except ConflictError as exc:
        raise _bad(str(exc), 409) from None
    return {"job_id": job_id, "status": state}


def node_view(node: NodeRow, now: float) -> dict[str, Any]:
    return {
        "node_id": node.node_id,
        "wallet": node.wallet,
        "name": node.name,
        "status": node.status,
        "tier": node.tier,
        "region": node.region,
        "capacity": node.capacity.model_dump(mode="json"),
        "slots": node.slots,
        "running": node.running,
        "reputation": round(node.score(now), 4),
        "excluded": node.excluded(now),
        "jobs_done": node.jobs_done,
        "jobs_failed": node.jobs_failed,
        "registered_at": node.registered_at,
        "last_seen": node.last_seen,
        "agent_version": node.agent_version,
    }


@router.get(API.NODES)
async def list_nodes(
    store: StoreDep,
    status_: str | None = Query(None, alias="status", pattern="^(online|offline)$"),
    limit: int = Query(200, ge=1, le=5000),
    offset: int = Query(0, ge=0, le=10**9),
) -> dict[str, Any]:
    """Registered nodes (the fleet view), with counts by status."""
    rows = await asyncio.to_thread(store.nodes, status=status_, limit=limit, offset=offset)
    counts = await asyncio.to_thread(store.node_counts)
    now = time.time()
    return {"counts": counts, "nodes": [node_view(n, now) for n in rows]}


@router.get(API.NODE)
async def get_node(node_id: str, store: StoreDep, dispatcher: DispatcherDep) -> dict[str, Any]:
    """One node, with the jobs it runs now and the images it advertises as cached (its last
    heartbeat to this replica, else its registration)."""
    try:
        node = await asyncio.to_thread(store.node, node_id)
    except NotFoundError as exc:
        raise _bad(str(exc), 404) from None
    running = await asyncio.to_thread(store.running_jobs, node_id)
    view = node_view(node, time.time())
    view["running_jobs"] = [j.job_id for j in running]
    advertised = dispatcher.images_of(node_id)
    view["images"] = sorted(node.capacity.images if advertised is None else advertised)
    return view
