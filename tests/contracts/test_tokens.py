"""JobEscrow version 4: jobs paid in an allow-listed ERC-20 (TestUSD here: 6 decimals, EIP-2612).

Every token function and its refusals: listing (owner only), funding with a permit in one
`multicall` or after an approve, single and replicated; tokens that move less or more than
asked (fee on transfer, rebasing) refused, tokens that return nothing accepted, tokens that
return false or have no code refused; per-token stakes and collateral (the ETH stake stays the
anti-sybil floor); every way token money leaves a job (release, fee, refund, dispute deposit
both ways, slash, resolve) and the balance, withdraw and fee functions; a token job's struct or
acceptance never passes for another currency's; and the keys table for token money.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import ape
import pytest
from eth_abi.abi import encode as abi_encode
from eth_typing import Hash32
from eth_utils.crypto import keccak

from gridmarket.escrow import ZERO_ADDRESS, JobState, Status, deposit_of, seat_ids
from gridmarket.token import PERMIT_TYPEHASH

from .conftest import (
    CHALLENGE,
    FEE_BPS,
    MEDIATION_WINDOW,
    MIN_STAKE,
    OUTPUT,
    SPEC,
    UNSTAKE_DELAY,
    Book,
    local,
)

USD = 10**6
"""One whole tUSD in its smallest units."""
T_BOUNTY = 100 * USD
T_MIN = USD
"""tokenMinBounty of tUSD: 1 tUSD (the ETH minBounty, 10**15 wei, means nothing here)."""
T_FEE = T_BOUNTY * FEE_BPS // 10_000
T_PAYOUT = T_BOUNTY - T_FEE
T_STAKE = 3 * T_BOUNTY
FUNDS = 1_000_000 * USD
BAD_OUTPUT = "bafkreibadoutputofalyingprovider"
EIP170 = 24_576


# ---------------------------------------------------------------------- fixtures and helpers
@pytest.fixture(scope="module")
def usd(
    project: Any,
    escrow: Any,
    owner: Any,
    submitter: Any,
    provider: Any,
    provider2: Any,
    stranger: Any,
    small: Any,
) -> Any:
    """TestUSD, listed at 1 tUSD; the submitter, the stranger and the providers hold tUSD and
    the two regular providers stake three default token jobs' collateral in it."""
    token = project.TestUSD.deploy(sender=owner)
    escrow.setToken(token, T_MIN, sender=owner)
    for account in (submitter, provider, provider2, stranger, small):
        token.mint(account, FUNDS, sender=owner)
    for p in (provider, provider2):
        token.approve(escrow, T_STAKE, sender=p)
        escrow.stakeToken(token, T_STAKE, sender=p)
    return token


def permit(token: Any, signer: Any, spender: Any, value: int, deadline: int) -> tuple[Any, ...]:
    """``signer``'s EIP-2612 permit as ``(v, r, s)`` over the token's domain and its nonce."""
    struct = keccak(
        abi_encode(
            ["bytes32", "address", "address", "uint256", "uint256", "uint256"],
            [PERMIT_TYPEHASH, signer.address, str(spender), value, token.nonces(signer), deadline],
        )
    )
    digest = keccak(b"\x19\x01" + bytes(token.DOMAIN_SEPARATOR()) + struct)
    sig = local(signer).unsafe_sign_hash(Hash32(digest))
    return int(sig.v), int(sig.r).to_bytes(32, "big"), int(sig.s).to_bytes(32, "big")


def fund_args(
    book: Book,
    token: Any,
    amount: int = T_BOUNTY,
    *,
    collateral: int | None = None,
    flags: int = 0,
    replicas: int = 0,
    mediator: Any = None,
    salt: bytes | None = None,
    duration: int = 3600,
) -> tuple[Any, ...]:
    share = amount // replicas if replicas else amount
    return (
        token,
        amount,
        salt or os.urandom(32),
        SPEC,
        book.chain.pending_timestamp + duration,
        book.escrow.operator(),
        mediator if mediator is not None else book.mediator,
        share if collateral is None else collateral,
        flags,
        replicas,
    )


def create_token_job(
    book: Book, submitter: Any, token: Any, amount: int = T_BOUNTY, **terms: Any
) -> JobState:
    """A token job funded after a plain approve (a single job: replicas 0)."""
    token.approve(book.escrow, amount, sender=submitter)
    receipt = book.escrow.createJobWith(*fund_args(book, token, amount, **terms), sender=submitter)
    return book.fold(None, receipt)


def fold_all(book: Book, receipt: Any, ids: list[bytes]) -> list[JobState]:
    """The states of the jobs ``ids`` from the JobCreated events of ``receipt``."""
    states: dict[bytes, JobState] = {}
    for log in receipt.events:
        if log.event_name == "JobCreated":
            jid = bytes(log.event_arguments["jobId"])
            states[jid] = book.fold(None, _only(receipt, jid))
    return [states[i] for i in ids]


class _only:  # noqa: N801 - a receipt filtered to one job's logs, for Book.fold
    def __init__(self, receipt: Any, jid: bytes) -> None:
        self.events = [
            log
            for log in receipt.events
            if "jobId" in log.event_arguments and bytes(log.event_arguments["jobId"]) == jid
        ]


