"""The request limits of the scheduler's HTTP API (:mod:`gridmarket.http_guard`) and its 422
answers with their inputs cut short."""

from __future__ import annotations

import hmac
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from gridmarket.http_guard import (
    ASGIApp,
    GuardLimits,
    Receive,
    RequestGuard,
    Scope,
    Send,
    answer,
    clip_validation_errors,
)
from gridmarket.wire import API
from scheduler.settings import Settings

NODE_AUTHENTICATED = re.compile(r"^/v1/nodes/[^/]+/.+")
"""Paths that take a node token (heartbeat, next-job, result, hand-back): not rate-limited per
address (a node is limited by its token; forged tokens are refused by one HMAC)."""


def rate_limited(path: str) -> bool:
    return path != API.HEALTH and not NODE_AUTHENTICATED.match(path)


DOC_PATHS = frozenset({"/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"})


class OperatorPaths:
    """``/metrics`` behind a bearer token (when ``metrics_token`` is set) and the API docs off
    (when ``docs_enabled`` is false): what an operator wants closed in production."""

    def __init__(self, app: ASGIApp, *, docs_enabled: bool, metrics_token: str | None) -> None:
        self.app = app
        self.docs_enabled = docs_enabled
        self.metrics_token = metrics_token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            if not self.docs_enabled and path in DOC_PATHS:
                await answer(send, 404, "the API documentation is turned off on this scheduler")
                return
            if self.metrics_token and path == API.METRICS:
                given = dict(scope.get("headers", [])).get(b"authorization", b"")
                expected = f"Bearer {self.metrics_token}".encode()
                if not hmac.compare_digest(given, expected):
                    await answer(
                        send,
                        401,
                        "/metrics needs 'Authorization: Bearer <metrics_token>'",
                        [(b"www-authenticate", b"Bearer")],
                    )
                    return
        await self.app(scope, receive, send)


def install_guard(app: FastAPI, settings: Settings) -> None:
    """Body caps, strict JSON and per-client rate limits in front of every route; the docs and
    /metrics closed as the settings say."""
    token = settings.metrics_token.get_secret_value() if settings.metrics_token else None
    app.add_middleware(
        OperatorPaths, docs_enabled=settings.docs_enabled, metrics_token=token or None
    )
    limits = GuardLimits(
        max_body_bytes=settings.max_body_bytes,
        body_limits=dict(settings.body_limits),
        rate_per_s=settings.rate_limit_per_s,
        burst=settings.rate_limit_burst,
        exempt_clients=frozenset(settings.rate_limit_exempt),
        rate_limited=rate_limited,
        settings_hint="GRIDMARKET_SCHEDULER_MAX_BODY_BYTES / _BODY_LIMITS",
    )
    app.add_middleware(RequestGuard, limits=limits)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": clip_validation_errors(exc.errors())}, status_code=422)
