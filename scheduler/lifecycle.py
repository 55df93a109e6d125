"""A job's life in the scheduler as plain data: its states, the events that move it, and the
table of which event may move a job in which state, and to what.

Pure: no I/O, no database. The store (``scheduler/store/``) persists what this table decides:
before it writes a new state it asks :func:`step` (or, for a conditional SQL update, takes the
states :func:`sources` names for its ``WHERE state IN (...)``); it never decides a transition
on its own. docs/scheduler.md draws the same table (:func:`markdown_table`, checked by
tests/scheduler/test_lifecycle.py).

A new state (disputes, replicas, verification policies, reorg rollbacks) is a member of
:class:`State`, its events members of :class:`Event`, and its moves rows of :data:`TABLE`.

This is the scheduler's view of a job. The escrow's own state machine (``Funded -> Assigned ->
Submitted -> Released``, with ``Disputed`` and a mediator's ruling; the source of truth for money)
lives in :mod:`gridmarket.escrow`; its events reach this table through :data:`CHAIN_EVENTS` (and
:func:`chain_event`, which tells a ruling against the result from one that upholds it).

Escrow version 2 (docs/trust.md): a lease is an *offer* until the node signs its acceptance of
the job's terms (``API.ACCEPT``); only then does the outbox assign it on-chain. A verified result
of an on-verify job is paid at once (``settle``); any other is relayed (``submitResultFor``) and
finalized once the challenge window has passed. A result failing the scheduler's check is not
relayed: the job is taken back (``unassign``, once the hold is over) and goes to another wallet.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gridmarket.wire import RunReason

__all__ = [
    "CHAIN_EVENTS",
    "FAULTS",
    "FOLD_ONLY",
    "HOLDS_SLOT",
    "OPEN",
    "SPEC_GIVE_UP_S",
    "SPEC_MIN_TRIES",
    "TABLE",
    "Event",
    "Fault",
    "RefusedError",
    "State",
    "Transition",
    "assign_refusal",
    "chain_event",
    "fault_of",
    "faults_table",
    "markdown_table",
    "on_requeue",
    "run_failed",
    "sources",
    "spec_retry_in",
    "step",
    "target",
]


class State(StrEnum):
    """What the scheduler is doing about a job (``jobs.state``)."""

    PENDING_SPEC = "pending_spec"
    """Seen on-chain; its spec is being fetched from IPFS."""
    QUEUED = "queued"
    """Waiting for a node."""
    LEASED = "leased"
    """Offered to a node (until it accepts, within the lease TTL), then running on it; the node
    renews the lease with heartbeats."""
    VERIFYING = "verifying"
    """The node reported an output; the verifier checks it."""
    SETTLING = "settling"
    """Verified: the outbox pays it (``settle``/``release``, on-verify jobs) or relays it
    (``submitResultFor``) and finalizes it once the challenge window has passed."""
    DISPUTED = "disputed"
    """A result on-chain waits for the job's mediator: the submitter disputed it, or the provider
    posted one itself that the scheduler's check failed (the scheduler does not finalize it; the
    submitter may dispute it within the window)."""
    RELEASED = "released"
    """Paid on-chain. Final."""
    REFUNDED = "refunded"
    """Refunded to the submitter on-chain. Final."""
    EXPIRED = "expired"
    """The deadline passed before a result: the submitter can refund."""
    FAILED = "failed"
    """Given up: attempts used up, the job's own run failed (its spec cannot run), or an
    on-chain step refused for good."""
    INVALID = "invalid"
    """The spec is missing or malformed: the submitter can cancel."""


class Event(StrEnum):
    """What happens to a job. ``chain:`` events are the escrow's, folded by the watcher (or from
    our own receipts); the others are the scheduler's own observations and decisions."""

    CREATED = "chain:JobCreated"
    SUBMITTED_ON_CHAIN = "chain:ResultSubmitted"
    """The provider submitted its result on-chain itself."""
    DISPUTED_ON_CHAIN = "chain:ResultDisputed"
    """The submitter disputed the pending result: the job's mediator rules on it."""
    RULED_AGAINST = "chain:Ruled"
    """The mediator ruled the result wrong (``upheld`` false): the provider lost the job's
    collateral and the job is Funded again. (A ruling that upholds it is followed by
    ``JobReleased`` in the same transaction.)"""
    RELEASED_ON_CHAIN = "chain:JobReleased"
    REFUNDED_ON_CHAIN = "chain:JobRefunded"
    SPEC_FETCHED = "spec fetched"
    SPEC_INVALID = "spec invalid"
    LEASE_GRANTED = "lease granted"
    """A dispatch round offered the job to a node with a free slot (nothing on-chain yet)."""
    ACCEPTED = "accepted"
    """The node signed its acceptance of the job's terms for this attempt (``API.ACCEPT``)."""
    LEASE_LOST = "lease lost"
    """The lease ran out (an offer not accepted in time too), or the node went offline."""
    HANDED_BACK = "hand back"
    """The node gave the job back unfinished (clean shutdown), or declined the offer: no
    penalty."""
    RESULT_REPORTED = "result reported"
    """The node reported a successful run with an output CID."""
    RUN_FAILED = "run failed"
    """The node reported a failed run that is the node's fault (agent error, timeout, ...:
    :func:`fault_of`)."""
    JOB_FAILED = "job failed"
    """The node reported a failed run that is the job's own fault (its command exited non-zero,
    went over its own memory or output cap, trapped, its image or dataset is bad: :func:`fault_of`).
    Deterministic: no other node would do better."""
    ASSIGN_REFUSED = "assign refused"
    """The provider cannot take the job (its free collateral is below the job's), or the
    on-chain assign reverted for a reason that may pass: the job goes to another wallet, no fault
    of the node."""
    ASSIGN_REFUSED_FOR_GOOD = "assign refused for good"
    """The on-chain assign reverted because of the job itself (deadline, status)."""
    VERDICT_OK = "verdict ok"
    VERDICT_BAD = "verdict bad"
    """The reported output failed the scheduler's check (never relayed)."""
    VERDICT_BAD_POSTED = "verdict bad, posted"
    """The output the provider posted on-chain itself failed the scheduler's check: it cannot
    be taken back; only the submitter (dispute) and the mediator (ruling) can stop it."""
    PAID = "paid"
    """The outbox's settle/release/finalize went through."""
    DEADLINE_PASSED = "deadline passed"
    ATTEMPTS_USED_UP = "attempts used up"
    GIVEN_UP = "given up"
    """An on-chain step the job needs was refused for good."""


