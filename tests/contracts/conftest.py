"""Role and factory fixtures for the escrow tests (Ape on anvil), escrow version 5.

Roles are Ape's test accounts: 0 owner, 1 operator, 2 submitter, 3 and 4 providers, 5 treasury,
6 a stranger, 7 the mediator (listed at deployment), 8 a provider with exactly one job's
collateral, 9 a spare (unregistered) account.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import pytest
from ape_ethereum.trace import Trace
from eth_account import Account
from eth_account.signers.local import LocalAccount
from rich.errors import MarkupError

from gridmarket.eip712 import sign_acceptance, sign_result
from gridmarket.escrow import (
    FLAG_ON_VERIFY,
    FLAG_SPOT,
    JOB_EVENTS,
    JobState,
    apply_event,
    assign_target,
    rule_args,
)

_show_trace = Trace.show


def _show_trace_safely(self: Trace, *args: Any, **kwargs: Any) -> None:
    """ape-foundry prints a reverted transaction's call trace through rich markup without
    escaping the revert message, which holds a custom error's raw arguments: a random job id
    whose bytes read like a closing tag (``[/...]``) makes rich raise MarkupError inside the
    transaction, and ``ape.reverts`` then reports "did not revert" (seen once in a fresh-clone
    CI run). The trace print is cosmetic; a rendering error is skipped, the revert stands."""
    with contextlib.suppress(MarkupError):
        _show_trace(self, *args, **kwargs)


Trace.show = _show_trace_safely  # type: ignore[method-assign]

SPEC = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
OUTPUT = "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"
BOUNTY = 10**17
FEE_BPS = 250
MIN_BOUNTY = 10**15
MIN_DURATION = 60
MAX_DURATION = 30 * 24 * 3600
CHALLENGE = 3600
MIN_STAKE = 10**16
UNSTAKE_DELAY = 7 * 24 * 3600
MIN_COLLATERAL_BPS = 10_000
DISPUTE_DEPOSIT = 10**15
"""The escrow's `disputeDeposit`: the floor of an ETH job's dispute deposit."""
MEDIATION_WINDOW = 3 * 24 * 3600
REASSIGN_DELAY = 600
STAKE = 3 * BOUNTY
"""What the two regular providers stake: the collateral of three default jobs."""
ON_VERIFY = FLAG_ON_VERIFY


def eth_deposit(bounty: int, floor: int = DISPUTE_DEPOSIT) -> int:
    """What disputing an ETH job with ``bounty`` deposits (`depositOf`): the bounty, at least
    the escrow's `disputeDeposit` (``floor``)."""
    return max(bounty, floor)


DEPOSIT = eth_deposit(BOUNTY)
"""What disputing a default ETH job deposits: its bounty (above the floor)."""


def params(operator: Any, treasury: Any, mediator: Any, **over: Any) -> tuple[Any, ...]:
    """JobEscrow.Params in constructor order; ``over`` replaces fields by name."""
    p = {
        "operator": operator,
        "treasury": treasury,
        "fee": FEE_BPS,
        "min_bounty": MIN_BOUNTY,
        "min_duration": MIN_DURATION,
        "max_duration": MAX_DURATION,
        "challenge": CHALLENGE,
        "min_stake": MIN_STAKE,
        "unstake_delay": UNSTAKE_DELAY,
        "min_collateral_bps": MIN_COLLATERAL_BPS,
        "dispute_deposit": DISPUTE_DEPOSIT,
        "mediation_window": MEDIATION_WINDOW,
        "reassign_delay": REASSIGN_DELAY,
        "mediator": mediator,
    }
    unknown = set(over) - set(p)
    assert not unknown, f"unknown params: {unknown}"
    p.update(over)
    return tuple(p.values())