def tbal(escrow: Any, account: Any, token: Any) -> int:
    return int(escrow.balanceOfToken(account, token))


def stake_of(escrow: Any, provider: Any, token: Any) -> Any:
    return escrow.stakeOf(provider, token)


def dispute_token(book: Book, state: JobState, submitter: Any, token: Any) -> JobState:
    deposit = int(book.escrow.depositOf(state.job.as_tuple()))
    token.approve(book.escrow, deposit, sender=submitter)
    return book.do("dispute", state, sender=submitter)


@pytest.fixture
def t_funded(book: Book, submitter: Any, usd: Any) -> JobState:
    return create_token_job(book, submitter, usd)


@pytest.fixture
def t_assigned(book: Book, t_funded: JobState, provider: Any) -> JobState:
    return book.assign(t_funded, provider)


@pytest.fixture
def t_submitted(book: Book, t_assigned: JobState, provider: Any) -> JobState:
    return book.do("submitResult", t_assigned, OUTPUT, sender=provider)


# ---------------------------------------------------------------------- listing
def test_only_the_owner_lists_and_unlists_a_token_and_funded_jobs_outlive_unlisting(
    book: Book,
    escrow: Any,
    usd: Any,
    owner: Any,
    operator: Any,
    stranger: Any,
    submitter: Any,
    provider: Any,
    project: Any,
) -> None:
    other = project.TestUSD.deploy(sender=owner)
    for who in (operator, stranger, submitter):
        with ape.reverts(escrow.JobEscrowNotOwner, caller=who.address):
            escrow.setToken(other, USD, sender=who)
    with ape.reverts(escrow.JobEscrowZeroAddress):
        escrow.setToken(ZERO_ADDRESS, USD, sender=owner)
    receipt = escrow.setToken(other, 5 * USD, sender=owner)
    assert [(e.event_name, e.token, e.minBounty) for e in receipt.events] == [
        ("TokenListed", other.address, 5 * USD)
    ]
    assert escrow.tokenMinBounty(other) == 5 * USD

    state = book.assign(create_token_job(book, submitter, usd), provider)
    receipt = escrow.setToken(usd, 0, sender=owner)  # unlisted: no new jobs nor stakes in it
    assert receipt.events[0].minBounty == 0 and escrow.tokenMinBounty(usd) == 0
    usd.approve(escrow, T_BOUNTY, sender=submitter)
    with ape.reverts(escrow.JobEscrowTokenNotAllowed, token=usd.address):
        escrow.createJobWith(*fund_args(book, usd), sender=submitter)
    with ape.reverts(escrow.JobEscrowTokenNotAllowed, token=usd.address):
        escrow.stakeToken(usd, USD, sender=provider)
    # the job funded before goes on to its payout, and the payout can be withdrawn
    state = book.do("submitResult", state, OUTPUT, sender=provider)
    book.do("release", state, sender=submitter)
    before = usd.balanceOf(provider)
    escrow.withdrawToken(usd, provider, sender=provider)
    assert usd.balanceOf(provider) == before + T_PAYOUT


# ---------------------------------------------------------------------- funding
def test_a_permit_and_createJobWith_in_one_multicall_fund_a_job_without_an_approve(
    book: Book, escrow: Any, usd: Any, submitter: Any
) -> None:
    assert usd.allowance(submitter, escrow) == 0
    held = usd.balanceOf(escrow)
    deadline = book.chain.pending_timestamp + 600
    v, r, s = permit(usd, submitter, escrow, T_BOUNTY, deadline)
    args = fund_args(book, usd)
    receipt = escrow.multicall(
        [
            escrow.permitToken.encode_input(usd, T_BOUNTY, deadline, v, r, s),
            escrow.createJobWith.encode_input(*args),
        ],
        sender=submitter,
    )
    created = [e for e in receipt.events if e.event_name == "JobCreated"]
    assert len(created) == 1
    assert created[0].token == usd.address and created[0].bounty == T_BOUNTY
    assert created[0].salt == args[2]
    state = book.fold(None, receipt)
    assert state.job.token == usd.address and state.status is Status.FUNDED
    assert book.current(state)
    assert usd.balanceOf(escrow) == held + T_BOUNTY
    assert usd.allowance(submitter, escrow) == 0  # the permit's allowance was spent exactly
    # the permit used in that multicall cannot fund a second job
    with ape.reverts(escrow.JobEscrowPermitFailed):
        escrow.multicall(
            [
                escrow.permitToken.encode_input(usd, T_BOUNTY, deadline, v, r, s),
                escrow.createJobWith.encode_input(*fund_args(book, usd)),
            ],
            sender=submitter,
        )


def test_a_replicated_token_job_funded_with_a_permit_in_one_multicall(
    book: Book, escrow: Any, usd: Any, submitter: Any
) -> None:
    deadline = book.chain.pending_timestamp + 600
    total = 2 * T_BOUNTY
    v, r, s = permit(usd, submitter, escrow, total, deadline)
    args = fund_args(book, usd, total, replicas=2)
    held = usd.balanceOf(escrow)
    receipt = escrow.multicall(
        [
            escrow.permitToken.encode_input(usd, total, deadline, v, r, s),
            escrow.createJobWith.encode_input(*args),
        ],
        sender=submitter,
    )
    made = next(e for e in receipt.events if e.event_name == "ReplicasCreated")
    group = bytes(made.groupId)
    seats = fold_all(book, receipt, seat_ids(group, 2))
    assert [s.job.bounty for s in seats] == [T_BOUNTY, T_BOUNTY]
    assert all(s.job.token == usd.address and book.current(s) for s in seats)
    assert usd.balanceOf(escrow) == held + total and usd.allowance(submitter, escrow) == 0


