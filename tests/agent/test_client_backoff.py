"""Backoff maths (full jitter) and NodeSession's failure paths.

Failure paths (expired tokens, 4xx/5xx bodies, a dead server) are driven through a small
``httpx.MockTransport`` standing in for the scheduler, the one I/O seam of the client; the happy
path against the real scheduler is in test_daemon.py.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from agent.client import (
    Backoff,
    NodeSession,
    NodeSessionError,
    SchedulerAuthError,
    SchedulerRejectedError,
    SchedulerUnavailableError,
    full_jitter_delay,
    retry_call,
)
from gridmarket.cid import bytes_cid
from gridmarket.wire import (
    AcceptRequest,
    Assignment,
    ExecutorKind,
    JobSpec,
    NodeCapacityIn,
    RegisterRequest,
    recover_registration_signer,
)

ESCROW = "0x" + "ab" * 20
ACCOUNT: LocalAccount = Account.from_key("0x" + "05" * 32)
CAPACITY = NodeCapacityIn(
    cpu_cores=2, ram_mib=2048, disk_mib=1000, region="eu-west", executors=[ExecutorKind.WASM]
)
TERMS = {
    "bounty_wei": 10**15,
    "fee_bps": 250,
    "deadline": int(time.time()) + 600,
    "collateral_wei": 10**15,
    "mediator": "0x" + "0a" * 20,
    "flags": 0,
    "operator": "0x" + "01" * 20,
    "hold_for": 900,
}

# --------------------------------------------------------------------------- backoff maths


@pytest.mark.parametrize("attempt", [0, 1, 2, 5, 10, 200, 10_000])
def test_full_jitter_stays_in_its_window(attempt: int) -> None:
    rng = random.Random(attempt)
    ceiling = min(30.0, 0.25 * 2.0 ** min(attempt, 1000))
    samples = [full_jitter_delay(attempt, 0.25, 30.0, rng) for _ in range(4000)]
    assert all(0.0 <= s <= ceiling for s in samples)
    # uniform on [0, ceiling]: mean ceiling/2, spread over the whole window
    assert statistics.fmean(samples) == pytest.approx(ceiling / 2, rel=0.05)
    assert min(samples) < ceiling * 0.02 and max(samples) > ceiling * 0.98


def test_full_jitter_rejects_bad_parameters() -> None:
    for args in ((-1, 1.0, 2.0), (0, 0.0, 2.0), (0, 3.0, 2.0)):
        with pytest.raises(ValueError):
            full_jitter_delay(*args)


def test_backoff_ceiling_doubles_to_the_cap_and_resets() -> None:
    backoff = Backoff(0.5, 4.0, rng=random.Random(1))
    ceilings = []
    for _ in range(6):
        ceilings.append(backoff.ceiling())
        assert 0 <= backoff.next_delay() <= ceilings[-1]
    assert ceilings == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    backoff.reset()
    assert backoff.failures == 0 and backoff.ceiling() == 0.5


def test_retry_call_retries_unavailable_then_succeeds() -> None:
    calls = []

    def flaky() -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise SchedulerUnavailableError("down")
        return "ok"

    backoff = Backoff(0.01, 0.02)
    assert retry_call(flaky, backoff=backoff) == "ok"
    assert len(calls) == 3 and backoff.failures == 0  # reset after the success


def test_retry_call_does_not_retry_a_refusal() -> None:
    def refused() -> None:
        raise SchedulerRejectedError("no", 400, "no")

    with pytest.raises(SchedulerRejectedError):
        retry_call(refused, backoff=Backoff(0.01, 0.02))


def test_retry_call_gives_up_at_the_deadline_and_on_stop() -> None:
    def down() -> None:
        raise SchedulerUnavailableError("down")

    started = time.monotonic()
    with pytest.raises(SchedulerUnavailableError):
        retry_call(down, backoff=Backoff(0.05, 0.1), deadline=time.monotonic() + 0.3)
    assert time.monotonic() - started < 1.0
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    with pytest.raises(SchedulerUnavailableError):
        retry_call(down, backoff=Backoff(5.0, 10.0), stop=stop)  # would sleep ~5 s otherwise
    assert time.monotonic() - started < 2.0


def test_retry_call_honours_retry_after() -> None:
    calls: list[float] = []

    def busy() -> str:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise SchedulerUnavailableError("busy", retry_after=0.3)
        return "ok"

    assert retry_call(busy, backoff=Backoff(0.001, 0.002)) == "ok"
    assert calls[1] - calls[0] >= 0.3


# --------------------------------------------------------------------------- client


class FakeScheduler:
    """Just enough of the scheduler's API to drive the client's failure paths."""

    def __init__(self) -> None:
        self.registrations: list[RegisterRequest] = []
        self.tokens_refused = 0  # how many next requests with a token answer 401
        self.handler: Callable[[httpx.Request], httpx.Response] | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/info":
            return httpx.Response(
                200,
                json={
                    "chain_id": 31337,
                    "escrow": ESCROW,
                    "operator": ESCROW,
                    "require_stake": False,
                    "heartbeat_interval_s": 5.0,
                    "lease_ttl_s": 30.0,
                    "long_poll_max_s": 30.0,
                    "fee_bps": 250,
                    "version": "test",
                },
            )
        if path == "/v1/nodes/register":
            body = RegisterRequest.model_validate_json(request.content)
            self.registrations.append(body)
            n = len(self.registrations)
            return httpx.Response(
                200,
                json={
                    "node_id": "n-1",
                    "token": f"token-{n}",
                    "token_expires_at": time.time() + 60,
                    "heartbeat_interval_s": 5.0,
                    "lease_ttl_s": 30.0,
                },
            )
        if self.tokens_refused:
            self.tokens_refused -= 1
            return httpx.Response(401, json={"detail": "node token expired: register again"})
        assert self.handler is not None, f"unexpected {request.method} {path}"
        return self.handler(request)


@pytest.fixture
def fake() -> FakeScheduler:
    return FakeScheduler()


@pytest.fixture
def client(fake: FakeScheduler) -> NodeSession:
    return NodeSession(
        "http://scheduler.test",
        ACCOUNT,
        name="node-a",
        capacity=CAPACITY,
        agent_version="0.1.0",
        transport=httpx.MockTransport(fake),
    )


def test_registration_is_signed_fresh_and_short_lived(
    client: NodeSession, fake: FakeScheduler
) -> None:
    client.register()
    client.register()
    first, second = fake.registrations
    for body in fake.registrations:
        reg = body.registration
        signer = recover_registration_signer(31337, ESCROW, reg, body.signature)
        assert signer == ACCOUNT.address and reg.wallet == ACCOUNT.address
        assert reg.capacity == CAPACITY and reg.name == "node-a"
        assert time.time() + 290 < reg.expiry <= time.time() + 300
    assert second.registration.nonce > first.registration.nonce  # replay protection


def test_expired_token_registers_again_and_retries(
    client: NodeSession, fake: FakeScheduler
) -> None:
    seen: list[str] = []

    def heartbeat(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["Authorization"])
        return httpx.Response(200, json={"leases": {}, "cancel": [], "next_heartbeat_s": 5.0})

    fake.handler = heartbeat
    client.heartbeat([])
    fake.tokens_refused = 1
    answer = client.heartbeat([])
    assert answer.next_heartbeat_s == 5.0
    assert len(fake.registrations) == 2  # the first heartbeat registered, the 401 once more
    assert seen == ["Bearer token-1", "Bearer token-2"]


def test_token_refused_twice_is_an_auth_error(client: NodeSession, fake: FakeScheduler) -> None:
    fake.tokens_refused = 2
    with pytest.raises(SchedulerAuthError, match="register again") as info:
        client.heartbeat([])
    assert info.value.status == 401


def test_4xx_detail_becomes_the_message(client: NodeSession, fake: FakeScheduler) -> None:
    fake.handler = lambda r: httpx.Response(409, json={"detail": "job 0x12 is not leased"})
    with pytest.raises(SchedulerRejectedError) as info:
        client.hand_back("0x12")
    assert info.value.status == 409 and info.value.detail == "job 0x12 is not leased"
    assert "hand-back of 0x12" in str(info.value) and "not leased" in str(info.value)

    errors = [{"loc": ["body", "attempt"], "msg": "Input should be greater than 0"}]
    fake.handler = lambda r: httpx.Response(422, json={"detail": errors})
    with pytest.raises(SchedulerRejectedError, match="attempt: Input should be greater than 0"):
        client.hand_back("0x12")


def test_5xx_and_429_are_unavailable_with_retry_after(
    client: NodeSession, fake: FakeScheduler
) -> None:
    fake.handler = lambda r: httpx.Response(503, json={"detail": "chain unavailable"})
    with pytest.raises(SchedulerUnavailableError, match="chain unavailable") as info:
        client.hand_back("0x12")
    assert info.value.retry_after is None
    fake.handler = lambda r: httpx.Response(429, headers={"Retry-After": "7"}, text="slow down")
    with pytest.raises(SchedulerUnavailableError) as info:
        client.hand_back("0x12")
    assert info.value.retry_after == 7.0


def test_unreachable_scheduler_is_unavailable() -> None:
    client = NodeSession("http://127.0.0.1:9", ACCOUNT, name="n", capacity=CAPACITY, timeout_s=2)
    with pytest.raises(SchedulerUnavailableError, match="unreachable"):
        client.info()


def test_garbage_answer_is_a_scheduler_error(client: NodeSession, fake: FakeScheduler) -> None:
    fake.handler = lambda r: httpx.Response(200, json={"leases": "no"})
    with pytest.raises(NodeSessionError, match="not a valid HeartbeatResponse"):
        client.heartbeat([])


def test_next_job_assignment_or_retry_after(client: NodeSession, fake: FakeScheduler) -> None:
    spec = JobSpec(executor=ExecutorKind.WASM, module_cid=bytes_cid(b"module"))
    assignment: dict[str, Any] = {
        "job_id": "0x" + "11" * 32,
        "attempt": 1,
        "spec_cid": bytes_cid(spec.to_bytes()),
        "spec": json.loads(spec.to_bytes()),
        "bounty_wei": 10**15,
        "deadline": TERMS["deadline"],
        "lease_expires_at": time.time() + 30,
        "chain_id": 31337,
        "escrow": ESCROW,
        "terms": TERMS,
    }
    asked: list[str] = []
    answers = [
        httpx.Response(204, headers={"Retry-After": "2.50"}),
        httpx.Response(204),
        httpx.Response(200, json=assignment),
    ]

    def next_job(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.params["wait_s"])
        return answers.pop(0)

    fake.handler = next_job
    assert client.next_job(3.0) == 2.5
    assert client.next_job(3.0) == 1.0  # no header: the default idle wait
    got = client.next_job(0.5)
    assert isinstance(got, Assignment) and got.spec == spec
    assert asked == ["3", "3", "0.5"]


def test_accept_posts_the_signed_acceptance_with_the_token(
    client: NodeSession, fake: FakeScheduler
) -> None:
    """``accept``: POST API.ACCEPT with the bearer token; a 401 re-registers and retries once,
    as every node call; the answer is an AcceptAck (accepted true or false)."""
    seen: list[tuple[str, str, AcceptRequest]] = []
    request = AcceptRequest(attempt=2, signature="0x" + "ab" * 65)

    def accept(req: httpx.Request) -> httpx.Response:
        body = AcceptRequest.model_validate_json(req.content)
        seen.append((req.url.path, req.headers["Authorization"], body))
        accepted = len(seen) == 1
        message = "" if accepted else "lease lost"
        return httpx.Response(
            200, json={"job_id": "0x" + "11" * 32, "accepted": accepted, "message": message}
        )

    fake.handler = accept
    fake.tokens_refused = 1
    ack = client.accept("0x" + "11" * 32, request)
    assert ack.accepted and len(fake.registrations) == 2  # registered again after the 401
    path, auth, body = seen[0]
    assert path == f"/v1/nodes/n-1/jobs/0x{'11' * 32}/accept" and auth == "Bearer token-2"
    assert body == request
    assert not client.accept("0x" + "11" * 32, request).accepted


def test_accept_failures_map_onto_the_error_tree(client: NodeSession, fake: FakeScheduler) -> None:
    answers = [
        httpx.Response(409, json={"detail": "no offer of this job to this node"}),
        httpx.Response(503, headers={"Retry-After": "3"}),
        httpx.Response(200, json={"job_id": "x"}),
    ]
    fake.handler = lambda request: answers.pop(0)
    request = AcceptRequest(attempt=1, signature="0x" + "ab" * 65)
    with pytest.raises(SchedulerRejectedError, match="no offer of this job") as refused:
        client.accept("0x" + "22" * 32, request)
    assert refused.value.status == 409
    with pytest.raises(SchedulerUnavailableError) as busy:
        client.accept("0x" + "22" * 32, request)
    assert busy.value.retry_after == 3.0
    with pytest.raises(NodeSessionError, match="not a valid AcceptAck"):
        client.accept("0x" + "22" * 32, request)
