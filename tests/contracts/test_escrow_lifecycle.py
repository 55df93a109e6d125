"""Escrow version 2, every job transition: each function's happy path and each custom-error
revert (``ape.reverts(contract.Error, arg=value)``). The attacks of the trust issue are in
test_trust.py; the registry's own functions in test_registry.py."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import ape
import pytest
from eth_account import Account
from eth_utils.crypto import keccak

from gridmarket.eip712 import (
    DOMAIN_NAME,
    DOMAIN_VERSION,
    recover_acceptance_signer,
    recover_result_signer,
    result_typed_data,
    sign_acceptance,
    sign_result,
)
from gridmarket.escrow import Status, cid_digest, commitment, deposit_of, job_id

from .conftest import (
    BOUNTY,
    CHALLENGE,
    DEPOSIT,
    DISPUTE_DEPOSIT,
    FEE_BPS,
    MAX_DURATION,
    MEDIATION_WINDOW,
    MIN_BOUNTY,
    MIN_DURATION,
    ON_VERIFY,
    OUTPUT,
    REASSIGN_DELAY,
    SPEC,
    STAKE,
    Book,
    local,
    params,
)

ZERO = "0x0000000000000000000000000000000000000000"
FEE = BOUNTY * FEE_BPS // 10_000
PAYOUT = BOUNTY - FEE


def stored_commitment(chain: Any, escrow: Any, jid: bytes) -> int:
    """The word the contract stores for job ``jid``, read from its storage: the one slot of a
    ``bytes32``-keyed mapping (``keccak256(jid . p)`` for the mapping's slot ``p``) that holds
    anything. Fails when none or several do."""
    words = set()
    for p in range(64):
        slot = int.from_bytes(keccak(jid + p.to_bytes(32, "big")), "big")
        word = int.from_bytes(bytes(chain.provider.get_storage(escrow.address, slot)), "big")
        if word:
            words.add(word)
    assert len(words) == 1, f"job {jid.hex()}: {len(words)} storage words"
    return words.pop()


def names(receipt: Any) -> list[str]:
    return [e.event_name for e in receipt.events]


# ------------------------------------------------------------------------- deployment
def test_deploy_sets_everything(
    escrow: Any, owner: Any, operator: Any, treasury: Any, mediator: Any
) -> None:
    assert escrow.owner() == owner.address and escrow.pendingOwner() == ZERO
    assert escrow.operator() == operator.address and escrow.treasury() == treasury.address
    assert escrow.feeBps() == FEE_BPS and escrow.feesAccrued() == 0
    assert escrow.minBounty() == MIN_BOUNTY and escrow.challengeWindow() == CHALLENGE
    assert escrow.minCollateralBps() == 10_000 and escrow.disputeDeposit() == DISPUTE_DEPOSIT
    assert escrow.mediationWindow() == MEDIATION_WINDOW
    assert escrow.reassignDelay() == REASSIGN_DELAY
    assert escrow.isListedMediator(mediator) and not escrow.isListedMediator(operator)
    assert escrow.minCollateral(BOUNTY) == BOUNTY
    assert escrow.FLAG_ON_VERIFY() == ON_VERIFY and escrow.MAX_FEE_BPS() == 2000


def test_deploy_without_mediator_lists_none(
    project: Any, owner: Any, operator: Any, treasury: Any
) -> None:
    contract = project.JobEscrow.deploy(params(operator, treasury, ZERO), sender=owner)
    assert not contract.isListedMediator(ZERO)


def test_deploy_refusals(project: Any, owner: Any, operator: Any, treasury: Any) -> None:
    c = project.JobEscrow
    with ape.reverts(c.JobEscrowFeeTooHigh, feeBps=2001, maxFeeBps=2000):
        c.deploy(params(operator, treasury, ZERO, fee=2001), sender=owner)
    with ape.reverts(c.JobEscrowZeroAddress):
        c.deploy(params(ZERO, treasury, ZERO), sender=owner)
    with ape.reverts(c.JobEscrowZeroAddress):
        c.deploy(params(operator, ZERO, ZERO), sender=owner)
    with ape.reverts(c.JobEscrowDeadlineOutOfRange):
        c.deploy(params(operator, treasury, ZERO, min_duration=10, max_duration=9), sender=owner)
    with ape.reverts(c.ProviderRegistryReservedAddress, account=operator.address):
        c.deploy(params(operator, operator, ZERO), sender=owner)
    with ape.reverts(c.ProviderRegistryReservedAddress, account=operator.address):
        c.deploy(params(operator, treasury, operator), sender=owner)


# ------------------------------------------------------------------------- createJob
def test_create_locks_bounty_and_emits_the_terms(
    book: Book, escrow: Any, chain: Any, submitter: Any, operator: Any, mediator: Any
) -> None:
    salt = os.urandom(32)
    before = escrow.balance
    state = book.create(submitter, salt=salt)
    assert state.job_id == job_id(submitter.address, SPEC, salt)
    assert state.status is Status.FUNDED
    assert state.spec_cid == SPEC and state.salt == salt
    job = state.job
    assert job.bounty == BOUNTY and job.fee_bps == FEE_BPS and job.collateral == BOUNTY
    assert job.operator == operator.address and job.mediator == mediator.address
    assert job.flags == 0 and job.attempt == 0 and job.provider == ZERO
    assert escrow.balance == before + BOUNTY
    assert escrow.statusOf(state.job_id) == Status.FUNDED
    assert book.current(state)
    assert not escrow.isCurrent(state.job_id, replace(job, bounty=BOUNTY - 1).as_tuple())
    assert not escrow.isCurrent(os.urandom(32), job.as_tuple())
    # the Python commitment is the contract's storage word, status byte included
    stored = stored_commitment(chain, escrow, state.job_id)
    assert stored == commitment(job, Status.FUNDED)
    assert stored & 0xFF == Status.FUNDED


def test_create_with_own_mediator_and_more_collateral(book: Book, submitter: Any) -> None:
    state = book.create(submitter, mediator=submitter, collateral=3 * BOUNTY, flags=ON_VERIFY)
    assert state.job.mediator == submitter.address and state.job.collateral == 3 * BOUNTY
    assert state.job.on_verify and book.current(state)


def test_create_rejects_small_bounty(book: Book, escrow: Any, submitter: Any) -> None:
    with ape.reverts(escrow.JobEscrowBountyTooLow, bounty=MIN_BOUNTY - 1, minBounty=MIN_BOUNTY):
        book.create(submitter, bounty=MIN_BOUNTY - 1)


def test_create_rejects_bounty_above_uint96(
    book: Book, escrow: Any, chain: Any, submitter: Any
) -> None:
    big = 2**96
    chain.set_balance(submitter, 2 * big)
    with ape.reverts(escrow.JobEscrowBountyTooHigh, bounty=big, maxBounty=2**96 - 1):
        book.create(submitter, bounty=big, collateral=2**96 - 1)


@pytest.mark.parametrize("duration", [MIN_DURATION - 1, MAX_DURATION + 1, -10])
def test_create_rejects_deadline_out_of_range(
    book: Book, escrow: Any, submitter: Any, duration: int
) -> None:
    with ape.reverts(escrow.JobEscrowDeadlineOutOfRange):
        book.create(submitter, duration=duration)


@pytest.mark.parametrize("spec", ["", "b" * 129])
def test_create_rejects_bad_spec_cid(book: Book, escrow: Any, submitter: Any, spec: str) -> None:
    with ape.reverts(escrow.JobEscrowBadSpecCid, length=len(spec)):
        book.create(submitter, spec=spec)


@pytest.mark.parametrize("flags", [2, 3, 255])
def test_create_rejects_unknown_flags(book: Book, escrow: Any, submitter: Any, flags: int) -> None:
    with ape.reverts(escrow.JobEscrowBadFlags, flags=flags):
        book.create(submitter, flags=flags)


def test_create_rejects_collateral_below_minimum(book: Book, escrow: Any, submitter: Any) -> None:
    with ape.reverts(escrow.JobEscrowCollateralTooLow, collateral=BOUNTY - 1, minCollateral=BOUNTY):
        book.create(submitter, collateral=BOUNTY - 1)


def test_create_rejects_unlisted_mediator(
    book: Book, escrow: Any, submitter: Any, stranger: Any
) -> None:
    with ape.reverts(escrow.JobEscrowMediatorNotListed, mediator=stranger.address):
        book.create(submitter, mediator=stranger)
    with ape.reverts(escrow.JobEscrowMediatorNotListed, mediator=ZERO):
        book.create(submitter, mediator=ZERO)


def test_create_rejects_the_operator_as_mediator(
    book: Book, escrow: Any, submitter: Any, operator: Any
) -> None:
    with ape.reverts(escrow.JobEscrowConflictOfInterest, provider=operator.address):
        book.create(submitter, mediator=operator)
    # nor can the operator fund a job naming itself (as the submitter) the mediator
    with ape.reverts(escrow.JobEscrowConflictOfInterest, provider=operator.address):
        book.create(operator, mediator=operator)


def test_create_same_id_twice_reverts(book: Book, escrow: Any, submitter: Any) -> None:
    salt = os.urandom(32)
    state = book.create(submitter, salt=salt)
    with ape.reverts(escrow.JobEscrowJobExists, jobId=state.job_id):
        book.create(submitter, salt=salt)


def test_front_running_create_cannot_take_the_id(book: Book, submitter: Any, stranger: Any) -> None:
    """An attacker copying a pending createJob (same spec, same salt) gets another id."""
    salt = os.urandom(32)
    theirs = book.create(stranger, salt=salt)
    mine = book.create(submitter, salt=salt)
    assert theirs.job_id != mine.job_id
    assert mine.job_id == job_id(submitter.address, SPEC, salt)
    assert mine.job.submitter == submitter.address


# ------------------------------------------------------------------------- cancel
def test_cancel_refunds_submitter(book: Book, escrow: Any, funded: Any, submitter: Any) -> None:
    state = book.do("cancel", funded, sender=submitter)
    assert state.status is Status.REFUNDED and book.current(state)
    assert escrow.balanceOf(submitter) == BOUNTY


def test_cancel_by_other_reverts(book: Book, escrow: Any, funded: Any, stranger: Any) -> None:
    with ape.reverts(escrow.JobEscrowNotSubmitter, caller=stranger.address):
        book.do("cancel", funded, sender=stranger)


def test_cancel_after_assignment_reverts(
    book: Book, escrow: Any, assigned: Any, submitter: Any
) -> None:
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.ASSIGNED):
        book.do("cancel", assigned, sender=submitter)


# ------------------------------------------------------------------------- assign
def test_assign_locks_collateral_and_counts_the_attempt(
    book: Book, escrow: Any, funded: Any, provider: Any
) -> None:
    assert escrow.freeCollateralOf(provider) == STAKE
    state = book.assign(funded, provider)
    assert state.status is Status.ASSIGNED and book.current(state)
    assert state.job.provider == provider.address and state.job.attempt == 1
    assert state.job.since == book.chain.blocks.head.timestamp
    assert escrow.providerOf(provider).locked == BOUNTY
    assert escrow.freeCollateralOf(provider) == STAKE - BOUNTY


def test_acceptance_signed_in_python_is_what_assign_recovers(
    book: Book, escrow: Any, chain: Any, funded: Any, provider: Any, stranger: Any
) -> None:
    """The contract no longer exposes its digests (EIP-170 room for spot checks): the Python
    EIP-712 code is checked against what ``assign`` recovers, the contract's own digest."""
    sig = book.accept(provider, funded)
    assert (
        recover_acceptance_signer(
            sig, chain.chain_id, escrow.address, funded.job_id, 1, funded.job, 0
        )
        == provider.address
    )
    # the same signature names another signer for other terms, so assign refuses it ...
    with ape.reverts(escrow.JobEscrowBadSignature):
        book.assign(funded, stranger, sig=sig)
    # ... and is accepted for these
    book.assign(funded, provider, sig=sig)


def test_assign_by_non_operator_reverts(
    book: Book, escrow: Any, funded: Any, provider: Any, stranger: Any, owner: Any
) -> None:
    for caller in (stranger, provider, owner):
        with ape.reverts(escrow.JobEscrowNotOperator, caller=caller.address):
            book.assign(funded, provider, sender=caller)


def test_assign_unregistered_provider_reverts(
    book: Book, escrow: Any, funded: Any, stranger: Any
) -> None:
    with ape.reverts(escrow.ProviderRegistryNotRegistered, provider=stranger.address):
        book.assign(funded, stranger)


def test_assign_unstaked_provider_reverts(
    book: Book, escrow: Any, funded: Any, stranger: Any
) -> None:
    escrow.registerProvider("bafkreinostake", sender=stranger)
    with ape.reverts(escrow.ProviderRegistryInsufficientStake, provider=stranger.address, stake=0):
        book.assign(funded, stranger)


def test_assign_without_free_collateral_reverts(
    book: Book, escrow: Any, funded: Any, stranger: Any
) -> None:
    escrow.registerProvider("bafkreilittle", sender=stranger, value=BOUNTY - 1)
    with ape.reverts(
        escrow.ProviderRegistryInsufficientCollateral,
        provider=stranger.address,
        free=BOUNTY - 1,
        needed=BOUNTY,
    ):
        book.assign(funded, stranger)


def test_assign_after_deadline_reverts(
    book: Book, escrow: Any, submitter: Any, provider: Any
) -> None:
    state = book.create(submitter, duration=120)
    book.sleep(121)
    with ape.reverts(escrow.JobEscrowDeadlinePassed, jobId=state.job_id):
        book.assign(state, provider)


def test_assign_with_tampered_struct_reverts(
    book: Book, escrow: Any, funded: Any, provider: Any
) -> None:
    forged = replace(funded, job=replace(funded.job, collateral=0))
    with ape.reverts(escrow.JobEscrowJobMismatch, jobId=funded.job_id):
        book.assign(forged, provider)


def test_assign_refuses_a_bad_acceptance(
    book: Book, escrow: Any, funded: Any, provider: Any, provider2: Any
) -> None:
    with ape.reverts(escrow.JobEscrowBadSignature, recovered=provider2.address):
        book.assign(funded, provider, sig=book.accept(provider2, funded))
    for bad in (b"", b"\x00" * 65, book.accept(provider, funded)[:64]):
        with ape.reverts(escrow.JobEscrowBadSignature, recovered=ZERO):
            book.assign(funded, provider, sig=bad)


def test_assign_refuses_conflicts_of_interest(
    book: Book, escrow: Any, funded: Any, operator: Any, submitter: Any, mediator: Any
) -> None:
    for who in (operator, submitter, mediator):
        with ape.reverts(escrow.JobEscrowConflictOfInterest, provider=who.address):
            book.assign(funded, who)


def test_reassign_after_the_delay_moves_the_collateral(
    book: Book, escrow: Any, assigned: Any, provider: Any, provider2: Any
) -> None:
    with ape.reverts(escrow.JobEscrowSameProvider, provider=provider.address):
        book.assign(assigned, provider)
    with ape.reverts(escrow.JobEscrowTooEarly, jobId=assigned.job_id):
        book.assign(assigned, provider2)
    book.sleep(REASSIGN_DELAY)
    state = book.assign(assigned, provider2)
    assert state.job.provider == provider2.address and state.job.attempt == 2
    assert escrow.providerOf(provider).locked == 0
    assert escrow.providerOf(provider2).locked == BOUNTY
    # the old provider can no longer deliver
    with ape.reverts(escrow.JobEscrowNotProvider, caller=provider.address):
        book.do("submitResult", state, OUTPUT, sender=provider)


# ------------------------------------------------------------------------- unassign
def test_provider_hands_back_at_once(book: Book, escrow: Any, assigned: Any, provider: Any) -> None:
    receipt = escrow.unassign(assigned.job_id, assigned.job.as_tuple(), sender=provider)
    assert names(receipt) == ["JobUnassigned"]
    state = book.fold(assigned, receipt)
    assert state.status is Status.FUNDED and state.job.attempt == 1 and book.current(state)
    assert escrow.providerOf(provider).locked == 0


def test_operator_takes_back_only_after_the_delay(
    book: Book, escrow: Any, assigned: Any, operator: Any, provider: Any, provider2: Any
) -> None:
    with ape.reverts(escrow.JobEscrowTooEarly, jobId=assigned.job_id):
        book.do("unassign", assigned, sender=operator)
    book.sleep(REASSIGN_DELAY)
    state = book.do("unassign", assigned, sender=operator)
    assert state.status is Status.FUNDED and escrow.providerOf(provider).locked == 0
    state = book.assign(state, provider2)  # attempt 2, signed for attempt 2
    assert state.job.attempt == 2 and book.current(state)


def test_unassign_by_others_reverts(
    book: Book, escrow: Any, assigned: Any, submitter: Any, stranger: Any, mediator: Any
) -> None:
    for who in (submitter, stranger, mediator):
        with ape.reverts(escrow.JobEscrowNotAllowed, caller=who.address):
            book.do("unassign", assigned, sender=who)


def test_unassign_of_a_funded_job_reverts(
    book: Book, escrow: Any, funded: Any, operator: Any
) -> None:
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.FUNDED):
        book.do("unassign", funded, sender=operator)