def test_a_replicated_token_job_after_an_approve_and_its_refusals(
    book: Book, escrow: Any, usd: Any, submitter: Any
) -> None:
    usd.approve(escrow, 10 * T_BOUNTY, sender=submitter)
    args = fund_args(book, usd, 3 * T_BOUNTY, replicas=3)
    receipt = escrow.createJobWith(*args, sender=submitter)
    group = keccak(abi_encode(["address", "bytes32", "bytes32"],
                              [submitter.address, keccak(text=SPEC), args[2]]))  # fmt: skip
    assert [e.event_name for e in receipt.events][:1] == ["ReplicasCreated"]
    assert bytes(receipt.events[0].groupId) == group
    seats = fold_all(book, receipt, seat_ids(group, 3))
    for seat in seats:
        assert seat.job.bounty == T_BOUNTY and seat.job.token == usd.address
        assert seat.job.replicas == 3 and book.current(seat)
    assert usd.allowance(submitter, escrow) == 7 * T_BOUNTY

    with ape.reverts(escrow.JobEscrowBountyNotDivisible):
        escrow.createJobWith(*fund_args(book, usd, 3 * T_BOUNTY + 1, replicas=3), sender=submitter)
    for k in (1, 6):
        with ape.reverts(escrow.JobEscrowBadReplicas, replicas=k):
            escrow.createJobWith(*fund_args(book, usd, 6 * T_BOUNTY, replicas=k), sender=submitter)
    with ape.reverts(escrow.JobEscrowBadFlags, flags=1):
        escrow.createJobWith(
            *fund_args(book, usd, 2 * T_BOUNTY, replicas=2, flags=1), sender=submitter
        )
    with ape.reverts(escrow.JobEscrowBountyTooLow):  # a share under the token's floor
        escrow.createJobWith(
            *fund_args(book, usd, 2 * T_MIN - 2, replicas=2, collateral=T_MIN), sender=submitter
        )


def test_unlisted_tokens_and_bounties_under_the_tokens_floor_are_refused(
    book: Book, escrow: Any, usd: Any, project: Any, owner: Any, submitter: Any
) -> None:
    unlisted = project.TestUSD.deploy(sender=owner)
    unlisted.mint(submitter, FUNDS, sender=owner)
    unlisted.approve(escrow, T_BOUNTY, sender=submitter)
    with ape.reverts(escrow.JobEscrowTokenNotAllowed, token=unlisted.address):
        escrow.createJobWith(*fund_args(book, unlisted), sender=submitter)
    with ape.reverts(escrow.JobEscrowTokenNotAllowed, token=ZERO_ADDRESS):  # ETH is not a token
        escrow.createJobWith(*fund_args(book, ZERO_ADDRESS), sender=submitter)
    usd.approve(escrow, T_BOUNTY, sender=submitter)
    with ape.reverts(escrow.JobEscrowBountyTooLow, bounty=T_MIN - 1, minBounty=T_MIN):
        escrow.createJobWith(*fund_args(book, usd, T_MIN - 1), sender=submitter)
    # the floor is the token's own: 1 tUSD is far under the ETH minBounty in raw units
    state = create_token_job(book, submitter, usd, T_MIN)
    assert state.job.bounty == T_MIN < int(escrow.minBounty())
    with ape.reverts(escrow.JobEscrowCollateralTooLow):
        escrow.createJobWith(*fund_args(book, usd, collateral=T_BOUNTY - 1), sender=submitter)
    with ape.reverts(escrow.JobEscrowBadFlags, flags=2):
        escrow.createJobWith(*fund_args(book, usd, flags=2), sender=submitter)
    usd.approve(escrow, 0, sender=submitter)
    with ape.reverts(escrow.JobEscrowTokenTransferFailed, token=usd.address):  # no allowance
        escrow.createJobWith(*fund_args(book, usd), sender=submitter)


@pytest.mark.parametrize("kind", ["FeeOnTransferToken", "RebasingToken"])
def test_tokens_that_move_another_amount_than_asked_are_refused(
    book: Book, escrow: Any, project: Any, owner: Any, submitter: Any, provider: Any, kind: str
) -> None:
    """A fee-on-transfer token delivers less, a rebasing one more: funding and staking are
    refused with what arrived, so the escrow never owes more (or less) than it holds."""
    odd = getattr(project, kind).deploy(sender=owner)
    escrow.setToken(odd, T_MIN, sender=owner)
    for who in (submitter, provider):
        odd.mint(who, FUNDS, sender=owner)
        odd.approve(escrow, FUNDS, sender=who)
    with ape.reverts(escrow.JobEscrowTokenAmountMismatch, token=odd.address, expected=T_BOUNTY):
        escrow.createJobWith(*fund_args(book, odd), sender=submitter)
    with ape.reverts(escrow.JobEscrowTokenAmountMismatch, token=odd.address, expected=T_STAKE):
        escrow.stakeToken(odd, T_STAKE, sender=provider)
    assert odd.balanceOf(escrow) == 0


