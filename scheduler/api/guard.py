"""The request limits of the scheduler's HTTP API (:mod:`gridmarket.http_guard`) and its 422
answers with their inputs cut short."""

from __future__ import annotations

import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from gridmarket.http_guard import GuardLimits, RequestGuard, clip_validation_errors
from gridmarket.wire import API
from scheduler.settings import Settings

NODE_AUTHENTICATED = re.compile(r"^/v1/nodes/[^/]+/.+")
"""Paths that take a node token (heartbeat, next-job, result, hand-back): not rate-limited per
address (a node is limited by its token; forged tokens are refused by one HMAC)."""


def rate_limited(path: str) -> bool:
    return path != API.HEALTH and not NODE_AUTHENTICATED.match(path)


def install_guard(app: FastAPI, settings: Settings) -> None:
    """Body caps, strict JSON and per-client rate limits in front of every route."""
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
