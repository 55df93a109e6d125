"""What the node does on-chain from its own wallet, so that it depends on nobody to be paid:

* :class:`OnChainSubmitter`: ``submitResult`` from the provider's wallet, idempotent per job
  and attempt (``submit_on_chain`` sends every result this way before reporting it);
* :class:`ResultGuard`: the theft defence. A job's operator can take an assigned job back
  once its hold is over (escrow version 5: ``holdUntil``, ``holdFor`` after the assignment, the
  time the node signed for) and ``reassignDelay`` has passed since the assignment, and give it
  to another provider; a scheduler that sat on a node's signed result until then could do so.
  The guard gives the scheduler ``delay_s`` to put the result on-chain (``submitResultFor``,
  the relay) and otherwise submits it itself, while the job is still assigned to this wallet,
  and never later than :data:`HOLD_GUARD_MARGIN_S` before ``holdUntil`` (nor before the
  deadline), read from the chain (the ``JobAssigned`` fold: ``job.hold_until``);
* :class:`Finalizer`: escrow version 2 has no ``claim``: after the challenge window anyone may
  ``finalize`` a result nobody objected to (and a disputed one its mediator left unruled for the
  mediation window). The node finalizes its own results whose window passed, idempotently.

All three need ``rpc_url`` and ``deployment``, and a wallet with ETH for gas. They talk to the
chain through :class:`gridmarket.lightchain.LightEscrowClient` (JSON-RPC over httpx, transactions
signed with :mod:`gridmarket.ethsig`): the daemon with an ``rpc_url`` loads neither web3 nor
eth-account (docs/agent.md, "Footprint").
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gridmarket.abicodec import topic
from gridmarket.deployment import ChainError, Deployment
from gridmarket.escrow import MAX_REPLICAS, JobState, Status
from gridmarket.ethsig import Signer, keccak
from gridmarket.lightchain import LightEscrowClient
from gridmarket.wire import ResultReport, RunReason, checksum

__all__ = [
    "DEFAULT_GUARD_DELAY_S",
    "GRACE_S",
    "HOLD_GUARD_MARGIN_S",
    "Finalizer",
    "OnChainSubmitter",
    "ResultGuard",
    "TimeLeft",
    "address_topic",
    "event_topic",
    "guard_delay",
    "reassign_delay",
    "seat_ids",
]

log = logging.getLogger(__name__)

DEFAULT_GUARD_DELAY_S = 60.0
"""How long the scheduler gets to relay a result when the deployment's reassign delay is
unknown."""


class _OnDeployment(Protocol):
    @property
    def deployment(self) -> Deployment: ...


def event_topic(client: _OnDeployment, name: str) -> str:
    """The 0x topic of the escrow's event ``name`` (``client``: either escrow client)."""
    for entry in client.deployment.abi:
        if entry.get("type") == "event" and entry.get("name") == name:
            return "0x" + topic(entry).hex()
    raise ChainError(f"JobEscrow has no event {name!r}")


def address_topic(address: str) -> str:
    """An indexed address as a log topic (32 bytes, left-padded)."""
    return "0x" + "00" * 12 + checksum(address)[2:].lower()


def reassign_delay(deployment: Deployment | None) -> float | None:
    """The escrow's ``reassignDelay`` as the deployment file records it, if it does."""
    value = deployment.params.get("reassign_delay") if deployment is not None else None
    return float(value) if isinstance(value, int | float) and value > 0 else None


def guard_delay(configured: float | None, deployment: Deployment | None) -> float:
    """``configured``, else half the deployment's ``reassign_delay``, else 60 s."""
    if configured is not None:
        return configured
    reassign = reassign_delay(deployment)
    return reassign / 2 if reassign is not None else DEFAULT_GUARD_DELAY_S


def seat_ids(group_id: bytes, replicas: int) -> list[bytes]:
    """The job ids of a replicated job's seats, ``keccak256(abi.encode(groupId, i))``:
    :func:`gridmarket.escrow.seat_ids` without loading eth-abi."""
    if len(group_id) != 32:
        raise ValueError(f"group id must be 32 bytes, got {len(group_id)}")
    if not 2 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"replicas must be 2..{MAX_REPLICAS}, got {replicas}")
    return [keccak(group_id + i.to_bytes(32, "big")) for i in range(replicas)]


@dataclass(frozen=True)
class TimeLeft:
    """How long an assigned job's result can still wait, on the chain's clock (the latest
    block's time): seconds to its ``holdUntil`` (zero or less: the hold is over) and to its
    deadline."""

    hold_s: float
    deadline_s: float