CHAIN_EVENTS: dict[str, Event] = {
    "JobCreated": Event.CREATED,
    "ResultSubmitted": Event.SUBMITTED_ON_CHAIN,
    "ResultDisputed": Event.DISPUTED_ON_CHAIN,
    "Ruled": Event.RULED_AGAINST,
    "JobReleased": Event.RELEASED_ON_CHAIN,
    "JobRefunded": Event.REFUNDED_ON_CHAIN,
}
"""Escrow events that move the scheduler's state, by their name on-chain (``Ruled`` only when
the result was not upheld: :func:`chain_event`)."""

FOLD_ONLY: frozenset[str] = frozenset({"JobAssigned", "JobUnassigned"})
"""Escrow events that only update the job's on-chain struct: they follow steps the scheduler
took itself (through the outbox), so its state has already moved."""

OPEN: tuple[State, ...] = (
    State.PENDING_SPEC,
    State.QUEUED,
    State.LEASED,
    State.VERIFYING,
    State.SETTLING,
    State.DISPUTED,
)
"""States the scheduler still works on; the others are final for it."""

HOLDS_SLOT: tuple[State, ...] = (State.LEASED, State.VERIFYING)
"""States in which the job holds a slot of its node (``nodes.running``): the node's work ends
with its verdict, so a result waiting out the challenge window does not keep the node busy."""


def chain_event(name: str, args: Any) -> Event | None:
    """The table's event for the escrow event ``name`` with ``args``; None for one that only
    updates the struct (:data:`FOLD_ONLY`, a ruling that upheld the result, any other)."""
    if name == "Ruled" and args["upheld"]:
        return None  # JobReleased follows in the same transaction
    return CHAIN_EVENTS.get(name)


