"""The attacks escrow version 5 closes, one test each (a row of docs/trust.md's roles table).

a. the operator takes a long run back before the provider's signed hold (``holdFor``) is over;
b. the operator and the submitter together: take back, then cancel, inside the hold;
c. the submitter cancels a seat of a replicated job, or the group once a seat was held;
d. the mediator rules a seat while a majority stands, while a seat still runs, or too late;
e. one wallet takes two seats of one replicated job (two votes);
f. a provider relaying its own result first sinks the operator's whole settle batch;
g. the owner swaps the operator between the submitter's look and its funding.

Real transactions on anvil (Ape); every job's state is folded from its events as the product
does, and ``isCurrent`` checks the fold against the contract's commitment.
"""

from __future__ import annotations

import os
from typing import Any

import ape
import pytest
from eth_account import Account

from gridmarket.escrow import JOB_EVENTS, ZERO_HASH, JobState, Status, apply_event

from .conftest import (
    BOUNTY,
    CHALLENGE,
    FEE_BPS,
    MEDIATION_WINDOW,
    ON_VERIFY,
    OUTPUT,
    REASSIGN_DELAY,
    SPEC,
    Book,
    v5_args,
)
from .test_replicas import OTHER, SHARE, create_group, deliver, resolve

HOLD = 4 * REASSIGN_DELAY
"""A long run: the provider signs for four times `reassignDelay` (inside the job's hour)."""
PAYOUT = BOUNTY - BOUNTY * FEE_BPS // 10_000
SEAT_PAYOUT = SHARE - SHARE * FEE_BPS // 10_000


@pytest.fixture
def third(accounts: Any, escrow: Any) -> Any:
    """A third staked provider (the spare account), with the collateral of two seats."""
    acct = accounts[9]
    if not escrow.providerOf(acct)[3]:
        escrow.registerProvider("bafkreithirdprovider", sender=acct, value=2 * SHARE)
    return acct


def fold_own(state: JobState, receipt: Any) -> JobState:
    """``state`` after the events of ``receipt`` that name its job (a batch holds others)."""
    for log in receipt.events:
        if log.event_name in JOB_EVENTS and bytes(log.jobId) == state.job_id:
            state = apply_event(state, log.event_name, dict(log.event_arguments))
    return state


def locked(escrow: Any, who: Any) -> int:
    return int(escrow.providerOf(who)[1])


# ----------------------------------------------------------------- a. the provider's hold
def test_a_long_run_is_not_taken_back_before_its_hold_and_is_paid(
    book: Book,
    escrow: Any,
    funded: JobState,
    operator: Any,
    provider: Any,
    provider2: Any,
    stranger: Any,
) -> None:
    """The provider signed for HOLD seconds (longer than reassignDelay): after reassignDelay the
    operator still cannot unassign or reassign (allowedAt is holdUntil), and the provider's own
    result, posted then, is paid."""
    state = book.assign(funded, provider, hold_for=HOLD)
    until = state.job.hold_until
    assert until == state.job.since + HOLD and book.current(state)
    book.sleep(REASSIGN_DELAY + 1)  # the old rule would let the operator take it now
    with ape.reverts(escrow.JobEscrowTooEarly, jobId=state.job_id, allowedAt=until):
        book.do("unassign", state, sender=operator)
    with ape.reverts(escrow.JobEscrowTooEarly, jobId=state.job_id, allowedAt=until):
        book.assign(state, provider2)
    before = escrow.balanceOf(provider)
    state = book.do("submitResult", state, OUTPUT, sender=provider)
    assert state.status is Status.SUBMITTED and state.job.hold_until == 0
    book.sleep(CHALLENGE)
    state = book.do("finalize", state, sender=stranger)
    assert state.status is Status.RELEASED and book.current(state)
    assert escrow.balanceOf(provider) - before == PAYOUT
    assert locked(escrow, provider) == 0


