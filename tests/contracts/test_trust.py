"""The trust issue, attack by attack (escrow version 2, docs/trust.md).

Each ``test_attack_*`` replays an attack's exact call sequence against the contract and shows
where it now fails (the custom error) and that no money or stake moved. Each ``test_role_*`` is
one row of the roles table in docs/trust.md and docs/contracts.md: what that key can do, then
what it cannot.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import ape

from gridmarket.escrow import ZERO_ADDRESS, JobState, Status

from .conftest import (
    BOUNTY,
    CHALLENGE,
    DEPOSIT,
    FEE_BPS,
    MEDIATION_WINDOW,
    ON_VERIFY,
    OUTPUT,
    REASSIGN_DELAY,
    STAKE,
    Book,
    v5_args,
)

FEE = BOUNTY * FEE_BPS // 10_000
PAYOUT = BOUNTY - FEE
JUNK = "bafkreijunkjunkjunkjunkjunkjunkjunkjunkjunkjunkjunkjunkjun"


def stakes(escrow: Any, *who: Any) -> list[tuple[int, int, int]]:
    """(stake, locked, unstakePending) of each account."""
    out = []
    for w in who:
        info = escrow.providerOf(w)
        out.append((info.stake, info.locked, info.unstakePending))
    return out


# ============================================================== (a) the operator as a provider
def test_attack_a_operator_registers_itself(escrow: Any, operator: Any) -> None:
    with ape.reverts(escrow.ProviderRegistryReservedAddress, account=operator.address):
        escrow.registerProvider("bafkreioperator", sender=operator, value=STAKE)
    assert not escrow.providerOf(operator).registered


def test_attack_a_operator_assigns_to_itself_or_a_party_of_the_job(
    book: Book,
    escrow: Any,
    funded: JobState,
    operator: Any,
    submitter: Any,
    mediator: Any,
    treasury: Any,
) -> None:
    # each signs its own acceptance: the willingness is there, the conflict is refused
    for who in (operator, submitter, mediator):
        with ape.reverts(escrow.JobEscrowConflictOfInterest, provider=who.address):
            book.assign(funded, who)
    # the treasury can never register, so it can never hold collateral or a job
    with ape.reverts(escrow.ProviderRegistryNotRegistered, provider=treasury.address):
        book.assign(funded, treasury)
    assert escrow.statusOf(funded.job_id) == Status.FUNDED and book.current(funded)


def test_attack_a_submitter_naming_itself_mediator_cannot_be_the_provider(
    book: Book, escrow: Any, submitter: Any
) -> None:
    state = book.create(submitter, mediator=submitter)
    with ape.reverts(escrow.JobEscrowConflictOfInterest, provider=submitter.address):
        book.assign(state, submitter)


# ============================================================== (b) assignment without consent
def test_attack_b_assign_without_the_providers_acceptance(
    book: Book, escrow: Any, funded: JobState, operator: Any, provider: Any, stranger: Any
) -> None:
    before = stakes(escrow, provider)
    # the operator signs "for" the provider, sends garbage, or nothing
    with ape.reverts(escrow.JobEscrowBadSignature, recovered=operator.address):
        book.assign(funded, provider, sig=book.accept(operator, funded))
    with ape.reverts(escrow.JobEscrowBadSignature, recovered=stranger.address):
        book.assign(funded, provider, sig=book.accept(stranger, funded))
    with ape.reverts(escrow.JobEscrowBadSignature, recovered=ZERO_ADDRESS):
        book.assign(funded, provider, sig=b"")
    assert stakes(escrow, provider) == before  # no collateral locked against its will


def test_attack_b_replay_an_acceptance_for_another_attempt(
    book: Book, escrow: Any, funded: JobState, provider: Any, operator: Any
) -> None:
    sig = book.accept(provider, funded)  # attempt 1
    state = book.assign(funded, provider, sig=sig)
    state = book.do("unassign", state, sender=provider)  # the provider hands it back
    # the operator pushes the job on it again with the attempt-1 acceptance
    with ape.reverts(escrow.JobEscrowBadSignature, provider=provider.address):
        book.assign(state, provider, sig=sig)
    assert escrow.providerOf(provider).locked == 0


def test_attack_b_replay_an_acceptance_for_another_job(
    book: Book, escrow: Any, submitter: Any, provider: Any
) -> None:
    a, b = book.create(submitter), book.create(submitter)
    with ape.reverts(escrow.JobEscrowBadSignature, provider=provider.address):
        book.assign(b, provider, sig=book.accept(provider, a))


def test_attack_b_replay_an_acceptance_from_another_chain_or_contract(
    book: Book, escrow: Any, chain: Any, funded: JobState, provider: Any, stranger: Any
) -> None:
    with ape.reverts(escrow.JobEscrowBadSignature, provider=provider.address):
        book.assign(
            funded, provider, sig=book.accept(provider, funded, chain_id=chain.chain_id + 1)
        )
    with ape.reverts(escrow.JobEscrowBadSignature, provider=provider.address):
        book.assign(funded, provider, sig=book.accept(provider, funded, contract=stranger.address))


def test_attack_b_acceptance_of_other_terms(
    book: Book, escrow: Any, funded: JobState, provider: Any, stranger: Any
) -> None:
    """A provider accepted a job with a listed mediator and full collateral; the operator
    cannot use it for the same job id with other terms (the job struct is the submitter's)."""
    for terms in (
        replace(funded.job, mediator=stranger.address),
        replace(funded.job, collateral=1),
        replace(funded.job, flags=ON_VERIFY),
        replace(funded.job, bounty=2 * BOUNTY),
    ):
        with ape.reverts(escrow.JobEscrowBadSignature, provider=provider.address):
            book.assign(funded, provider, sig=book.accept(provider, funded, job=terms))


# ============================================================== (c) stealing honest work
def test_attack_c_operator_cannot_take_a_job_back_before_the_delay(
    book: Book,
    escrow: Any,
    assigned: JobState,
    operator: Any,
    provider: Any,
    provider2: Any,
) -> None:
    """The operator has seen the honest provider's result off-chain and tries to give the job
    to a sybil (who would copy the result) before the provider posts it."""
    with ape.reverts(escrow.JobEscrowTooEarly, jobId=assigned.job_id):
        book.do("unassign", assigned, sender=operator)
    with ape.reverts(escrow.JobEscrowTooEarly, jobId=assigned.job_id):
        book.assign(assigned, provider2)
    book.sleep(REASSIGN_DELAY - 60)
    with ape.reverts(escrow.JobEscrowTooEarly, jobId=assigned.job_id):
        book.assign(assigned, provider2)
    # the honest provider posts its result itself, within the delay
    state = book.do("submitResult", assigned, OUTPUT, sender=provider)
    book.sleep(60)
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.SUBMITTED):
        book.do("unassign", state, sender=operator)
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.SUBMITTED):
        book.assign(state, provider2)
    book.sleep(CHALLENGE)
    book.do("finalize", state, sender=provider)
    assert escrow.balanceOf(provider) == PAYOUT and escrow.balanceOf(provider2) == 0


