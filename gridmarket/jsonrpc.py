"""A JSON-RPC 2.0 client for an Ethereum node over httpx, without web3.

The provider agent already loads httpx for the scheduler; this is what web3's ``HTTPProvider``
did for its on-chain duties (:mod:`gridmarket.lightchain`) at a fraction of the memory. One
:class:`JsonRpc` is safe to share between threads (httpx's connection pool is).

Failures keep web3's split: a JSON-RPC error answer (a revert, "nonce too low", an unknown
method) is an :class:`RpcError` with the node's ``code``, ``message`` and ``data``; the node
unreachable, a timeout or an HTTP error status stays httpx's exception (callers retry those);
an answer that is not JSON-RPC, or larger than ``max_bytes``, is a :class:`BadAnswerError`.
"""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any

import httpx

__all__ = ["BadAnswerError", "JsonRpc", "RpcError"]

MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""The largest answer read from the node (a wide ``eth_getLogs``); more is refused."""


class RpcError(Exception):
    """The node answered with a JSON-RPC error."""

    def __init__(self, method: str, code: int | None, message: str, data: Any = None) -> None:
        super().__init__(f"{method}: {message}" + (f" (code {code})" if code is not None else ""))
        self.method = method
        self.code = code
        self.message = message
        self.data = data


class BadAnswerError(Exception):
    """The node's answer is not a JSON-RPC answer (or is too large)."""


class JsonRpc:
    """Calls on the node at ``url`` (http or https), each with ``timeout`` seconds."""

    def __init__(
        self,
        url: str,
        timeout: float = 30.0,
        *,
        max_bytes: int = MAX_ANSWER_BYTES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url
        self.max_bytes = max_bytes
        # the CA bundle only for an https node (~5 MB of RSS otherwise: agent/client.py)
        self._http = httpx.Client(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            verify=url.startswith("https://"),
            transport=transport,
            follow_redirects=False,
            headers={"Content-Type": "application/json"},
        )
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, params: list[Any]) -> Any:
        """The ``result`` of ``method(params)``; :class:`RpcError` for an error answer."""
        with self._lock:
            ident = next(self._ids)
        body = json.dumps({"jsonrpc": "2.0", "id": ident, "method": method, "params": params})
        with self._http.stream("POST", self.url, content=body) as response:
            response.raise_for_status()
            chunks, size = [], 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > self.max_bytes:
                    raise BadAnswerError(f"{method}: the answer is over {self.max_bytes} bytes")
                chunks.append(chunk)
        try:
            answer = json.loads(b"".join(chunks))
        except ValueError as exc:
            raise BadAnswerError(f"{method}: the answer is not JSON: {exc}") from None
        if not isinstance(answer, dict) or answer.get("id") != ident:
            raise BadAnswerError(f"{method}: not a JSON-RPC answer to request {ident}")
        error = answer.get("error")
        if error is not None:
            if not isinstance(error, dict):
                raise RpcError(method, None, str(error))
            code = error.get("code")
            return_code = code if isinstance(code, int) and not isinstance(code, bool) else None
            raise RpcError(method, return_code, str(error.get("message", "")), error.get("data"))
        if "result" not in answer:
            raise BadAnswerError(f"{method}: the answer has neither result nor error")
        return answer["result"]