def test_a_token_that_returns_nothing_works_end_to_end(
    book: Book, escrow: Any, project: Any, owner: Any, submitter: Any, provider: Any
) -> None:
    """USDT-style: transfer and transferFrom return no bool; success is a call that did not
    revert on a contract with code."""
    odd = project.NoReturnToken.deploy(sender=owner)
    escrow.setToken(odd, T_MIN, sender=owner)
    for who in (submitter, provider):
        odd.mint(who, FUNDS, sender=owner)
        odd.approve(escrow, FUNDS, sender=who)
    escrow.stakeToken(odd, T_BOUNTY, sender=provider)
    state = book.fold(None, escrow.createJobWith(*fund_args(book, odd), sender=submitter))
    state = book.assign(state, provider)
    state = book.do("submitResult", state, OUTPUT, sender=provider)
    book.do("release", state, sender=submitter)
    escrow.withdrawToken(odd, provider, sender=provider)
    assert odd.balanceOf(provider) == FUNDS - T_BOUNTY + T_PAYOUT
    assert odd.balanceOf(escrow) == T_BOUNTY + T_FEE  # the stake and the fee stay
    with ape.reverts(escrow.JobEscrowTokenTransferFailed, token=odd.address):  # over allowance
        escrow.createJobWith(*fund_args(book, odd, FUNDS * 2), sender=submitter)


def test_a_token_that_returns_false_or_has_no_code_is_refused(
    book: Book,
    escrow: Any,
    project: Any,
    owner: Any,
    submitter: Any,
    provider: Any,
    stranger: Any,
    usd: Any,
) -> None:
    falsy = project.FalseToken.deploy(sender=owner)
    escrow.setToken(falsy, T_MIN, sender=owner)
    falsy.mint(submitter, FUNDS, sender=owner)
    falsy.approve(escrow, FUNDS, sender=submitter)
    state = book.fold(None, escrow.createJobWith(*fund_args(book, falsy), sender=submitter))
    falsy.setFailQuietly(True, sender=owner)  # from now on it answers false to every transfer
    with ape.reverts(escrow.JobEscrowTokenTransferFailed, token=falsy.address):
        escrow.createJobWith(*fund_args(book, falsy), sender=submitter)
    book.do("cancel", state, sender=submitter)
    assert tbal(escrow, submitter, falsy) == T_BOUNTY
    with ape.reverts(escrow.JobEscrowTokenTransferFailed, token=falsy.address):
        escrow.withdrawToken(falsy, submitter, sender=submitter)
    assert tbal(escrow, submitter, falsy) == T_BOUNTY  # nothing lost: the balance stays
    falsy.setFailQuietly(False, sender=owner)
    escrow.withdrawToken(falsy, submitter, sender=submitter)
    assert falsy.balanceOf(submitter) == FUNDS

    # an address without code, listed by mistake: nothing can be funded or staked in it
    escrow.setToken(stranger, T_MIN, sender=owner)
    with ape.reverts():
        escrow.createJobWith(*fund_args(book, stranger.address), sender=submitter)
    with ape.reverts():
        escrow.stakeToken(stranger, T_BOUNTY, sender=provider)
    with ape.reverts(escrow.JobEscrowNothingToWithdraw):
        escrow.withdrawToken(stranger, submitter, sender=submitter)


def test_a_bad_permit_is_refused_and_a_front_run_one_is_harmless(
    book: Book, escrow: Any, usd: Any, submitter: Any, stranger: Any
) -> None:
    deadline = book.chain.pending_timestamp + 600
    v, r, s = permit(usd, stranger, escrow, T_BOUNTY, deadline)  # someone else's signature
    with ape.reverts(escrow.JobEscrowPermitFailed, token=usd.address, allowance=0, needed=T_BOUNTY):
        escrow.permitToken(usd, T_BOUNTY, deadline, v, r, s, sender=submitter)
    past = book.chain.pending_timestamp - 1
    v, r, s = permit(usd, submitter, escrow, T_BOUNTY, past)
    with ape.reverts(escrow.JobEscrowPermitFailed):
        escrow.permitToken(usd, T_BOUNTY, past, v, r, s, sender=submitter)
    # a permit someone relayed first (front-running the multicall) still funds the job
    v, r, s = permit(usd, submitter, escrow, T_BOUNTY, deadline)
    usd.permit(submitter, escrow, T_BOUNTY, deadline, v, r, s, sender=stranger)
    receipt = escrow.multicall(
        [
            escrow.permitToken.encode_input(usd, T_BOUNTY, deadline, v, r, s),
            escrow.createJobWith.encode_input(*fund_args(book, usd)),
        ],
        sender=submitter,
    )
    assert book.fold(None, receipt).job.token == usd.address
    # a permit for less than the job then fails at the pull, with nothing funded
    v, r, s = permit(usd, submitter, escrow, T_BOUNTY - 1, deadline)
    with ape.reverts(escrow.JobEscrowTokenTransferFailed, token=usd.address):
        escrow.multicall(
            [
                escrow.permitToken.encode_input(usd, T_BOUNTY - 1, deadline, v, r, s),
                escrow.createJobWith.encode_input(*fund_args(book, usd)),
            ],
            sender=submitter,
        )


