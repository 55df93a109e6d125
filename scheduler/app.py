"""The scheduler's FastAPI app factory."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from scheduler import __version__
from scheduler.api import checkpoints, jobs, logs, market, nodes, ops
from scheduler.api.fastpath import NodeFastPath
from scheduler.api.guard import install_guard
from scheduler.api.nodecache import NodeCache
from scheduler.dispatch import Dispatcher
from scheduler.heartbeats import HeartbeatBuffer
from scheduler.service import Replica
from scheduler.settings import Settings
from scheduler.store import ConflictError, NotFoundError

log = logging.getLogger(__name__)


def create_app(
    settings: Settings | None = None,
    *,
    grid: Replica | None = None,
    node_fast_path: bool = True,
    freeze_heap: bool = False,
) -> FastAPI:
    """The scheduler app. ``grid`` (already built) is started with the app and stopped after.
    ``node_fast_path=False`` leaves heartbeats, polls and acceptances to the FastAPI routes
    (tests compare
    the two; production always runs it: ``scheduler/api/fastpath.py``).

    ``freeze_heap`` (``python -m scheduler`` sets it): once started, everything built so far
    (modules, models, the chain client, the store) is moved out of the cyclic collector's reach
    with :func:`gc.freeze`. A full collection otherwise scanned all of it and stopped the event
    loop for 50-120 ms several times a minute under heartbeats (measured with ``gc.callbacks``
    on the heartbeats bench): the paced p99. Off for apps built in a test process, where
    frozen garbage of earlier tests would never be collected."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        g = grid or Replica(settings)
        g.start()
        dispatcher = Dispatcher(
            g.store,
            settings,
            chain_id=g.chain_id,
            escrow=g.escrow,
            symbols={t.address: t.symbol for t in g.tokens.values() if not t.is_eth},
            hold_margin_s=g.hold_margin_s,
        )
        g.store.on_queued = dispatcher.wake
        dispatcher.on_claimed = lambda: g.wake("outbox")
        dispatcher.start()
        app.state.grid = g
        app.state.dispatcher = dispatcher
        node_cache = NodeCache(g.store)  # the node routes' rows: api/nodecache.py
        node_cache.start()
        app.state.node_cache = node_cache
        app.state.token_floors = {}  # token -> (monotonic time, floors by tier): api/market.py
        heartbeats = HeartbeatBuffer(g.store, settings.lease_ttl_s)
        heartbeats.start()
        app.state.heartbeats = heartbeats
        log.info("scheduler replica %s up (%s)", settings.replica_id, g.store.engine.dialect.name)
        if freeze_heap:
            gc.collect()
            gc.freeze()
        try:
            yield
        finally:
            await heartbeats.stop()
            await node_cache.stop()
            await dispatcher.stop()
            g.stop()

    app = FastAPI(
        title="GridMarket scheduler",
        version=__version__,
        summary="Matches on-chain funded jobs to provider nodes; verifies results; relays pay.",
        lifespan=lifespan,
        # no OpenTelemetry here (metrics are Prometheus, /metrics): FastAPI's native telemetry
        # looked up the global OTel providers (and the environment) on every request, 7% of the
        # event loop under heartbeats (docs/benchmarks.md, issue 12)
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    if node_fast_path:  # innermost of the middlewares: the guard's limits apply first
        app.add_middleware(NodeFastPath)
    install_guard(app, settings)
    app.include_router(ops.router)
    app.include_router(nodes.router)
    app.include_router(jobs.router)
    app.include_router(market.router)
    app.include_router(logs.router)
    app.include_router(checkpoints.router)

    @app.exception_handler(NotFoundError)
    async def _not_found(_: Request, exc: NotFoundError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(ConflictError)
    async def _conflict(_: Request, exc: ConflictError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    return app
