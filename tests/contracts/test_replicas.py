"""Replicated jobs (escrow version 5): ``createJob`` with ``replicas`` funds k seats, ``assign``
gives each seat to its own wallet, ``resolve`` pays the seats whose results agree in a strict
majority and slashes the others.

Each test drives real transactions on anvil (Ape) and folds the events as the product does
(:func:`gridmarket.escrow.apply_event`); ``isCurrent`` then proves the fold matches the contract's
commitment for every seat.
"""

from __future__ import annotations

import os
from typing import Any

import ape
import pytest

from gridmarket.escrow import (
    JOB_EVENTS,
    ZERO_HASH,
    JobState,
    Status,
    apply_event,
    cid_digest,
    seat_ids,
)

from .conftest import FEE_BPS, MEDIATION_WINDOW, MIN_BOUNTY, OUTPUT, SPEC, Book

SHARE = 10**16
"""Each seat's share of the bounty, and the collateral each seat's provider locks."""
OTHER = "bafkreibm6jg3ux5qumhcn2b3flc3tyu6dmlb4xa7u5bf44yegnrjhc4yeq"
"""A well-formed CID that is not the honest output: what a cheater posts."""


def create_group(
    book: Book, submitter: Any, k: int, duration: int = 3600
) -> tuple[bytes, list[JobState]]:
    deadline = book.chain.pending_timestamp + duration
    receipt = book.escrow.createJob(
        os.urandom(32),
        SPEC,
        deadline,
        book.escrow.operator(),
        book.mediator,
        SHARE,
        0,
        k,
        sender=submitter,
        value=SHARE * k,
    )
    (group,) = [e for e in receipt.events if e.event_name == "ReplicasCreated"]
    seats = [
        apply_event(None, e.event_name, dict(e.event_arguments))
        for e in receipt.events
        if e.event_name == "JobCreated"
    ]
    return bytes(group.groupId), seats


def fold_all(seats: list[JobState], receipt: Any) -> list[JobState]:
    out = []
    for state in seats:
        for log in receipt.events:
            if log.event_name in JOB_EVENTS and bytes(log.jobId) == state.job_id:
                state = apply_event(state, log.event_name, dict(log.event_arguments))
        out.append(state)
    return out


def resolve(
    book: Book, group: bytes, seats: list[JobState], sender: Any
) -> tuple[list[JobState], Any]:
    receipt = book.escrow.resolve(group, [s.job.as_tuple() for s in seats], sender=sender)
    return fold_all(seats, receipt), receipt


def deliver(book: Book, seat: JobState, provider: Any, cid: str) -> JobState:
    return book.do("submitResult", book.assign(seat, provider), cid, sender=provider)


@pytest.fixture
def third(accounts: Any, escrow: Any) -> Any:
    """A fourth staked provider, registered here with the collateral of two seats."""
    acct = accounts[9]
    if not escrow.providerOf(acct)[3]:
        escrow.registerProvider("bafkreithirdprovider", sender=acct, value=2 * SHARE)
    return acct


def test_funding_makes_k_seats_with_derived_ids_and_an_equal_share(
    book: Book, submitter: Any
) -> None:
    group, seats = create_group(book, submitter, 3)
    assert [s.job_id for s in seats] == seat_ids(group, 3)
    for s in seats:
        assert s.status is Status.FUNDED and s.job.bounty == SHARE and s.job.replicas == 3
        assert s.salt == group
        assert book.current(s)


@pytest.mark.parametrize("replicas", [1, 6])
def test_replica_counts_outside_two_to_five_are_refused(
    book: Book, escrow: Any, submitter: Any, replicas: int
) -> None:
    """Zero replicas funds a single job (createJob's plain form); 1 and 6 are refused."""
    with ape.reverts(escrow.JobEscrowBadReplicas, replicas=replicas):
        escrow.createJob(
            os.urandom(32),
            SPEC,
            book.chain.pending_timestamp + 3600,
            escrow.operator(),
            book.mediator,
            SHARE,
            0,
            replicas,
            sender=submitter,
            value=SHARE * 6,
        )


def test_bad_replicated_funding_is_refused_naming_what_is_wrong(
    book: Book, escrow: Any, submitter: Any
) -> None:
    deadline = book.chain.pending_timestamp + 3600
    op = escrow.operator()

    def fund(value: int, collateral: int = SHARE, flags: int = 0) -> None:
        escrow.createJob(
            os.urandom(32), SPEC, deadline, op, book.mediator, collateral, flags, 3,
            sender=submitter, value=value,
        )  # fmt: skip

    with ape.reverts(escrow.JobEscrowBountyNotDivisible, bounty=SHARE * 3 + 1, replicas=3):
        fund(SHARE * 3 + 1)
    with ape.reverts(escrow.JobEscrowBadFlags, flags=1):
        fund(SHARE * 3, flags=1)  # never paid on the operator's check
    with ape.reverts(escrow.JobEscrowBountyTooLow):
        fund((MIN_BOUNTY - 1) * 3)  # each seat's share is a bounty of its own
    with ape.reverts(escrow.JobEscrowCollateralTooLow, collateral=SHARE - 1, minCollateral=SHARE):
        fund(SHARE * 3, collateral=SHARE - 1)
    with ape.reverts(escrow.JobEscrowBadFlags, flags=2):
        escrow.createJob(
            os.urandom(32), SPEC, deadline, op, book.mediator, SHARE, 2, 0,
            sender=submitter, value=SHARE,
        )  # fmt: skip  # a single job cannot claim to be a seat


