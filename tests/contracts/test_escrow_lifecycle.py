"""Every job transition: happy paths, each revert by its custom error, and the attacks."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import ape
import pytest
from eth_account import Account
from eth_utils.crypto import keccak

from gridmarket.eip712 import recover_result_signer, sign_result
from gridmarket.escrow import Status, cid_digest, commitment, job_id

from .conftest import (
    BOUNTY,
    CHALLENGE,
    FEE_BPS,
    MAX_DURATION,
    MIN_BOUNTY,
    OUTPUT,
    SLASH_BPS,
    SPEC,
    STAKE,
    Book,
    local,
    params,
)


def sign(escrow: Any, chain: Any, signer: Any, state: Any, cid: str = OUTPUT, **over: Any) -> bytes:
    return sign_result(
        local(signer),
        over.get("chain_id", chain.chain_id),
        over.get("contract", escrow.address),
        over.get("job_id", state.job_id),
        over.get("attempt", state.job.attempt),
        cid,
    )


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


# ------------------------------------------------------------------------- deployment
def test_deploy_refuses_fee_above_cap(
    project: Any, owner: Any, operator: Any, treasury: Any
) -> None:
    with ape.reverts(project.JobEscrow.JobEscrowFeeTooHigh):
        project.JobEscrow.deploy(params(operator, treasury, fee=2001), sender=owner)


def test_deploy_refuses_zero_operator(project: Any, owner: Any, treasury: Any) -> None:
    with ape.reverts(project.JobEscrow.JobEscrowZeroAddress):
        project.JobEscrow.deploy(params(ape.utils.ZERO_ADDRESS, treasury), sender=owner)


# ------------------------------------------------------------------------- createJob
def test_create_locks_bounty_and_emits_everything(
    book: Book, escrow: Any, chain: Any, submitter: Any
) -> None:
    salt = os.urandom(32)
    before = escrow.balance
    state = book.create(submitter, salt=salt)
    assert state.job_id == job_id(submitter.address, SPEC, salt)
    assert state.status is Status.FUNDED
    assert state.spec_cid == SPEC and state.salt == salt
    assert state.job.bounty == BOUNTY and state.job.fee_bps == FEE_BPS
    assert escrow.balance == before + BOUNTY
    assert escrow.statusOf(state.job_id) == Status.FUNDED
    assert escrow.isCurrent(state.job_id, state.job.as_tuple())
    assert not escrow.isCurrent(state.job_id, replace(state.job, bounty=BOUNTY - 1).as_tuple())
    # the Python commitment is the contract's storage word, status byte included
    stored = stored_commitment(chain, escrow, state.job_id)
    assert stored == commitment(state.job, Status.FUNDED)
    assert stored & 0xFF == Status.FUNDED


def test_create_rejects_small_bounty(book: Book, escrow: Any, submitter: Any) -> None:
    with ape.reverts(escrow.JobEscrowBountyTooLow, bounty=MIN_BOUNTY - 1, minBounty=MIN_BOUNTY):
        book.create(submitter, bounty=MIN_BOUNTY - 1)


@pytest.mark.parametrize("duration", [59, MAX_DURATION + 1, -10])
def test_create_rejects_deadline_out_of_range(
    book: Book, escrow: Any, submitter: Any, duration: int
) -> None:
    with ape.reverts(escrow.JobEscrowDeadlineOutOfRange):
        book.create(submitter, duration=duration)


@pytest.mark.parametrize("spec", ["", "b" * 129])
def test_create_rejects_bad_spec_cid(book: Book, escrow: Any, submitter: Any, spec: str) -> None:
    with ape.reverts(escrow.JobEscrowBadSpecCid, length=len(spec)):
        book.create(submitter, spec=spec)


def test_create_same_id_twice_reverts(book: Book, escrow: Any, submitter: Any) -> None:
    salt = os.urandom(32)
    state = book.create(submitter, salt=salt)
    with ape.reverts(escrow.JobEscrowJobExists, jobId=state.job_id):
        book.create(submitter, salt=salt)


def test_front_running_create_cannot_take_the_id(
    book: Book, escrow: Any, submitter: Any, stranger: Any
) -> None:
    """An attacker copying a pending createJob (same spec, same salt) gets another id."""
    salt = os.urandom(32)
    theirs = book.create(stranger, salt=salt)
    mine = book.create(submitter, salt=salt)
    assert theirs.job_id != mine.job_id
    assert mine.job_id == job_id(submitter.address, SPEC, salt)
    assert mine.job.submitter == submitter.address


# ------------------------------------------------------------------------- cancel
def test_cancel_refunds_submitter(book: Book, escrow: Any, submitter: Any) -> None:
    state = book.create(submitter)
    state = book.do("cancel", state, sender=submitter)
    assert state.status is Status.REFUNDED
    assert escrow.balanceOf(submitter) == BOUNTY


def test_cancel_by_other_reverts(book: Book, escrow: Any, submitter: Any, stranger: Any) -> None:
    state = book.create(submitter)
    with ape.reverts(escrow.JobEscrowNotSubmitter, caller=stranger.address):
        book.do("cancel", state, sender=stranger)


def test_cancel_after_assignment_reverts(
    book: Book, escrow: Any, assigned: Any, submitter: Any
) -> None:
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.ASSIGNED):
        book.do("cancel", assigned, sender=submitter)


# ------------------------------------------------------------------------- assign
def test_assign_by_non_operator_reverts(
    book: Book, escrow: Any, submitter: Any, provider: Any, stranger: Any
) -> None:
    """The hackathon bug: an outsider assigning a job to itself."""
    state = book.create(submitter)
    with ape.reverts(escrow.JobEscrowNotOperator, caller=stranger.address):
        book.do("assign", state, stranger, sender=stranger)
    with ape.reverts(escrow.JobEscrowNotOperator, caller=provider.address):
        book.do("assign", state, provider, sender=provider)


def test_assign_unregistered_provider_reverts(
    book: Book, escrow: Any, submitter: Any, operator: Any, stranger: Any
) -> None:
    state = book.create(submitter)
    with ape.reverts(escrow.ProviderRegistryNotRegistered, provider=stranger.address):
        book.do("assign", state, stranger, sender=operator)


def test_assign_unstaked_provider_reverts(
    book: Book, escrow: Any, submitter: Any, operator: Any, stranger: Any
) -> None:
    escrow.registerProvider("bafkreinostake", sender=stranger)
    state = book.create(submitter)
    with ape.reverts(escrow.ProviderRegistryInsufficientStake, provider=stranger.address, stake=0):
        book.do("assign", state, stranger, sender=operator)


def test_assign_after_deadline_reverts(
    book: Book, escrow: Any, submitter: Any, operator: Any, provider: Any
) -> None:
    state = book.create(submitter, duration=120)
    book.sleep(121)
    with ape.reverts(escrow.JobEscrowDeadlinePassed):
        book.do("assign", state, provider, sender=operator)


def test_assign_with_tampered_struct_reverts(
    book: Book, escrow: Any, submitter: Any, operator: Any, provider: Any
) -> None:
    state = book.create(submitter)
    forged = replace(state, job=replace(state.job, bounty=state.job.bounty * 10))
    with ape.reverts(escrow.JobEscrowJobMismatch, jobId=state.job_id):
        book.do("assign", forged, provider, sender=operator)


def test_reassign_to_other_provider_counts_attempts(
    book: Book, escrow: Any, assigned: Any, operator: Any, provider: Any, provider2: Any
) -> None:
    with ape.reverts(escrow.JobEscrowSameProvider, provider=provider.address):
        book.do("assign", assigned, provider, sender=operator)
    state = book.do("assign", assigned, provider2, sender=operator)
    assert state.job.provider == provider2.address and state.job.attempt == 2
    # the old provider can no longer deliver
    with ape.reverts(escrow.JobEscrowNotProvider, caller=provider.address):
        book.do("submitResult", state, OUTPUT, sender=provider)


def test_unassign_returns_job_to_queue(
    book: Book, escrow: Any, assigned: Any, operator: Any, stranger: Any
) -> None:
    with ape.reverts(escrow.JobEscrowNotOperator):
        book.do("unassign", assigned, sender=stranger)
    state = book.do("unassign", assigned, sender=operator)
    assert state.status is Status.FUNDED and state.job.attempt == 1
    assert escrow.isCurrent(state.job_id, state.job.as_tuple())


# ------------------------------------------------------------------------- results
def test_result_only_from_assigned_provider(
    book: Book, escrow: Any, assigned: Any, provider2: Any, submitter: Any, operator: Any
) -> None:
    for caller in (provider2, submitter, operator):
        with ape.reverts(escrow.JobEscrowNotProvider, caller=caller.address):
            book.do("submitResult", assigned, OUTPUT, sender=caller)


def test_result_once_per_assignment(book: Book, escrow: Any, submitted: Any, provider: Any) -> None:
    assert submitted.status is Status.SUBMITTED
    assert submitted.job.result_digest == cid_digest(OUTPUT)
    assert submitted.output_cid == OUTPUT
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.SUBMITTED):
        book.do("submitResult", submitted, OUTPUT, sender=provider)


def test_result_after_deadline_reverts(
    book: Book, escrow: Any, submitter: Any, operator: Any, provider: Any
) -> None:
    state = book.do("assign", book.create(submitter, duration=120), provider, sender=operator)
    book.sleep(200)
    with ape.reverts(escrow.JobEscrowDeadlinePassed):
        book.do("submitResult", state, OUTPUT, sender=provider)


@pytest.mark.parametrize("cid", ["", "x" * 129])
def test_result_rejects_bad_cid(
    book: Book, escrow: Any, assigned: Any, provider: Any, cid: str
) -> None:
    with ape.reverts(escrow.JobEscrowBadOutputCid, length=len(cid)):
        book.do("submitResult", assigned, cid, sender=provider)


# ------------------------------------------------------------------------- signatures
def test_relayed_result_by_anyone(
    book: Book, escrow: Any, chain: Any, assigned: Any, provider: Any, stranger: Any
) -> None:
    sig = sign(escrow, chain, provider, assigned)
    digest = escrow.resultDigest(assigned.job_id, assigned.job.attempt, OUTPUT)
    assert (
        recover_result_signer(
            sig, chain.chain_id, escrow.address, assigned.job_id, assigned.job.attempt, OUTPUT
        )
        == provider.address
    )
    assert len(bytes(digest)) == 32
    state = book.do("submitResultFor", assigned, OUTPUT, sig, sender=stranger)
    assert state.status is Status.SUBMITTED and state.job.provider == provider.address
    # the same signature cannot be used twice
    with ape.reverts(escrow.JobEscrowWrongStatus):
        book.do("submitResultFor", assigned, OUTPUT, sig, sender=stranger)


def test_signature_by_wrong_key_reverts(
    book: Book, escrow: Any, chain: Any, assigned: Any, provider2: Any, operator: Any
) -> None:
    sig = sign(escrow, chain, provider2, assigned)
    with ape.reverts(escrow.JobEscrowBadSignature, recovered=provider2.address):
        book.do("submitResultFor", assigned, OUTPUT, sig, sender=operator)


def test_signature_does_not_cover_other_cid(
    book: Book, escrow: Any, chain: Any, assigned: Any, provider: Any, operator: Any
) -> None:
    sig = sign(escrow, chain, provider, assigned, cid=OUTPUT)
    with ape.reverts(escrow.JobEscrowBadSignature):
        book.do("submitResultFor", assigned, "bafkreievil", sig, sender=operator)


def test_signature_replay_across_jobs(
    book: Book, escrow: Any, chain: Any, submitter: Any, operator: Any, provider: Any
) -> None:
    a = book.do("assign", book.create(submitter), provider, sender=operator)
    b = book.do("assign", book.create(submitter), provider, sender=operator)
    sig_a = sign(escrow, chain, provider, a)
    with ape.reverts(escrow.JobEscrowBadSignature):
        book.do("submitResultFor", b, OUTPUT, sig_a, sender=operator)


def test_signature_replay_across_assignments(
    book: Book,
    escrow: Any,
    chain: Any,
    assigned: Any,
    operator: Any,
    provider: Any,
    provider2: Any,
) -> None:
    old = sign(escrow, chain, provider, assigned)  # attempt 1
    state = book.do("assign", assigned, provider2, sender=operator)
    state = book.do("assign", state, provider, sender=operator)  # attempt 3, provider again
    with ape.reverts(escrow.JobEscrowBadSignature):
        book.do("submitResultFor", state, OUTPUT, old, sender=operator)


def test_signature_replay_across_chains_and_contracts(
    project: Any,
    book: Book,
    escrow: Any,
    chain: Any,
    assigned: Any,
    owner: Any,
    operator: Any,
    treasury: Any,
    provider: Any,
) -> None:
    other_chain = sign(escrow, chain, provider, assigned, chain_id=chain.chain_id + 1)
    with ape.reverts(escrow.JobEscrowBadSignature):
        book.do("submitResultFor", assigned, OUTPUT, other_chain, sender=operator)
    twin = project.JobEscrow.deploy(params(operator, treasury), sender=owner)
    other_contract = sign(escrow, chain, provider, assigned, contract=twin.address)
    with ape.reverts(escrow.JobEscrowBadSignature):
        book.do("submitResultFor", assigned, OUTPUT, other_contract, sender=operator)


def test_malleable_and_malformed_signatures_rejected(
    book: Book, escrow: Any, chain: Any, assigned: Any, provider: Any, operator: Any
) -> None:
    sig = sign(escrow, chain, provider, assigned)
    n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
    r, s, v = sig[:32], int.from_bytes(sig[32:64], "big"), sig[64]
    flipped = r + (n - s).to_bytes(32, "big") + bytes([55 - v])  # same signer, high s
    for bad in (flipped, sig[:64], sig + b"\x00", b""):
        with ape.reverts(escrow.JobEscrowBadSignature):
            book.do("submitResultFor", assigned, OUTPUT, bad, sender=operator)


# ------------------------------------------------------------------------- settle
def test_settle_verifies_and_pays_in_one_tx(
    book: Book,
    escrow: Any,
    chain: Any,
    assigned: Any,
    provider: Any,
    operator: Any,
    stranger: Any,
) -> None:
    sig = sign(escrow, chain, provider, assigned)
    with ape.reverts(escrow.JobEscrowNotOperator):
        book.do("settle", assigned, OUTPUT, sig, sender=stranger)
    with ape.reverts(escrow.JobEscrowBadSignature):
        book.do(
            "settle", assigned, OUTPUT, sign(escrow, chain, stranger, assigned), sender=operator
        )
    before = escrow.balanceOf(provider)
    fees = escrow.feesAccrued()
    state = book.do("settle", assigned, OUTPUT, sig, sender=operator)
    assert state.status is Status.RELEASED and state.output_cid == OUTPUT
    assert escrow.balanceOf(provider) == before + state.job.payout
    assert escrow.feesAccrued() == fees + state.job.fee
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.RELEASED):
        book.do("settle", assigned, OUTPUT, sig, sender=operator)


# ------------------------------------------------------------------------- release / claim
def test_release_by_operator_pays_provider_minus_fee(
    book: Book, escrow: Any, submitted: Any, operator: Any, provider: Any
) -> None:
    before = escrow.balanceOf(provider)
    state = book.do("release", submitted, sender=operator)
    assert state.status is Status.RELEASED
    fee = BOUNTY * FEE_BPS // 10_000
    assert escrow.balanceOf(provider) == before + BOUNTY - fee
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.RELEASED):
        book.do("release", submitted, sender=operator)


def test_submitter_can_accept_early(
    book: Book, escrow: Any, submitted: Any, submitter: Any, stranger: Any, provider: Any
) -> None:
    with ape.reverts(escrow.JobEscrowNotAllowed, caller=stranger.address):
        book.do("release", submitted, sender=stranger)
    with ape.reverts(escrow.JobEscrowNotAllowed, caller=provider.address):
        book.do("release", submitted, sender=provider)
    assert book.do("release", submitted, sender=submitter).status is Status.RELEASED


def test_claim_after_challenge_window_without_operator(
    book: Book, escrow: Any, submitted: Any, provider: Any, stranger: Any, operator: Any
) -> None:
    with ape.reverts(escrow.JobEscrowChallengeWindowOpen):
        book.do("claim", submitted, sender=provider)
    book.sleep(CHALLENGE)
    with ape.reverts(escrow.JobEscrowNotProvider, caller=stranger.address):
        book.do("claim", submitted, sender=stranger)
    state = book.do("claim", submitted, sender=provider)
    assert state.status is Status.RELEASED
    assert escrow.balanceOf(provider) == state.job.payout
    # no double payment by any path
    with ape.reverts(escrow.JobEscrowWrongStatus):
        book.do("claim", submitted, sender=provider)
    with ape.reverts(escrow.JobEscrowWrongStatus):
        book.do("release", submitted, sender=operator)


# ------------------------------------------------------------------------- reject
def test_reject_slashes_and_requeues(
    book: Book,
    escrow: Any,
    submitted: Any,
    operator: Any,
    provider: Any,
    provider2: Any,
    submitter: Any,
) -> None:
    stake = escrow.providerOf(provider).stake
    state = book.do("reject", submitted, sender=operator)
    slashed = stake * SLASH_BPS // 10_000
    assert state.status is Status.FUNDED and state.output_cid is None
    assert escrow.providerOf(provider).stake == stake - slashed
    assert escrow.balanceOf(submitter) == slashed
    # completed elsewhere, and the rejected provider cannot sneak its result in
    state = book.do("assign", state, provider2, sender=operator)
    with ape.reverts(escrow.JobEscrowNotProvider):
        book.do("submitResult", state, OUTPUT, sender=provider)
    state = book.do("submitResult", state, OUTPUT, sender=provider2)
    assert book.do("release", state, sender=operator).status is Status.RELEASED


def test_reject_rules(
    book: Book, escrow: Any, submitted: Any, operator: Any, submitter: Any, provider: Any
) -> None:
    with ape.reverts(escrow.JobEscrowNotOperator):
        book.do("reject", submitted, sender=submitter)
    book.sleep(CHALLENGE)
    with ape.reverts(escrow.JobEscrowChallengeWindowClosed):
        book.do("reject", submitted, sender=operator)
    assert book.do("claim", submitted, sender=provider).status is Status.RELEASED


# ------------------------------------------------------------------------- refund
def test_refund_needs_no_operator(
    book: Book, escrow: Any, submitter: Any, operator: Any, provider: Any, stranger: Any
) -> None:
    state = book.do("assign", book.create(submitter, duration=120), provider, sender=operator)
    with ape.reverts(escrow.JobEscrowDeadlineNotPassed):
        book.do("refund", state, sender=stranger)
    book.sleep(121)
    state = book.do("refund", state, sender=stranger)  # a stranger triggers, submitter gets it
    assert state.status is Status.REFUNDED
    assert escrow.balanceOf(submitter) == BOUNTY
    assert escrow.balanceOf(stranger) == 0
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.REFUNDED):
        book.do("refund", state, sender=submitter)


def test_no_refund_of_a_delivered_or_paid_job(
    book: Book, escrow: Any, submitted: Any, submitter: Any, operator: Any
) -> None:
    book.sleep(3700)
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.SUBMITTED):
        book.do("refund", submitted, sender=submitter)
    book.do("release", submitted, sender=operator)
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.RELEASED):
        book.do("refund", submitted, sender=submitter)


def test_unknown_job_reverts(book: Book, escrow: Any, submitter: Any, operator: Any) -> None:
    state = book.create(submitter)
    ghost = replace(state, job_id=os.urandom(32))
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.NONE):
        book.do("assign", ghost, submitter, sender=operator)


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
    state = book.do("assign", book.create(submitter), provider, sender=operator)
    with ape.reverts(escrow.JobEscrowFeeTooHigh, feeBps=2001, maxFeeBps=2000):
        escrow.setFeeBps(2001, sender=owner)
    with ape.reverts(escrow.JobEscrowNotOwner):
        escrow.setFeeBps(100, sender=operator)
    escrow.setFeeBps(2000, sender=owner)  # later jobs only
    state = book.do("submitResult", state, OUTPUT, sender=provider)
    state = book.do("release", state, sender=operator)
    assert state.job.fee == BOUNTY * FEE_BPS // 10_000
    assert escrow.feesAccrued() == state.job.fee
    escrow.collectFees(sender=stranger)
    assert escrow.feesAccrued() == 0 and escrow.balanceOf(treasury) == state.job.fee
    with ape.reverts(escrow.JobEscrowNothingToWithdraw):
        escrow.collectFees(sender=stranger)
    assert book.create(submitter).job.fee_bps == 2000


# ------------------------------------------------------------------------- withdrawals
def test_withdraw_pays_exactly_once(
    book: Book, escrow: Any, submitted: Any, operator: Any, provider: Any
) -> None:
    state = book.do("release", submitted, sender=operator)
    before = provider.balance
    receipt = escrow.withdraw(sender=provider)
    gas = receipt.gas_used * receipt.gas_price
    assert provider.balance == before + state.job.payout - gas
    assert escrow.balanceOf(provider) == 0
    with ape.reverts(escrow.JobEscrowNothingToWithdraw, account=provider.address):
        escrow.withdraw(sender=provider)
    with ape.reverts(escrow.JobEscrowZeroAddress):
        escrow.withdrawTo(ape.utils.ZERO_ADDRESS, sender=provider)


def _attacker_job(book: Book, escrow: Any, attacker: Any, submitter: Any, operator: Any) -> Any:
    attacker.register("bafkreiattacker", sender=operator, value=STAKE)
    state = book.do("assign", book.create(submitter), attacker, sender=operator)
    receipt = attacker.submit(state.job_id, state.job.as_tuple(), OUTPUT, sender=operator)
    state = book.fold(state, receipt)
    return book.do("release", state, sender=operator)


def test_reentrant_receiver_cannot_drain(
    project: Any, book: Book, escrow: Any, submitter: Any, operator: Any, submitted: Any
) -> None:
    book.do("release", submitted, sender=operator)  # other people's money in the escrow
    attacker = project.ReentrantProvider.deploy(escrow.address, sender=operator)
    state = _attacker_job(book, escrow, attacker, submitter, operator)
    held = escrow.balance
    attacker.drain(sender=operator)
    assert attacker.reentryBlocked() and attacker.reentries() >= 1
    assert attacker.balance == state.job.payout
    assert escrow.balance == held - state.job.payout


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
    attacker = project.RevertingProvider.deploy(escrow.address, sender=operator)
    state = _attacker_job(book, escrow, attacker, submitter, operator)
    with ape.reverts(escrow.JobEscrowWithdrawFailed):
        attacker.drain(sender=operator)
    assert escrow.balanceOf(attacker) == state.job.payout  # nothing lost
    # everybody else is unaffected
    book.do("release", submitted, sender=operator)
    escrow.withdraw(sender=provider)
    # and the stuck wallet can send its money elsewhere
    before = stranger.balance
    attacker.rescue(stranger, sender=operator)
    assert stranger.balance == before + state.job.payout


# ------------------------------------------------------------------------- ownership
def test_two_step_ownership(
    escrow: Any, owner: Any, stranger: Any, operator: Any, treasury: Any
) -> None:
    with ape.reverts(escrow.JobEscrowNotOwner, caller=stranger.address):
        escrow.transferOwnership(stranger, sender=stranger)
    escrow.transferOwnership(stranger, sender=owner)
    assert escrow.owner() == owner.address and escrow.pendingOwner() == stranger.address
    with ape.reverts(escrow.JobEscrowNotPendingOwner, caller=operator.address):
        escrow.acceptOwnership(sender=operator)
    escrow.acceptOwnership(sender=stranger)
    assert escrow.owner() == stranger.address
    with ape.reverts(escrow.JobEscrowNotOwner):
        escrow.setOperator(owner, sender=owner)
    with ape.reverts(escrow.JobEscrowZeroAddress):
        escrow.setOperator(ape.utils.ZERO_ADDRESS, sender=stranger)
    escrow.setOperator(owner, sender=stranger)
    assert escrow.operator() == owner.address
    with ape.reverts(escrow.JobEscrowZeroAddress):
        escrow.setTreasury(ape.utils.ZERO_ADDRESS, sender=stranger)
    escrow.setTreasury(operator, sender=stranger)
    assert escrow.treasury() == operator.address


def test_eip712_domain_matches_python(escrow: Any, chain: Any) -> None:
    signer = Account.create()
    jid = os.urandom(32)
    sig = sign_result(signer, chain.chain_id, escrow.address, jid, 7, OUTPUT)
    digest = bytes(escrow.resultDigest(jid, 7, OUTPUT))
    assert Account._recover_hash(digest, signature=sig) == signer.address