# ============================================================== (d) no reject, no slash
def test_attack_d_there_is_no_reject_or_slash(escrow: Any) -> None:
    functions = {a.name for a in escrow.contract_type.abi if a.type == "function"}
    assert {"reject", "claim", "slash", "slashBps"}.isdisjoint(functions)
    assert not [n for n in functions if "slash" in n.lower()]


def test_attack_d_every_operator_call_leaves_the_stake_alone(
    book: Book,
    escrow: Any,
    submitted: JobState,
    operator: Any,
    provider: Any,
    provider2: Any,
) -> None:
    """The operator tries every job function on a submitted job; nothing moves the provider's
    stake, and after the window the result is paid."""
    before = stakes(escrow, provider)
    job = submitted.job.as_tuple()
    jid = submitted.job_id
    attempts = [
        ("rule", (False,), escrow.JobEscrowNotMediator),
        ("rule", (True,), escrow.JobEscrowNotMediator),
        ("release", (), escrow.JobEscrowNotAllowed),
        ("settle", (OUTPUT, book.sign(provider, submitted)), escrow.JobEscrowNotOnVerify),
        ("unassign", (), escrow.JobEscrowWrongStatus),
        ("dispute", (), escrow.JobEscrowNotSubmitter),
        ("finalize", (), escrow.JobEscrowChallengeWindowOpen),
        ("cancel", (), escrow.JobEscrowWrongStatus),
        ("refund", (), escrow.JobEscrowWrongStatus),
        ("submitResult", (JUNK,), escrow.JobEscrowWrongStatus),
        ("assign", (provider2, book.accept(provider2, submitted)), escrow.JobEscrowWrongStatus),
    ]
    for fn, extra, error in attempts:
        value = DEPOSIT if fn == "dispute" else 0
        with ape.reverts(error):
            getattr(escrow, fn)(*v5_args(fn, jid, job, *extra), sender=operator, value=value)
    assert stakes(escrow, provider) == before
    book.sleep(CHALLENGE)
    for fn, extra, _ in attempts:  # and again once the window closed
        if fn == "finalize":
            continue
        value = DEPOSIT if fn == "dispute" else 0
        with ape.reverts():
            getattr(escrow, fn)(*v5_args(fn, jid, job, *extra), sender=operator, value=value)
    assert stakes(escrow, provider) == before
    book.do("finalize", submitted, sender=operator)  # anyone, the operator too: pays the provider
    assert escrow.balanceOf(provider) == PAYOUT and escrow.balanceOf(operator) == 0
    assert stakes(escrow, provider) == [(STAKE, 0, 0)]