class OnChainSubmitter:
    """Submits succeeded results from the provider's wallet; idempotent per job and attempt."""

    def __init__(self, client: LightEscrowClient, account: Signer) -> None:
        self.account = account
        self.client = client

    @classmethod
    def connect(cls, rpc_url: str, deployment: Path, account: Signer) -> OnChainSubmitter:
        return cls(LightEscrowClient.connect(rpc_url, Deployment.load(deployment)), account)

    def submit(self, job_id: str, report: ResultReport) -> str | None:
        """The tx hash of ``submitResult``, or None when there is nothing (more) to send.

        Raises ChainError for a refusal (not assigned to this wallet, deadline passed, ...) and
        the RPC's errors when the chain is unreachable (the caller retries those).
        """
        if report.reason is not RunReason.SUCCEEDED or report.output_cid is None:
            return None
        jid = bytes.fromhex(job_id.removeprefix("0x"))
        state = self.client.job_state(jid)
        if state.status is not Status.ASSIGNED:
            if state.output_cid == report.output_cid and state.job.attempt == report.attempt:
                return None  # on-chain already: sent before, or relayed by the scheduler
            raise ChainError(f"job {job_id} is {state.status.name}, not ASSIGNED", "NotAssigned")
        if (
            checksum(state.job.provider) != self.account.address
            or state.job.attempt != report.attempt
        ):
            raise ChainError(
                f"job {job_id} attempt {state.job.attempt} is assigned to {state.job.provider}",
                "NotOurs",
            )
        sent = self.client.send(
            self.account, "submitResult", jid, state.job.as_tuple(), report.output_cid
        )
        log.info("job %s: result submitted on-chain in %s", job_id[:10], sent.tx_hash)
        return sent.tx_hash

    def time_left(self, job_id: str, report: ResultReport) -> TimeLeft | None:
        """How long ``report``'s result may wait before the node must put it on-chain: the
        job's ``holdUntil`` and deadline less the latest block's time, while the job is assigned
        to this wallet for that attempt; None otherwise (relayed already, taken back, handed
        back: :meth:`submit` says which)."""
        state = self.client.job_state(bytes.fromhex(job_id.removeprefix("0x")))
        job = state.job
        if (
            state.status is not Status.ASSIGNED
            or checksum(job.provider) != self.account.address
            or job.attempt != report.attempt
        ):
            return None
        now = self.client.timestamp()
        return TimeLeft(hold_s=float(job.hold_until - now), deadline_s=float(job.deadline - now))


# --------------------------------------------------------------------------- theft defence


@dataclass(order=True)
class _Watch:
    due: float
    job_id: str = field(compare=False)
    report: ResultReport = field(compare=False)
    tries: int = field(default=0, compare=False)
    ready: float = field(default=0.0, compare=False)
    accepted: float | None = field(default=None, compare=False)
    planned: bool = field(default=True, compare=False)
    """False until the job's hold and deadline are read from the chain (``ResultGuard._plan``)."""


GRACE_S = 10.0
"""The least time the scheduler gets to relay a result (when the take-back window is open)."""
HOLD_GUARD_MARGIN_S = 60.0
"""How long before a job's ``holdUntil`` (and its deadline) the guard puts a result nobody
relayed on-chain itself: time for its transaction to be mined, and to retry an RPC that does not
answer. The hold the scheduler offers leaves at least :data:`gridmarket.holds.HOLD_MARGIN_S`
(300 s) after a run that used its whole timeout."""


