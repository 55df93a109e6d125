"""Spot-checked jobs (``FLAG_SPOT``): the check deposit locked at funding, the check the
mediator opens with ``dispute``, and where the deposit goes on every way a spot job can end.

Every path below ends with the escrow holding exactly what its open jobs and balances owe."""

from __future__ import annotations

from typing import Any

import ape
import pytest

from gridmarket.escrow import FLAG_ON_VERIFY, FLAG_SPOT, Status, deposit_of, dispute_value

from .conftest import (
    BOUNTY,
    CHALLENGE,
    DEPOSIT,
    FEE_BPS,
    MEDIATION_WINDOW,
    OUTPUT,
    REASSIGN_DELAY,
    STAKE,
    UNSTAKE_DELAY,
    Book,
    v5_args,
)
from .test_tokens import FUNDS, T_BOUNTY, T_MIN, T_STAKE, create_token_job, fund_args

FEE = BOUNTY * FEE_BPS // 10_000
PAYOUT = BOUNTY - FEE
ZERO = "0x0000000000000000000000000000000000000000"


@pytest.fixture(scope="module")
def usd(
    project: Any, escrow: Any, owner: Any, submitter: Any, provider: Any, provider2: Any
) -> Any:
    """TestUSD listed at 1 tUSD (as in test_tokens.py): the submitter holds tUSD, the two
    regular providers stake three default token jobs' collateral in it."""
    token = project.TestUSD.deploy(sender=owner)
    escrow.setToken(token, T_MIN, sender=owner)
    for account in (submitter, provider, provider2):
        token.mint(account, FUNDS, sender=owner)
    for p in (provider, provider2):
        token.approve(escrow, T_STAKE, sender=p)
        escrow.stakeToken(token, T_STAKE, sender=p)
    return token


def spot_job(book: Book, submitter: Any, **kw: Any) -> Any:
    return book.create(submitter, flags=FLAG_SPOT, **kw)