# ============================================================== (e) a sybil's junk at the deadline
def _junk_at_the_deadline(book: Book, submitter: Any, small: Any) -> JobState:
    state = book.assign(book.create(submitter, duration=120), small)
    book.chain.pending_timestamp = state.job.deadline  # the next block is the deadline itself
    state = book.do("submitResult", state, JUNK, sender=small)
    assert state.job.since == state.job.deadline
    return state


def test_attack_e_junk_never_claimed_is_finalized_by_anyone(
    book: Book, escrow: Any, submitter: Any, small: Any, stranger: Any
) -> None:
    """The old escrow let a result sit unclaimed with the bounty stuck; now anyone finalizes."""
    state = _junk_at_the_deadline(book, submitter, small)
    book.sleep(CHALLENGE)
    state = book.do("finalize", state, sender=stranger)
    assert state.status is Status.RELEASED and escrow.balanceOf(small) == PAYOUT


def test_attack_e_junk_disputed_and_ruled_wrong_costs_the_sybil_its_collateral(
    book: Book, escrow: Any, submitter: Any, small: Any, mediator: Any, stranger: Any
) -> None:
    state = _junk_at_the_deadline(book, submitter, small)
    state = book.do("dispute", state, sender=submitter, value=DEPOSIT)
    state = book.do("rule", state, False, sender=mediator)
    assert state.status is Status.FUNDED
    # the submitter: its deposit back and the collateral less the mediator's re-run
    assert escrow.balanceOf(submitter) == BOUNTY
    assert escrow.balanceOf(mediator) == DEPOSIT
    assert stakes(escrow, small) == [(0, 0, 0)]
    # the deadline has passed: the bounty comes back too (anyone triggers it)
    book.sleep(1)  # anvil may mine blocks in the same second: be past the deadline
    state = book.do("refund", state, sender=stranger)
    assert state.status is Status.REFUNDED
    assert escrow.balanceOf(submitter) == 2 * BOUNTY and escrow.balanceOf(small) == 0


# ============================================================== (f) owner changes after funding
def test_attack_f_owner_settings_do_not_reach_a_funded_job(
    book: Book,
    escrow: Any,
    owner: Any,
    operator: Any,
    submitter: Any,
    provider: Any,
    mediator: Any,
    spare: Any,
    stranger: Any,
) -> None:
    funded = book.create(submitter, flags=ON_VERIFY)
    escrow.setOperator(spare, sender=owner)
    escrow.setFeeBps(2000, sender=owner)
    escrow.setMediator(mediator, False, sender=owner)
    escrow.setTreasury(stranger, sender=owner)
    # the new operator cannot touch the job; the old one is still its only operator
    with ape.reverts(escrow.JobEscrowNotOperator, caller=spare.address, operator=operator.address):
        book.assign(funded, provider, sender=spare)
    state = book.assign(funded, provider, sender=operator)
    sig = book.sign(provider, state)
    with ape.reverts(escrow.JobEscrowNotOperator, caller=spare.address):
        book.do("settle", state, OUTPUT, sig, sender=spare)
    state = book.do("submitResult", state, OUTPUT, sender=provider)
    with ape.reverts(escrow.JobEscrowNotAllowed, caller=spare.address):
        book.do("release", state, sender=spare)
    # the unlisted mediator still rules on the job that named it; the fee is the funded one
    state = book.do("rule", state, True, sender=mediator)
    assert state.status is Status.RELEASED
    assert escrow.balanceOf(provider) == PAYOUT and escrow.feesAccrued() == FEE
    # a job funded now gets the new terms
    fresh = book.create(submitter, mediator=submitter)
    assert fresh.job.operator == spare.address and fresh.job.fee_bps == 2000


