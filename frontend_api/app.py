"""The front end's FastAPI app factory: ``create_app(settings)``.

Pages (:mod:`frontend_api.pages`), the JSON API under ``/api`` (:mod:`frontend_api.api`), static
files under ``/static``. At start-up it loads the deployment file and connects to the chain
(failing at once, with the reason, when either is wrong); the scheduler and IPFS are asked per
request, so the explorer keeps working while they are down.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from gridmarket.chain import ChainError
from gridmarket.conn_guard import ConnLimits
from gridmarket.http_guard import GuardLimits, RequestGuard
from gridmarket.ipfs import IpfsError

from . import __version__, api, joblogs, pages, uploads
from .backend import Backend
from .forms import FieldError
from .live import JobFeeds
from .records import NotFoundError
from .scheduler import SchedulerError
from .security import BrowserGuard
from .settings import Settings
from .txs import TxError
from .web import HERE, error_body, use_currencies, wants_html

log = logging.getLogger(__name__)


def guard_limits(settings: Settings) -> GuardLimits:
    """Body caps (uploads get ``upload_max_bytes`` plus room for the multipart framing), strict
    JSON, and a rate per client on everything but static files and the health check."""
    uploads = settings.upload_max_bytes + 65536
    return GuardLimits(
        max_body_bytes=settings.max_body_bytes,
        body_limits={"/api/uploads/": uploads, **settings.body_limits},
        rate_per_s=settings.rate_limit_per_s,
        burst=settings.rate_limit_burst,
        exempt_clients=frozenset(settings.rate_limit_exempt),
        rate_limited=lambda path: not path.startswith(("/static/", "/healthz")),
        settings_hint="GRIDMARKET_FRONTEND_MAX_BODY_BYTES / _BODY_LIMITS / _UPLOAD_MAX_BYTES",
    )


def conn_limits(settings: Settings) -> ConnLimits:
    """Open connections per client, header and body timeouts (:mod:`gridmarket.conn_guard`)."""
    return ConnLimits(
        per_client=settings.conn_per_client,
        exempt=frozenset(settings.rate_limit_exempt),  # a reverse proxy on this host
        header_timeout_s=settings.header_timeout_s,
        max_header_bytes=settings.max_header_bytes,
        body_timeout_s=settings.body_timeout_s,
        body_min_bytes_per_s=settings.body_min_bytes_per_s,
        settings_hint="GRIDMARKET_FRONTEND_CONN_PER_CLIENT / _HEADER_TIMEOUT_S / _BODY_TIMEOUT_S",
    )


def create_app(settings: Settings | None = None) -> FastAPI:
    """The app; its :class:`~frontend_api.backend.Backend` is built when the app starts."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        backend = Backend(settings)
        app.state.backend = backend
        app.state.feeds = feeds = JobFeeds.of(backend)
        use_currencies(backend.currencies)
        await backend.refresh(force=True)
        log.info(
            "front end for escrow %s (chain %d), scheduler %s",
            backend.escrow.address,
            backend.deployment.chain_id,
            settings.scheduler_url,
        )
        try:
            yield
        finally:
            for feed in list(feeds.feeds.values()):
                if feed.task is not None:
                    feed.task.cancel()
            await backend.aclose()

    app = FastAPI(
        title="GridMarket",
        version=__version__,
        summary="Submit jobs, follow them, and see every payout on-chain.",
        lifespan=lifespan,
        docs_url="/api/docs",
        openapi_url="/api/openapi.json",
        redoc_url=None,
    )
    app.add_middleware(
        BrowserGuard, public_base_url=settings.public_base_url, docs_enabled=settings.docs_enabled
    )
    app.add_middleware(RequestGuard, limits=guard_limits(settings))
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    app.include_router(api.router)
    app.include_router(joblogs.router)
    app.include_router(uploads.router)
    app.include_router(pages.router)

    def answer(
        request: Request,
        status: int,
        detail: str,
        field: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        if wants_html(request) and hasattr(request.app.state, "backend"):
            page = pages.render(
                request,
                request.app.state.backend,
                "error.html",
                status_code=status,
                status=status,
                detail=detail,
                field=field,
            )
            page.headers.update(headers or {})
            return page
        return JSONResponse(error_body(detail, field), status_code=status, headers=headers)

    @app.exception_handler(FieldError)
    async def _field(request: Request, exc: FieldError) -> Response:
        return answer(request, 400, str(exc), exc.field)

    @app.exception_handler(TxError)
    async def _tx(request: Request, exc: TxError) -> Response:
        return answer(request, 400, str(exc), exc.field)

    @app.exception_handler(NotFoundError)
    async def _missing(request: Request, exc: NotFoundError) -> Response:
        return answer(request, 404, str(exc))

    @app.exception_handler(SchedulerError)
    async def _scheduler(request: Request, exc: SchedulerError) -> Response:
        status = exc.status if exc.status >= 500 else 502
        return answer(request, status, str(exc))

    @app.exception_handler(ChainError)
    async def _chain(request: Request, exc: ChainError) -> Response:
        return answer(request, 502, f"chain: {exc}")

    @app.exception_handler(IpfsError)
    async def _ipfs(request: Request, exc: IpfsError) -> Response:
        return answer(request, 502, f"IPFS: {exc}")

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
        field = ".".join(loc) or None
        message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
        detail = f"{field}: {message}" if field else message
        if wants_html(request):
            return answer(request, 422, detail, field)
        body = error_body(detail, field)
        body["errors"] = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))} for e in errors
        ]
        return JSONResponse(body, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        return answer(request, exc.status_code, str(exc.detail), headers=exc.headers)

    @app.get("/healthz", include_in_schema=False)
    async def health() -> dict[str, object]:
        return {"ok": True, "version": __version__}

    return app
