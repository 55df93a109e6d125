"""What the outbox sends for each kind of row, and what a refused transaction undoes.

A row is written by the store in the same transaction as the state change that needs it:

- ``assign`` when the node accepts its offer (the payload carries its signed acceptance);
- ``settle`` / ``release`` with a good verdict on an on-verify job (paid at once);
- ``relay`` with a good verdict on any other job (``submitResultFor``); once it is mined the
  rule writes ``finalize``, due when the challenge window has passed;
- ``finalize`` directly for a good result the provider posted on-chain itself;
- ``unassign`` when a lease the node had accepted ends without a paid result (lost, failed,
  refused by our check, handed back, attempts used up).

Each rule reads the job's on-chain struct first, so a retry after an unknown outcome does not
send twice, and a step someone else already took (the provider submitted or handed back itself,
the submitter released) is not sent again.

Rows of different jobs that are ready together go out together (:meth:`OutboxRules.send_many`):
each rule makes its call (:class:`~scheduler.chain.Call`), and
:meth:`~scheduler.chain.TxSender.send_many` preflights them all and sends the ones that pass in
``tryMulticall`` batches (one intrinsic 21,000 gas for up to ``BATCH_MAX_CALLS`` calls; a call
someone else made moot first, e.g. a provider relaying its own result, is skipped, not fatal to
the batch, and settled as a single send). Each row's outcome is then recorded as if it had been
sent alone: its job's events folded, the row done, or its own refusal.

The escrow refuses some steps only *for now*: the operator's ``unassign`` and reassign before
the provider's hold is over, ``max(since + reassignDelay, holdUntil)`` (``JobEscrowTooEarly``;
checked here first, :meth:`OutboxRules._take_back_allowed`), and ``finalize`` before the window
closes (``JobEscrowChallengeWindowOpen``). Those raise :class:`NotYetError` with the chain time they
become possible; the outbox waits for it (the row and its job's later rows), it is not a
refusal.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

from gridmarket.chain import ChainError, Event, Sent
from gridmarket.escrow import JOB_EVENTS, JobState, Status
from gridmarket.holds import hold_for as offered_hold
from scheduler.chain import BATCH_MAX_CALLS, BATCH_MAX_GAS, Call, TxSender
from scheduler.store import OutboxItem, Store

__all__ = ["NotYetError", "OutboxRules", "not_yet"]

log = logging.getLogger(__name__)

_TOO_EARLY = re.compile(
    r"(JobEscrowTooEarly|JobEscrowChallengeWindowOpen|JobEscrowNoMajority)\(.*?"
    r"(?:allowedAt|claimableAt|resolvableAt)=(\d+)"
)
_SEATS_PENDING = re.compile(r"JobEscrowSeatsPending\(.*?deadline=(\d+)")


class NotYetError(ChainError):
    """The escrow refuses this step until chain time :attr:`at`: wait, do not give up."""

    def __init__(self, message: str, at: float, reason: str | None = None) -> None:
        super().__init__(message, reason)
        self.at = at


def not_yet(exc: ChainError) -> NotYetError | None:
    """``exc`` as a :class:`NotYetError` when it is a "too early" revert, else None."""
    text = exc.reason or str(exc)
    match = _TOO_EARLY.search(text)
    if match is not None:
        return NotYetError(str(exc), float(match.group(2)), exc.reason)
    pending = _SEATS_PENDING.search(text)
    if pending is not None:  # a seat may still deliver until its deadline
        return NotYetError(str(exc), float(pending.group(1)) + 1, exc.reason)
    return None


@dataclass
class _Step:
    """What a row needs: ``call`` (None: nothing to send, the chain has it already), then
    ``after`` with the mined transaction's hash (None when nothing was sent), which returns
    the hash recorded on the row; ``refusal`` turns a refusal of ``call`` into what the row
    raises (e.g. "the job moved on meanwhile": retry later)."""

    call: Call | None
    after: Callable[[str | None], str | None]
    refusal: Callable[[ChainError], NoReturn] | None = None
    also: tuple[str, ...] = ()
    """Other jobs whose events of the call are folded with the row's (a group's seats)."""


def _same(tx: str | None) -> str | None:
    return tx


def _events_of(sent: Sent, job_id: str, also: Sequence[str] = ()) -> list[Event]:
    """The events of ``sent`` that belong to ``job_id`` (and to the jobs ``also`` names): a
    batch carries several jobs'."""
    want = {bytes.fromhex(j.removeprefix("0x")) for j in (job_id, *also)}
    return [
        e
        for e in sent.events
        if e.name not in JOB_EVENTS or bytes(e.args.get("jobId", b"")) in want
    ]


