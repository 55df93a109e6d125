"""What counts as a passing RPC failure, and how long to wait before trying again.

Both the transaction sender and the chain watcher retry the same failures: the node cannot be
reached (connection refused or reset, DNS), the request timed out, or something in front of it
answered HTTP 5xx / 408 / 429. Everything else (a revert, a malformed request, a JSON-RPC error
the node means) is final and is raised at once: retrying it would only repeat it.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import requests
from web3.exceptions import (
    ProviderConnectionError,
    RequestTimedOut,
    TimeExhausted,
    TooManyRequests,
    Web3RPCError,
)

from gridmarket.chain import ChainError

# JSON-RPC error codes that mean "later" rather than "no": -32005 limit exceeded (EIP-1474).
_TRANSIENT_RPC_CODES = frozenset({-32005})


class ChainUnavailableError(ChainError):
    """The RPC endpoint could not be reached within the retry deadline; nothing was sent."""


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, bounded by a deadline.

    Delays go ``initial_delay_s``, x ``multiplier`` each time, capped at ``max_delay_s``; each is
    then shortened by up to ``jitter`` of itself at random so that many clients coming back from
    the same outage do not hit the node in lockstep. ``deadline_s`` bounds the whole operation
    (the watcher, which never gives up, ignores it).
    """

    deadline_s: float = 120.0
    initial_delay_s: float = 0.1
    max_delay_s: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.deadline_s < 0:
            raise ValueError(f"deadline_s must be >= 0, got {self.deadline_s}")
        if self.initial_delay_s <= 0:
            raise ValueError(f"initial_delay_s must be > 0, got {self.initial_delay_s}")
        if self.max_delay_s < self.initial_delay_s:
            raise ValueError(
                f"max_delay_s ({self.max_delay_s}) must be >= initial_delay_s "
                f"({self.initial_delay_s})"
            )
        if self.multiplier < 1:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be within [0, 1], got {self.jitter}")

    def delays(self) -> Iterator[float]:
        """An endless series of jittered, exponentially growing delays in seconds."""
        base = self.initial_delay_s
        while True:
            yield base * (1 - self.jitter * random.random())  # noqa: S311 (not cryptographic)
            base = min(base * self.multiplier, self.max_delay_s)


class Deadline:
    """A point in monotonic time; ``remaining`` never goes below zero."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    @property
    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.at


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is an RPC failure worth retrying (the node may answer later).

    True for connection failures and timeouts (``requests``, built-in ``ConnectionError`` /
    ``TimeoutError``, web3's provider errors), HTTP 5xx / 408 / 429 answers, and JSON-RPC
    'limit exceeded' errors. False for everything else, reverts included.
    """
    if isinstance(exc, requests.HTTPError):
        status = exc.response.status_code if exc.response is not None else None
        return status is None or status >= 500 or status in (408, 429)
    if isinstance(
        exc,
        requests.ConnectionError
        | requests.Timeout
        | requests.exceptions.ChunkedEncodingError
        | ConnectionError
        | TimeoutError
        | ProviderConnectionError
        | RequestTimedOut
        | TimeExhausted
        | TooManyRequests,
    ):
        return True
    if isinstance(exc, Web3RPCError):
        rpc = exc.rpc_response
        error = rpc.get("error") if isinstance(rpc, dict) else None
        return isinstance(error, dict) and error.get("code") in _TRANSIENT_RPC_CODES
    return False


def describe(exc: BaseException) -> str:
    """A one-line description of an RPC failure for logs. requests' connection errors nest
    three exceptions deep; the OS reason (``[Errno 111] Connection refused``) is what matters."""
    text = str(exc).replace("\n", " ")
    errno = re.search(r"\[Errno -?\d+\] [^'\")]+", text)
    if errno is not None:
        text = errno.group(0).strip()
    if len(text) > 200:
        text = text[:200] + "..."
    return f"{type(exc).__name__}: {text}"