class ResultGuard:
    """Puts a result on-chain from the node's wallet when nobody relayed it in ``delay_s``.

    :meth:`watch` a succeeded result when it is ready; ``delay_s`` later the guard calls
    ``submit`` (:meth:`OnChainSubmitter.submit`), which sends ``submitResult`` only
    while the job is still assigned to this wallet for that attempt and its result is not on-chain
    (otherwise it returns None or refuses with :class:`ChainError`: logged, nothing sent). An
    unreachable chain is retried every ``retry_s``, ``max_tries`` times. :meth:`stop` checks
    every result still waiting at once (the node is leaving: nobody else will).

    ``take_back_s`` is the escrow's ``reassignDelay``: with the time the job was accepted, the
    guard checks no later than ``delay_s`` before the operator may take the job back, and, for a
    run that outlasted that, :data:`GRACE_S` after the result is ready (:meth:`due`).

    ``time_left`` (:meth:`OnChainSubmitter.time_left`) reads the job's ``holdUntil`` and
    deadline from the chain as soon as a result is watched: the guard then checks no later than
    ``margin_s`` before either, so that its own ``submitResult`` is mined while nobody else can
    take the job back, and before the deadline (:meth:`due`). A chain that does not answer
    that read leaves the check at the time above.
    """

    def __init__(
        self,
        submit: Callable[[str, ResultReport], str | None],
        delay_s: float,
        *,
        take_back_s: float | None = None,
        time_left: Callable[[str, ResultReport], TimeLeft | None] | None = None,
        margin_s: float = HOLD_GUARD_MARGIN_S,
        retry_s: float = 5.0,
        max_tries: int = 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.submit = submit
        self.delay_s = delay_s
        self.take_back_s = take_back_s
        self.time_left = time_left
        self.margin_s = margin_s
        self.retry_s = retry_s
        self.max_tries = max_tries
        self._clock = clock
        self._heap: list[_Watch] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.sent: dict[str, str] = {}
        """job id -> tx hash of each result the guard put on-chain itself."""

    def due(
        self,
        ready: float,
        accepted: float | None = None,
        left: TimeLeft | None = None,
        now: float | None = None,
    ) -> float:
        """When to check a result ready at ``ready`` of a job accepted at ``accepted`` (both
        on the guard's clock): ``delay_s`` after it is ready, but no later than ``delay_s``
        before the take-back window opens, and no sooner than :data:`GRACE_S` after it is ready
        (the scheduler needs a moment to relay).

        ``left`` (read from the chain at ``now``, on the guard's clock; ``ready`` by default)
        adds what the chain says: the take-back opens no sooner than the hold ends, and the
        check is, with no grace, no later than ``margin_s`` before the hold ends (while it
        lasts) and before the deadline."""
        due = ready + self.delay_s
        at = ready if now is None else now
        holding = left is not None and left.hold_s > 0  # only the node can take it back yet
        if accepted is not None and self.take_back_s is not None:
            opens = accepted + self.take_back_s
            if left is not None and holding:
                opens = max(opens, at + left.hold_s)
            due = min(due, max(ready + min(self.delay_s, GRACE_S), opens - self.delay_s))
        if left is not None:
            if holding:
                due = min(due, at + max(0.0, left.hold_s - self.margin_s))
            due = min(due, at + max(0.0, left.deadline_s - self.margin_s))
        return due

    def watch(self, job_id: str, report: ResultReport, accepted: float | None = None) -> None:
        """Check ``report`` on-chain in time (``accepted``: when the job was accepted, on the
        guard's clock, :func:`time.monotonic` by default). With ``time_left``, the job's hold
        and deadline are read from the chain at once (:meth:`_plan`)."""
        if report.reason is not RunReason.SUCCEEDED:
            return
        ready = self._clock()
        watch = _Watch(self.due(ready, accepted), job_id, report, ready=ready, accepted=accepted)
        if self.time_left is not None:
            watch.planned, watch.due = False, ready
        with self._cond:
            heapq.heappush(self._heap, watch)
            self._cond.notify_all()

    def _plan(self, watch: _Watch) -> None:
        """Read the job's hold and deadline and reschedule its check (:meth:`due`); a job no
        longer assigned to this wallet is checked now (relayed, or not ours: logged)."""
        assert self.time_left is not None
        watch.planned = True
        try:
            left = self.time_left(watch.job_id, watch.report)
        except Exception as exc:  # the chain unreachable: the check stays where it was
            log.warning(
                "job %s: could not read its hold from the chain (%s)", watch.job_id[:10], _line(exc)
            )
            watch.due = self.due(watch.ready, watch.accepted)
        else:
            if left is None:
                self._check(watch)
                return
            now = self._clock()
            watch.due = self.due(watch.ready, watch.accepted, left, now)
            log.info(
                "job %s: result on-chain by this node in %.0f s unless relayed (hold ends in "
                "%.0f s)",
                watch.job_id[:10],
                max(0.0, watch.due - now),
                left.hold_s,
            )
        with self._cond:
            heapq.heappush(self._heap, watch)
            self._cond.notify_all()

    @property
    def pending(self) -> list[str]:
        with self._cond:
            return [w.job_id for w in self._heap]

    def start(self) -> ResultGuard:
        self._thread = threading.Thread(target=self._loop, name="result-guard", daemon=True)
        self._thread.start()
        return self

    def stop(self, flush_s: float = 30.0) -> None:
        """Stop; the results still waiting are checked (and sent if need be) now, for at most
        ``flush_s`` seconds."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        deadline = self._clock() + flush_s
        with self._cond:
            left, self._heap = sorted(self._heap), []
        for watch in left:
            if self._clock() > deadline:
                log.error("job %s: result guard stopped before checking it", watch.job_id[:10])
                continue
            self._check(watch, final=True)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (not self._heap or self._heap[0].due > self._clock()):
                    wait = self._heap[0].due - self._clock() if self._heap else None
                    self._cond.wait(wait)
                if self._stopping:
                    return
                watch = heapq.heappop(self._heap)
            if watch.planned:
                self._check(watch)
            else:
                self._plan(watch)

    def _check(self, watch: _Watch, *, final: bool = False) -> None:
        short = watch.job_id[:10]
        try:
            tx = self.submit(watch.job_id, watch.report)
        except ChainError as exc:
            log.warning("job %s: result not submitted on-chain by this node: %s", short, exc)
            return
        except Exception as exc:  # the chain unreachable: try again later
            watch.tries += 1
            if final or watch.tries >= self.max_tries:
                log.error("job %s: could not check the result on-chain: %s", short, _line(exc))
                return
            log.warning("job %s: chain check failed (%s); retrying", short, _line(exc))
            with self._cond:
                watch.due = self._clock() + self.retry_s
                heapq.heappush(self._heap, watch)
            return
        if tx is None:
            log.info("job %s: result is on-chain (relayed)", short)
        else:
            log.warning(
                "job %s: the scheduler had not put the result on-chain; submitted it (tx %s)",
                short,
                tx,
            )
            self.sent[watch.job_id] = tx


# --------------------------------------------------------------------------- finalize


class Finalizer:
    """Finalizes this wallet's results whose challenge (or unruled mediation) window passed,
    and resolves the replicated jobs it holds a seat of once every seat has a result (or the
    deadline passed): nobody in the middle can hold a seat's pay back.

    Keeps a cursor over the ``ResultSubmitted`` events naming this wallet, so each pass reads
    only new blocks plus the jobs still open. :meth:`run_once` is idempotent: a job someone else
    finalized meanwhile is skipped.
    """

    def __init__(self, client: LightEscrowClient, account: Signer) -> None:
        self.client = client
        self.account = account
        self._next_block = client.deployment.block
        self._open: set[bytes] = set()
        self._windows: tuple[int, int] | None = None
        self._lock = threading.Lock()

    def windows(self) -> tuple[int, int]:
        """``(challengeWindow, mediationWindow)`` of the escrow, in seconds."""
        if self._windows is None:
            self._windows = (
                int(self.client.call("challengeWindow")),
                int(self.client.call("mediationWindow")),
            )
        return self._windows

    def due(self) -> list[JobState]:
        """This wallet's Submitted/Disputed jobs that ``finalize`` would pay now."""
        latest = self.client.block_number()
        if latest >= self._next_block:
            topics = [event_topic(self.client, "ResultSubmitted"), None]
            topics.append(address_topic(self.account.address))
            for event in self.client.events(self._next_block, latest, topics):
                self._open.add(bytes(event.args["jobId"]))
            self._next_block = latest + 1
        challenge, mediation = self.windows()
        now = self.client.timestamp()
        out = []
        for job_id in sorted(self._open):
            state = self.client.job_state(job_id)
            ours = checksum(state.job.provider) == self.account.address
            if state.status not in (Status.SUBMITTED, Status.DISPUTED, Status.ASSIGNED) or not ours:
                self._open.discard(job_id)  # paid, refunded, or no longer this wallet's result
                continue
            if state.job.replicas:
                if state.status is Status.SUBMITTED and self._seats_resolvable(state, now):
                    out.append(state)
                continue
            opens_at = {
                Status.SUBMITTED: state.job.since + challenge,
                Status.DISPUTED: state.job.disputed_at + mediation,
            }.get(state.status)
            if opens_at is not None and now >= opens_at:
                out.append(state)
        return out

    def _seats(self, state: JobState) -> list[JobState]:
        """Every seat of the replicated job ``state`` is a seat of, in seat order."""
        return [self.client.job_state(i) for i in seat_ids(state.salt, state.job.replicas)]

    def _seats_resolvable(self, state: JobState, now: int) -> bool:
        """Whether ``resolve`` may pay now: every seat has a result, or the deadline passed.
        (Without a majority it still refuses until the mediation window has passed.)"""
        if now > state.job.deadline:
            return True
        waiting = (Status.FUNDED, Status.ASSIGNED)
        return not any(s.status in waiting for s in self._seats(state))

    def run_once(self) -> list[str]:
        """Finalize every due job; the transaction hashes sent."""
        with self._lock:
            sent = []
            for state in self.due():
                short = "0x" + state.job_id.hex()[:8]
                try:
                    if state.job.replicas:  # a seat: the group is resolved, not finalized
                        _, tx = self.client.resolve(self.account, state.salt, self._seats(state))
                    else:
                        _, tx = self.client.call_job(self.account, "finalize", state)
                except ChainError as exc:  # finalized by someone else meanwhile, or disputed
                    log.info("job %s: not finalized: %s", short, exc)
                    continue
                self._open.discard(state.job_id)
                log.info(
                    "job %s: %s, up to %d wei paid to this wallet (tx %s)",
                    short,
                    "its replicated job resolved" if state.job.replicas else "finalized",
                    state.job.payout,
                    tx.tx_hash,
                )
                sent.append(tx.tx_hash)
            return sent


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
