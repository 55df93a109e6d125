"""The agent's side of the scheduler API (:mod:`gridmarket.wire`): :class:`NodeSession`.

One synchronous ``httpx`` client, safe to share between the daemon's threads. The node
registers with a registration signed by its wallet (EIP-712, :func:`gridmarket.wire.
sign_registration`) and then sends ``Authorization: Bearer <token>``; when the token expires
(401) the client signs a fresh registration and retries the request once, transparently.

Failures are mapped onto three exceptions, so callers decide by type, not by status code:

    NodeSessionError (AgentError)
    ├── SchedulerUnavailableError (ConnectionError)   unreachable, timed out, 5xx, 429: retry later
    └── SchedulerRejectedError (ValueError)           4xx: retrying the same request will not help
        └── SchedulerAuthError                        401/403 even with a fresh registration

Retrying is the caller's job, with :class:`Backoff` (exponential backoff, full jitter) or
:func:`retry_call`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from agent.errors import AgentError
from gridmarket.checkpoints import NODE_CHECKPOINTS, CheckpointReport
from gridmarket.ethsig import Signer
from gridmarket.joblogs import NODE_LOGS, LogBatch
from gridmarket.wire import (
    API,
    AcceptAck,
    AcceptRequest,
    Assignment,
    HeartbeatRequest,
    HeartbeatResponse,
    NodeCapacityIn,
    NodeRegistration,
    RegisterRequest,
    RegisterResponse,
    ResultAck,
    ResultReport,
    SchedulerInfo,
    sign_registration,
)

__all__ = [
    "Backoff",
    "NodeSession",
    "NodeSessionError",
    "SchedulerAuthError",
    "SchedulerRejectedError",
    "SchedulerUnavailableError",
    "agent_version",
    "full_jitter_delay",
    "retry_call",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

REGISTRATION_TTL_S = 300
"""A signed registration expires this long after it was made (replay protection)."""
DEFAULT_RETRY_AFTER_S = 1.0
"""Idle wait when a 204 from ``next-job`` carries no usable ``Retry-After``."""


# --------------------------------------------------------------------------- errors


class NodeSessionError(AgentError):
    """The scheduler could not be reached, refused a request, or answered nonsense."""


class SchedulerUnavailableError(NodeSessionError, ConnectionError):
    """Transport error, timeout, 5xx or 429: the same request may work later.

    ``retry_after`` is the server's ``Retry-After`` in seconds, when it sent one.
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SchedulerRejectedError(NodeSessionError, ValueError):
    """A 4xx answer: the scheduler understood and refused. ``detail`` is its own words."""

    def __init__(self, message: str, status: int, detail: str) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


class SchedulerAuthError(SchedulerRejectedError):
    """Registration or authentication refused (bad signature, not staked, token refused)."""


# --------------------------------------------------------------------------- backoff


def full_jitter_delay(
    attempt: int, base_s: float, cap_s: float, rng: random.Random | None = None
) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): exponential, full jitter.

    Uniform in ``[0, min(cap_s, base_s * 2**attempt)]`` ("full jitter", AWS architecture blog,
    2015): spreading retries over the whole window keeps a fleet of agents that lost the
    scheduler at the same moment from coming back in synchronised waves.
    """
    if attempt < 0 or base_s <= 0 or cap_s < base_s:
        raise ValueError(
            f"need attempt >= 0 and 0 < base_s <= cap_s ({attempt}, {base_s}, {cap_s})"
        )
    ceiling = min(cap_s, base_s * 2.0 ** min(attempt, 1000))
    return (rng or _RNG).uniform(0.0, ceiling)


_RNG = random.Random()  # noqa: S311 -- jitter, not cryptography


class Backoff:
    """Successive retry delays for one failing operation; :meth:`reset` after a success."""

    def __init__(
        self, base_s: float = 0.5, cap_s: float = 60.0, *, rng: random.Random | None = None
    ) -> None:
        full_jitter_delay(0, base_s, cap_s)  # validates the parameters
        self.base_s = base_s
        self.cap_s = cap_s
        self.failures = 0
        self._rng = rng

    def ceiling(self) -> float:
        """The longest the next delay can be."""
        return min(self.cap_s, self.base_s * 2.0 ** min(self.failures, 1000))

    def next_delay(self) -> float:
        """The delay before the next attempt; counts one more failure."""
        delay = full_jitter_delay(self.failures, self.base_s, self.cap_s, self._rng)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0


def retry_call(
    fn: Callable[[], T],
    *,
    backoff: Backoff,
    stop: threading.Event | None = None,
    deadline: float | None = None,
    retry_on: tuple[type[BaseException], ...] = (SchedulerUnavailableError,),
    what: str = "request",
) -> T:
    """Call ``fn`` until it returns, retrying ``retry_on`` errors with ``backoff``.

    Gives up, re-raising the last error, when ``stop`` is set or the next attempt would start
    after ``deadline`` (``time.monotonic()``). A server's ``Retry-After`` lengthens the wait.
    """
    while True:
        try:
            result = fn()
        except retry_on as exc:
            delay = backoff.next_delay()
            hint = getattr(exc, "retry_after", None)
            if isinstance(hint, int | float):
                delay = max(delay, float(hint))
            if deadline is not None and time.monotonic() + delay > deadline:
                raise
            log.warning("%s failed (%s); retrying in %.1f s", what, exc, delay)
            if stop is not None:
                if stop.wait(delay):
                    raise
            else:
                time.sleep(delay)
            continue
        backoff.reset()
        return result


# --------------------------------------------------------------------------- client


def agent_version() -> str:
    """This package's version (``0.1.0``), or ``unknown`` when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gridmarket")
    except PackageNotFoundError:
        return "unknown"


