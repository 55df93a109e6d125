"""Operations: health, scheduler info for clients, Prometheus metrics."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from fastapi import APIRouter, Response
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gridmarket.wire import API, SchedulerInfo
from scheduler import __version__
from scheduler.chain.sender import REGISTRY as TX_REGISTRY

from .deps import DispatcherDep, GridDep

router = APIRouter(tags=["ops"])


@router.get(API.INFO, response_model=SchedulerInfo)
async def info(grid: GridDep) -> SchedulerInfo:
    """What agents and wallets need: chain, escrow, operator, timings, fee."""
    s = grid.settings
    return SchedulerInfo(
        chain_id=grid.chain_id,
        escrow=grid.escrow,
        operator=grid.operator_address,
        require_stake=s.require_stake,
        heartbeat_interval_s=s.heartbeat_interval_s,
        lease_ttl_s=s.lease_ttl_s,
        long_poll_max_s=s.long_poll_max_s,
        fee_bps=grid.fee_bps,
        version=__version__,
    )


@router.get(API.HEALTH)
async def health(grid: GridDep, dispatcher: DispatcherDep) -> dict[str, Any]:
    """Liveness and a few numbers: database reachable, leader (the chain duty) or not, the
    leader duties held (``chain``, ``verify``), nodes waiting, and the
    block the chain watcher has folded events through (``chain_cursor``, null before its first
    pass: compare it with the chain's head to see the watcher's lag)."""
    await asyncio.to_thread(grid.store.ping)
    cursor = await asyncio.to_thread(grid.store.chain_cursor)
    return {
        "ok": True,
        "replica": grid.settings.replica_id,
        "leader": grid.is_leader,
        "duties": sorted(grid.duties_held),
        "waiting_nodes": dispatcher.waiting,
        "chain_cursor": cursor,
    }


@router.get(API.METRICS, include_in_schema=False)
async def metrics(grid: GridDep, dispatcher: DispatcherDep) -> Response:
    """Prometheus text format: jobs by state, nodes by status, outbox, counters, and what the
    operator key's transactions spend (gas, fees, replacements: :mod:`scheduler.chain.sender`)."""
    jobs = await asyncio.to_thread(grid.store.job_counts)
    nodes = await asyncio.to_thread(grid.store.node_counts)
    out = await asyncio.to_thread(grid.store.outbox_counts)
    reg = CollectorRegistry()
    g_jobs = Gauge("gridmarket_jobs", "Jobs by state", ["state"], registry=reg)
    for k, v in jobs.items():
        g_jobs.labels(k).set(v)
    g_nodes = Gauge("gridmarket_nodes", "Nodes by status", ["status"], registry=reg)
    for k, v in nodes.items():
        g_nodes.labels(k).set(v)
    g_out = Gauge("gridmarket_outbox", "Outbox transactions by status", ["status"], registry=reg)
    for k, v in out.items():
        g_out.labels(k).set(v)
    Gauge("gridmarket_waiting_nodes", "Nodes long-polling this replica", registry=reg).set(
        dispatcher.waiting
    )
    Gauge("gridmarket_leader", "1 if this replica leads", registry=reg).set(int(grid.is_leader))
    g_duty = Gauge("gridmarket_duty", "1 if this replica holds the duty", ["duty"], registry=reg)
    for duty in grid.duties:
        g_duty.labels(duty).set(int(duty in grid.duties_held))
    Gauge("gridmarket_dispatch_rounds", "Dispatch rounds run", registry=reg).set(dispatcher.rounds)
    view = grid.collateral
    g_coll = Gauge(
        "gridmarket_collateral_lookups",
        "Acceptance checks' free-collateral lookups, by source (chain read or remembered)",
        ["source"],
        registry=reg,
    )
    g_coll.labels("chain").set(view.reads)
    g_coll.labels("remembered").set(view.hits)
    Gauge(
        "gridmarket_gc_frozen_objects",
        "Objects moved out of the cyclic collector's reach at start (gc.freeze)",
        registry=reg,
    ).set(gc.get_freeze_count())
    g_events = Gauge("gridmarket_events", "Counted events since start", ["name"], registry=reg)
    for k, v in sorted(grid.counters.items()):
        g_events.labels(k).set(v)
    body = generate_latest(reg) + generate_latest(TX_REGISTRY)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