def test_attack_f_operator_cannot_become_a_provider_or_vice_versa(
    escrow: Any, owner: Any, provider: Any, spare: Any, operator: Any
) -> None:
    with ape.reverts(escrow.ProviderRegistryReservedAddress, account=provider.address):
        escrow.setOperator(provider, sender=owner)
    escrow.setOperator(spare, sender=owner)
    with ape.reverts(escrow.ProviderRegistryReservedAddress, account=spare.address):
        escrow.registerProvider("bafkreinewop", sender=spare, value=STAKE)


def test_attack_f_retired_operator_cannot_work_its_own_jobs(
    book: Book, escrow: Any, owner: Any, operator: Any, submitter: Any, spare: Any
) -> None:
    """Once rotated out, the old operator may register as a provider, but never for the jobs
    funded under it (it is still their operator)."""
    funded = book.create(submitter)
    escrow.setOperator(spare, sender=owner)
    escrow.registerProvider("bafkreiretired", sender=operator, value=STAKE)
    with ape.reverts(escrow.JobEscrowConflictOfInterest, provider=operator.address):
        book.assign(funded, operator, sender=operator)


# ============================================================== (g) unstake while holding a job
def test_attack_g_unstake_while_holding_a_job(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
    mediator: Any,
) -> None:
    state = book.assign(book.create(submitter), provider)
    with ape.reverts(
        escrow.ProviderRegistryUnstakeTooLarge, amount=STAKE, available=STAKE - BOUNTY
    ):
        escrow.requestUnstake(STAKE, sender=provider)
    escrow.requestUnstake(STAKE - BOUNTY, sender=provider)  # all it may: the free part
    state = book.do("submitResult", state, JUNK, sender=provider)
    state = book.do("dispute", state, sender=submitter, value=DEPOSIT)
    book.do("rule", state, False, sender=mediator)
    assert stakes(escrow, provider) == [(0, 0, STAKE - BOUNTY)]  # the locked part was taken
    assert escrow.balanceOf(submitter) == BOUNTY


# ============================================================== (h) more work than collateral
def test_attack_h_no_more_work_than_free_collateral(
    book: Book, escrow: Any, submitter: Any, small: Any
) -> None:
    book.assign(book.create(submitter), small)
    second = book.create(submitter)
    with ape.reverts(
        escrow.ProviderRegistryInsufficientCollateral, provider=small.address, free=0, needed=BOUNTY
    ):
        book.assign(second, small)


# ============================================================== (i) paying without the opt-in
def test_attack_i_operator_cannot_pay_a_job_not_funded_on_verify(
    book: Book, escrow: Any, assigned: JobState, operator: Any, provider: Any
) -> None:
    with ape.reverts(escrow.JobEscrowNotOnVerify, jobId=assigned.job_id):
        book.do("settle", assigned, OUTPUT, book.sign(provider, assigned), sender=operator)
    state = book.do("submitResult", assigned, OUTPUT, sender=provider)
    with ape.reverts(escrow.JobEscrowNotAllowed, caller=operator.address):
        book.do("release", state, sender=operator)
    assert escrow.balanceOf(provider) == 0


# ============================================================== (j) a silent mediator
def test_attack_j_silent_mediator_then_anyone_finalizes(
    book: Book, escrow: Any, submitted: JobState, submitter: Any, stranger: Any, provider: Any
) -> None:
    state = book.do("dispute", submitted, sender=submitter, value=DEPOSIT)
    book.sleep(MEDIATION_WINDOW - 120)
    with ape.reverts(escrow.JobEscrowChallengeWindowOpen, jobId=state.job_id):
        book.do("finalize", state, sender=stranger)
    book.sleep(120)
    state = book.do("finalize", state, sender=stranger)
    assert state.status is Status.RELEASED
    assert escrow.balanceOf(submitter) == DEPOSIT  # the deposit comes back
    assert escrow.balanceOf(provider) == PAYOUT


