"""What counts as a passing RPC failure, and how long to wait before trying again.

Both the transaction sender and the chain watcher retry the same failures: the node cannot be
reached (connection refused or reset, DNS), the request timed out, or something in front of it
answered HTTP 5xx / 408 / 429. Everything else (a revert, a malformed request, a JSON-RPC error
the node means) is final and is raised at once: retrying it would only repeat it.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import requests
from web3.exceptions import (
    ProviderConnectionError,
    RequestTimedOut,
    TimeExhausted,
    TooManyRequests,
    Web3RPCError,
)

from gridmarket.chain import ChainError, rpc_error_message

log = logging.getLogger(__name__)

T = TypeVar("T")

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


# While an outage lasts, how often a retrying call repeats its warning.
_LOG_EVERY_S = 10.0


class Throttle:
    """Says when to repeat a warning during an outage: the first time, then every
    ``_LOG_EVERY_S`` (so a minute-long outage gives a handful of lines, not hundreds)."""

    def __init__(self) -> None:
        self.failures = 0
        self.started = 0.0
        self._last = 0.0

    def failed(self) -> bool:
        """Count a failure; True if this one should be logged."""
        now = time.monotonic()
        self.failures += 1
        if self.failures == 1:
            self.started = now
        if self.failures == 1 or now - self._last >= _LOG_EVERY_S:
            self._last = now
            return True
        return False

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started if self.failures else 0.0


def retrying(policy: RetryPolicy, what: str, deadline: Deadline, fn: Callable[[], T]) -> T:
    """``fn()``, retrying transient RPC failures with backoff until ``deadline``.

    A JSON-RPC error the node means (not a transient one) becomes :class:`ChainError`;
    reverts already are one (``EscrowClient.prepare``) and pass through untouched.
    """
    delays = policy.delays()
    throttle = Throttle()
    while True:
        try:
            result = fn()
        except Exception as exc:
            if not is_transient(exc):
                if isinstance(exc, Web3RPCError):  # the node answered, and meant it
                    raise ChainError(f"{what}: {rpc_error_message(exc)}") from exc
                raise
            if deadline.expired:
                raise ChainUnavailableError(
                    f"{what}: RPC unreachable, gave up after {deadline.seconds:.1f}s and "
                    f"{throttle.failures + 1} attempts (last error: {describe(exc)})"
                ) from exc
            if throttle.failed():
                log.warning(
                    "%s: RPC failing for %.1fs (%d attempts): %s; retrying with backoff "
                    "for up to %.0fs more",
                    what,
                    throttle.elapsed,
                    throttle.failures,
                    describe(exc),
                    deadline.remaining,
                )
            time.sleep(min(next(delays), deadline.remaining))
            continue
        if throttle.failures:
            log.warning(
                "%s: RPC answered again after %.1fs and %d failed attempts",
                what,
                throttle.elapsed,
                throttle.failures,
            )
        return result
