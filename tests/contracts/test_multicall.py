"""``JobEscrow.multicall``: several calls of the escrow in one transaction, each a delegatecall
to the escrow itself with the caller's identity (the scheduler batches its operator steps).

What must hold: a batch does what its calls do one by one and emits the same events (which fold
to the stored state); it takes no ETH, so no payable call inside can count a deposit twice; a
call that reverts reverts the batch with that call's error and nothing of the batch stays; the
withdraw guard still stops reentrancy through a batch; and every call's own role check sees the
real caller, so only a job's operator passes the operator checks inside a batch.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import ape
from eth_utils.crypto import keccak

from gridmarket.escrow import JOB_EVENTS, JobState, Status, apply_event

from .conftest import BOUNTY, FEE_BPS, ON_VERIFY, OUTPUT, SPEC, Book, v5_args

FEE = BOUNTY * FEE_BPS // 10_000
PAYOUT = BOUNTY - FEE


def names(receipt: Any) -> list[str]:
    return [log.event_name for log in receipt.events]


def fold(state: JobState, receipt: Any) -> JobState:
    """``state`` after its job's events in ``receipt`` (a batch carries several jobs')."""
    for log in receipt.events:
        args = dict(log.event_arguments)
        if log.event_name in JOB_EVENTS and bytes(args["jobId"]) == state.job_id:
            state = apply_event(state, log.event_name, args)
    return state


def encoded(escrow: Any, fn: str, state: Any, *args: Any) -> bytes:
    """Calldata of ``fn(jobId, job, *args)`` for the job ``state`` describes."""
    return bytes(
        getattr(escrow, fn).encode_input(*v5_args(fn, state.job_id, state.job.as_tuple(), *args))
    )


def test_batched_assigns_and_settles_fold_to_the_same_events(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
    provider2: Any,
    operator: Any,
) -> None:
    """Two jobs assigned in one batch and settled in the next emit what one call each emits,
    in call order, and the events fold to the state the escrow stored."""
    single = book.assign(book.create(submitter, flags=ON_VERIFY), provider)
    alone = escrow.settle(
        single.job_id, single.job.as_tuple(), OUTPUT, book.sign(provider, single), sender=operator
    )
    a, b = (book.create(submitter, flags=ON_VERIFY) for _ in range(2))
    paid_before = (escrow.balanceOf(provider), escrow.balanceOf(provider2))
    fees_before = escrow.feesAccrued()

    receipt = escrow.multicall(
        [
            encoded(escrow, "assign", a, provider, book.accept(provider, a)),
            encoded(escrow, "assign", b, provider2, book.accept(provider2, b)),
        ],
        sender=operator,
    )
    assert names(receipt) == ["JobAssigned", "JobAssigned"]
    a, b = fold(a, receipt), fold(b, receipt)
    assert a.status is b.status is Status.ASSIGNED
    assert (a.job.provider, b.job.provider) == (provider.address, provider2.address)
    assert book.current(a) and book.current(b)

    receipt = escrow.multicall(
        [
            encoded(escrow, "settle", a, OUTPUT, book.sign(provider, a)),
            encoded(escrow, "settle", b, OUTPUT, book.sign(provider2, b)),
        ],
        sender=operator,
    )
    assert names(receipt) == 2 * names(alone) == 2 * ["ResultSubmitted", "JobReleased"]
    a, b = fold(a, receipt), fold(b, receipt)
    assert a.status is b.status is Status.RELEASED
    assert a.output_cid == b.output_cid == OUTPUT
    assert book.current(a) and book.current(b)  # the fold agrees with what was stored
    assert escrow.balanceOf(provider) - paid_before[0] == PAYOUT
    assert escrow.balanceOf(provider2) - paid_before[1] == PAYOUT
    assert escrow.feesAccrued() - fees_before == 2 * FEE
    assert escrow.providerOf(provider).locked == escrow.providerOf(provider2).locked == 0


def test_assign_and_settle_of_one_job_in_one_batch(
    book: Book, chain: Any, escrow: Any, submitter: Any, provider: Any, operator: Any
) -> None:
    """A batch runs its calls in order on the state the ones before it left: the settle that
    follows an assign in the same batch names the struct the assign stored."""
    state = book.create(submitter, flags=ON_VERIFY)
    at = chain.pending_timestamp + 5
    chain.pending_timestamp = at
    after_assign = replace(
        state,
        status=Status.ASSIGNED,
        job=replace(state.job, provider=provider.address, since=at, attempt=1, hold_until=at),
    )
    receipt = escrow.multicall(
        [
            encoded(escrow, "assign", state, provider, book.accept(provider, state)),
            encoded(escrow, "settle", after_assign, OUTPUT, book.sign(provider, after_assign)),
        ],
        sender=operator,
    )
    assert names(receipt) == ["JobAssigned", "ResultSubmitted", "JobReleased"]
    done = book.fold(state, receipt)
    assert done.status is Status.RELEASED and book.current(done)
    assert escrow.providerOf(provider).locked == 0


def test_no_eth_goes_in_so_no_payable_call_can_reuse_it(
    book: Book, escrow: Any, submitter: Any, submitted: Any
) -> None:
    """multicall is not payable: ETH sent with it is refused outright, and a payable call inside
    sees msg.value 0 (so one deposit can never fund several createJob or dispute calls)."""
    deadline = book.chain.pending_timestamp + 3600
    create = bytes(
        escrow.createJob.encode_input(
            os.urandom(32), SPEC, deadline, escrow.operator(), submitter, BOUNTY, 0, 0
        )
    )
    held = escrow.balance
    with ape.reverts():
        escrow.multicall([create, create], sender=submitter, value=BOUNTY)
    with ape.reverts(escrow.JobEscrowBountyTooLow, bounty=0):
        escrow.multicall([create], sender=submitter)
    with ape.reverts(escrow.JobEscrowWrongDeposit, sent=0):
        escrow.multicall([encoded(escrow, "dispute", submitted)], sender=submitter)
    assert escrow.balance == held
    assert escrow.statusOf(submitted.job_id) == Status.SUBMITTED


def test_a_reverting_call_reverts_the_batch_with_its_error(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
    provider2: Any,
    operator: Any,
    stranger: Any,
) -> None:
    a, b = book.create(submitter), book.create(submitter)
    locked = escrow.providerOf(provider).locked
    with ape.reverts(escrow.JobEscrowBadSignature, recovered=stranger.address):
        escrow.multicall(
            [
                encoded(escrow, "assign", a, provider, book.accept(provider, a)),
                encoded(escrow, "assign", b, provider2, book.accept(stranger, b)),
            ],
            sender=operator,
        )
    # nothing of the batch stayed: the first, valid assign was undone with it
    assert escrow.statusOf(a.job_id) == escrow.statusOf(b.job_id) == Status.FUNDED
    assert book.current(a) and book.current(b)
    assert escrow.providerOf(provider).locked == locked
    # and the valid call alone goes through
    assert book.assign(a, provider).status is Status.ASSIGNED


def test_only_the_jobs_operator_passes_operator_checks_in_a_batch(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
    operator: Any,
    stranger: Any,
    verify_assigned: Any,
) -> None:
    """msg.sender inside a batch is the batch's sender: a stranger, the submitter or the
    provider cannot assign or settle through multicall; the submitter's own call works."""
    funded = book.create(submitter)
    assign = encoded(escrow, "assign", funded, provider, book.accept(provider, funded))
    settle = encoded(
        escrow, "settle", verify_assigned, OUTPUT, book.sign(provider, verify_assigned)
    )
    for who in (stranger, submitter, provider):
        for call in (assign, settle):
            with ape.reverts(escrow.JobEscrowNotOperator, caller=who.address):
                escrow.multicall([call], sender=who)
    with ape.reverts(escrow.JobEscrowNotSubmitter, caller=operator.address):
        escrow.multicall([encoded(escrow, "cancel", funded)], sender=operator)
    receipt = escrow.multicall([encoded(escrow, "cancel", funded)], sender=submitter)
    assert names(receipt) == ["JobRefunded"]
    assert book.fold(funded, receipt).status is Status.REFUNDED
    # the operator's batch does what the operator may
    receipt = escrow.multicall([settle], sender=operator)
    assert book.fold(verify_assigned, receipt).status is Status.RELEASED