CapacitySource = NodeCapacityIn | Callable[[], NodeCapacityIn]


class NodeSession:
    """Talks to one scheduler as one node (``account`` + ``name`` + ``capacity``).

    ``capacity`` may be a callable, evaluated at each (re-)registration so a node reports its
    current free disk. ``transport`` is for tests of failure paths (an ``httpx.MockTransport``);
    the happy path is tested against the real scheduler.
    """

    def __init__(
        self,
        base_url: str,
        account: Signer,
        *,
        name: str,
        capacity: CapacitySource,
        agent_version: str = "",
        timeout_s: float = 15.0,
        transport: httpx.BaseTransport | None = None,
        images: Callable[[], list[str] | None] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._images = images  # the cached images each heartbeat advertises
        self.account = account
        self.name = name
        self._capacity = capacity
        self.agent_version = agent_version
        self.timeout_s = timeout_s
        # TLS settings only matter for https; skipping the CA bundle for http saves ~5 MB RSS.
        https = self.base_url.startswith("https://")
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
            headers={"User-Agent": f"gridmarket-agent/{agent_version or 'dev'}"},
            verify=https,
            transport=transport,
            follow_redirects=False,
        )
        self._lock = threading.Lock()
        self._registration: RegisterResponse | None = None
        self._info: SchedulerInfo | None = None

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> NodeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ state

    @property
    def registration(self) -> RegisterResponse | None:
        """The last successful registration (node id, token, intervals), if any."""
        return self._registration

    @property
    def node_id(self) -> str:
        reg = self._registration
        if reg is None:
            raise NodeSessionError("this node is not registered yet")
        return reg.node_id

    def capacity(self) -> NodeCapacityIn:
        """What this node offers now."""
        return self._capacity() if callable(self._capacity) else self._capacity

    # ------------------------------------------------------------------ API

    def info(self, *, refresh: bool = False) -> SchedulerInfo:
        """``GET /v1/info``: the chain, escrow and intervals of this scheduler (cached)."""
        if self._info is None or refresh:
            response = self._send("GET", API.INFO, what="info")
            self._info = self._parse(SchedulerInfo, response, "info")
        return self._info

    def register(self) -> RegisterResponse:
        """Sign a fresh registration (new nonce, expiry in 5 minutes) and send it."""
        with self._lock:
            return self._register_locked()

    def _register_locked(self) -> RegisterResponse:
        info = self.info(refresh=True)  # the escrow the signature binds to may have changed
        now = time.time()
        registration = NodeRegistration(
            wallet=self.account.address,
            name=self.name,
            capacity=self.capacity(),
            agent_version=self.agent_version,
            nonce=time.time_ns(),
            expiry=int(now) + REGISTRATION_TTL_S,
        )
        signature = sign_registration(self.account, info.chain_id, info.escrow, registration)
        body = RegisterRequest(registration=registration, signature=signature)
        response = self._send("POST", API.REGISTER, json=_dump(body), what="registration")
        answer = self._parse(RegisterResponse, response, "registration")
        self._registration = answer
        log.info(
            "registered as node %s (token valid %.0f s)",
            answer.node_id,
            answer.token_expires_at - now,
        )
        return answer

    def heartbeat(
        self, running: Iterable[str] = (), load: float | None = None
    ) -> HeartbeatResponse:
        """Report the jobs this node runs (their leases are renewed) and the images it has
        cached; what to cancel."""
        images = self._images() if self._images is not None else None
        body = HeartbeatRequest(running=list(running), load=load, images=images)
        response = self._authed("POST", API.HEARTBEAT, json=_dump(body), what="heartbeat")
        return self._parse(HeartbeatResponse, response, "heartbeat")

    def next_job(self, wait_s: float) -> Assignment | float:
        """Long-poll for work, the server holding the request up to ``wait_s``.

        Returns the :class:`Assignment`, or the seconds to wait before asking again (a 204's
        ``Retry-After``).
        """
        timeout = httpx.Timeout(self.timeout_s + wait_s, connect=min(self.timeout_s, 10.0))
        response = self._authed(
            "POST",
            API.NEXT_JOB,
            params={"wait_s": f"{wait_s:g}"},
            timeout=timeout,
            what="next-job",
        )
        if response.status_code == 204:
            return _retry_after(response) or DEFAULT_RETRY_AFTER_S
        return self._parse(Assignment, response, "next-job")

    def report_result(self, job_id: str, report: ResultReport) -> ResultAck:
        """Send how a run ended (202: the scheduler took it; ``accepted`` says if it counts)."""
        response = self._authed(
            "POST", API.RESULT, job_id=job_id, json=_dump(report), what=f"result of {job_id}"
        )
        return self._parse(ResultAck, response, "result")

    def accept(self, job_id: str, request: AcceptRequest) -> AcceptAck:
        """Send the node's signed acceptance of an offered job; ``accepted`` says whether the
        scheduler will assign it (false: the offer is gone, the node must not run the job)."""
        response = self._authed(
            "POST", API.ACCEPT, job_id=job_id, json=_dump(request), what=f"acceptance of {job_id}"
        )
        return self._parse(AcceptAck, response, "acceptance")

    def hand_back(self, job_id: str) -> None:
        """Give a job back unrun (shutdown): the scheduler reassigns it."""
        self._authed("POST", API.HAND_BACK, job_id=job_id, what=f"hand-back of {job_id}")

    # ------------------------------------------------------------------ plumbing

    def post_logs(self, job_id: str, batch: LogBatch, timeout_s: float = 5.0) -> None:
        """Post a batch of a running job's log lines (:mod:`agent.logship`; best effort)."""
        self._authed(
            "POST",
            NODE_LOGS,
            job_id=job_id,
            json=_dump(batch),
            timeout=min(timeout_s, self.timeout_s),
            what=f"logs of {job_id}",
        )

    def post_checkpoint(
        self, job_id: str, report: CheckpointReport, timeout_s: float = 10.0
    ) -> None:
        """Report a checkpoint of a running job (:mod:`agent.checkpointing`)."""
        self._authed(
            "POST",
            NODE_CHECKPOINTS,
            job_id=job_id,
            json=_dump(report),
            timeout=min(timeout_s, self.timeout_s),
            what=f"checkpoint of {job_id}",
        )

    def _authed(
        self,
        method: str,
        template: str,
        *,
        job_id: str | None = None,
        what: str,
        **kwargs: Any,
    ) -> httpx.Response:
        """A node request with the bearer token; one transparent re-registration on 401."""
        for attempt in (1, 2):
            with self._lock:
                if self._registration is None:
                    self._register_locked()
                registration = self._registration
            assert registration is not None
            path = template.format(node_id=registration.node_id, job_id=job_id)
            headers = {"Authorization": f"Bearer {registration.token}"}
            try:
                return self._send(method, path, headers=headers, what=what, **kwargs)
            except SchedulerAuthError as exc:
                if attempt == 2 or exc.status != 401:
                    raise
                log.info("%s: token refused (%s); registering again", what, exc.detail)
                with self._lock:
                    if self._registration is registration:  # no other thread did it meanwhile
                        self._register_locked()
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(self, method: str, path: str, *, what: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            raise SchedulerUnavailableError(
                f"the scheduler at {self.base_url} timed out on {what} ({type(exc).__name__})"
            ) from exc
        except httpx.TransportError as exc:
            why = str(exc) or type(exc).__name__
            raise SchedulerUnavailableError(
                f"the scheduler at {self.base_url} is unreachable ({what}): {why}"
            ) from exc
        status = response.status_code
        if status < 400:
            return response
        detail = _detail(response)
        if status >= 500 or status == 429:
            raise SchedulerUnavailableError(
                f"the scheduler answered {status} to {what}: {detail}", _retry_after(response)
            )
        error = SchedulerAuthError if status in (401, 403) else SchedulerRejectedError
        raise error(f"the scheduler refused {what} ({status}): {detail}", status, detail)

    @staticmethod
    def _parse(model: type[M], response: httpx.Response, what: str) -> M:
        try:
            return model.model_validate_json(response.content)
        except ValidationError as exc:
            raise NodeSessionError(
                f"the scheduler's {what} answer is not a valid {model.__name__}: "
                f"{exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"
            ) from None


def _dump(model: BaseModel) -> Any:
    return model.model_dump(mode="json")


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: not used by this scheduler
    return max(0.0, seconds)


def _detail(response: httpx.Response) -> str:
    """The JSON ``detail`` (FastAPI's error shape) in one line, else the body's start."""
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        return text[:200] or response.reason_phrase or "no detail"
    detail = body.get("detail") if isinstance(body, dict) else body
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):  # request validation errors: [{loc, msg, ...}]
        parts = []
        for item in detail[:5]:
            if isinstance(item, dict):
                loc = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
                parts.append(f"{loc}: {item.get('msg', '')}" if loc else str(item.get("msg", "")))
            else:
                parts.append(str(item))
        return "; ".join(parts) or "no detail"
    return str(detail)[:200] if detail is not None else "no detail"