_ALL = tuple(State)


@dataclass(frozen=True, slots=True)
class Transition:
    """One row: ``event`` moves a job in ``source`` (None: not yet known) to ``target``."""

    source: State | None
    event: Event
    target: State
    why: str


def _rows(sources: Iterable[State], event: Event, target: State, why: str) -> list[Transition]:
    return [Transition(s, event, target, why) for s in sources]


S, E = State, Event
TABLE: tuple[Transition, ...] = (
    Transition(None, E.CREATED, S.PENDING_SPEC, "funded on-chain; fetch the spec"),
    Transition(S.PENDING_SPEC, E.SPEC_FETCHED, S.QUEUED, "spec valid: wait for a node"),
    Transition(S.PENDING_SPEC, E.SPEC_INVALID, S.INVALID, "the submitter can cancel"),
    Transition(
        S.QUEUED,
        E.SPEC_INVALID,
        S.INVALID,
        "never offered yet: a spot job whose commitment an earlier job holds (its spec read "
        "later); the submitter can cancel",
    ),
    Transition(
        S.QUEUED,
        E.LEASE_GRANTED,
        S.LEASED,
        "an offer: the node accepts (signed) within the lease TTL, or loses it",
    ),
    Transition(
        S.LEASED,
        E.ACCEPTED,
        S.LEASED,
        "outbox: assign on-chain with the acceptance (waits while the last hold lasts)",
    ),
    Transition(S.LEASED, E.RESULT_REPORTED, S.VERIFYING, "check the output"),
    Transition(S.LEASED, E.SUBMITTED_ON_CHAIN, S.VERIFYING, "check it like a relayed result"),
    Transition(
        S.LEASED,
        E.RUN_FAILED,
        S.QUEUED,
        "another wallet; the node loses reputation (a timeout: once the job is done elsewhere)",
    ),
    Transition(
        S.LEASED,
        E.JOB_FAILED,
        S.FAILED,
        "no other node, no reputation loss; outbox: unassign, the submitter can cancel",
    ),
    Transition(
        S.LEASED,
        E.LEASE_LOST,
        S.QUEUED,
        "another wallet; the node loses reputation; outbox: unassign (once the hold is over)",
    ),
    Transition(
        S.LEASED,
        E.HANDED_BACK,
        S.QUEUED,
        "no penalty; accepted: outbox unassign (any wallet may take it); an offer declined: "
        "not to that node again",
    ),
    Transition(S.LEASED, E.ASSIGN_REFUSED, S.QUEUED, "another wallet, no fault of this node"),
    Transition(S.LEASED, E.ASSIGN_REFUSED_FOR_GOOD, S.FAILED, "the chain will not take it"),
    Transition(
        S.VERIFYING,
        E.VERDICT_OK,
        S.SETTLING,
        "outbox: settle/release (on-verify), else relay and finalize after the challenge window",
    ),
    Transition(
        S.VERIFYING,
        E.VERDICT_BAD,
        S.QUEUED,
        "not relayed; another wallet, a node fault; outbox: unassign (once the hold is over)",
    ),
    Transition(
        S.VERIFYING,
        E.VERDICT_BAD_POSTED,
        S.DISPUTED,
        "not finalized by the scheduler; the submitter may dispute, the mediator rules",
    ),
    *_rows(
        (S.VERIFYING, S.SETTLING),
        E.DISPUTED_ON_CHAIN,
        S.DISPUTED,
        "no finalize: the mediator rules (or its window passes)",
    ),
    *_rows(
        (S.VERIFYING, S.SETTLING, S.DISPUTED),
        E.RULED_AGAINST,
        S.QUEUED,
        "the provider was slashed; another wallet, its node takes a node fault",
    ),
    Transition(S.SETTLING, E.PAID, S.RELEASED, "the node gains reputation"),
    Transition(
        S.QUEUED, E.ATTEMPTS_USED_UP, S.FAILED, "(on a requeue) outbox: unassign; cancel at once"
    ),
    *_rows(
        (S.PENDING_SPEC, S.QUEUED, S.LEASED),
        E.DEADLINE_PASSED,
        S.EXPIRED,
        "the submitter can refund",
    ),
    *_rows(OPEN, E.GIVEN_UP, S.FAILED, "an on-chain step refused for good"),
    *_rows(
        [s for s in _ALL if s not in (S.RELEASED, S.REFUNDED)],
        E.RELEASED_ON_CHAIN,
        S.RELEASED,
        "paid on-chain, by whoever sent it",
    ),
    *_rows(
        [s for s in _ALL if s not in (S.RELEASED, S.REFUNDED)],
        E.REFUNDED_ON_CHAIN,
        S.REFUNDED,
        "refunded on-chain",
    ),
)
"""Every move a job can make. A pair (state, event) not in here is refused."""