def test_reentry_through_multicall_is_blocked(
    project: Any, book: Book, escrow: Any, submitter: Any, operator: Any, submitted: Any
) -> None:
    """A wallet withdrawing through multicall whose receive() re-enters multicall with two
    withdraws meets the same transient guard: it gets its own balance once, nothing more."""
    book.do("release", submitted, sender=submitter)  # other people's money in the escrow
    wallet = project.MulticallReentrant.deploy(escrow.address, sender=operator)
    deadline = book.chain.pending_timestamp + 3600
    create = escrow.createJob.encode_input(
        os.urandom(32), SPEC, deadline, escrow.operator(), wallet, BOUNTY, 0, 0
    )
    state = book.fold(None, wallet.exec(create, sender=operator, value=BOUNTY))
    wallet.exec(escrow.cancel.encode_input(state.job_id, state.job.as_tuple()), sender=operator)
    assert escrow.balanceOf(wallet) == BOUNTY
    held = escrow.balance

    wallet.drain(sender=operator)
    assert wallet.reentries() >= 1 and wallet.reentryBlocked()
    assert bytes(wallet.blockedWith()) == keccak(b"ReentrancyGuardReentrantCall()")[:4]
    assert wallet.balance == BOUNTY
    assert escrow.balance == held - BOUNTY
    assert escrow.balanceOf(wallet) == 0