# ------------------------------------------------------------------------- results
def test_submit_result(book: Book, escrow: Any, assigned: Any, provider: Any) -> None:
    state = book.do("submitResult", assigned, OUTPUT, sender=provider)
    assert state.status is Status.SUBMITTED and book.current(state)
    assert state.job.result_digest == cid_digest(OUTPUT) and state.output_cid == OUTPUT
    assert state.job.submitted_at == state.job.since == book.chain.blocks.head.timestamp
    assert escrow.providerOf(provider).locked == BOUNTY  # still at stake until final


def test_result_only_from_assigned_provider(
    book: Book,
    escrow: Any,
    assigned: Any,
    provider2: Any,
    submitter: Any,
    operator: Any,
    mediator: Any,
) -> None:
    for caller in (provider2, submitter, operator, mediator):
        with ape.reverts(escrow.JobEscrowNotProvider, caller=caller.address):
            book.do("submitResult", assigned, OUTPUT, sender=caller)


def test_result_once_per_assignment(book: Book, escrow: Any, submitted: Any, provider: Any) -> None:
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.SUBMITTED):
        book.do("submitResult", submitted, OUTPUT, sender=provider)


def test_result_after_deadline_reverts(
    book: Book, escrow: Any, submitter: Any, provider: Any
) -> None:
    state = book.assign(book.create(submitter, duration=120), provider)
    book.sleep(200)
    with ape.reverts(escrow.JobEscrowDeadlinePassed, jobId=state.job_id):
        book.do("submitResult", state, OUTPUT, sender=provider)