_BY_PAIR: dict[tuple[State | None, Event], Transition] = {}
for _t in TABLE:
    if (_t.source, _t.event) in _BY_PAIR:
        raise AssertionError(f"two rows for {_t.source} + {_t.event}")
    _BY_PAIR[(_t.source, _t.event)] = _t


class RefusedError(ValueError):
    """The table has no row for this (state, event)."""


def target(state: State | str | None, event: Event) -> State | None:
    """The state ``event`` moves a job in ``state`` to, or None when the table has no such row."""
    t = _BY_PAIR.get((None if state is None else State(state), event))
    return None if t is None else t.target


def step(state: State | str | None, event: Event) -> State:
    """Like :func:`target`, but a pair the table does not allow raises :class:`RefusedError`."""
    new = target(state, event)
    if new is None:
        raise RefusedError(f"a job in state {state} cannot take event {event.value!r}")
    return new


def sources(event: Event) -> tuple[State, ...]:
    """The states ``event`` may move a job from (for ``WHERE state IN (...)``), in table order."""
    return tuple(t.source for t in TABLE if t.event is event and t.source is not None)


def on_requeue(*, failures: int, max_attempts: int, deadline_passed: bool) -> Event | None:
    """What a job meets on its way back to the queue: it fails when its failed attempts reach
    ``max_attempts``, expires when its deadline has passed; None: it waits for a node."""
    if failures >= max_attempts:
        return Event.ATTEMPTS_USED_UP
    if deadline_passed:
        return Event.DEADLINE_PASSED
    return None


def assign_refusal(error: str) -> Event:
    """Which refusal a reverted assign is: a revert about the job itself (its deadline, its
    on-chain status) is for good; anything else may pass with another node."""
    if "Deadline" in error or "Status" in error:
        return Event.ASSIGN_REFUSED_FOR_GOOD
    return Event.ASSIGN_REFUSED


class Fault(StrEnum):
    """Whose fault a failed run is."""

    NODE = "node"
    """The node's: the job goes to another wallet and the node loses reputation."""
    NODE_IF_IT_FITS = "node, once the job is done elsewhere"
    """The node's if the job fits, which only another node can show: the job goes to another
    wallet, and the node loses reputation when (if) the job is paid to someone else. A job
    that never ends in time anywhere (``sleep`` forever) costs nobody reputation."""
    JOB = "job"
    """The job's own (its spec): it fails at once, the node keeps its reputation."""