# ---------------------------------------------------------------------- stakes and collateral
def test_token_stake_unstake_delay_and_locked_collateral(
    book: Book, escrow: Any, usd: Any, submitter: Any, provider: Any, spare: Any, owner: Any
) -> None:
    with ape.reverts(escrow.ProviderRegistryNotRegistered, provider=spare.address):
        escrow.stakeToken(usd, USD, sender=spare)
    with ape.reverts(escrow.ProviderRegistryZeroAmount):
        escrow.stakeToken(usd, 0, sender=provider)
    eth_before = escrow.providerOf(provider)
    usd.approve(escrow, T_BOUNTY, sender=provider)
    receipt = escrow.stakeToken(usd, T_BOUNTY, sender=provider)
    staked = receipt.events[0]
    assert staked.event_name == "Staked"
    assert dict(staked.event_arguments) == {
        "provider": provider.address, "token": usd.address, "amount": T_BOUNTY,
        "totalStake": T_STAKE + T_BOUNTY,
    }  # fmt: skip
    assert escrow.providerOf(provider) == eth_before  # the ETH stake is another pot

    state = book.assign(create_token_job(book, submitter, usd, collateral=2 * T_BOUNTY), provider)
    assert stake_of(escrow, provider, usd).locked == 2 * T_BOUNTY
    assert escrow.freeCollateralIn(provider, usd) == 2 * T_BOUNTY
    assert escrow.providerOf(provider).locked == eth_before.locked  # nothing locked in ETH
    with ape.reverts(escrow.ProviderRegistryUnstakeTooLarge):
        escrow.requestUnstakeToken(usd, 2 * T_BOUNTY + 1, sender=provider)
    receipt = escrow.requestUnstakeToken(usd, 2 * T_BOUNTY, sender=provider)
    assert receipt.events[0].token == usd.address
    assert stake_of(escrow, provider, usd).unstakePending == 2 * T_BOUNTY
    with ape.reverts(escrow.ProviderRegistryUnstakeNotReady):
        escrow.completeUnstakeToken(usd, sender=provider)
    with ape.reverts(escrow.ProviderRegistryNoUnstakePending):
        escrow.completeUnstake(sender=provider)  # the ETH pot has nothing pending
    book.sleep(UNSTAKE_DELAY)
    receipt = escrow.completeUnstakeToken(usd, sender=provider)
    assert (receipt.events[0].event_name, receipt.events[0].token) == ("Unstaked", usd.address)
    assert tbal(escrow, provider, usd) == 2 * T_BOUNTY
    assert escrow.balanceOf(provider) == 0  # not an ETH balance
    # the collateral stayed locked through the unstake and is unlocked by the refund
    book.do("refund", state, sender=owner)
    assert stake_of(escrow, provider, usd).locked == 0
    assert tbal(escrow, submitter, usd) == T_BOUNTY


def test_assign_needs_free_collateral_in_the_jobs_token_and_the_eth_floor(
    book: Book,
    escrow: Any,
    usd: Any,
    submitter: Any,
    provider: Any,
    small: Any,
    spare: Any,
    owner: Any,
) -> None:
    """Ample ETH stake does not back a token job; a tUSD stake does not replace the ETH floor."""
    state = create_token_job(book, submitter, usd)
    assert escrow.freeCollateralOf(small) > 0 and escrow.freeCollateralIn(small, usd) == 0
    with ape.reverts(
        escrow.ProviderRegistryInsufficientCollateral, provider=small.address, free=0,
        needed=T_BOUNTY,
    ):  # fmt: skip
        book.assign(state, small)
    # a provider with tUSD but under the ETH minStake: the anti-sybil floor holds
    escrow.registerProvider("bafkreisparemetadata", sender=spare, value=MIN_STAKE - 1)
    usd.mint(spare, T_BOUNTY, sender=owner)
    usd.approve(escrow, T_BOUNTY, sender=spare)
    escrow.stakeToken(usd, T_BOUNTY, sender=spare)
    with ape.reverts(escrow.ProviderRegistryInsufficientStake, provider=spare.address):
        book.assign(state, spare)
    escrow.stake(sender=spare, value=1)
    state = book.assign(state, spare)
    assert stake_of(escrow, spare, usd).locked == T_BOUNTY
    # the provider's second token job finds no free tUSD left
    other = create_token_job(book, submitter, usd)
    with ape.reverts(escrow.ProviderRegistryInsufficientCollateral):
        book.assign(other, spare)
    book.assign(other, provider)


