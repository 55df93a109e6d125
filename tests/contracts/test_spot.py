"""Spot-checked jobs (``FLAG_SPOT``): the check deposit locked at funding, the check the
mediator opens with ``dispute``, and where the deposit goes on every way a spot job can end.

Every path below ends with the escrow holding exactly what its open jobs and balances owe."""

from __future__ import annotations

from typing import Any

import ape

from gridmarket.escrow import FLAG_SPOT, Status, deposit_of, dispute_value

from .conftest import BOUNTY, CHALLENGE, FEE_BPS, MEDIATION_WINDOW, OUTPUT, STAKE, Book

FEE = BOUNTY * FEE_BPS // 10_000
PAYOUT = BOUNTY - FEE
ZERO = "0x0000000000000000000000000000000000000000"


def spot_job(book: Book, submitter: Any, **kw: Any) -> Any:
    return book.create(submitter, flags=FLAG_SPOT, **kw)


def submitted_spot(book: Book, submitter: Any, provider: Any) -> Any:
    state = book.assign(spot_job(book, submitter), provider)
    return book.do("submitResult", state, OUTPUT, sender=provider)


def credited(receipt: Any) -> list[tuple[str, int, str]]:
    return [(e.account, e.amount, e.reason) for e in receipt.events if e.event_name == "Credited"]


def test_funding_locks_bounty_and_check_deposit(book: Book, escrow: Any, submitter: Any) -> None:
    before = escrow.balance
    state = spot_job(book, submitter)
    assert state.job.bounty == BOUNTY and state.job.flags == FLAG_SPOT
    assert escrow.balance == before + 2 * BOUNTY
    assert escrow.depositOf(state.job.as_tuple()) == BOUNTY  # no floor: it is locked already
    assert deposit_of(BOUNTY, ZERO, 10**30, FLAG_SPOT) == BOUNTY
    assert dispute_value(BOUNTY, ZERO, 10**15, FLAG_SPOT) == 0


def test_odd_funding_and_mixed_flags_are_refused(
    book: Book, escrow: Any, chain: Any, submitter: Any, mediator: Any
) -> None:
    deadline = chain.pending_timestamp + 3600
    with ape.reverts(escrow.JobEscrowBountyNotDivisible, bounty=2 * BOUNTY + 1, replicas=2):
        escrow.createJob(
            b"\1" * 32,
            "bafkspec",
            deadline,
            mediator,
            BOUNTY,
            FLAG_SPOT,
            sender=submitter,
            value=2 * BOUNTY + 1,
        )
    # spot with on-verify (paid at once: no window to check in), or an unknown bit
    for flags in (FLAG_SPOT | 1, 0x20, FLAG_SPOT | 0x02):
        with ape.reverts(escrow.JobEscrowBadFlags, flags=flags):
            escrow.createJob(
                b"\2" * 32,
                "bafkspec",
                deadline,
                mediator,
                BOUNTY,
                flags,
                sender=submitter,
                value=2 * BOUNTY,
            )
    # a replicated job cannot be a spot job either
    with ape.reverts(escrow.JobEscrowBadFlags, flags=FLAG_SPOT):
        escrow.createReplicated(
            b"\3" * 32,
            "bafkspec",
            deadline,
            mediator,
            BOUNTY,
            FLAG_SPOT,
            2,
            sender=submitter,
            value=2 * BOUNTY,
        )


def test_unchecked_result_finalized_returns_the_deposit(
    book: Book, escrow: Any, submitter: Any, provider: Any, stranger: Any
) -> None:
    state = submitted_spot(book, submitter, provider)
    book.sleep(CHALLENGE)
    receipt = escrow.finalize(state.job_id, state.job.as_tuple(), sender=stranger)
    assert credited(receipt) == [(submitter.address, BOUNTY, "check deposit returned")]
    assert escrow.balanceOf(provider) == PAYOUT and escrow.balanceOf(submitter) == BOUNTY
    assert book.fold(state, receipt).status is Status.RELEASED


def test_submitter_release_returns_the_deposit(
    book: Book, escrow: Any, submitter: Any, provider: Any
) -> None:
    state = submitted_spot(book, submitter, provider)
    book.do("release", state, sender=submitter)
    assert escrow.balanceOf(submitter) == BOUNTY and escrow.balanceOf(provider) == PAYOUT


def test_cancel_and_refund_return_bounty_and_deposit(
    book: Book, escrow: Any, submitter: Any, provider: Any, stranger: Any
) -> None:
    book.do("cancel", spot_job(book, submitter), sender=submitter)
    assert escrow.balanceOf(submitter) == 2 * BOUNTY
    state = book.assign(spot_job(book, submitter, duration=120), provider)
    book.sleep(121)
    book.do("refund", state, sender=stranger)
    assert escrow.balanceOf(submitter) == 4 * BOUNTY
    assert escrow.providerOf(provider).locked == 0