# ============================================================== (k) rulings by the job's mediator
def test_attack_k_only_the_jobs_mediator_rules(
    book: Book,
    escrow: Any,
    owner: Any,
    submitter: Any,
    provider: Any,
    mediator: Any,
    spare: Any,
    operator: Any,
) -> None:
    escrow.setMediator(spare, True, sender=owner)  # another listed mediator
    own = book.create(submitter, mediator=submitter)  # the submitter mediates its own job
    state = book.do("submitResult", book.assign(own, provider), OUTPUT, sender=provider)
    for who in (mediator, spare, operator, owner):
        with ape.reverts(
            escrow.JobEscrowNotMediator, caller=who.address, mediator=submitter.address
        ):
            book.do("rule", state, False, sender=who)
    named = book.create(submitter, mediator=spare)
    state2 = book.do("submitResult", book.assign(named, provider), OUTPUT, sender=provider)
    state2 = book.do("dispute", state2, sender=submitter, value=DEPOSIT)
    with ape.reverts(escrow.JobEscrowNotMediator, caller=mediator.address, mediator=spare.address):
        book.do("rule", state2, False, sender=mediator)
    assert book.do("rule", state2, True, sender=spare).status is Status.RELEASED
    assert book.do("rule", state, True, sender=submitter).status is Status.RELEASED


# ============================================================== roles (docs/trust.md table)
def test_role_owner(
    book: Book, escrow: Any, owner: Any, funded: JobState, provider: Any, submitter: Any,
    spare: Any,
) -> None:  # fmt: skip
    """Owner: can change settings for jobs funded later and hand over ownership; cannot
    assign, pay, refund, rule, or move a balance or a stake."""
    escrow.setFeeBps(100, sender=owner)
    escrow.setMediator(spare, True, sender=owner)
    escrow.transferOwnership(spare, sender=owner)
    with ape.reverts(escrow.JobEscrowNotOperator):
        book.assign(funded, provider, sender=owner)
    with ape.reverts(escrow.JobEscrowNotSubmitter):
        book.do("cancel", funded, sender=owner)
    state = book.do("submitResult", book.assign(funded, provider), OUTPUT, sender=provider)
    with ape.reverts(escrow.JobEscrowNotAllowed):
        book.do("release", state, sender=owner)
    with ape.reverts(escrow.JobEscrowNotMediator):
        book.do("rule", state, False, sender=owner)
    with ape.reverts(escrow.JobEscrowNothingToWithdraw, account=owner.address):
        escrow.withdraw(sender=owner)
    assert escrow.providerOf(provider).stake == STAKE and book.current(state)


def test_role_operator(
    book: Book, escrow: Any, operator: Any, submitter: Any, provider: Any, provider2: Any
) -> None:
    """Operator: can assign a willing provider, take a job back after reassignDelay, and pay
    on-verify jobs at once; cannot pay other jobs, rule, refund early, or take a stake."""
    state = book.assign(book.create(submitter, flags=ON_VERIFY), provider)
    book.sleep(REASSIGN_DELAY)
    state = book.assign(state, provider2)
    state = book.do("settle", state, OUTPUT, book.sign(provider2, state), sender=operator)
    assert state.status is Status.RELEASED and escrow.balanceOf(provider2) == PAYOUT
    other = book.do(
        "submitResult", book.assign(book.create(submitter), provider), OUTPUT, sender=provider
    )
    with ape.reverts(escrow.JobEscrowNotAllowed):
        book.do("release", other, sender=operator)
    with ape.reverts(escrow.JobEscrowNotMediator):
        book.do("rule", other, False, sender=operator)
    assert stakes(escrow, provider, provider2) == [(STAKE, BOUNTY, 0), (STAKE, 0, 0)]
    assert escrow.balanceOf(operator) == 0