@pytest.mark.parametrize("cid", ["", "x" * 129])
def test_result_rejects_bad_cid(
    book: Book, escrow: Any, assigned: Any, provider: Any, cid: str
) -> None:
    with ape.reverts(escrow.JobEscrowBadOutputCid, length=len(cid)):
        book.do("submitResult", assigned, cid, sender=provider)


def test_relayed_result_by_anyone(
    book: Book, escrow: Any, chain: Any, assigned: Any, provider: Any, stranger: Any
) -> None:
    sig = book.sign(provider, assigned)
    assert (
        recover_result_signer(
            sig, chain.chain_id, escrow.address, assigned.job_id, assigned.job.attempt, OUTPUT
        )
        == provider.address
    )
    state = book.do("submitResultFor", assigned, OUTPUT, sig, sender=stranger)
    assert state.status is Status.SUBMITTED and state.job.provider == provider.address
    assert book.current(state)
    with ape.reverts(escrow.JobEscrowWrongStatus):  # single use
        book.do("submitResultFor", assigned, OUTPUT, sig, sender=stranger)


def test_relayed_result_checks(
    book: Book, escrow: Any, assigned: Any, provider: Any, provider2: Any, operator: Any
) -> None:
    with ape.reverts(escrow.JobEscrowBadSignature, recovered=provider2.address):
        book.do(
            "submitResultFor", assigned, OUTPUT, book.sign(provider2, assigned), sender=operator
        )
    with ape.reverts(escrow.JobEscrowBadSignature):  # signed another CID
        book.do(
            "submitResultFor",
            assigned,
            "bafkreievil",
            book.sign(provider, assigned),
            sender=operator,
        )
    with ape.reverts(escrow.JobEscrowBadSignature):  # signed for another attempt
        sig = book.sign(provider, assigned, attempt=assigned.job.attempt + 1)
        book.do("submitResultFor", assigned, OUTPUT, sig, sender=operator)