def test_after_the_hold_the_operator_may_take_back_and_the_provider_hands_back_any_time(
    book: Book,
    escrow: Any,
    funded: JobState,
    operator: Any,
    provider: Any,
    provider2: Any,
) -> None:
    state = book.assign(funded, provider, hold_for=HOLD)
    book.sleep(HOLD)
    state = book.do("unassign", state, sender=operator)  # the hold is over
    assert state.status is Status.FUNDED and locked(escrow, provider) == 0
    # the provider hands a job back at once, whatever hold it signed for
    state = book.assign(state, provider, hold_for=HOLD)
    state = book.do("unassign", state, sender=provider)
    assert state.status is Status.FUNDED and locked(escrow, provider) == 0 and book.current(state)
    # a hold of zero still gives the provider reassignDelay
    state = book.assign(state, provider2, hold_for=0)
    assert state.job.hold_until == state.job.since
    allowed = state.job.since + REASSIGN_DELAY
    with ape.reverts(escrow.JobEscrowTooEarly, jobId=state.job_id, allowedAt=allowed):
        book.do("unassign", state, sender=operator)
    book.sleep(REASSIGN_DELAY)
    state = book.assign(state, provider)  # reassigned once reassignDelay passed
    assert state.job.provider == provider.address and locked(escrow, provider2) == 0
    assert book.current(state)


# ----------------------------------------------------------------- b. operator + submitter
def test_the_operator_and_the_submitter_cannot_unassign_then_cancel_inside_the_hold(
    book: Book,
    escrow: Any,
    funded: JobState,
    operator: Any,
    submitter: Any,
    provider: Any,
) -> None:
    state = book.assign(funded, provider, hold_for=HOLD)
    book.sleep(REASSIGN_DELAY + 1)
    with ape.reverts(escrow.JobEscrowTooEarly, allowedAt=state.job.hold_until):
        book.do("unassign", state, sender=operator)
    with ape.reverts(escrow.JobEscrowWrongStatus, jobId=state.job_id, status=Status.ASSIGNED):
        book.do("cancel", state, sender=submitter)
    with ape.reverts(escrow.JobEscrowDeadlineNotPassed):
        book.do("refund", state, sender=submitter)
    # the provider still holds the job and can deliver it
    assert escrow.statusOf(state.job_id) == Status.ASSIGNED and book.current(state)
    state = book.do("submitResult", state, OUTPUT, sender=provider)
    assert state.status is Status.SUBMITTED


# ----------------------------------------------------------------- c. submitter and seats
def test_the_submitter_cancels_a_replicated_job_only_whole_and_only_before_any_seat_is_held(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
    stranger: Any,
    operator: Any,
) -> None:
    group, seats = create_group(book, submitter, 3)
    with ape.reverts(escrow.JobEscrowReplicated, jobId=seats[0].job_id):
        book.do("cancel", seats[0], sender=submitter)
    at = seats[0].job.deadline + MEDIATION_WINDOW
    for who in (stranger, operator, provider):
        with ape.reverts(escrow.JobEscrowNoMajority, groupId=group, resolvableAt=at):
            resolve(book, group, seats, who)
    before = escrow.balanceOf(submitter)
    seats, receipt = resolve(book, group, seats, submitter)
    (ev,) = [e for e in receipt.events if e.event_name == "Resolved"]
    assert (bytes(ev.resultDigest), ev.agreeing, ev.replicas) == (ZERO_HASH, 0, 3)
    assert [s.status for s in seats] == [Status.REFUNDED] * 3
    assert all(book.current(s) for s in seats)
    assert escrow.balanceOf(submitter) - before == 3 * SHARE


def test_once_a_seat_delivered_the_submitter_waits_for_the_mediation_window(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
) -> None:
    group, seats = create_group(book, submitter, 3)
    held = book.assign(seats[0], provider)
    at = seats[0].job.deadline + MEDIATION_WINDOW
    with ape.reverts(escrow.JobEscrowNoMajority, groupId=group, resolvableAt=at):
        resolve(book, group, [held, *seats[1:]], submitter)  # a seat is held: no cancel
    seats[0] = book.do("submitResult", held, OUTPUT, sender=provider)
    with ape.reverts(escrow.JobEscrowReplicated, jobId=seats[1].job_id):
        book.do("cancel", seats[1], sender=submitter)
    with ape.reverts(escrow.JobEscrowNoMajority, groupId=group, resolvableAt=at):
        resolve(book, group, seats, submitter)
    with ape.reverts(escrow.JobEscrowWrongStatus):
        book.do("refund", seats[0], sender=submitter)  # the delivered seat's share stays
    book.sleep(3600)  # past the deadline, inside the mediation window
    with ape.reverts(escrow.JobEscrowNoMajority, groupId=group, resolvableAt=at):
        resolve(book, group, seats, submitter)
    book.sleep(MEDIATION_WINDOW)
    stake = escrow.providerOf(provider)[0]
    before = escrow.balanceOf(submitter)
    seats, _ = resolve(book, group, seats, submitter)
    assert [s.status for s in seats] == [Status.REFUNDED] * 3
    assert escrow.balanceOf(submitter) - before == 3 * SHARE
    assert escrow.providerOf(provider)[0] == stake and locked(escrow, provider) == 0


