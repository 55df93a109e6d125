"""Limits every HTTP request meets before an app sees it: body size, bounded strict JSON, bounded
numbers in queries and forms, a rate per client.

Requests are hostile input. :class:`RequestGuard` is a pure ASGI middleware both apps (the
scheduler and the front end) install with their own :class:`GuardLimits`:

* **Body size**, per path prefix (longest wins) with a default: a ``Content-Length`` over the
  limit is answered 413 before a byte of the body is read; a body without one (chunked) is
  counted as it streams and refused with 413 the moment it passes the limit. Nothing larger
  than the limit is ever held in memory.
* **Bounded, strict JSON**: a body the app will parse as JSON (``application/json``,
  ``*+json`` or no content type) is read whole (within its limit) and checked before anything
  parses it (:func:`gridmarket.input_checks.check_json`): nesting deeper than
  ``max_json_depth``, numbers over 100 characters or with an exponent over 999, ``NaN``,
  ``Infinity``, numbers that overflow to infinity, lone UTF-16 surrogates and bytes that are
  not UTF-8 are answered 400 with ``detail`` and ``field`` (where in the body: ``nodes[0]``).
  Python's ``json`` recurses per level and accepts the rest; they came back as 500s or were
  stored as null. Bodies over ``thread_over_bytes`` are checked in a worker thread, so a large
  body never holds the event loop. Other syntax errors are left to the app (422).
* **Bounded numbers in queries and forms**: a query parameter's value (or an urlencoded form
  field's) that is a number over 100 characters or with an exponent over 999 is answered 400
  naming the parameter (``?bounty_eth=1e300000``); other values are the app's to check.
* **Rate per client**: a token bucket per client address (``rate_per_s`` refill, ``burst``
  capacity) on every path ``rate_limited`` says is unauthenticated; over it, 429 with
  ``Retry-After``. Addresses in ``exempt_clients`` are never limited.

:func:`clip_validation_errors` is for 422 answers: the errors with ``input`` cut short, so a
large invalid body is not echoed back.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio.to_thread
from starlette.exceptions import HTTPException

from gridmarket.input_checks import MAX_JSON_DEPTH, Problem, check_json, check_query

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_CLIENTS = 50_000
"""Token buckets kept at most (least recently seen dropped first): memory stays bounded under a
flood of source addresses."""


@dataclass(frozen=True)
class GuardLimits:
    """What :class:`RequestGuard` enforces. ``settings_hint`` names the settings in messages."""

    max_body_bytes: int = 1024**2
    body_limits: Mapping[str, int] = field(default_factory=dict)
    """Path prefix -> byte limit; the longest matching prefix wins over ``max_body_bytes``."""
    rate_per_s: float = 20.0
    """Requests per second per client on rate-limited paths; 0 turns the limit off."""
    burst: int = 60
    exempt_clients: frozenset[str] = frozenset()
    rate_limited: Callable[[str], bool] = lambda path: True
    thread_over_bytes: int = 64 * 1024
    max_json_depth: int = MAX_JSON_DEPTH
    """Arrays and objects nested at most this deep in a JSON body."""
    settings_hint: str = ""

    def body_limit(self, path: str) -> int:
        best, limit = -1, self.max_body_bytes
        for prefix, value in self.body_limits.items():
            if path.startswith(prefix) and len(prefix) > best:
                best, limit = len(prefix), value
        return limit


class TokenBuckets:
    """Token buckets per key, thread-safe, bounded to :data:`MAX_CLIENTS` keys."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate = rate_per_s
        self.burst = float(burst)
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """Take one token for ``key``: 0 if granted, else the seconds until one is available."""
        now = self.clock()
        with self._lock:
            tokens, at = self._buckets.pop(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens >= 1:
                self._buckets[key] = (tokens - 1, now)
                wait = 0.0
            else:
                self._buckets[key] = (tokens, now)
                wait = (1 - tokens) / self.rate
            while len(self._buckets) > MAX_CLIENTS:
                self._buckets.popitem(last=False)
            return wait


class RequestGuard:
    """The ASGI middleware (see the module's docstring)."""

    def __init__(self, app: ASGIApp, limits: GuardLimits) -> None:
        self.app = app
        self.limits = limits
        self.buckets = TokenBuckets(limits.rate_per_s, limits.burst)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        client = (scope.get("client") or ("unknown", 0))[0]
        limits = self.limits
        if (
            limits.rate_per_s > 0
            and client not in limits.exempt_clients
            and limits.rate_limited(path)
        ):
            wait = self.buckets.take(client)
            if wait > 0:
                retry = max(1, math.ceil(wait))
                await answer(
                    send,
                    429,
                    f"too many requests from {client}: at most {limits.rate_per_s:g} per "
                    f"second (bursts of {limits.burst}); retry in {retry} s",
                    [(b"retry-after", str(retry).encode())],
                )
                return
        query = check_query(scope.get("query_string") or b"")
        if query is not None:
            await answer(send, 400, query.detail, field=query.field)
            return
        limit = limits.body_limit(path)
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        length = headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await answer(send, 400, "Content-Length is not a number")
                return
            if declared > limit:
                await answer(send, 413, self._too_large(path, limit, declared, exact=True))
                return
        if scope.get("method") in ("GET", "HEAD", "OPTIONS", "DELETE") and length is None:
            await self.app(scope, receive, send)
            return
        kind = _body_kind(headers.get(b"content-type"))
        if kind is not None:
            body = await _read_body(receive, limit)
            if body is None:
                await answer(send, 413, self._too_large(path, limit, None))
                return
            if body:
                problem = await self._check(kind, body)
                if problem is not None:
                    await answer(send, 400, problem.detail, field=problem.field)
                    return
            await self.app(scope, _replay(body, receive), send)
            return
        await self._counted(scope, receive, send, path, limit)

    async def _check(self, kind: str, body: bytes) -> Problem | None:
        """:func:`check_json` (or :func:`check_query` for a form) of ``body``; in a worker
        thread when it is over ``thread_over_bytes``."""
        check = (
            partial(check_query, body, "form field")
            if kind == "form"
            else partial(check_json, body, self.limits.max_json_depth)
        )
        if len(body) > self.limits.thread_over_bytes:
            return await anyio.to_thread.run_sync(check)
        return check()

    async def _counted(
        self, scope: Scope, receive: Receive, send: Send, path: str, limit: int
    ) -> None:
        """Run the app with a ``receive`` that refuses the body past ``limit`` bytes."""
        seen = 0
        started = False

        async def counting() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLargeError(self._too_large(path, limit, seen))
            return message

        async def watching(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting, watching)
        except BodyTooLargeError as exc:
            if started:
                raise
            await answer(send, 413, str(exc.detail))

    def _too_large(self, path: str, limit: int, seen: int | None, *, exact: bool = False) -> str:
        size = "" if seen is None else f" ({seen}{'' if exact else '+'} bytes)"
        hint = f"; see {self.limits.settings_hint}" if self.limits.settings_hint else ""
        return f"request body{size} is over the {limit}-byte limit for {path}{hint}"


class BodyTooLargeError(HTTPException):
    """Raised from ``receive`` when a streamed body passes its limit: an HTTP 413, which
    FastAPI's body reading passes on to the app's handler unchanged."""

    def __init__(self, detail: str) -> None:
        super().__init__(413, detail)


def _body_kind(content_type: bytes | None) -> str | None:
    """``json`` for a body the app parses as JSON, ``form`` for an urlencoded form, else None
    (counted as it streams, not checked)."""
    if not content_type:
        return "json"  # FastAPI parses a body without a content type as JSON
    main = content_type.split(b";", 1)[0].strip().lower()
    if main == b"application/json" or main.endswith(b"+json"):
        return "json"
    return "form" if main == b"application/x-www-form-urlencoded" else None


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None once it passes ``limit`` (reading stops there)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def answer(
    send: Send,
    status: int,
    detail: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
    *,
    field: str | None = None,
) -> None:
    """A JSON answer: ``{"detail": ...}``, with ``"field"`` when one is named."""
    content: dict[str, str] = {"detail": detail}
    if field is not None:
        content["field"] = field
    body = json.dumps(content).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def clip_validation_errors(
    errors: Sequence[Any], max_input: int = 200, max_errors: int = 20
) -> list[dict[str, Any]]:
    """Pydantic's errors made safe to answer with: ``input`` shown as at most ``max_input``
    characters of its JSON, at most ``max_errors`` errors (a last entry counts the rest)."""
    out: list[dict[str, Any]] = []
    for error in list(errors)[:max_errors]:
        item = {k: v for k, v in dict(error).items() if k not in ("input", "ctx", "url")}
        item["loc"] = [p if isinstance(p, int | str) else str(p) for p in error.get("loc", ())]
        item["msg"] = str(error.get("msg", ""))
        if "input" in error:
            item["input"] = _clip(error["input"], max_input)
        ctx = error.get("ctx")
        if isinstance(ctx, dict):
            item["ctx"] = {k: _clip(v, max_input) for k, v in ctx.items()}
        out.append(item)
    if len(errors) > max_errors:
        out.append(
            {
                "loc": [],
                "msg": f"... and {len(errors) - max_errors} more errors",
                "type": "truncated",
            }
        )
    return out


def _clip(value: Any, limit: int) -> Any:
    """``value`` if its JSON is short, else the start of its JSON text and its full size."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    try:
        text = json.dumps(value, default=str, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) <= limit:
        return json.loads(text)
    return f"{text[:limit]}... ({len(text)} characters in all)"