def test_result_signature_replays_fail(
    project: Any,
    book: Book,
    escrow: Any,
    chain: Any,
    submitter: Any,
    owner: Any,
    operator: Any,
    treasury: Any,
    mediator: Any,
    provider: Any,
    provider2: Any,
) -> None:
    a = book.assign(book.create(submitter), provider)
    b = book.assign(book.create(submitter), provider)
    with ape.reverts(escrow.JobEscrowBadSignature):  # another job
        book.do("submitResultFor", b, OUTPUT, book.sign(provider, a), sender=operator)
    with ape.reverts(escrow.JobEscrowBadSignature):  # another chain
        book.do("submitResultFor", a, OUTPUT, book.sign(provider, a, chain_id=1), sender=operator)
    twin = project.JobEscrow.deploy(params(operator, treasury, mediator), sender=owner)
    with ape.reverts(escrow.JobEscrowBadSignature):  # another deployment
        sig = book.sign(provider, a, contract=twin.address)
        book.do("submitResultFor", a, OUTPUT, sig, sender=operator)
    old = book.sign(provider, a)  # attempt 1
    book.sleep(REASSIGN_DELAY)
    state = book.assign(a, provider2)
    book.sleep(REASSIGN_DELAY)
    state = book.assign(state, provider)  # attempt 3, the same provider again
    with ape.reverts(escrow.JobEscrowBadSignature):
        book.do("submitResultFor", state, OUTPUT, old, sender=operator)


def test_malleable_and_malformed_result_signatures_rejected(
    book: Book, escrow: Any, assigned: Any, provider: Any, operator: Any
) -> None:
    sig = book.sign(provider, assigned)
    n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
    r, s, v = sig[:32], int.from_bytes(sig[32:64], "big"), sig[64]
    flipped = r + (n - s).to_bytes(32, "big") + bytes([55 - v])  # same signer, high s
    bad_v = sig[:64] + bytes([v + 2])
    for bad in (flipped, bad_v, sig[:64], sig + b"\x00", b""):
        with ape.reverts(escrow.JobEscrowBadSignature, recovered=ZERO):
            book.do("submitResultFor", assigned, OUTPUT, bad, sender=operator)


# ------------------------------------------------------------------------- settle (on-verify)
def test_settle_verifies_and_pays_in_one_tx(
    book: Book, escrow: Any, verify_assigned: Any, provider: Any, operator: Any
) -> None:
    sig = book.sign(provider, verify_assigned)
    receipt = escrow.settle(
        verify_assigned.job_id, verify_assigned.job.as_tuple(), OUTPUT, sig, sender=operator
    )
    assert names(receipt) == ["ResultSubmitted", "JobReleased"]
    state = book.fold(verify_assigned, receipt)
    assert state.status is Status.RELEASED and state.output_cid == OUTPUT
    # the fixed quirk: settle stores what its events fold to (result digest and time included)
    assert book.current(state)
    assert not book.current(replace(state, job=verify_assigned.job))
    assert escrow.balanceOf(provider) == PAYOUT and escrow.feesAccrued() == FEE
    assert escrow.providerOf(provider).locked == 0
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.RELEASED):
        book.do("settle", verify_assigned, OUTPUT, sig, sender=operator)


def test_settle_refusals(
    book: Book,
    escrow: Any,
    verify_assigned: Any,
    assigned: Any,
    provider: Any,
    operator: Any,
    stranger: Any,
    submitter: Any,
) -> None:
    sig = book.sign(provider, verify_assigned)
    for who in (stranger, submitter, provider):
        with ape.reverts(escrow.JobEscrowNotOperator, caller=who.address):
            book.do("settle", verify_assigned, OUTPUT, sig, sender=who)
    with ape.reverts(escrow.JobEscrowBadSignature, recovered=stranger.address):
        book.do(
            "settle", verify_assigned, OUTPUT, book.sign(stranger, verify_assigned), sender=operator
        )
    with ape.reverts(escrow.JobEscrowNotOnVerify, jobId=assigned.job_id):
        book.do("settle", assigned, OUTPUT, book.sign(provider, assigned), sender=operator)
    with ape.reverts(escrow.JobEscrowBadOutputCid, length=0):
        book.do(
            "settle",
            verify_assigned,
            "",
            book.sign(provider, verify_assigned, cid=""),
            sender=operator,
        )


def test_settle_after_deadline_reverts(
    book: Book, escrow: Any, submitter: Any, provider: Any, operator: Any
) -> None:
    state = book.assign(book.create(submitter, duration=120, flags=ON_VERIFY), provider)
    book.sleep(121)
    with ape.reverts(escrow.JobEscrowDeadlinePassed, jobId=state.job_id):
        book.do("settle", state, OUTPUT, book.sign(provider, state), sender=operator)


# ------------------------------------------------------------------------- release
def test_submitter_releases_early(
    book: Book, escrow: Any, submitted: Any, submitter: Any, provider: Any
) -> None:
    receipt = escrow.release(submitted.job_id, submitted.job.as_tuple(), sender=submitter)
    assert names(receipt) == ["JobReleased"]
    state = book.fold(submitted, receipt)
    assert state.status is Status.RELEASED and book.current(state)
    assert escrow.balanceOf(provider) == PAYOUT and escrow.feesAccrued() == FEE
    assert escrow.providerOf(provider).locked == 0
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.RELEASED):
        book.do("release", submitted, sender=submitter)


def test_release_by_others_reverts(
    book: Book,
    escrow: Any,
    submitted: Any,
    operator: Any,
    provider: Any,
    stranger: Any,
    mediator: Any,
) -> None:
    # the operator may not release a job its submitter did not fund on-verify
    for who in (operator, provider, stranger, mediator):
        with ape.reverts(escrow.JobEscrowNotAllowed, caller=who.address):
            book.do("release", submitted, sender=who)


def test_operator_releases_an_on_verify_job(
    book: Book, escrow: Any, verify_assigned: Any, operator: Any, provider: Any
) -> None:
    state = book.do("submitResult", verify_assigned, OUTPUT, sender=provider)
    state = book.do("release", state, sender=operator)
    assert state.status is Status.RELEASED and escrow.balanceOf(provider) == PAYOUT


# ------------------------------------------------------------------------- finalize
def test_anyone_finalizes_after_the_window(
    book: Book, escrow: Any, submitted: Any, provider: Any, stranger: Any, submitter: Any
) -> None:
    with ape.reverts(escrow.JobEscrowChallengeWindowOpen, jobId=submitted.job_id):
        book.do("finalize", submitted, sender=stranger)
    book.sleep(CHALLENGE)
    state = book.do("finalize", submitted, sender=stranger)
    assert state.status is Status.RELEASED and book.current(state)
    assert escrow.balanceOf(provider) == PAYOUT and escrow.balanceOf(stranger) == 0
    for fn in ("finalize", "release"):  # no double payment by any path
        with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.RELEASED):
            book.do(fn, submitted, sender=submitter)


def test_finalize_needs_a_result(book: Book, escrow: Any, assigned: Any, stranger: Any) -> None:
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.ASSIGNED):
        book.do("finalize", assigned, sender=stranger)