def test_two_of_three_agree_the_majority_is_paid_and_the_liar_slashed(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
    provider2: Any,
    third: Any,
    stranger: Any,
) -> None:
    group, seats = create_group(book, submitter, 3)
    seats = [
        deliver(book, seats[0], provider, OUTPUT),
        deliver(book, seats[1], provider2, OUTPUT),
        deliver(book, seats[2], third, OTHER),
    ]
    before = {a: escrow.balanceOf(a) for a in (provider, provider2, third, submitter)}
    stake = escrow.providerOf(third)[0]
    seats, receipt = resolve(book, group, seats, stranger)  # anyone may resolve

    (ev,) = [e for e in receipt.events if e.event_name == "Resolved"]
    assert (bytes(ev.resultDigest), ev.agreeing, ev.replicas) == (cid_digest(OUTPUT), 2, 3)
    assert [s.status for s in seats] == [Status.RELEASED, Status.RELEASED, Status.REFUNDED]
    assert all(book.current(s) for s in seats)
    payout = SHARE - SHARE * FEE_BPS // 10_000
    assert escrow.balanceOf(provider) - before[provider] == payout
    assert escrow.balanceOf(provider2) - before[provider2] == payout
    assert escrow.balanceOf(third) == before[third]
    # the liar's collateral and its seat's share go to the submitter
    assert escrow.balanceOf(submitter) - before[submitter] == SHARE + SHARE
    assert escrow.providerOf(third)[0] == stake - SHARE
    slashes = [e for e in receipt.events if e.event_name == "ProviderSlashed"]
    (slash,) = [dict(e.event_arguments) for e in slashes]
    assert (slash["provider"], bytes(slash["jobId"]), slash["amount"], slash["toMediator"]) == (
        third.address,
        seats[2].job_id,
        SHARE,
        0,
    )
    assert escrow.freeCollateralOf(provider) == escrow.providerOf(provider)[0]
    with ape.reverts(escrow.JobEscrowWrongStatus):
        resolve(book, group, seats, stranger)  # once


def test_resolve_waits_for_every_seat_until_the_deadline(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
    provider2: Any,
    third: Any,
    stranger: Any,
) -> None:
    group, seats = create_group(book, submitter, 3, duration=600)
    seats = [
        deliver(book, seats[0], provider, OUTPUT),
        deliver(book, seats[1], provider2, OUTPUT),
        book.assign(seats[2], third),  # still running
    ]
    deadline = seats[0].job.deadline
    with ape.reverts(escrow.JobEscrowSeatsPending, groupId=group, deadline=deadline):
        resolve(book, group, seats, stranger)
    book.sleep(601)
    stake = escrow.providerOf(third)[0]
    seats, _ = resolve(book, group, seats, stranger)
    assert [s.status for s in seats] == [Status.RELEASED, Status.RELEASED, Status.REFUNDED]
    assert all(book.current(s) for s in seats)
    # the seat that never delivered is refunded, its provider unlocked and not slashed
    assert escrow.providerOf(third)[0] == stake
    assert escrow.freeCollateralOf(third) == stake


