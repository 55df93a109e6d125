"""A JSON-RPC 2.0 client for an Ethereum node over httpx, without web3.

The provider agent already loads httpx for the scheduler; this is what web3's ``HTTPProvider``
did for its on-chain duties (:mod:`gridmarket.lightchain`) at a fraction of the memory. One
:class:`JsonRpc` is safe to share between threads (httpx's connection pool is).

Failures keep web3's split: a JSON-RPC error answer (a revert, "nonce too low", an unknown
method) is an :class:`RpcError` with the node's ``code``, ``message`` and ``data``; the node
unreachable, a timeout or an HTTP error status stays httpx's exception (callers retry those);
an answer that is not JSON-RPC, or larger than ``max_bytes``, is a :class:`BadAnswerError`.
As web3's ``HTTPProvider`` does by default, a read (:data:`RETRIED`) that fails in transport is
tried 5 times in all, 0.125, 0.25, 0.5 and 1 s apart; ``eth_sendRawTransaction`` never is.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from typing import Any

import httpx

__all__ = ["BadAnswerError", "JsonRpc", "RpcError"]

MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""The largest answer read from the node (a wide ``eth_getLogs``); more is refused."""
RETRIED = frozenset(
    {
        "eth_chainId",
        "eth_blockNumber",
        "eth_getBlockByNumber",
        "eth_call",
        "eth_estimateGas",
        "eth_gasPrice",
        "eth_maxPriorityFeePerGas",
        "eth_getLogs",
        "eth_getTransactionCount",
        "eth_getTransactionReceipt",
        "eth_getTransactionByHash",
        "eth_getBalance",
    }
)
"""The reads tried again after a transport failure (web3's ``REQUEST_RETRY_ALLOWLIST``, the
methods this client uses)."""


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
        tries: int = 5,
        backoff_s: float = 0.125,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url
        self.max_bytes = max_bytes
        self.tries = tries
        self.backoff_s = backoff_s
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
        tries = self.tries if method in RETRIED else 1
        for attempt in range(tries):
            try:
                raw = self._post(method, body)
                break
            except (httpx.TransportError, httpx.HTTPStatusError):
                if attempt + 1 >= tries:
                    raise
                time.sleep(self.backoff_s * 2**attempt)
        try:
            answer = json.loads(raw)
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

    def _post(self, method: str, body: str) -> bytes:
        with self._http.stream("POST", self.url, content=body) as response:
            response.raise_for_status()
            chunks, size = [], 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > self.max_bytes:
                    raise BadAnswerError(f"{method}: the answer is over {self.max_bytes} bytes")
                chunks.append(chunk)
        return b"".join(chunks)