def test_the_mediator_opens_a_check_sending_nothing(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
    mediator: Any,
    stranger: Any,
    operator: Any,
) -> None:
    state = submitted_spot(book, submitter, provider)
    # nobody else opens a check; the mediator sends no deposit (it is already locked)
    for who in (stranger, operator, provider):
        with ape.reverts(escrow.JobEscrowNotSubmitter):
            book.do("dispute", state, sender=who)
    with ape.reverts(escrow.JobEscrowWrongDeposit, sent=BOUNTY, deposit=0):
        book.do("dispute", state, sender=mediator, value=BOUNTY)
    held = escrow.balance
    state = book.do("dispute", state, sender=mediator)
    assert state.status is Status.DISPUTED and escrow.balance == held


def test_a_check_that_upholds_pays_the_rerun_from_the_deposit(
    book: Book, escrow: Any, submitter: Any, provider: Any, mediator: Any
) -> None:
    state = book.do("dispute", submitted_spot(book, submitter, provider), sender=mediator)
    receipt = escrow.rule(state.job_id, state.job.as_tuple(), True, sender=mediator)
    assert credited(receipt) == [(mediator.address, BOUNTY, "result upheld")]
    assert escrow.balanceOf(provider) == PAYOUT and escrow.balanceOf(submitter) == 0


def test_a_check_that_finds_a_lie_slashes_and_keeps_the_deposit_for_the_next_attempt(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
    provider2: Any,
    mediator: Any,
    stranger: Any,
) -> None:
    state = book.do("dispute", submitted_spot(book, submitter, provider), sender=mediator)
    receipt = escrow.rule(state.job_id, state.job.as_tuple(), False, sender=mediator)
    assert credited(receipt) == []  # the deposit stays: the job is a spot job again
    (slash,) = [e for e in receipt.events if e.event_name == "ProviderSlashed"]
    assert slash.amount == BOUNTY and slash.toMediator == BOUNTY  # the liar pays the re-run
    state = book.fold(state, receipt)
    assert state.status is Status.FUNDED
    assert escrow.providerOf(provider).stake == STAKE - BOUNTY
    assert escrow.balanceOf(mediator) == BOUNTY and escrow.balanceOf(submitter) == 0
    # the next attempt can be checked again, from the same deposit ...
    state = book.assign(state, provider2)
    state = book.do("submitResult", state, OUTPUT, sender=provider2)
    state = book.do("dispute", state, sender=mediator)
    # ... and an unruled check is finalized after the mediation window: deposit back once
    book.sleep(MEDIATION_WINDOW)
    receipt = escrow.finalize(state.job_id, state.job.as_tuple(), sender=stranger)
    assert credited(receipt) == [(submitter.address, BOUNTY, "deposit returned: no ruling")]
    assert escrow.balanceOf(provider2) == PAYOUT and escrow.balanceOf(submitter) == BOUNTY


def test_the_submitter_disputes_a_spot_job_from_the_locked_deposit(
    book: Book, escrow: Any, submitter: Any, provider: Any, mediator: Any
) -> None:
    state = submitted_spot(book, submitter, provider)
    with ape.reverts(escrow.JobEscrowWrongDeposit, sent=BOUNTY, deposit=0):
        book.do("dispute", state, sender=submitter, value=BOUNTY)
    state = book.do("dispute", state, sender=submitter)
    receipt = escrow.rule(state.job_id, state.job.as_tuple(), True, sender=mediator)
    assert credited(receipt) == [(mediator.address, BOUNTY, "result upheld")]


def test_an_own_check_ruling_without_a_dispute_returns_or_keeps_the_deposit(
    book: Book, escrow: Any, submitter: Any, provider: Any, provider2: Any, mediator: Any
) -> None:
    state = submitted_spot(book, submitter, provider)
    receipt = escrow.rule(state.job_id, state.job.as_tuple(), False, sender=mediator)
    assert credited(receipt) == []
    state = book.fold(state, receipt)
    assert escrow.balanceOf(submitter) == BOUNTY  # the collateral; the deposit stays locked
    state = book.do("submitResult", book.assign(state, provider2), OUTPUT, sender=provider2)
    receipt = escrow.rule(state.job_id, state.job.as_tuple(), True, sender=mediator)
    assert credited(receipt) == [(submitter.address, BOUNTY, "check deposit returned")]
    assert escrow.balanceOf(submitter) == 2 * BOUNTY and escrow.balanceOf(mediator) == 0


def test_the_escrow_holds_exactly_what_it_owes_after_every_spot_ending(
    book: Book, escrow: Any, submitter: Any, provider: Any, mediator: Any, stranger: Any
) -> None:
    start = escrow.balance
    state = book.do("dispute", submitted_spot(book, submitter, provider), sender=mediator)
    escrow.rule(state.job_id, state.job.as_tuple(), True, sender=mediator)
    owed = sum(escrow.balanceOf(a) for a in (submitter, provider, mediator)) + escrow.feesAccrued()
    assert escrow.balance - start == owed == 2 * BOUNTY