# ------------------------------------------------------------------------- dispute and rule
def dispute(book: Book, state: Any, submitter: Any) -> Any:
    return book.do("dispute", state, sender=submitter, value=DEPOSIT)


def test_dispute_holds_the_deposit(book: Book, escrow: Any, submitted: Any, submitter: Any) -> None:
    held = escrow.balance
    state = dispute(book, submitted, submitter)
    assert state.status is Status.DISPUTED and book.current(state)
    assert state.job.disputed_at == book.chain.blocks.head.timestamp
    assert escrow.balance == held + DEPOSIT == held + BOUNTY
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.DISPUTED):
        dispute(book, state, submitter)


def test_dispute_refusals(
    book: Book, escrow: Any, submitted: Any, submitter: Any, stranger: Any, assigned: Any
) -> None:
    with ape.reverts(escrow.JobEscrowNotSubmitter, caller=stranger.address):
        book.do("dispute", submitted, sender=stranger, value=DEPOSIT)
    # the old flat deposit among them: an ETH job's deposit is its bounty
    for wrong in (0, DISPUTE_DEPOSIT, DEPOSIT - 1, DEPOSIT + 1):
        with ape.reverts(escrow.JobEscrowWrongDeposit, sent=wrong, deposit=DEPOSIT):
            book.do("dispute", submitted, sender=submitter, value=wrong)
    book.sleep(CHALLENGE)
    with ape.reverts(escrow.JobEscrowChallengeWindowClosed, jobId=submitted.job_id):
        dispute(book, submitted, submitter)


def test_ruling_upheld_on_a_dispute_pays_provider_and_mediator(
    book: Book, escrow: Any, submitted: Any, submitter: Any, mediator: Any, provider: Any
) -> None:
    state = dispute(book, submitted, submitter)
    receipt = escrow.rule(state.job_id, [state.job.as_tuple()], 0, True, sender=mediator)
    assert names(receipt) == ["Ruled", "Credited", "JobReleased"]
    state = book.fold(state, receipt)
    assert state.status is Status.RELEASED and book.current(state)
    assert escrow.balanceOf(provider) == PAYOUT
    assert escrow.balanceOf(mediator) == DEPOSIT == BOUNTY  # the re-run, at the job's bounty
    assert escrow.balanceOf(submitter) == 0
    assert escrow.providerOf(provider).locked == 0
    assert escrow.providerOf(provider).stake == STAKE


def test_ruling_against_a_dispute_slashes_and_requeues(
    book: Book,
    escrow: Any,
    submitted: Any,
    submitter: Any,
    mediator: Any,
    provider: Any,
    provider2: Any,
) -> None:
    state = dispute(book, submitted, submitter)
    receipt = escrow.rule(state.job_id, [state.job.as_tuple()], 0, False, sender=mediator)
    assert names(receipt) == ["Ruled", "Credited", "ProviderSlashed"]
    slashed = receipt.events[2]
    assert slashed.amount == BOUNTY and slashed.toMediator == DEPOSIT
    state = book.fold(state, receipt)
    assert state.status is Status.FUNDED and state.output_cid is None and book.current(state)
    assert state.job.attempt == 1 and state.job.provider == ZERO
    info = escrow.providerOf(provider)
    assert info.stake == STAKE - BOUNTY and info.locked == 0
    # the submitter: its deposit back plus the collateral less the mediator's re-run
    assert escrow.balanceOf(submitter) == DEPOSIT + BOUNTY - DEPOSIT
    assert escrow.balanceOf(mediator) == DEPOSIT
    # the job runs again elsewhere (attempt 2); the slashed provider cannot sneak a result in
    state = book.assign(state, provider2)
    assert state.job.attempt == 2
    with ape.reverts(escrow.JobEscrowNotProvider):
        book.do("submitResult", state, OUTPUT, sender=provider)
    state = book.do("submitResult", state, OUTPUT, sender=provider2)
    assert book.do("release", state, sender=submitter).status is Status.RELEASED


def test_mediator_rules_on_its_own_check_within_the_window(
    book: Book, escrow: Any, submitted: Any, submitter: Any, mediator: Any, provider: Any
) -> None:
    receipt = escrow.rule(submitted.job_id, [submitted.job.as_tuple()], 0, False, sender=mediator)
    assert names(receipt) == ["Ruled", "ProviderSlashed"]  # no deposit, nothing to the mediator
    state = book.fold(submitted, receipt)
    assert state.status is Status.FUNDED and book.current(state)
    assert escrow.balanceOf(submitter) == BOUNTY and escrow.balanceOf(mediator) == 0


def test_mediator_upholds_on_its_own_check(
    book: Book, escrow: Any, submitted: Any, mediator: Any, provider: Any
) -> None:
    state = book.do("rule", submitted, True, sender=mediator)
    assert state.status is Status.RELEASED and book.current(state)
    assert escrow.balanceOf(provider) == PAYOUT and escrow.balanceOf(mediator) == 0


def test_rule_by_others_or_too_late_reverts(
    book: Book,
    escrow: Any,
    submitted: Any,
    operator: Any,
    submitter: Any,
    owner: Any,
    stranger: Any,
    mediator: Any,
) -> None:
    for who in (operator, submitter, owner, stranger):
        with ape.reverts(escrow.JobEscrowNotMediator, caller=who.address):
            book.do("rule", submitted, False, sender=who)
    book.sleep(CHALLENGE)
    with ape.reverts(escrow.JobEscrowChallengeWindowClosed, jobId=submitted.job_id):
        book.do("rule", submitted, False, sender=mediator)


def test_rule_needs_a_result(book: Book, escrow: Any, assigned: Any, mediator: Any) -> None:
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.ASSIGNED):
        book.do("rule", assigned, False, sender=mediator)


def test_a_dispute_may_be_ruled_after_the_challenge_window(
    book: Book, escrow: Any, submitted: Any, submitter: Any, mediator: Any
) -> None:
    state = dispute(book, submitted, submitter)
    book.sleep(CHALLENGE + 1)
    assert book.do("rule", state, False, sender=mediator).status is Status.FUNDED


def test_unruled_dispute_is_finalized_after_the_mediation_window(
    book: Book,
    escrow: Any,
    submitted: Any,
    submitter: Any,
    stranger: Any,
    provider: Any,
    mediator: Any,
) -> None:
    state = dispute(book, submitted, submitter)
    book.sleep(CHALLENGE)
    with ape.reverts(escrow.JobEscrowChallengeWindowOpen, jobId=state.job_id):
        book.do("finalize", state, sender=stranger)
    book.sleep(MEDIATION_WINDOW - CHALLENGE)
    receipt = escrow.finalize(state.job_id, state.job.as_tuple(), sender=stranger)
    assert names(receipt) == ["Credited", "JobReleased"]
    state = book.fold(state, receipt)
    assert state.status is Status.RELEASED and book.current(state)
    assert escrow.balanceOf(submitter) == DEPOSIT
    assert escrow.balanceOf(provider) == PAYOUT and escrow.balanceOf(mediator) == 0


