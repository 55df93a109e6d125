"""Limits every HTTP request meets before an app sees it: body size, strict JSON, a rate per client.

Requests are hostile input. :class:`RequestGuard` is a pure ASGI middleware both apps (the
scheduler and the front end) install with their own :class:`GuardLimits`:

* **Body size**, per path prefix (longest wins) with a default: a ``Content-Length`` over the
  limit is answered 413 before a byte of the body is read; a body without one (chunked) is
  counted as it streams and refused with 413 the moment it passes the limit. Nothing larger
  than the limit is ever held in memory.
* **Strict JSON**: a body the app will parse as JSON (``application/json``, ``*+json`` or no
  content type) is read whole (within its limit) and checked: ``NaN``, ``Infinity``, numbers
  that overflow to infinity, lone UTF-16 surrogates and bytes that are not UTF-8 are answered
  400 naming the problem (Python's ``json`` accepts all of them, and they came back as 500s or
  were stored as null). Bodies over ``thread_over_bytes`` are checked in a worker thread, so a
  large body never holds the event loop. Other syntax errors are left to the app (422).
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
from typing import Any

import anyio.to_thread
from starlette.exceptions import HTTPException

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


class JsonProblemError(ValueError):
    """A JSON body that the app must not see (names what is wrong)."""


def _bad_constant(name: str) -> Any:
    raise JsonProblemError(f"{name} is not a JSON number (use a finite number or null)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonProblemError(f"the number {text[:40]} is out of range")
    return value


_STRICT = json.JSONDecoder(parse_constant=_bad_constant, parse_float=_finite)
"""``json.loads(text, parse_constant=..., parse_float=...)`` built once: ``json.loads`` with
those arguments builds a decoder (and its scanner) per call, most of the check's cost."""


def check_json(body: bytes) -> str | None:
    """What makes ``body`` unacceptable as strict JSON; None if it is fine or not JSON at all
    (syntax errors are the app's to report)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"request body is not UTF-8 (byte 0x{body[exc.start]:02x} at offset {exc.start})"
    try:
        value = _STRICT.decode(text)
    except JsonProblemError as exc:
        return f"request body: {exc}"
    except ValueError:
        return None
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        point = ord(exc.object[exc.start])
        return f"request body holds a lone UTF-16 surrogate (\\u{point:04x}) in a string"
    return None


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
        if _is_json(headers.get(b"content-type")):
            body = await _read_body(receive, limit)
            if body is None:
                await answer(send, 413, self._too_large(path, limit, None))
                return
            if body:
                if len(body) > limits.thread_over_bytes:
                    problem = await anyio.to_thread.run_sync(check_json, body)
                else:
                    problem = check_json(body)
                if problem is not None:
                    await answer(send, 400, problem)
                    return
            await self.app(scope, _replay(body, receive), send)
            return
        await self._counted(scope, receive, send, path, limit)

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


def _is_json(content_type: bytes | None) -> bool:
    if not content_type:
        return True  # FastAPI parses a body without a content type as JSON
    main = content_type.split(b";", 1)[0].strip().lower()
    return main == b"application/json" or main.endswith(b"+json")


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
    send: Send, status: int, detail: str, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    body = json.dumps({"detail": detail}).encode()
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