def v5_args(fn: str, job_id: bytes, job: Any, *extra: Any) -> tuple[Any, ...]:
    """The arguments of escrow function ``fn`` on the single job ``job_id`` (struct ``job``)
    given the rest as the older tests name them: ``assign`` takes ``(provider, acceptance)``
    (its hold is then zero) or ``(provider, hold_for, acceptance)`` and becomes
    ``assign(id, 0, job, provider, holdFor, acceptance)``; ``rule`` takes ``(upheld,)`` and
    becomes ``rule(id, [job], 0, upheld)``; the rest are ``(id, job, *extra)``."""
    if fn == "assign":
        provider, *rest = extra
        hold_for, acceptance = rest if len(rest) == 2 else (0, rest[0])
        return (job_id, 0, job, provider, hold_for, acceptance)
    if fn == "rule":
        return (job_id, [job], 0, *extra)
    return (job_id, job, *extra)


@pytest.fixture(scope="session")
def owner(accounts: Any) -> Any:
    return accounts[0]


@pytest.fixture(scope="session")
def operator(accounts: Any) -> Any:
    return accounts[1]


@pytest.fixture(scope="session")
def submitter(accounts: Any) -> Any:
    return accounts[2]


@pytest.fixture(scope="session")
def provider(accounts: Any) -> Any:
    return accounts[3]


@pytest.fixture(scope="session")
def provider2(accounts: Any) -> Any:
    return accounts[4]


@pytest.fixture(scope="session")
def treasury(accounts: Any) -> Any:
    return accounts[5]


@pytest.fixture(scope="session")
def stranger(accounts: Any) -> Any:
    return accounts[6]


@pytest.fixture(scope="session")
def mediator(accounts: Any) -> Any:
    return accounts[7]


@pytest.fixture(scope="session")
def small(accounts: Any) -> Any:
    """A provider staking exactly one default job's collateral (registered with the escrow)."""
    return accounts[8]


@pytest.fixture(scope="session")
def spare(accounts: Any) -> Any:
    return accounts[9]


def local(account: Any) -> LocalAccount:
    """The eth-account signer behind an Ape test account (for EIP-712 signatures)."""
    signer: LocalAccount = Account.from_key(account.private_key)
    return signer


@pytest.fixture(scope="session")
def escrow(
    project: Any,
    owner: Any,
    operator: Any,
    treasury: Any,
    mediator: Any,
    provider: Any,
    provider2: Any,
    small: Any,
) -> Any:
    contract = project.JobEscrow.deploy(params(operator, treasury, mediator), sender=owner)
    for p in (provider, provider2):
        contract.registerProvider("bafkreiprovidermetadata", sender=p, value=STAKE)
    contract.registerProvider("bafkreismallprovider", sender=small, value=BOUNTY)
    return contract