def test_collateral_smaller_than_the_deposit_pays_the_mediator_what_there_is(
    project: Any,
    owner: Any,
    operator: Any,
    treasury: Any,
    mediator: Any,
    submitter: Any,
    provider: Any,
    chain: Any,
) -> None:
    contract = project.JobEscrow.deploy(
        params(operator, treasury, mediator, min_collateral_bps=0), sender=owner
    )
    contract.registerProvider("bafkreip", sender=provider, value=STAKE)
    b = Book(contract, chain, mediator, operator)
    state = b.assign(b.create(submitter, collateral=DEPOSIT // 2), provider)
    state = b.do("submitResult", state, OUTPUT, sender=provider)
    state = b.do("dispute", state, sender=submitter, value=DEPOSIT)
    state = b.do("rule", state, False, sender=mediator)
    assert contract.balanceOf(mediator) == DEPOSIT // 2
    assert contract.balanceOf(submitter) == DEPOSIT  # its deposit; the rest of 0
    assert b.current(state)


# ------------------------------------------------------------ the ETH deposit: bounty, floored
FLOOR = 10**16
"""`disputeDeposit` of the floored escrow: between MIN_BOUNTY and BOUNTY."""
UNDER = 2 * MIN_BOUNTY
"""A bounty under the floor."""


@pytest.fixture
def floored(
    project: Any,
    owner: Any,
    operator: Any,
    treasury: Any,
    mediator: Any,
    provider: Any,
    chain: Any,
) -> Book:
    """An escrow whose flat `disputeDeposit` (FLOOR) lies between two bounties, UNDER and
    BOUNTY, with the provider staking enough for either job's collateral."""
    contract = project.JobEscrow.deploy(
        params(operator, treasury, mediator, dispute_deposit=FLOOR), sender=owner
    )
    contract.registerProvider("bafkreip", sender=provider, value=STAKE)
    return Book(contract, chain, mediator, operator)


def _delivered(b: Book, submitter: Any, provider: Any, bounty: int) -> Any:
    state = b.assign(b.create(submitter, bounty=bounty), provider)
    return b.do("submitResult", state, OUTPUT, sender=provider)


@pytest.mark.parametrize(
    ("bounty", "deposit"),
    [(BOUNTY, BOUNTY), (FLOOR, FLOOR), (UNDER, FLOOR)],
    ids=["above-the-floor", "at-the-floor", "under-the-floor"],
)
def test_an_eth_jobs_deposit_is_its_bounty_at_least_the_floor(
    floored: Book, submitter: Any, provider: Any, bounty: int, deposit: int
) -> None:
    """`depositOf` an ETH job: max(bounty, disputeDeposit); `dispute` takes exactly that."""
    escrow = floored.escrow
    state = _delivered(floored, submitter, provider, bounty)
    assert escrow.depositOf(state.job.as_tuple()) == deposit == max(bounty, FLOOR)
    assert deposit_of(bounty, ZERO, FLOOR) == deposit  # the product's mirror agrees
    # the old flat deposit is refused when the bounty is above it, and so is the bounty under it
    for wrong in sorted({0, FLOOR, bounty, deposit - 1, deposit + 1} - {deposit}):
        with ape.reverts(escrow.JobEscrowWrongDeposit, sent=wrong, deposit=deposit):
            floored.do("dispute", state, sender=submitter, value=wrong)
    held = escrow.balance
    receipt = escrow.dispute(state.job_id, state.job.as_tuple(), sender=submitter, value=deposit)
    assert receipt.events[0].event_name == "ResultDisputed"
    assert receipt.events[0].deposit == deposit
    assert escrow.balance == held + deposit


@pytest.mark.parametrize("upheld", [True, False], ids=["upheld", "ruled-wrong"])
@pytest.mark.parametrize("bounty", [BOUNTY, UNDER], ids=["above-the-floor", "under-the-floor"])
def test_a_ruling_on_an_eth_dispute_pays_to_the_wei_and_the_mediator_is_made_whole(
    floored: Book, submitter: Any, provider: Any, mediator: Any, bounty: int, upheld: bool
) -> None:
    """Whoever was wrong pays the re-run (which costs the job's bounty). Upheld: the deposit
    goes to the mediator, the provider is paid. Ruled wrong: the deposit comes back, the
    provider loses its collateral (the bounty here), of which the mediator takes
    min(collateral, deposit) and the submitter the rest."""
    escrow = floored.escrow
    state = _delivered(floored, submitter, provider, bounty)
    deposit = max(bounty, FLOOR)
    collateral = state.job.collateral
    assert collateral == bounty
    state = floored.do("dispute", state, sender=submitter, value=deposit)
    held = escrow.balance
    receipt = escrow.rule(state.job_id, [state.job.as_tuple()], 0, upheld, sender=mediator)
    state = floored.fold(state, receipt)
    assert escrow.balance == held  # a ruling only credits balances
    fee = bounty * FEE_BPS // 10_000
    if upheld:
        assert state.status is Status.RELEASED
        assert escrow.balanceOf(mediator) == deposit
        assert escrow.balanceOf(provider) == bounty - fee
        assert escrow.balanceOf(submitter) == 0
        assert escrow.providerOf(provider).stake == STAKE
        assert escrow.feesAccrued() == fee
    else:
        to_mediator = min(collateral, 2 * deposit)
        assert to_mediator == bounty  # the collateral (= bounty) bounds it under the floor
        slashed = next(e for e in receipt.events if e.event_name == "ProviderSlashed")
        assert (slashed.amount, slashed.toMediator) == (collateral, to_mediator)
        assert state.status is Status.FUNDED
        assert escrow.balanceOf(mediator) == to_mediator
        assert escrow.balanceOf(submitter) == deposit + collateral - to_mediator
        assert escrow.balanceOf(provider) == 0
        assert escrow.providerOf(provider).stake == STAKE - collateral
        assert escrow.feesAccrued() == 0
    assert escrow.balanceOf(mediator) >= bounty  # the re-run at the job's bounty is paid for
    # solvency to the wei: stake, the bounty if offered again, and what was credited
    owed = escrow.providerOf(provider).stake + escrow.feesAccrued()
    owed += sum(escrow.balanceOf(a) for a in (mediator, submitter, provider))
    owed += 0 if upheld else bounty
    assert escrow.balance == owed


# ------------------------------------------------------------------------- refund
def test_refund_needs_no_operator(
    book: Book, escrow: Any, submitter: Any, provider: Any, stranger: Any
) -> None:
    state = book.assign(book.create(submitter, duration=120), provider)
    with ape.reverts(escrow.JobEscrowDeadlineNotPassed, jobId=state.job_id):
        book.do("refund", state, sender=stranger)
    book.sleep(121)
    state = book.do("refund", state, sender=stranger)  # a stranger triggers, submitter gets it
    assert state.status is Status.REFUNDED and book.current(state)
    assert escrow.balanceOf(submitter) == BOUNTY and escrow.balanceOf(stranger) == 0
    assert escrow.providerOf(provider).locked == 0  # the collateral is free again
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.REFUNDED):
        book.do("refund", state, sender=submitter)


def test_refund_of_a_funded_job(book: Book, escrow: Any, submitter: Any) -> None:
    state = book.create(submitter, duration=120)
    book.sleep(121)
    assert book.do("refund", state, sender=submitter).status is Status.REFUNDED


def test_no_refund_of_a_delivered_or_paid_job(
    book: Book, escrow: Any, submitted: Any, submitter: Any
) -> None:
    book.sleep(3700)
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.SUBMITTED):
        book.do("refund", submitted, sender=submitter)
    book.do("finalize", submitted, sender=submitter)
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.RELEASED):
        book.do("refund", submitted, sender=submitter)