def test_role_mediator(
    book: Book, escrow: Any, submitted: JobState, mediator: Any, submitter: Any, provider: Any
) -> None:
    """Mediator: can rule on the jobs that name it (a dispute, or its own check within the
    window) and is paid the deposit for a re-run; cannot be those jobs' provider, rule late on
    an undisputed result, or take more than the deposit."""
    with ape.reverts(escrow.JobEscrowConflictOfInterest, provider=mediator.address):
        book.assign(book.create(submitter), mediator)
    state = book.do("dispute", submitted, sender=submitter, value=DEPOSIT)
    book.do("rule", state, True, sender=mediator)
    assert escrow.balanceOf(mediator) == DEPOSIT
    late = book.do(
        "submitResult", book.assign(book.create(submitter), provider), OUTPUT, sender=provider
    )
    book.sleep(CHALLENGE)
    with ape.reverts(escrow.JobEscrowChallengeWindowClosed):
        book.do("rule", late, False, sender=mediator)


def test_role_provider(
    book: Book, escrow: Any, funded: JobState, provider: Any, provider2: Any, submitter: Any
) -> None:
    """Provider: can accept, deliver, hand back, and be paid after the window without anyone;
    cannot deliver another's job, deliver late, pay itself early, or unstake locked stake."""
    state = book.assign(funded, provider)
    with ape.reverts(escrow.JobEscrowNotProvider):
        book.do("submitResult", state, OUTPUT, sender=provider2)
    with ape.reverts(escrow.ProviderRegistryUnstakeTooLarge):
        escrow.requestUnstake(STAKE, sender=provider)
    state = book.do("submitResult", state, OUTPUT, sender=provider)
    with ape.reverts(escrow.JobEscrowNotAllowed):
        book.do("release", state, sender=provider)
    with ape.reverts(escrow.JobEscrowChallengeWindowOpen):
        book.do("finalize", state, sender=provider)
    book.sleep(CHALLENGE)
    book.do("finalize", state, sender=provider)
    assert escrow.balanceOf(provider) == PAYOUT
    late = book.assign(book.create(submitter, duration=120), provider)
    book.sleep(121)
    with ape.reverts(escrow.JobEscrowDeadlinePassed):
        book.do("submitResult", late, OUTPUT, sender=provider)
    handed = book.do("unassign", book.assign(book.create(submitter), provider2), sender=provider2)
    assert handed.status is Status.FUNDED


def test_role_submitter(
    book: Book, escrow: Any, submitter: Any, provider: Any, mediator: Any
) -> None:
    """Submitter: can fund with its terms, cancel before assignment, accept early, dispute in
    the window, get a refund after the deadline; cannot cancel an assigned job, take the bounty
    back from a pending result, rule (unless it named itself), or dispute late."""
    cancelled = book.do("cancel", book.create(submitter), sender=submitter)
    assert cancelled.status is Status.REFUNDED
    state = book.assign(book.create(submitter, duration=200), provider)
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.ASSIGNED):
        book.do("cancel", state, sender=submitter)
    state = book.do("submitResult", state, OUTPUT, sender=provider)
    book.sleep(201)
    with ape.reverts(escrow.JobEscrowWrongStatus, status=Status.SUBMITTED):
        book.do("refund", state, sender=submitter)
    with ape.reverts(escrow.JobEscrowNotMediator):
        book.do("rule", state, False, sender=submitter)
    book.sleep(CHALLENGE)
    with ape.reverts(escrow.JobEscrowChallengeWindowClosed):
        book.do("dispute", state, sender=submitter, value=DEPOSIT)
    early = book.do(
        "submitResult", book.assign(book.create(submitter), provider), OUTPUT, sender=provider
    )
    assert book.do("release", early, sender=submitter).status is Status.RELEASED


def test_role_anyone(
    book: Book, escrow: Any, submitter: Any, provider: Any, stranger: Any, treasury: Any
) -> None:
    """Anyone: can finalize after the window, refund after the deadline, collect fees and relay
    a signed result; the money only ever goes to the provider, submitter or treasury."""
    state = book.assign(book.create(submitter), provider)
    state = book.do("submitResultFor", state, OUTPUT, book.sign(provider, state), sender=stranger)
    book.sleep(CHALLENGE)
    book.do("finalize", state, sender=stranger)
    expired = book.create(submitter, duration=120)
    book.sleep(121)
    book.do("refund", expired, sender=stranger)
    escrow.collectFees(sender=stranger)
    assert escrow.balanceOf(provider) == PAYOUT and escrow.balanceOf(submitter) == BOUNTY
    assert escrow.balanceOf(treasury) == FEE and escrow.balanceOf(stranger) == 0
    with ape.reverts(escrow.JobEscrowNothingToWithdraw):
        escrow.withdraw(sender=stranger)
