"""Node tokens: short-lived HMAC bearer tokens, so heartbeats and polls need no signature check.

A token is ``<node_id>.<expiry>.<mac>`` where ``mac`` is HMAC-SHA256 (truncated to 128 bits,
base64url) of ``node_id.expiry`` under the scheduler's ``token_secret``. Checking one costs a
hash, not a database read; every replica with the same secret accepts it. A node gets a token by
registering (a fresh EIP-712 signature); when it expires the node registers again.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time


class TokenError(ValueError):
    """A missing, malformed, forged or expired token."""


def _mac(secret: bytes, body: str) -> str:
    digest = hmac.new(secret, body.encode(), hashlib.sha256).digest()[:16]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def issue(secret: bytes, node_id: str, ttl_s: float, now: float | None = None) -> tuple[str, float]:
    """A token for ``node_id`` and its expiry (Unix seconds)."""
    expires = int((time.time() if now is None else now) + ttl_s)
    body = f"{node_id}.{expires}"
    return f"{body}.{_mac(secret, body)}", float(expires)


def verify(secret: bytes, token: str, now: float | None = None) -> str:
    """The node id a valid token was issued to; TokenError otherwise."""
    parts = token.split(".")
    if len(parts) != 3 or not parts[1].isdigit():
        raise TokenError("malformed node token")
    node_id, expires, mac = parts
    if not hmac.compare_digest(mac, _mac(secret, f"{node_id}.{expires}")):
        raise TokenError("invalid node token")
    if int(expires) < (time.time() if now is None else now):
        raise TokenError("node token expired: register again")
    return node_id