FAULTS: dict[RunReason, tuple[Fault, str]] = {
    RunReason.EXIT_CODE: (Fault.JOB, "the submitter's command exited non-zero"),
    RunReason.OUT_OF_MEMORY: (Fault.JOB, "killed at the job's own memory limit"),
    RunReason.OUTPUT_TOO_LARGE: (Fault.JOB, "the output is over the job's own cap"),
    RunReason.OUTPUT_INVALID: (Fault.JOB, "the job wrote what cannot be uploaded (symlinks, ...)"),
    RunReason.TRAPPED: (Fault.JOB, "the WASM module trapped"),
    RunReason.DATASET_ERROR: (Fault.JOB, "the dataset is missing, fails its CID or is over cap"),
    RunReason.WORKLOAD_ERROR: (
        Fault.JOB,
        "image missing or invalid, its registry unreachable, unknown or refused (loopback, "
        "private, metadata addresses), WASM module missing or invalid; but a node that lacks "
        "the executor or the GPUs it advertised, or refuses an image by its own policy (size "
        "cap, registry list, credentials), is the node's fault",
    ),
    RunReason.TIMEOUT: (
        Fault.NODE_IF_IT_FITS,
        "not done within the job's time limit: the node's if another node does it in time; "
        "out of WASM fuel (the job's own budget) is the job's fault",
    ),
    RunReason.AGENT_ERROR: (
        Fault.NODE,
        "the agent itself failed (IPFS down, engine gone, a pull past its time limit, ...)",
    ),
    RunReason.CANCELLED: (Fault.NODE, "the agent stopped the run"),
    RunReason.SUCCEEDED: (Fault.NODE, "a success reported without an output CID"),
}
"""Whose fault each reported :class:`~gridmarket.wire.RunReason` is (docs/matching.md). Lost
leases and outputs that fail verification are always the node's (:data:`TABLE`)."""

# The agent reports these node-side problems as workload_error / timeout (agent/runner.py,
# agent/executors/): told apart by their message until the wire names them.
_NODE_WORKLOAD = ("this node does not run", "GPU(s) and the engine cannot provide them")
_JOB_TIMEOUT = ("ran out of fuel",)


def fault_of(reason: RunReason, message: str = "") -> Fault:
    """Whose fault a failed run with ``reason`` (and the agent's ``message``) is: :data:`FAULTS`,
    with the two exceptions it names."""
    fault = FAULTS[reason][0]
    if reason is RunReason.WORKLOAD_ERROR and any(m in message for m in _NODE_WORKLOAD):
        return Fault.NODE
    if reason is RunReason.TIMEOUT and any(m in message for m in _JOB_TIMEOUT):
        return Fault.JOB
    return fault


def run_failed(reason: RunReason, message: str = "") -> Event:
    """The event a failed run is: :attr:`Event.JOB_FAILED` when it is the job's own fault, else
    :attr:`Event.RUN_FAILED` (the node's, now or once the job is done elsewhere)."""
    return Event.JOB_FAILED if fault_of(reason, message) is Fault.JOB else Event.RUN_FAILED


SPEC_GIVE_UP_S = 120.0
"""A spec IPFS cannot give within this many seconds of the job's creation makes it invalid..."""
SPEC_MIN_TRIES = 3
"""... once it has been tried this many times (a leader back from a long absence still tries)."""


def spec_retry_in(tries: int, age_s: float) -> float | None:
    """After ``tries`` failed fetches of a job's spec, the job ``age_s`` seconds old: seconds
    until the next try (1, 2, 4, ... 30), or None to give up (the job goes ``invalid``)."""
    if age_s >= SPEC_GIVE_UP_S and tries >= SPEC_MIN_TRIES:
        return None
    return min(30.0, 2.0 ** max(0, tries - 1))


def faults_table() -> str:
    """:data:`FAULTS` for docs/scheduler.md and docs/matching.md."""
    lines = ["| run reason | whose fault | why |", "| --- | --- | --- |"]
    for reason, (fault, why) in FAULTS.items():
        lines.append(f"| `{reason.value}` | {fault.value} | {why} |")
    return "\n".join(lines) + "\n"


def markdown_table() -> str:
    """The table for docs/scheduler.md: one line per (event, target), its source states joined."""
    groups: dict[tuple[Event, State, str], list[str]] = {}
    for t in TABLE:
        key = (t.event, t.target, t.why)
        groups.setdefault(key, []).append("(new)" if t.source is None else f"`{t.source}`")
    lines = ["| from | event | to | what follows |", "| --- | --- | --- | --- |"]
    for (event, to, why), froms in groups.items():
        lines.append(f"| {', '.join(froms)} | {event.value} | `{to}` | {why} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m scheduler.lifecycle [faults]: the tables for docs/
    print(faults_table() if sys.argv[1:] == ["faults"] else markdown_table(), end="")