def submitted_spot(book: Book, submitter: Any, provider: Any, **kw: Any) -> Any:
    state = book.assign(spot_job(book, submitter, **kw), provider)
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
            escrow.operator(),
            mediator,
            BOUNTY,
            FLAG_SPOT,
            0,
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
                escrow.operator(),
                mediator,
                BOUNTY,
                flags,
                0,
                sender=submitter,
                value=2 * BOUNTY,
            )
    # a replicated job cannot be a spot job either
    with ape.reverts(escrow.JobEscrowBadFlags, flags=FLAG_SPOT):
        escrow.createJob(
            b"\3" * 32,
            "bafkspec",
            deadline,
            escrow.operator(),
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
    receipt = escrow.rule(state.job_id, [state.job.as_tuple()], 0, True, sender=mediator)
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
    receipt = escrow.rule(state.job_id, [state.job.as_tuple()], 0, False, sender=mediator)
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
    receipt = escrow.rule(state.job_id, [state.job.as_tuple()], 0, True, sender=mediator)
    assert credited(receipt) == [(mediator.address, BOUNTY, "result upheld")]


def test_an_own_check_ruling_without_a_dispute_returns_or_keeps_the_deposit(
    book: Book, escrow: Any, submitter: Any, provider: Any, provider2: Any, mediator: Any
) -> None:
    state = submitted_spot(book, submitter, provider)
    receipt = escrow.rule(state.job_id, [state.job.as_tuple()], 0, False, sender=mediator)
    assert credited(receipt) == []
    state = book.fold(state, receipt)
    assert escrow.balanceOf(submitter) == BOUNTY  # the collateral; the deposit stays locked
    state = book.do("submitResult", book.assign(state, provider2), OUTPUT, sender=provider2)
    receipt = escrow.rule(state.job_id, [state.job.as_tuple()], 0, True, sender=mediator)
    assert credited(receipt) == [(submitter.address, BOUNTY, "check deposit returned")]
    assert escrow.balanceOf(submitter) == 2 * BOUNTY and escrow.balanceOf(mediator) == 0


def test_the_escrow_holds_exactly_what_it_owes_after_every_spot_ending(
    book: Book, escrow: Any, submitter: Any, provider: Any, mediator: Any, stranger: Any
) -> None:
    start = escrow.balance
    state = book.do("dispute", submitted_spot(book, submitter, provider), sender=mediator)
    escrow.rule(state.job_id, [state.job.as_tuple()], 0, True, sender=mediator)
    owed = sum(escrow.balanceOf(a) for a in (submitter, provider, mediator)) + escrow.feesAccrued()
    assert escrow.balance - start == owed == 2 * BOUNTY


# ---------------------------------------------------------------------- roles and attacks
# Each key against a spot job and its check deposit: what it can do, and every refusal with the
# exact call sequence. "The deposit" is the bounty-sized check deposit locked at funding.

DEPOSIT_REASONS = ("check deposit returned", "result upheld", "deposit returned: no ruling")


def step(book: Book, fn: str, state: Any, *args: Any, sender: Any) -> tuple[Any, Any]:
    """``book.do`` that also returns the receipt (for its Credited events)."""
    receipt = getattr(book.escrow, fn)(
        *v5_args(fn, state.job_id, state.job.as_tuple(), *args), sender=sender
    )
    return book.fold(state, receipt), receipt


def test_the_operator_cannot_open_a_check_or_take_the_deposit(
    book: Book, escrow: Any, submitter: Any, provider: Any, operator: Any, stranger: Any
) -> None:
    held = escrow.balance
    funded = spot_job(book, submitter)
    with ape.reverts(escrow.JobEscrowNotSubmitter):  # cancel (bounty + deposit) is the submitter's
        book.do("cancel", funded, sender=operator)
    state = book.do("submitResult", book.assign(funded, provider), OUTPUT, sender=provider)
    with ape.reverts(escrow.JobEscrowNotSubmitter):  # a check: the mediator's or the submitter's
        book.do("dispute", state, sender=operator)
    with ape.reverts(escrow.JobEscrowNotSubmitter):  # inside its own batch too
        escrow.multicall(
            [escrow.dispute.encode_input(state.job_id, state.job.as_tuple())], sender=operator
        )
    with ape.reverts(escrow.JobEscrowNotMediator):
        escrow.rule(state.job_id, [state.job.as_tuple()], 0, False, sender=operator)
    with ape.reverts(escrow.JobEscrowNotAllowed):  # paying at once needs FLAG_ON_VERIFY
        book.do("release", state, sender=operator)
    with ape.reverts(escrow.JobEscrowNotOnVerify):
        escrow.settle(state.job_id, state.job.as_tuple(), OUTPUT, b"\0" * 65, sender=operator)
    with ape.reverts(escrow.JobEscrowChallengeWindowOpen):
        book.do("finalize", state, sender=operator)
    # the honest way: after the window it finalizes, and the deposit goes to the submitter
    book.sleep(CHALLENGE)
    state, receipt = step(book, "finalize", state, sender=operator)
    assert credited(receipt) == [(submitter.address, BOUNTY, "check deposit returned")]
    assert escrow.balanceOf(operator) == 0
    assert escrow.balance - held == PAYOUT + BOUNTY + FEE  # provider + submitter + fees


def test_the_operator_taking_a_spot_job_back_leaves_the_deposit_locked(
    book: Book, escrow: Any, submitter: Any, provider: Any, provider2: Any, operator: Any
) -> None:
    state = book.assign(spot_job(book, submitter), provider)
    book.sleep(REASSIGN_DELAY)
    state, receipt = step(book, "unassign", state, sender=operator)
    assert credited(receipt) == [] and state.status is Status.FUNDED
    assert escrow.providerOf(provider).locked == 0
    # reassigned, the next attempt is a spot job with its deposit as before
    state = book.do("submitResult", book.assign(state, provider2), OUTPUT, sender=provider2)
    assert state.job.attempt == 2 and escrow.depositOf(state.job.as_tuple()) == BOUNTY
    book.do("release", state, sender=submitter)
    assert escrow.balanceOf(submitter) == BOUNTY and escrow.balanceOf(operator) == 0


def test_the_owner_cannot_open_a_check_and_unlisting_the_mediator_does_not_stop_one(
    book: Book, escrow: Any, submitter: Any, provider: Any, mediator: Any, owner: Any
) -> None:
    state = submitted_spot(book, submitter, provider)
    for fn, error in (
        ("dispute", escrow.JobEscrowNotSubmitter),
        ("release", escrow.JobEscrowNotAllowed),
    ):
        with ape.reverts(error):
            book.do(fn, state, sender=owner)
    with ape.reverts(escrow.JobEscrowNotMediator):
        escrow.rule(state.job_id, [state.job.as_tuple()], 0, True, sender=owner)
    escrow.setMediator(mediator, False, sender=owner)  # terms were fixed at funding
    try:
        state = book.do("dispute", state, sender=mediator)
        state, receipt = step(book, "rule", state, True, sender=mediator)
    finally:
        escrow.setMediator(mediator, True, sender=owner)
    assert credited(receipt) == [(mediator.address, BOUNTY, "result upheld")]
    assert escrow.balanceOf(owner) == 0


def test_a_mediator_cannot_open_a_check_without_a_spot_deposit_or_out_of_time(
    book: Book,
    escrow: Any,
    submitter: Any,
    provider: Any,
    provider2: Any,
    mediator: Any,
    submitted: Any,
) -> None:
    # a plain job: the mediator cannot dispute it, with or without a deposit of its own
    for value in (0, DEPOSIT):
        with ape.reverts(escrow.JobEscrowNotSubmitter):
            book.do("dispute", submitted, sender=mediator, value=value)
    # an on-verify job neither
    verify = book.do(
        "submitResult",
        book.assign(book.create(submitter, flags=FLAG_ON_VERIFY), provider),
        OUTPUT,
        sender=provider,
    )
    with ape.reverts(escrow.JobEscrowNotSubmitter):
        book.do("dispute", verify, sender=mediator)
    # a spot job naming another mediator (the submitter itself): the listed one cannot check it
    own = book.do(
        "submitResult",
        book.assign(spot_job(book, submitter, mediator=submitter), provider),
        OUTPUT,
        sender=provider,
    )
    with ape.reverts(escrow.JobEscrowNotSubmitter):
        book.do("dispute", own, sender=mediator)
    # its own spot job: not before a result, not after the window, not twice
    funded = spot_job(book, submitter)
    with ape.reverts(escrow.JobEscrowWrongStatus):
        book.do("dispute", funded, sender=mediator)
    assigned = book.assign(funded, provider2)
    with ape.reverts(escrow.JobEscrowWrongStatus):
        book.do("dispute", assigned, sender=mediator)
    late = book.do("submitResult", assigned, OUTPUT, sender=provider2)
    book.sleep(CHALLENGE)
    with ape.reverts(escrow.JobEscrowChallengeWindowClosed):
        book.do("dispute", late, sender=mediator)
    with ape.reverts(escrow.JobEscrowChallengeWindowClosed):  # nor rule on its own check
        escrow.rule(late.job_id, [late.job.as_tuple()], 0, False, sender=mediator)
    fresh = book.do("dispute", submitted_spot(book, submitter, provider2), sender=mediator)
    with ape.reverts(escrow.JobEscrowWrongStatus):
        book.do("dispute", fresh, sender=mediator)
    assert escrow.balanceOf(mediator) == 0


def test_a_provider_cannot_open_a_check_nor_escape_one_by_unstaking(
    book: Book, escrow: Any, submitter: Any, provider: Any, mediator: Any, chain: Any
) -> None:
    state = submitted_spot(book, submitter, provider, collateral=2 * BOUNTY)
    with ape.reverts(escrow.JobEscrowNotSubmitter):
        book.do("dispute", state, sender=provider)
    with ape.reverts(escrow.JobEscrowNotMediator):
        escrow.rule(state.job_id, [state.job.as_tuple()], 0, True, sender=provider)
    free = STAKE - 2 * BOUNTY
    assert escrow.providerOf(provider).locked == 2 * BOUNTY
    with ape.reverts(escrow.ProviderRegistryUnstakeTooLarge, amount=free + 1, available=free):
        escrow.requestUnstake(free + 1, sender=provider)
    escrow.requestUnstake(free, sender=provider)  # only what no job locks leaves
    state = book.do("dispute", state, sender=mediator)
    book.sleep(UNSTAKE_DELAY)
    escrow.completeUnstake(sender=provider)
    with ape.reverts(escrow.ProviderRegistryUnstakeTooLarge, amount=1, available=0):
        escrow.requestUnstake(1, sender=provider)  # still locked while the check is open
    receipt = escrow.rule(state.job_id, [state.job.as_tuple()], 0, False, sender=mediator)
    (slash,) = [e for e in receipt.events if e.event_name == "ProviderSlashed"]
    # the liar pays the re-run and its tie-break: two deposits' worth, all of its collateral
    assert slash.amount == 2 * BOUNTY and slash.toMediator == 2 * BOUNTY
    assert escrow.providerOf(provider).stake == 0 and escrow.providerOf(provider).locked == 0
    assert escrow.balanceOf(submitter) == 0 and escrow.balanceOf(mediator) == 2 * BOUNTY


def test_the_submitter_cannot_take_the_deposit_twice_or_check_late(
    book: Book, escrow: Any, submitter: Any, provider: Any, mediator: Any
) -> None:
    state = submitted_spot(book, submitter, provider)
    state, receipt = step(book, "release", state, sender=submitter)
    assert credited(receipt) == [(submitter.address, BOUNTY, "check deposit returned")]
    for fn in ("release", "dispute", "finalize", "cancel", "refund"):
        with ape.reverts(escrow.JobEscrowWrongStatus):
            book.do(fn, state, sender=submitter)
    late = submitted_spot(book, submitter, provider)
    with ape.reverts(escrow.JobEscrowNotMediator):  # nor rule a check of its own job
        escrow.rule(late.job_id, [late.job.as_tuple()], 0, False, sender=submitter)
    book.sleep(CHALLENGE)
    with ape.reverts(escrow.JobEscrowChallengeWindowClosed):
        book.do("dispute", late, sender=submitter)
    with ape.reverts(escrow.JobEscrowChallengeWindowClosed):  # the window is checked first
        escrow.rule(late.job_id, [late.job.as_tuple()], 0, False, sender=submitter)
    assert escrow.balanceOf(submitter) == BOUNTY


def test_anyone_else_only_finalizes_or_refunds_when_due(
    book: Book, escrow: Any, submitter: Any, provider: Any, stranger: Any, spare: Any
) -> None:
    state = submitted_spot(book, submitter, provider)
    for who in (stranger, spare):
        with ape.reverts(escrow.JobEscrowNotSubmitter):
            book.do("dispute", state, sender=who)
        with ape.reverts(escrow.JobEscrowNotMediator):
            escrow.rule(state.job_id, [state.job.as_tuple()], 0, True, sender=who)
        with ape.reverts(escrow.JobEscrowNotAllowed):
            book.do("release", state, sender=who)
        with ape.reverts(escrow.JobEscrowChallengeWindowOpen):
            book.do("finalize", state, sender=who)
    funded = spot_job(book, submitter, duration=120)
    with ape.reverts(escrow.JobEscrowNotSubmitter):
        book.do("cancel", funded, sender=stranger)
    with ape.reverts(escrow.JobEscrowDeadlineNotPassed):
        book.do("refund", funded, sender=stranger)
    book.sleep(CHALLENGE)
    _, receipt = step(book, "refund", funded, sender=stranger)
    assert credited(receipt) == [(submitter.address, BOUNTY, "check deposit returned")]
    _, receipt = step(book, "finalize", state, sender=stranger)
    assert credited(receipt) == [(submitter.address, BOUNTY, "check deposit returned")]
    assert escrow.balanceOf(stranger) == escrow.balanceOf(spare) == 0


# ---------------------------------------------------------------------- the deposit, exactly once
# Every way a spot job can end, in ETH and in tUSD: the deposit is paid out exactly once (one
# Credited with a deposit reason, for the bounty), and what the escrow holds of the currency
# moves by exactly what its accounts are owed.

PATHS = [
    "finalize unchecked",
    "release",
    "cancel",
    "refund funded",
    "refund assigned",
    "check upheld",
    "check unruled",
    "submitter dispute upheld",
    "own ruling upheld",
    "check wrong, then cancel",
    "check wrong, then refund",
    "check wrong, then check upheld",
    "own ruling wrong, then release",
]


def _end(book: Book, path: str, state: Any, r: dict[str, Any]) -> list[Any]:
    """Drive ``state`` (a funded spot job) along ``path``; the receipts."""
    sub, prov, prov2, med, anyone = (
        r["submitter"],
        r["provider"],
        r["provider2"],
        r["mediator"],
        r["stranger"],
    )
    receipts: list[Any] = []

    def do(fn: str, *args: Any, sender: Any) -> None:
        nonlocal state
        state, receipt = step(book, fn, state, *args, sender=sender)
        receipts.append(receipt)

    def submit(who: Any) -> None:
        nonlocal state
        state = book.do("submitResult", book.assign(state, who), OUTPUT, sender=who)

    if path == "cancel":
        do("cancel", sender=sub)
        return receipts
    if path == "refund funded":
        book.sleep(3601)
        do("refund", sender=anyone)
        return receipts
    if path == "refund assigned":
        state = book.assign(state, prov)
        book.sleep(3601)
        do("refund", sender=anyone)
        return receipts
    submit(prov)
    if path == "finalize unchecked":
        book.sleep(CHALLENGE)
        do("finalize", sender=anyone)
    elif path == "release":
        do("release", sender=sub)
    elif path == "check upheld":
        do("dispute", sender=med)
        do("rule", True, sender=med)
    elif path == "check unruled":
        do("dispute", sender=med)
        book.sleep(MEDIATION_WINDOW)
        do("finalize", sender=anyone)
    elif path == "submitter dispute upheld":
        do("dispute", sender=sub)
        do("rule", True, sender=med)
    elif path == "own ruling upheld":
        do("rule", True, sender=med)
    elif path.startswith("check wrong") or path.startswith("own ruling wrong"):
        if path.startswith("check"):
            do("dispute", sender=med)
        do("rule", False, sender=med)
        if path.endswith("cancel"):
            do("cancel", sender=sub)
        elif path.endswith("refund"):
            book.sleep(3601)
            do("refund", sender=anyone)
        elif path.endswith("check upheld"):
            submit(prov2)
            do("dispute", sender=med)
            do("rule", True, sender=med)
        else:
            submit(prov2)
            do("release", sender=sub)
    else:
        raise AssertionError(path)
    assert state.status in (Status.RELEASED, Status.REFUNDED), (path, state.status)
    return receipts


def _owed(escrow: Any, token: Any, accounts: list[Any]) -> int:
    """What the escrow owes in ``token`` (None: ETH) to ``accounts``: balances, stakes,
    pending unstakes and the fee pot."""
    if token is None:
        total = int(escrow.feesAccrued())
        for a in accounts:
            p = escrow.providerOf(a)
            total += int(escrow.balanceOf(a)) + p.stake + p.unstakePending
        return total
    total = int(escrow.tokenFeesAccrued(token))
    for a in accounts:
        p = escrow.stakeOf(a, token)
        total += int(escrow.balanceOfToken(a, token)) + p.stake + p.unstakePending
    return total


@pytest.mark.parametrize("currency", ["ETH", "tUSD"])
@pytest.mark.parametrize("path", PATHS)
def test_the_check_deposit_is_paid_out_exactly_once_on_every_path(
    book: Book,
    escrow: Any,
    accounts: Any,
    submitter: Any,
    provider: Any,
    provider2: Any,
    mediator: Any,
    stranger: Any,
    usd: Any,
    path: str,
    currency: str,
) -> None:
    token = usd if currency == "tUSD" else None
    bounty = T_BOUNTY if token else BOUNTY
    everyone = list(accounts)[:10]

    def held() -> int:
        return int(usd.balanceOf(escrow)) if token else int(escrow.balance)

    held0, owed0 = held(), _owed(escrow, token, everyone)
    if token:
        usd.approve(escrow, 2 * bounty, sender=submitter)
        receipt = escrow.createJobWith(
            *fund_args(book, usd, 2 * bounty, flags=FLAG_SPOT, collateral=bounty),
            sender=submitter,
        )
        state = book.fold(None, receipt)
        assert usd.allowance(submitter, escrow) == 0  # the whole 2 x bounty was pulled
    else:
        state = spot_job(book, submitter)
    assert state.job.bounty == bounty and held() - held0 == 2 * bounty
    roles = {
        "submitter": submitter, "provider": provider, "provider2": provider2,
        "mediator": mediator, "stranger": stranger,
    }  # fmt: skip
    if token:  # a token dispute would pull an approved deposit: a spot check must not
        usd.approve(escrow, 10 * bounty, sender=submitter)
    receipts = _end(book, path, state, roles)
    deposits = [
        (who, amount, why)
        for rc in receipts
        for who, amount, why in credited(rc)
        if why in DEPOSIT_REASONS
    ]
    assert len(deposits) == 1 and deposits[0][1] == bounty, deposits
    expected_to = {
        "check upheld": mediator, "submitter dispute upheld": mediator,
        "check wrong, then check upheld": mediator,
    }.get(path, submitter)  # fmt: skip
    assert deposits[0][0] == expected_to.address
    # solvency: everything that came in is owed to someone, to the smallest unit
    assert held() - held0 == _owed(escrow, token, everyone) - owed0
    if token:
        assert usd.allowance(submitter, escrow) == 10 * bounty  # no check pulled tokens


def test_token_spot_jobs_fund_twice_the_bounty_and_are_never_replicated(
    book: Book, escrow: Any, submitter: Any, usd: Any
) -> None:
    usd.approve(escrow, 10 * T_BOUNTY, sender=submitter)
    with ape.reverts(escrow.JobEscrowBountyNotDivisible, bounty=2 * T_BOUNTY + 1, replicas=2):
        escrow.createJobWith(
            *fund_args(book, usd, 2 * T_BOUNTY + 1, flags=FLAG_SPOT, collateral=T_BOUNTY),
            sender=submitter,
        )
    with ape.reverts(escrow.JobEscrowBadFlags, flags=FLAG_SPOT):
        escrow.createJobWith(
            *fund_args(book, usd, 2 * T_BOUNTY, flags=FLAG_SPOT, replicas=2), sender=submitter
        )
    # a spot job's bounty is half the amount: it must clear the token's floor on its own
    with ape.reverts(escrow.JobEscrowBountyTooLow):
        escrow.createJobWith(
            *fund_args(book, usd, T_MIN, flags=FLAG_SPOT, collateral=T_MIN), sender=submitter
        )
    state = create_token_job(
        book, submitter, usd, 2 * T_BOUNTY, flags=FLAG_SPOT, collateral=T_BOUNTY
    )
    assert state.job.bounty == T_BOUNTY and escrow.depositOf(state.job.as_tuple()) == T_BOUNTY