# ---------------------------------------------------------------------- money out of a job
def test_release_pays_the_payout_and_the_fee_in_the_token(
    book: Book,
    escrow: Any,
    usd: Any,
    submitter: Any,
    provider: Any,
    treasury: Any,
    stranger: Any,
    t_submitted: JobState,
) -> None:
    eth = (escrow.balanceOf(provider), escrow.feesAccrued(), escrow.balanceOf(treasury))
    receipt = escrow.release(t_submitted.job_id, t_submitted.job.as_tuple(), sender=submitter)
    released = next(e for e in receipt.events if e.event_name == "JobReleased")
    assert (released.payout, released.fee) == (T_PAYOUT, T_FEE)
    assert tbal(escrow, provider, usd) == T_PAYOUT
    assert escrow.tokenFeesAccrued(usd) == T_FEE
    assert stake_of(escrow, provider, usd).locked == 0
    assert (escrow.balanceOf(provider), escrow.feesAccrued(), escrow.balanceOf(treasury)) == eth

    with ape.reverts(escrow.JobEscrowZeroAddress):
        escrow.withdrawToken(usd, ZERO_ADDRESS, sender=provider)
    with ape.reverts(escrow.JobEscrowZeroAddress):
        escrow.withdrawToken(ZERO_ADDRESS, provider, sender=provider)
    before = usd.balanceOf(stranger)
    receipt = escrow.withdrawToken(usd, stranger, sender=provider)  # to another wallet
    w = receipt.events[0]
    assert (w.event_name, w.account, w.token, w.to, w.amount) == (
        "Withdrawn",
        provider.address,
        usd.address,
        stranger.address,
        T_PAYOUT,
    )
    assert usd.balanceOf(stranger) == before + T_PAYOUT and tbal(escrow, provider, usd) == 0
    with ape.reverts(escrow.JobEscrowNothingToWithdraw, account=provider.address):
        escrow.withdrawToken(usd, provider, sender=provider)

    receipt = escrow.collectTokenFees(usd, sender=stranger)  # anyone; to the treasury only
    fc = receipt.events[0]
    assert (fc.event_name, fc.treasury, fc.token, fc.amount) == (
        "FeesCollected",
        treasury.address,
        usd.address,
        T_FEE,
    )
    assert tbal(escrow, treasury, usd) == T_FEE and escrow.tokenFeesAccrued(usd) == 0
    with ape.reverts(escrow.JobEscrowNothingToWithdraw):
        escrow.collectTokenFees(usd, sender=stranger)
    with ape.reverts(escrow.JobEscrowNothingToWithdraw):
        escrow.collectFees(sender=stranger)  # the ETH pot is another pot, empty
    escrow.withdrawToken(usd, treasury, sender=treasury)
    assert usd.balanceOf(treasury) == T_FEE


def test_an_on_verify_token_job_is_settled_in_the_token(
    book: Book, escrow: Any, usd: Any, submitter: Any, provider: Any, operator: Any
) -> None:
    state = book.assign(create_token_job(book, submitter, usd, flags=1), provider)
    book.do("settle", state, OUTPUT, book.sign(provider, state), sender=operator)
    assert tbal(escrow, provider, usd) == T_PAYOUT and escrow.tokenFeesAccrued(usd) == T_FEE
    assert tbal(escrow, operator, usd) == 0


def test_refund_after_the_deadline_and_cancel_return_the_token(
    book: Book,
    escrow: Any,
    usd: Any,
    submitter: Any,
    stranger: Any,
    provider: Any,
    t_assigned: JobState,
) -> None:
    with ape.reverts(escrow.JobEscrowDeadlineNotPassed):
        book.do("refund", t_assigned, sender=stranger)
    book.sleep(3601)
    receipt = escrow.refund(t_assigned.job_id, t_assigned.job.as_tuple(), sender=stranger)
    assert [e.event_name for e in receipt.events] == ["JobRefunded"]
    assert tbal(escrow, submitter, usd) == T_BOUNTY and escrow.balanceOf(submitter) == 0
    assert tbal(escrow, stranger, usd) == 0
    assert stake_of(escrow, provider, usd).locked == 0
    funded = create_token_job(book, submitter, usd)
    book.do("cancel", funded, sender=submitter)
    assert tbal(escrow, submitter, usd) == 2 * T_BOUNTY


# ---------------------------------------------------------------------- disputes and slashes
def test_a_token_dispute_deposits_the_bounty_in_the_token_and_upheld_pays_the_mediator(
    book: Book,
    escrow: Any,
    usd: Any,
    submitter: Any,
    provider: Any,
    mediator: Any,
    t_submitted: JobState,
) -> None:
    # the bounty, though it is far under the ETH floor `disputeDeposit` (which is in wei)
    assert escrow.depositOf(t_submitted.job.as_tuple()) == T_BOUNTY < escrow.disputeDeposit()
    assert deposit_of(T_BOUNTY, usd.address, escrow.disputeDeposit()) == T_BOUNTY  # the mirror
    usd.approve(escrow, T_BOUNTY, sender=submitter)
    with ape.reverts(escrow.JobEscrowWrongDeposit, sent=1, deposit=0):  # no ETH with a token
        book.do("dispute", t_submitted, sender=submitter, value=1)
    held = usd.balanceOf(escrow)
    state = book.do("dispute", t_submitted, sender=submitter)
    assert state.status is Status.DISPUTED
    assert usd.balanceOf(escrow) == held + T_BOUNTY
    state = book.do("rule", state, True, sender=mediator)
    assert state.status is Status.RELEASED
    assert tbal(escrow, mediator, usd) == T_BOUNTY  # the deposit pays the re-run
    assert tbal(escrow, provider, usd) == T_PAYOUT
    assert tbal(escrow, submitter, usd) == 0 and escrow.balanceOf(mediator) == 0