# ----------------------------------------------------------------- d. mediator and seats
def test_the_mediator_cannot_rule_a_seat_of_a_majority(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
    provider2: Any,
    third: Any,
    mediator: Any,
) -> None:
    group, seats = create_group(book, submitter, 3)
    seats = [
        deliver(book, seats[0], provider, OUTPUT),
        deliver(book, seats[1], provider2, OUTPUT),
        deliver(book, seats[2], third, OTHER),
    ]
    for i in range(3):  # 2 of 3: neither side of the majority is the mediator's
        for upheld in (True, False):
            with ape.reverts(escrow.JobEscrowMajority, groupId=group):
                book.rule(seats[i], upheld, mediator, seats)
    group, seats = create_group(book, submitter, 3)
    seats = [
        deliver(book, seats[0], provider, OUTPUT),
        deliver(book, seats[1], provider2, OUTPUT),
        deliver(book, seats[2], third, OUTPUT),
    ]
    with ape.reverts(escrow.JobEscrowMajority, groupId=group):
        book.rule(seats[0], False, mediator, seats)  # 3 of 3


def test_the_mediator_cannot_rule_while_a_seat_runs_nor_after_the_window(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
    provider2: Any,
    mediator: Any,
) -> None:
    group, seats = create_group(book, submitter, 2, duration=7200)
    seats = [deliver(book, seats[0], provider, OUTPUT), book.assign(seats[1], provider2)]
    deadline = seats[0].job.deadline
    with ape.reverts(escrow.JobEscrowSeatsPending, groupId=group, deadline=deadline):
        book.rule(seats[0], False, mediator, seats)  # seat 1 may yet agree
    seats[1] = book.do("submitResult", seats[1], OTHER, sender=provider2)
    book.sleep(7200 + MEDIATION_WINDOW)
    closes = deadline + MEDIATION_WINDOW
    for i in range(2):
        with ape.reverts(
            escrow.JobEscrowChallengeWindowClosed, jobId=seats[i].job_id, closedAt=closes
        ):
            book.rule(seats[i], True, mediator, seats)


def test_a_tie_is_ruled_seat_by_seat_and_resolve_pays_each_seat_once(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
    provider2: Any,
    third: Any,
    mediator: Any,
    stranger: Any,
) -> None:
    group, seats = create_group(book, submitter, 2, duration=7200)
    seats = [deliver(book, seats[0], provider, OUTPUT), deliver(book, seats[1], provider2, OTHER)]
    with ape.reverts(escrow.JobEscrowReplicated, jobId=seats[0].job_id):
        escrow.rule(seats[0].job_id, [seats[0].job.as_tuple()], 0, True, sender=mediator)
    paid = escrow.balanceOf(provider)
    stake2 = escrow.providerOf(provider2)[0]
    seats[0] = book.rule(seats[0], True, mediator, seats)  # 1-1, all delivered: the mediator's
    assert seats[0].status is Status.RELEASED and book.current(seats[0])
    assert escrow.balanceOf(provider) - paid == SEAT_PAYOUT and locked(escrow, provider) == 0
    seats[1] = book.rule(seats[1], False, mediator, seats)  # still 1-1: the other side
    assert seats[1].status is Status.FUNDED and book.current(seats[1])
    assert escrow.providerOf(provider2)[0] == stake2 - SHARE and locked(escrow, provider2) == 0
    seats[1] = deliver(book, seats[1], third, OUTPUT)  # the tie-break run agrees with seat 0
    paid3 = escrow.balanceOf(third)
    fees = escrow.feesAccrued()
    seats, receipt = resolve(book, group, seats, stranger)
    assert [s.status for s in seats] == [Status.RELEASED, Status.RELEASED]
    assert all(book.current(s) for s in seats)
    released = [bytes(e.jobId) for e in receipt.events if e.event_name == "JobReleased"]
    assert released == [seats[1].job_id]  # seat 0 was paid by the ruling, not again
    assert escrow.balanceOf(provider) - paid == SEAT_PAYOUT
    assert escrow.balanceOf(third) - paid3 == SEAT_PAYOUT
    assert escrow.feesAccrued() - fees == SHARE - SEAT_PAYOUT
    for p in (provider, provider2, third):
        assert locked(escrow, p) == 0