class OutboxRules:
    """Sends outbox rows (:meth:`send_many`, :meth:`send`); undoes what a refused one needed
    (:meth:`refused`)."""

    def __init__(self, store: Store, count: Callable[[str], None]) -> None:
        self.store = store
        self.count = count
        self._window: int | None = None
        self._delay: int | None = None
        self._now: int | None = None
        self._rules: dict[str, Callable[[OutboxItem], _Step]] = {
            "assign": self._assign,
            "settle": self._settle,
            "release": self._release,
            "relay": self._relay,
            "finalize": self._finalize,
            "unassign": self._unassign,
            "resolve": self._resolve,
        }
        self._sender: TxSender | None = None

    def send(self, sender: TxSender, item: OutboxItem) -> None:
        """Send ``item`` (or nothing, when the chain already has it) and mark it done.
        A refusal raises :class:`ChainError` and leaves the row to the caller; a step the
        escrow takes only later raises :class:`NotYetError`."""
        (outcome,) = self.send_many(sender, [item])
        if outcome is not None:
            raise outcome

    def send_many(
        self,
        sender: TxSender,
        items: Sequence[OutboxItem],
        *,
        max_calls: int = BATCH_MAX_CALLS,
        max_gas: int = BATCH_MAX_GAS,
    ) -> list[ChainError | None]:
        """Send ``items`` (at most one row per job: a job's rows go in order) together, and
        mark each one that went through done. Returns each row's outcome, in order: None
        (done), a :class:`NotYetError` (wait for its time), or the :class:`ChainError` that
        refused it, as :meth:`send` would raise for it alone. Transient failures (the node
        unreachable, an outcome unknown) are raised for all of them: nothing is recorded for
        rows whose transaction may or may not be mined, and the next pass reads the chain."""
        jobs = [item.job_id for item in items]
        if len(set(jobs)) != len(jobs):
            raise ValueError(f"send_many takes one row per job, got {jobs}")
        self._sender = sender
        self._now = None  # the chain's time, read again each pass
        outcomes: list[ChainError | None] = [None] * len(items)
        steps: list[tuple[int, _Step]] = []
        for i, item in enumerate(items):
            rule = self._rules.get(item.kind)
            if rule is None:
                outcomes[i] = ChainError(f"unknown outbox kind {item.kind}", "UnknownKind")
                continue
            try:
                steps.append((i, rule(item)))
            except ChainError as exc:
                outcomes[i] = not_yet(exc) or exc
        calls = [(i, st.call) for i, st in steps if st.call is not None]
        results = dict(
            zip(
                (i for i, _ in calls),
                sender.send_many([c for _, c in calls], max_calls=max_calls, max_gas=max_gas)
                if calls
                else [],
                strict=True,
            )
        )
        # the mined calls' events, every job's, folded in one transaction (one commit a batch)
        mined = [
            (i, _events_of(r, items[i].job_id, step.also))
            for i, step in steps
            if step.call is not None and not isinstance(r := results[i], ChainError)
        ]
        self.store.apply_sent_many([events for _, events in mined])
        folded = {i for i, _ in mined}
        done: list[tuple[int, str | None]] = []
        for i, step in steps:
            item = items[i]
            try:
                tx: str | None = None
                if step.call is not None:
                    result = results[i]
                    if isinstance(result, ChainError):
                        if step.refusal is not None:
                            step.refusal(result)
                        raise result
                    assert i in folded
                    tx = result.tx_hash
                tx = step.after(tx)
            except NotYetError as exc:
                outcomes[i] = exc
                continue
            except ChainError as exc:
                outcomes[i] = not_yet(exc) or exc
                continue
            done.append((item.id, tx))
        # a pass that dies before this leaves its rows pending: each rule then finds the chain
        # has the step already and sends nothing (as after an unknown outcome)
        self.store.outbox_done_many(done)
        return outcomes

    def refused(self, item: OutboxItem, reason: str) -> None:
        """The chain refused ``item`` for good: a refused assign ends that lease (the job may go
        to another node); a refused unassign leaves the job as it is (the chain holds it for
        the provider until it hands it back, submits, or the deadline refunds it); any other
        refused step gives the job up."""
        if item.kind == "assign":
            self.store.assign_failed(item.job_id, int(item.payload["attempt"]), reason)
        elif item.kind == "unassign":
            log.warning("job %s: unassign refused: %s", item.job_id, reason)
        elif item.kind == "resolve":
            # the seats stay as the chain has them: anyone may resolve the group later, and the
            # watcher folds it whoever does
            log.warning("job %s: resolve refused: %s", item.job_id, reason)
        else:
            self.store.fail_job(item.job_id, f"{item.kind} refused on-chain: {reason}")

    def challenge_window(self, sender: TxSender) -> int:
        """The escrow's ``challengeWindow`` (immutable: read once)."""
        if self._window is None:
            self._window = int(sender.client.call("challengeWindow"))
        return self._window

    def reassign_delay(self, sender: TxSender) -> int:
        """The escrow's ``reassignDelay`` (immutable: read once)."""
        if self._delay is None:
            self._delay = int(sender.client.call("reassignDelay"))
        return self._delay

    # ------------------------------------------------------------------ per kind
    def _assign(self, item: OutboxItem) -> _Step:
        row = self.store.job(item.job_id)
        state = row.chain
        p = item.payload
        if row.node_id != p.get("node_id", row.node_id) or row.attempt != p["attempt"]:
            # the lease this acceptance was for ended before it went on-chain
            log.info(
                "job %s: attempt %s no longer leased; not assigning", item.job_id, p["attempt"]
            )
            return _Step(None, _same)
        if state.job.attempt >= p["attempt"]:
            return _Step(None, _same)  # already on-chain (a retry after an unknown outcome)
        if state.status not in (Status.FUNDED, Status.ASSIGNED):
            raise ChainError(f"job is {state.status.name}", f"JobStatus({state.status.name})")
        if state.status is Status.ASSIGNED:
            self._take_back_allowed(item, state)  # a reassign takes it from the last provider
        acceptance = bytes.fromhex(p["acceptance"][2:])
        hold = p.get("hold_for")
        if hold is None:  # a row written before holds: the hold its spec is offered
            if row.spec is None:
                raise ChainError(f"job {item.job_id} has no spec: no hold", "NoSpec")
            hold = offered_hold(row.spec.limits.timeout_s)
        return _Step(Call.assign(state, p["provider"], int(hold), acceptance), _same)

    def _take_back_allowed(self, item: OutboxItem, state: JobState) -> None:
        """Raise :class:`NotYetError` unless the operator may take the Assigned job ``state``
        back now (``unassign``, or reassign it): the escrow allows it from
        ``max(since + reassignDelay, holdUntil)`` on, the end of the hold the provider signed
        for. Checked here, on the chain's clock, so a row that must wait is not preflighted
        (nor does it fail a batch's estimate) until then; the escrow checks it again."""
        assert self._sender is not None
        at = max(state.job.since + self.reassign_delay(self._sender), state.job.hold_until)
        now = self._chain_now(self._sender)
        if now < at:
            raise NotYetError(
                f"{item.kind} of job {item.job_id}: the provider's hold lasts until {at} "
                f"(chain time {now})",
                float(at),
                f"JobEscrowTooEarly(jobId={item.job_id}, allowedAt={at}, now={now})",
            )

    def _chain_now(self, sender: TxSender) -> int:
        """The latest block's time, read once a pass (:meth:`send_many`)."""
        if self._now is None:
            self._now = int(sender.client.w3.eth.get_block("latest")["timestamp"])
        return self._now

    def _settle(self, item: OutboxItem) -> _Step:
        state = self.store.job(item.job_id).chain
        p = item.payload

        def paid(tx: str | None) -> str | None:
            self._paid(item, tx)
            return tx

        if state.status is Status.SUBMITTED:  # the provider submitted it on-chain meanwhile
            return _Step(Call.job("release", state), paid)
        if state.status is Status.RELEASED:
            return _Step(None, paid)
        call = Call.job("settle", state, p["output_cid"], bytes.fromhex(p["signature"][2:]))
        return _Step(call, paid, self._moved_on(item, state.status))

    def _moved_on(self, item: OutboxItem, used: Status) -> Callable[[ChainError], NoReturn]:
        """A step refused because the job is no longer Assigned on-chain as the rule read it:
        the provider posted its result itself while our ``settle`` or relay was in flight. The
        row is retried once the watcher has folded what the chain has (``NotYetError`` at
        once: the next pass reads the new status, e.g. Submitted, and releases or waits for
        the window), instead of failing the job; any other refusal is raised as it is."""

        def refusal(exc: ChainError) -> NoReturn:
            if used is Status.ASSIGNED and "JobEscrowWrongStatus" in (exc.reason or str(exc)):
                raise NotYetError(
                    f"the job moved on-chain while {item.kind} was in flight: {exc}",
                    0.0,
                    exc.reason,
                ) from exc
            raise exc

        return refusal

    def _release(self, item: OutboxItem) -> _Step:
        state = self.store.job(item.job_id).chain

        def paid(tx: str | None) -> str | None:
            self._paid(item, tx)
            return tx

        if state.status is Status.SUBMITTED:
            return _Step(Call.job("release", state), paid)
        return _Step(None, paid)

    def _relay(self, item: OutboxItem) -> _Step:
        """``submitResultFor``; then ``finalize`` is due at ``since + challengeWindow``."""
        state = self.store.job(item.job_id).chain
        p = item.payload

        def after(tx: str | None) -> str | None:
            now = self.store.job(item.job_id).chain if tx is not None else state
            if now.status is Status.SUBMITTED and now.job.replicas:
                self.store.seat_relayed(item.job_id)  # a seat: resolved with its group
                self.count("results_relayed")
            elif now.status is Status.SUBMITTED:
                assert self._sender is not None
                window = self.challenge_window(self._sender)
                self.store.relayed(item.job_id, now.job.since + window)
                self.count("results_relayed")
            elif now.status not in (Status.DISPUTED, Status.RELEASED):
                # not assigned to the provider whose result this is (its assign never went
                # on-chain)
                raise ChainError(f"job is {now.status.name}", f"JobStatus({now.status.name})")
            return tx

        if state.status is Status.ASSIGNED:
            call = Call.job(
                "submitResultFor", state, p["output_cid"], bytes.fromhex(p["signature"][2:])
            )
            return _Step(call, after, self._moved_on(item, state.status))
        return _Step(None, after)

    def _finalize(self, item: OutboxItem) -> _Step:
        """Pay a result nobody disputed once the window has passed. A disputed one waits for
        the mediator (until ``mediationWindow`` passes unruled: then it stands and is paid); one
        ruled wrong is Funded again (nothing to send)."""
        state = self.store.job(item.job_id).chain

        def after(tx: str | None) -> str | None:
            if tx is not None or state.status is Status.RELEASED:
                self._paid(item, tx)
            return tx

        if state.status in (Status.SUBMITTED, Status.DISPUTED):
            return _Step(Call.job("finalize", state), after)
        return _Step(None, after)

    def _resolve(self, item: OutboxItem) -> _Step:
        """Resolve a replicated job (``payload.group``): pay the agreeing seats, slash the
        others. Nothing to send when no seat is open any more (resolved meanwhile, by anyone).
        Refused as too early while a seat may still deliver (``JobEscrowSeatsPending``: retried
        after the deadline) or while no majority agrees (``JobEscrowNoMajority``: the mediator
        may rule on the seats meanwhile; retried when the escrow lets anyone close it)."""
        group = str(item.payload["group"])
        seats = self.store.seats(group)
        k = seats[0].chain.job.replicas if seats else 0
        if not seats or len(seats) != k:
            raise ChainError(
                f"replicated job {group}: {len(seats)} of its {k} seats are known here",
                "SeatsUnknown",
            )
        if all(s.chain.status.terminal for s in seats):
            return _Step(None, _same)

        def after(tx: str | None) -> str | None:
            self.count("groups_resolved")
            return tx

        call = Call.resolve(bytes.fromhex(group[2:]), [s.chain for s in seats])
        return _Step(call, after, also=tuple(s.job_id for s in seats))

    def _unassign(self, item: OutboxItem) -> _Step:
        """Take the job back from ``provider`` (any provider when the row names none), once
        its hold is over (:meth:`_take_back_allowed`: until then the row waits, while the
        scheduler has moved the job on already)."""
        state = self.store.job(item.job_id).chain
        provider = item.payload.get("provider")
        if state.status is Status.ASSIGNED and (
            provider is None or state.job.provider.lower() == str(provider).lower()
        ):
            self._take_back_allowed(item, state)
            return _Step(Call.job("unassign", state), _same)
        return _Step(None, _same)

    def _paid(self, item: OutboxItem, tx: str | None) -> None:
        self.store.settled(item.job_id, detail=f"tx {tx}")
        self.count("jobs_paid")
