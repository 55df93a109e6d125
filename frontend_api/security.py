"""Browser-facing protections of the front end, as one pure ASGI middleware.

* **Headers** on every answer that does not set its own: a Content-Security-Policy (scripts
  from this origin or carrying the request's nonce, no framing, no plugins, forms and fetches to
  this origin only), ``X-Frame-Options: DENY``, ``X-Content-Type-Options: nosniff`` and
  ``Referrer-Policy: same-origin``. Templates put ``nonce="{{ csp_nonce }}"`` on inline scripts.
* **Same-origin writes**: a state-changing request (POST, PUT, PATCH, DELETE) that a browser
  marks as cross-site (``Sec-Fetch-Site`` other than ``same-origin``/``none``) or whose
  ``Origin`` is not this site is refused with 403 before the body is read: a page elsewhere
  cannot make a visitor's browser upload and pin files, or relay transactions. Clients that are
  not browsers send neither header and are not affected.
* **No Host reflection**: a ``Location`` (Starlette's trailing-slash redirects build it from the
  ``Host`` header) is rewritten onto ``public_base_url`` when set, else made relative.
* **Closed docs**: with ``docs_enabled`` false, the OpenAPI document and its page answer 404.
"""

from __future__ import annotations

import secrets
from collections.abc import MutableMapping
from typing import Any
from urllib.parse import urlsplit

from gridmarket.http_guard import ASGIApp, Message, Receive, Scope, Send, answer

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
DOC_PATHS = frozenset({"/api/docs", "/api/openapi.json", "/api/docs/oauth2-redirect"})


def content_security_policy(nonce: str) -> str:
    return (
        "default-src 'self'; "
        f"script-src 'self' 'nonce-{nonce}'; "
        "style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; "
        "connect-src 'self'; "
        "object-src 'none'; "
        "base-uri 'none'; "
        "form-action 'self'; "
        "frame-ancestors 'none'"
    )


class BrowserGuard:
    """The middleware (see the module's docstring)."""

    def __init__(
        self, app: ASGIApp, *, public_base_url: str | None = None, docs_enabled: bool = True
    ) -> None:
        self.app = app
        self.public_base_url = public_base_url.rstrip("/") if public_base_url else None
        self.docs_enabled = docs_enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        if not self.docs_enabled and path in DOC_PATHS:
            await _deny(send, 404, "the API documentation is turned off on this site")
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if scope.get("method") in UNSAFE_METHODS:
            refusal = self._cross_site(headers)
            if refusal:
                await _deny(send, 403, refusal)
                return
        nonce = secrets.token_urlsafe(16)
        state: MutableMapping[str, Any] = scope.setdefault("state", {})
        state["csp_nonce"] = nonce

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                raw = list(message.get("headers", []))
                present = {k.lower() for k, _ in raw}
                defaults = [
                    (b"content-security-policy", content_security_policy(nonce).encode()),
                    (b"x-frame-options", b"DENY"),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"same-origin"),
                ]
                raw += [(k, v) for k, v in defaults if k not in present]
                raw = [
                    (k, self._location(v)) if k.lower() == b"location" else (k, v) for k, v in raw
                ]
                message["headers"] = raw
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _cross_site(self, headers: dict[str, str]) -> str | None:
        site = headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return f"cross-site request refused (Sec-Fetch-Site: {site[:40]})"
        origin = headers.get("origin")
        if origin is None:
            return None
        if self.public_base_url:
            parts = urlsplit(self.public_base_url)
            expected = f"{parts.scheme}://{parts.netloc}"
            if origin != expected:
                return f"cross-origin request refused (Origin {origin[:100]} is not {expected})"
            return None
        host = headers.get("host", "")
        if origin in ("null", "") or urlsplit(origin).netloc != host:
            return f"cross-origin request refused (Origin {origin[:100]} is not this site)"
        return None

    def _location(self, value: bytes) -> bytes:
        parts = urlsplit(value.decode("latin-1"))
        if not parts.scheme and not parts.netloc:
            return value
        rest = parts.path or "/"
        if parts.query:
            rest += "?" + parts.query
        base = self.public_base_url or ""
        return (base + rest).encode("latin-1")


async def _deny(send: Send, status: int, detail: str) -> None:
    await answer(send, status, detail, [(b"x-content-type-options", b"nosniff")])