# ----------------------------------------------------------------- e. one wallet, two seats
def test_one_wallet_cannot_take_a_second_seat_but_may_retake_its_own(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
    provider2: Any,
) -> None:
    group, seats = create_group(book, submitter, 3)
    seats[0] = book.assign(seats[0], provider)
    with ape.reverts(escrow.JobEscrowSeatTaken, groupId=group, provider=provider.address):
        book.assign(seats[1], provider)
    seats[0] = book.do("unassign", seats[0], sender=provider)  # handed back: still its seat
    with ape.reverts(escrow.JobEscrowSeatTaken, groupId=group, provider=provider.address):
        book.assign(seats[2], provider)
    seats[0] = book.assign(seats[0], provider)  # its own seat again
    assert seats[0].status is Status.ASSIGNED and book.current(seats[0])
    seats[1] = book.assign(seats[1], provider2)
    assert seats[1].job.provider == provider2.address and book.current(seats[1])


# ----------------------------------------------------------------- f. tryMulticall
def test_a_provider_relaying_first_does_not_sink_the_operators_try_batch(
    book: Book,
    escrow: Any,
    submitter: Any,
    operator: Any,
    provider: Any,
    provider2: Any,
) -> None:
    jobs = [
        book.assign(book.create(submitter, flags=ON_VERIFY), p)
        for p in (provider, provider2, provider)
    ]
    holders = [provider, provider2, provider]
    batch = [
        bytes(
            escrow.settle.encode_input(
                *v5_args("settle", s.job_id, s.job.as_tuple(), OUTPUT, book.sign(p, s))
            )
        )
        for s, p in zip(jobs, holders, strict=True)
    ]
    jobs[1] = book.do("submitResult", jobs[1], OUTPUT, sender=provider2)  # relayed itself first
    with ape.reverts(escrow.JobEscrowWrongStatus, jobId=jobs[1].job_id):
        escrow.multicall(batch, sender=operator)  # the plain batch: all or nothing
    assert [escrow.statusOf(s.job_id) for s in jobs] == [
        Status.ASSIGNED,
        Status.SUBMITTED,
        Status.ASSIGNED,
    ]
    assert list(escrow.tryMulticall.call(batch, sender=operator)) == [True, False, True]
    receipt = escrow.tryMulticall(batch, sender=operator)
    settled = [fold_own(s, receipt) for s in jobs]
    assert [s.status for s in settled] == [Status.RELEASED, Status.SUBMITTED, Status.RELEASED]
    assert all(book.current(s) for s in settled)
    assert [e.event_name for e in receipt.events].count("JobReleased") == 2


# ----------------------------------------------------------------- g. expected operator
def test_funding_names_the_operator_and_refuses_a_swapped_one(
    project: Any,
    book: Book,
    escrow: Any,
    owner: Any,
    operator: Any,
    submitter: Any,
) -> None:
    usd = project.TestUSD.deploy(sender=owner)
    escrow.setToken(usd, 10**6, sender=owner)
    usd.mint(submitter, 10**9, sender=owner)
    usd.approve(escrow, 10**9, sender=submitter)
    new = Account.create().address
    escrow.setOperator(new, sender=owner)  # between the submitter's look and its funding
    held, tokens, owed = escrow.balance, usd.balanceOf(submitter), escrow.balanceOf(submitter)
    deadline = book.chain.pending_timestamp + 3600
    with ape.reverts(escrow.JobEscrowOperatorChanged, expected=operator.address, operator=new):
        book.create(submitter, expected=operator)
    with ape.reverts(escrow.JobEscrowOperatorChanged, expected=operator.address, operator=new):
        escrow.createJob(
            os.urandom(32), SPEC, deadline, operator, book.mediator, SHARE, 0, 3,
            sender=submitter, value=3 * SHARE,
        )  # fmt: skip
    with ape.reverts(escrow.JobEscrowOperatorChanged, expected=operator.address, operator=new):
        escrow.createJobWith(
            usd, 10**7, os.urandom(32), SPEC, deadline, operator, book.mediator, 10**7, 0, 0,
            sender=submitter,
        )  # fmt: skip
    assert (escrow.balance, usd.balanceOf(submitter), escrow.balanceOf(submitter)) == (
        held,
        tokens,
        owed,
    )
    state = book.create(submitter, expected=new)  # naming the one in office funds the job
    assert state.job.operator == new and book.current(state)