def test_unknown_job_reverts(book: Book, escrow: Any, funded: Any, provider: Any) -> None:
    ghost = replace(funded, job_id=os.urandom(32))
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.NONE):
        book.assign(ghost, provider)
    assert escrow.statusOf(ghost.job_id) == Status.NONE


# ------------------------------------------------------------------------- fees
def test_fee_snapshot_and_collection(
    book: Book,
    escrow: Any,
    owner: Any,
    operator: Any,
    submitter: Any,
    provider: Any,
    treasury: Any,
    stranger: Any,
) -> None:
    state = book.assign(book.create(submitter), provider)
    with ape.reverts(escrow.JobEscrowFeeTooHigh, feeBps=2001, maxFeeBps=2000):
        escrow.setFeeBps(2001, sender=owner)
    with ape.reverts(escrow.JobEscrowNotOwner, caller=operator.address):
        escrow.setFeeBps(100, sender=operator)
    escrow.setFeeBps(2000, sender=owner)  # later jobs only
    assert escrow.feeBps() == 2000
    state = book.do("submitResult", state, OUTPUT, sender=provider)
    state = book.do("release", state, sender=submitter)
    assert state.job.fee == FEE and escrow.feesAccrued() == FEE
    receipt = escrow.collectFees(sender=stranger)
    assert names(receipt) == ["FeesCollected"]
    assert escrow.feesAccrued() == 0 and escrow.balanceOf(treasury) == FEE
    with ape.reverts(escrow.JobEscrowNothingToWithdraw, account=treasury.address):
        escrow.collectFees(sender=stranger)
    assert book.create(submitter).job.fee_bps == 2000


def test_zero_fee_job_pays_everything(
    book: Book, escrow: Any, owner: Any, submitter: Any, provider: Any
) -> None:
    escrow.setFeeBps(0, sender=owner)
    state = book.do(
        "submitResult", book.assign(book.create(submitter), provider), OUTPUT, sender=provider
    )
    book.do("release", state, sender=submitter)
    assert escrow.balanceOf(provider) == BOUNTY and escrow.feesAccrued() == 0


# ------------------------------------------------------------------------- withdrawals
def test_withdraw_pays_exactly_once(
    book: Book, escrow: Any, submitted: Any, submitter: Any, provider: Any, stranger: Any
) -> None:
    book.do("release", submitted, sender=submitter)
    before = provider.balance
    receipt = escrow.withdraw(sender=provider)
    assert names(receipt) == ["Withdrawn"]
    gas = receipt.gas_used * receipt.gas_price
    assert provider.balance == before + PAYOUT - gas
    assert escrow.balanceOf(provider) == 0
    with ape.reverts(escrow.JobEscrowNothingToWithdraw, account=provider.address):
        escrow.withdraw(sender=provider)
    with ape.reverts(escrow.JobEscrowZeroAddress):
        escrow.withdrawTo(ZERO, sender=provider)


def test_withdraw_to_another_address(
    book: Book, escrow: Any, funded: Any, submitter: Any, stranger: Any
) -> None:
    book.do("cancel", funded, sender=submitter)
    before = stranger.balance
    escrow.withdrawTo(stranger, sender=submitter)
    assert stranger.balance == before + BOUNTY and escrow.balanceOf(submitter) == 0


def _wallet_with_balance(project: Any, book: Book, kind: str, payer: Any) -> Any:
    """An attacker contract holding BOUNTY in the escrow (a cancelled job it funded)."""
    wallet = getattr(project, kind).deploy(book.escrow.address, sender=payer)
    deadline = book.chain.pending_timestamp + 3600
    salt = os.urandom(32)
    op = book.escrow.operator()
    create = book.escrow.createJob.encode_input(salt, SPEC, deadline, op, wallet, BOUNTY, 0, 0)
    receipt = wallet.exec(create, sender=payer, value=BOUNTY)
    state = book.fold(None, receipt)
    wallet.exec(book.escrow.cancel.encode_input(state.job_id, state.job.as_tuple()), sender=payer)
    assert book.escrow.balanceOf(wallet) == BOUNTY
    return wallet


def test_reentrant_receiver_cannot_drain(
    project: Any, book: Book, escrow: Any, submitter: Any, operator: Any, submitted: Any
) -> None:
    book.do("release", submitted, sender=submitter)  # other people's money in the escrow
    attacker = _wallet_with_balance(project, book, "ReentrantProvider", operator)
    held = escrow.balance
    attacker.drain(sender=operator)
    assert attacker.reentryBlocked() and attacker.reentries() >= 1
    assert bytes(attacker.blockedWith()) == keccak(b"ReentrancyGuardReentrantCall()")[:4]
    assert attacker.balance == BOUNTY
    assert escrow.balance == held - BOUNTY


def test_reverting_receiver_blocks_only_itself(
    project: Any,
    book: Book,
    escrow: Any,
    submitter: Any,
    operator: Any,
    submitted: Any,
    provider: Any,
    stranger: Any,
) -> None:
    attacker = _wallet_with_balance(project, book, "RevertingProvider", operator)
    with ape.reverts(escrow.JobEscrowWithdrawFailed):
        attacker.drain(sender=operator)
    assert escrow.balanceOf(attacker) == BOUNTY  # nothing lost
    book.do("release", submitted, sender=submitter)  # everybody else is unaffected
    escrow.withdraw(sender=provider)
    before = stranger.balance  # and the stuck wallet can send its money elsewhere
    attacker.rescue(stranger, sender=operator)
    assert stranger.balance == before + BOUNTY


# ------------------------------------------------------------------------- admin
def test_two_step_ownership(escrow: Any, owner: Any, stranger: Any, operator: Any) -> None:
    with ape.reverts(escrow.JobEscrowNotOwner, caller=stranger.address):
        escrow.transferOwnership(stranger, sender=stranger)
    receipt = escrow.transferOwnership(stranger, sender=owner)
    assert names(receipt) == ["OwnershipTransferStarted"]
    assert escrow.owner() == owner.address and escrow.pendingOwner() == stranger.address
    with ape.reverts(escrow.OwnableUnauthorizedAccount, caller=operator.address):
        escrow.acceptOwnership(sender=operator)
    escrow.acceptOwnership(sender=stranger)
    assert escrow.owner() == stranger.address and escrow.pendingOwner() == ZERO
    with ape.reverts(escrow.JobEscrowNotOwner, caller=owner.address):
        escrow.setFeeBps(1, sender=owner)