@pytest.mark.parametrize("times", [1, 3])
def test_ruled_wrong_the_submitter_is_made_whole_and_the_mediator_takes_at_most_two_reruns(
    book: Book,
    escrow: Any,
    usd: Any,
    submitter: Any,
    provider: Any,
    mediator: Any,
    times: int,
) -> None:
    """Collateral `times` the bounty: the deposit comes back in full, the mediator is paid
    its re-run and its tie-break (up to two deposits' worth, two of the job's bounties) out of
    the collateral, the submitter gets the rest."""
    collateral = times * T_BOUNTY
    state = book.assign(create_token_job(book, submitter, usd, collateral=collateral), provider)
    state = book.do("submitResult", state, BAD_OUTPUT, sender=provider)
    state = dispute_token(book, state, submitter, usd)
    stake = stake_of(escrow, provider, usd).stake
    receipt = escrow.rule(state.job_id, [state.job.as_tuple()], 0, False, sender=mediator)
    slashed = next(e for e in receipt.events if e.event_name == "ProviderSlashed")
    to_mediator = min(collateral, 2 * T_BOUNTY)
    assert (slashed.amount, slashed.toMediator) == (collateral, to_mediator)
    credited = [(e.account, e.amount) for e in receipt.events if e.event_name == "Credited"]
    assert credited == [(submitter.address, T_BOUNTY)]  # the deposit, first and in full
    assert int(escrow.depositOf(state.job.as_tuple())) == T_BOUNTY
    assert tbal(escrow, mediator, usd) == to_mediator
    assert tbal(escrow, submitter, usd) == T_BOUNTY + collateral - to_mediator
    assert stake_of(escrow, provider, usd).stake == stake - collateral
    assert stake_of(escrow, provider, usd).locked == 0
    state = book.fold(state, receipt)
    assert state.status is Status.FUNDED and book.current(state)  # offered again, bounty kept
    owed = T_BOUNTY + stake_of(escrow, provider, usd).stake + T_STAKE  # bounty, two stakes
    owed += tbal(escrow, mediator, usd) + tbal(escrow, submitter, usd)
    assert usd.balanceOf(escrow) == owed and escrow.tokenFeesAccrued(usd) == 0


def test_the_mediators_own_check_gives_the_whole_collateral_to_the_submitter(
    book: Book, escrow: Any, usd: Any, submitter: Any, provider: Any, mediator: Any
) -> None:
    state = book.assign(create_token_job(book, submitter, usd), provider)
    state = book.do("submitResult", state, BAD_OUTPUT, sender=provider)
    state = book.do("rule", state, False, sender=mediator)
    assert tbal(escrow, submitter, usd) == T_BOUNTY and tbal(escrow, mediator, usd) == 0


def test_an_unruled_token_dispute_finalizes_with_the_deposit_back(
    book: Book,
    escrow: Any,
    usd: Any,
    submitter: Any,
    provider: Any,
    stranger: Any,
    t_submitted: JobState,
) -> None:
    state = dispute_token(book, t_submitted, submitter, usd)
    with ape.reverts(escrow.JobEscrowChallengeWindowOpen):
        book.do("finalize", state, sender=stranger)
    book.sleep(MEDIATION_WINDOW)
    book.do("finalize", state, sender=stranger)
    assert tbal(escrow, submitter, usd) == T_BOUNTY and tbal(escrow, provider, usd) == T_PAYOUT
    assert tbal(escrow, stranger, usd) == 0


def test_resolve_pays_a_token_groups_majority_and_slashes_the_liar_in_the_token(
    book: Book,
    escrow: Any,
    usd: Any,
    owner: Any,
    submitter: Any,
    provider: Any,
    provider2: Any,
    small: Any,
    stranger: Any,
) -> None:
    usd.approve(escrow, T_STAKE, sender=small)
    escrow.stakeToken(usd, T_BOUNTY, sender=small)
    usd.approve(escrow, 3 * T_BOUNTY, sender=submitter)
    args = fund_args(book, usd, 3 * T_BOUNTY, replicas=3)
    receipt = escrow.createJobWith(*args, sender=submitter)
    group = bytes(receipt.events[0].groupId)
    seats = fold_all(book, receipt, seat_ids(group, 3))
    outs = [OUTPUT, OUTPUT, BAD_OUTPUT]
    for i, who in enumerate((provider, provider2, small)):
        seats[i] = book.assign(seats[i], who)
        seats[i] = book.do("submitResult", seats[i], outs[i], sender=who)
    receipt = escrow.resolve(group, [s.job.as_tuple() for s in seats], sender=stranger)
    assert [e.event_name for e in receipt.events].count("JobReleased") == 2
    assert tbal(escrow, provider, usd) == tbal(escrow, provider2, usd) == T_PAYOUT
    assert escrow.tokenFeesAccrued(usd) == 2 * T_FEE
    # the liar's seat: refunded and its collateral to the submitter, in tUSD
    assert tbal(escrow, submitter, usd) == 2 * T_BOUNTY
    assert stake_of(escrow, small, usd).stake == 0 and tbal(escrow, small, usd) == 0
    assert escrow.balanceOf(submitter) == 0 and tbal(escrow, stranger, usd) == 0