@dataclass
class Book:
    """Drives jobs through the contract and folds their events like the product does."""

    escrow: Any
    chain: Any
    mediator: Any
    operator: Any

    def fold(self, state: JobState | None, receipt: Any) -> JobState:
        for log in receipt.events:
            if log.event_name in JOB_EVENTS:
                state = apply_event(state, log.event_name, dict(log.event_arguments))
        assert state is not None
        return state

    def create(
        self,
        submitter: Any,
        bounty: int = BOUNTY,
        duration: int = 3600,
        spec: str = SPEC,
        salt: bytes | None = None,
        mediator: Any = None,
        collateral: int | None = None,
        flags: int = 0,
        expected: Any = None,
    ) -> JobState:
        """Fund a single ETH job; ``expected`` is the operator it names (default: the one in
        office, as the product reads it just before sending)."""
        operator = self.escrow.operator() if expected is None else expected
        now = self.chain.pending_timestamp
        self.chain.pending_timestamp = now  # mined at the time the deadline counts from
        receipt = self.escrow.createJob(
            salt or os.urandom(32),
            spec,
            now + duration,
            operator,
            mediator if mediator is not None else self.mediator,
            bounty * MIN_COLLATERAL_BPS // 10_000 if collateral is None else collateral,
            flags,
            0,
            sender=submitter,
            value=2 * bounty if flags & FLAG_SPOT else bounty,  # a spot job: bounty + deposit
        )
        return self.fold(None, receipt)

    def accept(self, signer: Any, state: JobState, hold_for: int = 0, **over: Any) -> bytes:
        """``signer``'s EIP-712 acceptance of the next assignment of ``state``'s job, given
        ``hold_for`` seconds (zero: the operator may take it back after `reassignDelay`)."""
        return sign_acceptance(
            local(signer),
            over.get("chain_id", self.chain.chain_id),
            over.get("contract", self.escrow.address),
            over.get("job_id", state.job_id),
            over.get("attempt", state.job.attempt + 1),
            over.get("job", state.job),
            hold_for,
        )

    def sign(self, signer: Any, state: JobState, cid: str = OUTPUT, **over: Any) -> bytes:
        """``signer``'s EIP-712 result ``cid`` for the current assignment of ``state``'s job."""
        return sign_result(
            local(signer),
            over.get("chain_id", self.chain.chain_id),
            over.get("contract", self.escrow.address),
            over.get("job_id", state.job_id),
            over.get("attempt", state.job.attempt),
            cid,
        )

    def assign(
        self,
        state: JobState,
        provider: Any,
        sender: Any = None,
        sig: bytes | None = None,
        hold_for: int = 0,
    ) -> JobState:
        """``assign`` with ``provider``'s own acceptance of ``hold_for`` seconds unless ``sig``
        is given; a seat of a replicated job is assigned through its group id and index."""
        acceptance = self.accept(provider, state, hold_for) if sig is None else sig
        target, seat = assign_target(state)
        receipt = self.escrow.assign(
            target,
            seat,
            state.job.as_tuple(),
            provider,
            hold_for,
            acceptance,
            sender=sender or self.operator,
        )
        return self.fold(state, receipt)

    def rule(
        self, state: JobState, upheld: bool, sender: Any, seats: list[JobState] | None = None
    ) -> JobState:
        """The mediator's ``rule`` on ``state``'s job (a seat: ``seats`` is the whole group, in
        order, and the seat's new state is returned)."""
        receipt = self.escrow.rule(*rule_args(state, seats or ()), upheld, sender=sender)
        return self.fold(state, receipt)

    def do(self, fn: str, state: JobState, *args: Any, sender: Any, value: int = 0) -> JobState:
        """Call escrow function ``fn`` on ``state``'s single job (:func:`v5_args` maps the
        arguments) and fold its events."""
        method = getattr(self.escrow, fn)
        full = v5_args(fn, state.job_id, state.job.as_tuple(), *args)
        if value:
            receipt = method(*full, sender=sender, value=value)
        else:
            receipt = method(*full, sender=sender)
        return self.fold(state, receipt)

    def sleep(self, seconds: int) -> None:
        self.chain.pending_timestamp = self.chain.pending_timestamp + seconds
        self.chain.mine()

    def current(self, state: JobState) -> bool:
        return bool(self.escrow.isCurrent(state.job_id, state.job.as_tuple()))


@pytest.fixture
def book(escrow: Any, chain: Any, mediator: Any, operator: Any) -> Book:
    return Book(escrow, chain, mediator, operator)


@pytest.fixture
def funded(book: Book, submitter: Any) -> JobState:
    return book.create(submitter)


@pytest.fixture
def assigned(book: Book, funded: JobState, provider: Any) -> JobState:
    return book.assign(funded, provider)


@pytest.fixture
def submitted(book: Book, assigned: JobState, provider: Any) -> JobState:
    return book.do("submitResult", assigned, OUTPUT, sender=provider)


@pytest.fixture
def verify_assigned(book: Book, submitter: Any, provider: Any) -> JobState:
    """An on-verify job (the submitter's opt-in) assigned to ``provider``."""
    return book.assign(book.create(submitter, flags=ON_VERIFY), provider)