def test_a_tie_goes_to_the_mediator_whose_ruling_reopens_the_wrong_seat_for_a_rerun(
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
    at = seats[0].job.deadline + MEDIATION_WINDOW
    with ape.reverts(escrow.JobEscrowNoMajority, groupId=group, resolvableAt=at):
        resolve(book, group, seats, stranger)
    with ape.reverts(escrow.JobEscrowNotMediator):
        book.rule(seats[1], False, stranger, seats)
    book.sleep(3601)  # past the challenge window: a seat's ruling is not bound by it
    stake = escrow.providerOf(provider2)[0]
    seats[1] = book.rule(seats[1], False, mediator, seats)
    assert seats[1].status is Status.FUNDED and book.current(seats[1])
    assert escrow.providerOf(provider2)[0] == stake - SHARE
    seats[1] = deliver(book, seats[1], third, OUTPUT)  # the tie-break run
    seats, _ = resolve(book, group, seats, stranger)
    assert [s.status for s in seats] == [Status.RELEASED, Status.RELEASED]
    assert all(book.current(s) for s in seats)


def test_no_majority_and_no_ruling_refunds_every_open_seat_without_slashing(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
    provider2: Any,
    stranger: Any,
) -> None:
    group, seats = create_group(book, submitter, 2, duration=600)
    seats = [deliver(book, seats[0], provider, OUTPUT), deliver(book, seats[1], provider2, OTHER)]
    stakes = [escrow.providerOf(p)[0] for p in (provider, provider2)]
    before = escrow.balanceOf(submitter)
    book.sleep(600 + MEDIATION_WINDOW + 1)
    seats, receipt = resolve(book, group, seats, stranger)
    (ev,) = [e for e in receipt.events if e.event_name == "Resolved"]
    assert (bytes(ev.resultDigest), ev.agreeing) == (ZERO_HASH, 0)
    assert [s.status for s in seats] == [Status.REFUNDED, Status.REFUNDED]
    assert all(book.current(s) for s in seats)
    assert [escrow.providerOf(p)[0] for p in (provider, provider2)] == stakes
    assert escrow.balanceOf(submitter) - before == 2 * SHARE


def test_one_wallet_never_holds_two_seats_so_a_seat_is_a_vote(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
    provider2: Any,
    third: Any,
    stranger: Any,
) -> None:
    """The operator cannot give a second seat to one wallet (it would vote twice): since
    version 5 ``assign`` refuses it, so ``resolve`` counts each seat once."""
    group, seats = create_group(book, submitter, 3)
    first = deliver(book, seats[0], provider, OTHER)
    with ape.reverts(escrow.JobEscrowSeatTaken, groupId=group, provider=provider.address):
        book.assign(seats[1], provider)
    seats = [
        first,
        deliver(book, seats[1], provider2, OUTPUT),
        deliver(book, seats[2], third, OUTPUT),
    ]
    before = escrow.balanceOf(provider2)
    seats, _ = resolve(book, group, seats, stranger)
    assert [s.status for s in seats] == [Status.REFUNDED, Status.RELEASED, Status.RELEASED]
    assert escrow.balanceOf(provider2) - before == SHARE - SHARE * FEE_BPS // 10_000
    assert all(book.current(s) for s in seats)


def test_a_seat_the_submitter_already_paid_counts_for_its_result(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
    provider2: Any,
    third: Any,
    stranger: Any,
) -> None:
    group, seats = create_group(book, submitter, 3)
    seats = [
        deliver(book, seats[0], provider, OUTPUT),
        deliver(book, seats[1], provider2, OUTPUT),
        deliver(book, seats[2], third, OTHER),
    ]
    seats[0] = book.do("release", seats[0], sender=submitter)  # the submitter's own consent
    seats, _ = resolve(book, group, seats, stranger)
    assert [s.status for s in seats] == [Status.RELEASED, Status.RELEASED, Status.REFUNDED]
    assert all(book.current(s) for s in seats)


def test_seats_are_paid_only_by_resolve_the_submitter_or_a_ruling(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
    provider2: Any,
    operator: Any,
    stranger: Any,
) -> None:
    _, seats = create_group(book, submitter, 2, duration=7200)
    seat = deliver(book, seats[0], provider, OUTPUT)
    with ape.reverts(escrow.JobEscrowNotAllowed):
        book.do("release", seat, sender=operator)  # never on the operator's check
    with ape.reverts(escrow.JobEscrowReplicated, jobId=seat.job_id):
        deposit = int(escrow.depositOf(seat.job.as_tuple()))  # the seat's bounty
        book.do("dispute", seat, sender=submitter, value=deposit)
    other = book.assign(seats[1], provider2)
    book.sleep(3601)
    with ape.reverts(escrow.JobEscrowReplicated, jobId=seat.job_id):
        book.do("finalize", seat, sender=stranger)  # the window alone proves nothing
    sig = book.sign(provider2, other)
    with ape.reverts(escrow.JobEscrowNotOnVerify):
        book.do("settle", other, OUTPUT, sig, sender=operator)


def test_resolve_checks_every_seat_struct_and_order(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
    provider2: Any,
    stranger: Any,
) -> None:
    group, seats = create_group(book, submitter, 2)
    seats = [deliver(book, seats[0], provider, OUTPUT), deliver(book, seats[1], provider2, OUTPUT)]
    with ape.reverts(escrow.JobEscrowJobMismatch, jobId=seats[0].job_id):
        resolve(book, group, [seats[1], seats[0]], stranger)
    with ape.reverts(escrow.JobEscrowBadReplicas):
        resolve(book, group, seats[:1], stranger)
    with ape.reverts(escrow.JobEscrowBadReplicas):
        resolve(book, group, [*seats, seats[1]], stranger)
    _, other = create_group(book, submitter, 2)
    with ape.reverts(escrow.JobEscrowJobMismatch):
        resolve(book, group, [seats[0], other[1]], stranger)  # a seat of another group
    seats, _ = resolve(book, group, seats, stranger)
    assert [s.status for s in seats] == [Status.RELEASED, Status.RELEASED]