# ---------------------------------------------------------------------- currencies never mix
def test_a_token_jobs_struct_or_acceptance_never_passes_for_another_currency(
    book: Book,
    escrow: Any,
    usd: Any,
    project: Any,
    owner: Any,
    submitter: Any,
    provider: Any,
    operator: Any,
    t_funded: JobState,
    funded: JobState,
) -> None:
    other = project.TestUSD.deploy(sender=owner)
    escrow.setToken(other, T_MIN, sender=owner)
    for token in (ZERO_ADDRESS, other.address):
        forged = replace(t_funded, job=replace(t_funded.job, token=token))
        with ape.reverts(escrow.JobEscrowJobMismatch):
            book.do("cancel", forged, sender=submitter)
        with ape.reverts(escrow.JobEscrowJobMismatch):
            book.assign(forged, provider)
    as_token = replace(funded, job=replace(funded.job, token=usd.address))  # an ETH job as tUSD
    with ape.reverts(escrow.JobEscrowJobMismatch):
        book.do("cancel", as_token, sender=submitter)
    # an acceptance signed for the job in ETH does not assign it in tUSD
    eth_terms = replace(t_funded, job=replace(t_funded.job, token=ZERO_ADDRESS))
    with ape.reverts(escrow.JobEscrowBadSignature):
        book.assign(t_funded, provider, sig=book.accept(provider, eth_terms))
    # ETH sent with createJobWith (not payable) or a multicall: refused, nothing funded
    usd.approve(escrow, T_BOUNTY, sender=submitter)
    data = escrow.createJobWith.encode_input(*fund_args(book, usd))
    with ape.reverts():
        submitter.transfer(escrow, 10**15, data=data)
    with ape.reverts():
        submitter.transfer(escrow, 10**15, data=escrow.multicall.encode_input([data]))
    assert usd.allowance(submitter, escrow) == T_BOUNTY  # nothing was pulled
    # a token job's ETH and token views stay apart
    assert escrow.balanceOfToken(submitter, ZERO_ADDRESS) == escrow.balanceOf(submitter)


# ---------------------------------------------------------------------- keys and token money
def test_keys_table_for_token_money(
    book: Book,
    escrow: Any,
    usd: Any,
    owner: Any,
    operator: Any,
    mediator: Any,
    submitter: Any,
    provider: Any,
    stranger: Any,
    treasury: Any,
) -> None:
    """Owner, operator, mediator, provider, submitter and anyone against a token job: each does
    what its row of docs/trust.md says with the job's tUSD, and nothing else."""
    state = create_token_job(book, submitter, usd)
    job = state.job.as_tuple()
    # nobody but the submitter cancels; only the job's operator assigns
    for who in (owner, operator, mediator, provider, stranger):
        with ape.reverts(escrow.JobEscrowNotSubmitter):
            escrow.cancel(state.job_id, job, sender=who)
    for who in (owner, mediator, submitter, stranger):
        with ape.reverts(escrow.JobEscrowNotOperator):
            escrow.assign(
                state.job_id, 0, job, provider, 0, book.accept(provider, state), sender=who
            )
    state = book.assign(state, provider)
    state = book.do("submitResult", state, OUTPUT, sender=provider)
    job = state.job.as_tuple()
    # nobody but the submitter releases a job not funded on-verify; only its mediator rules
    for who in (owner, operator, mediator, provider, stranger):
        with ape.reverts(escrow.JobEscrowNotAllowed):
            escrow.release(state.job_id, job, sender=who)
    for who in (owner, operator, submitter, provider, stranger):
        with ape.reverts(escrow.JobEscrowNotMediator):
            escrow.rule(state.job_id, [job], 0, False, sender=who)
    for who in (owner, operator, mediator, provider, stranger):
        with ape.reverts(escrow.JobEscrowNotSubmitter):
            escrow.dispute(state.job_id, job, sender=who)
    # the owner's settings do not reach the funded job's fee or its token
    escrow.setFeeBps(2000, sender=owner)
    escrow.setToken(usd, 0, sender=owner)
    escrow.setTreasury(book.escrow.owner(), sender=owner)
    # the provider finalizes after the window (anyone could): paid in tUSD at the job's fee
    book.sleep(CHALLENGE)
    book.do("finalize", state, sender=provider)
    assert tbal(escrow, provider, usd) == T_PAYOUT
    # nobody withdraws another's tUSD: withdrawToken only ever moves the caller's own
    for who in (owner, operator, mediator, submitter, stranger, treasury):
        with ape.reverts(escrow.JobEscrowNothingToWithdraw):
            escrow.withdrawToken(usd, who, sender=who)
    # fees go to the treasury in office at collection (the owner now), by anyone's call
    escrow.collectTokenFees(usd, sender=stranger)
    assert tbal(escrow, owner, usd) == T_FEE and tbal(escrow, treasury, usd) == 0
    escrow.withdrawToken(usd, provider, sender=provider)
    escrow.withdrawToken(usd, owner, sender=owner)


def test_the_runtime_stays_under_the_eip170_limit() -> None:
    """anvil (and every chain) refuses a contract over 24,576 bytes of runtime code."""
    artifact = json.loads((Path(__file__).parents[2] / ".build" / "__local__.json").read_text())
    runtime = artifact["contractTypes"]["JobEscrow"]["runtimeBytecode"]["bytecode"]
    size = (len(runtime) - 2) // 2
    assert size < EIP170, f"JobEscrow runtime is {size} bytes, over EIP-170's {EIP170}"