def test_renouncing_ownership_freezes_the_settings_and_nothing_else(
    book: Book, escrow: Any, owner: Any, operator: Any, provider: Any, submitter: Any
) -> None:
    funded = book.create(submitter)
    with ape.reverts(escrow.JobEscrowNotOwner, caller=operator.address):
        escrow.renounceOwnership(sender=operator)
    escrow.renounceOwnership(sender=owner)
    assert escrow.owner() == ZERO and escrow.pendingOwner() == ZERO
    for call, args in [
        ("setFeeBps", (1,)),
        ("setOperator", (provider,)),
        ("transferOwnership", (owner,)),
    ]:
        with ape.reverts(escrow.JobEscrowNotOwner, caller=owner.address):
            getattr(escrow, call)(*args, sender=owner)
    # jobs go on without an owner: assigned, delivered and paid as before
    assigned = book.assign(funded, provider)
    submitted = book.do("submitResult", assigned, OUTPUT, sender=provider)
    released = book.do("release", submitted, sender=submitter)
    assert escrow.statusOf(released.job_id) == Status.RELEASED


EIP170_LIMIT = 24_576
ROOM = 800
"""Bytes the escrow keeps free under EIP-170 for the next version's rules (docs/contracts.md).
Version 5 runs 23,701 bytes (875 under the limit): it spent most of version 4's 1,500 on the
trust fixes (the provider's signed hold ``holdFor``, one wallet per seat, the mediator's window
on seats, ``tryMulticall``, the expected operator at funding) and freed bytes by dropping
``createReplicated``, ``domainSeparator``, ``metadataDigestOf`` and resolve's per-provider
dedup."""


def test_escrow_runtime_keeps_room_under_the_size_limit(escrow: Any) -> None:
    size = len(ape.chain.provider.get_code(escrow.address))
    assert 0 < size <= EIP170_LIMIT - ROOM, f"JobEscrow is {size} bytes"


def test_eip712_domain_is_the_one_clients_sign_for(escrow: Any) -> None:
    """OpenZeppelin's EIP-5267 `eip712Domain` names the domain gridmarket.eip712 signs under."""
    fields, name, version, chain_id, contract, salt, extensions = escrow.eip712Domain()
    assert (name, version) == (DOMAIN_NAME, DOMAIN_VERSION)
    assert contract == escrow.address and bytes(fields) == b"\x0f" and not extensions
    assert chain_id == ape.chain.chain_id and bytes(salt) == bytes(32)


def test_set_operator(
    escrow: Any, owner: Any, stranger: Any, spare: Any, provider: Any, treasury: Any,
    mediator: Any, operator: Any,
) -> None:  # fmt: skip
    with ape.reverts(escrow.JobEscrowNotOwner, caller=operator.address):
        escrow.setOperator(spare, sender=operator)
    with ape.reverts(escrow.JobEscrowZeroAddress):
        escrow.setOperator(ZERO, sender=owner)
    for reserved in (provider, treasury, mediator):
        with ape.reverts(escrow.ProviderRegistryReservedAddress, account=reserved.address):
            escrow.setOperator(reserved, sender=owner)
    receipt = escrow.setOperator(spare, sender=owner)
    assert names(receipt) == ["OperatorChanged"]
    assert escrow.operator() == spare.address


def test_set_treasury(
    escrow: Any, owner: Any, operator: Any, provider: Any, spare: Any, treasury: Any
) -> None:
    with ape.reverts(escrow.JobEscrowNotOwner, caller=operator.address):
        escrow.setTreasury(spare, sender=operator)
    with ape.reverts(escrow.JobEscrowZeroAddress):
        escrow.setTreasury(ZERO, sender=owner)
    for reserved in (provider, operator):
        with ape.reverts(escrow.ProviderRegistryReservedAddress, account=reserved.address):
            escrow.setTreasury(reserved, sender=owner)
    receipt = escrow.setTreasury(spare, sender=owner)
    assert names(receipt) == ["TreasuryChanged"]
    assert escrow.treasury() == spare.address
    # the old treasury is an ordinary account again; the new one cannot register
    with ape.reverts(escrow.ProviderRegistryReservedAddress, account=spare.address):
        escrow.registerProvider("bafkreit", sender=spare)


def test_set_mediator(
    book: Book, escrow: Any, owner: Any, operator: Any, spare: Any, submitter: Any
) -> None:
    with ape.reverts(escrow.JobEscrowNotOwner, caller=operator.address):
        escrow.setMediator(spare, True, sender=operator)
    with ape.reverts(escrow.JobEscrowZeroAddress):
        escrow.setMediator(ZERO, True, sender=owner)
    with ape.reverts(escrow.ProviderRegistryReservedAddress, account=operator.address):
        escrow.setMediator(operator, True, sender=owner)
    escrow.setMediator(operator, False, sender=owner)  # unlisting is always allowed
    receipt = escrow.setMediator(spare, True, sender=owner)
    assert names(receipt) == ["MediatorListed"] and escrow.isListedMediator(spare)
    assert book.create(submitter, mediator=spare).job.mediator == spare.address
    escrow.setMediator(spare, False, sender=owner)
    with ape.reverts(escrow.JobEscrowMediatorNotListed, mediator=spare.address):
        book.create(submitter, mediator=spare)


# ------------------------------------------------------------------------- views
def test_eip712_domain_matches_python(escrow: Any, chain: Any) -> None:
    from eth_account.messages import encode_typed_data

    from gridmarket.eip712 import domain_separator

    signer = Account.create()
    jid = os.urandom(32)
    typed = result_typed_data(chain.chain_id, escrow.address, jid, 7, OUTPUT)
    message = encode_typed_data(full_message=typed)
    # the domain separator Python signs under is the contract's
    # the domain the contract reports (EIP-5267) is the one Python signs under
    _, name, version, chain_id, verifying, _, _ = escrow.eip712Domain()
    assert (name, version, chain_id) == ("GridMarket JobEscrow", "5", chain.chain_id)
    assert verifying == escrow.address
    assert domain_separator(chain.chain_id, escrow.address.lower()) == bytes(message.header)
    sig = sign_result(signer, chain.chain_id, escrow.address, jid, 7, OUTPUT)
    assert recover_result_signer(sig, chain.chain_id, escrow.address, jid, 7, OUTPUT) == (
        signer.address
    )


def test_acceptance_for_another_contract_is_refused(
    book: Book, escrow: Any, chain: Any, funded: Any, provider: Any
) -> None:
    sig = sign_acceptance(local(provider), chain.chain_id, ZERO, funded.job_id, 1, funded.job, 0)
    with ape.reverts(escrow.JobEscrowBadSignature):
        book.assign(funded, provider, sig=sig)
