"""Role and factory fixtures for the escrow tests (Ape on anvil)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from gridmarket.escrow import JobState, apply_event

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
SLASH_BPS = 1000
STAKE = 10**17


def params(operator: Any, treasury: Any, **over: Any) -> tuple[Any, ...]:
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
        "slash": SLASH_BPS,
    }
    p.update(over)
    return tuple(p.values())


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


def local(account: Any) -> LocalAccount:
    """The eth-account signer behind an Ape test account (for EIP-712 signatures)."""
    return Account.from_key(account.private_key)


@pytest.fixture(scope="session")
def escrow(
    project: Any, owner: Any, operator: Any, treasury: Any, provider: Any, provider2: Any
) -> Any:
    contract = project.JobEscrow.deploy(params(operator, treasury), sender=owner)
    for p in (provider, provider2):
        contract.registerProvider("bafkreiprovidermetadata", sender=p, value=STAKE)
    return contract


@dataclass
class Book:
    """Drives jobs through the contract and folds their events like the product does."""

    escrow: Any
    chain: Any

    def fold(self, state: JobState | None, receipt: Any) -> JobState:
        for log in receipt.events:
            if log.event_name in {
                "JobCreated", "JobAssigned", "JobUnassigned", "ResultSubmitted",
                "ResultRejected", "JobReleased", "JobRefunded",
            }:  # fmt: skip
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
    ) -> JobState:
        deadline = self.chain.pending_timestamp + duration
        receipt = self.escrow.createJob(
            salt or os.urandom(32), spec, deadline, sender=submitter, value=bounty
        )
        return self.fold(None, receipt)

    def do(self, fn: str, state: JobState, *args: Any, sender: Any) -> JobState:
        receipt = getattr(self.escrow, fn)(state.job_id, state.job.as_tuple(), *args, sender=sender)
        return self.fold(state, receipt)

    def sleep(self, seconds: int) -> None:
        self.chain.pending_timestamp = self.chain.pending_timestamp + seconds
        self.chain.mine()


@pytest.fixture
def book(escrow: Any, chain: Any) -> Book:
    return Book(escrow, chain)


@pytest.fixture
def assigned(book: Book, submitter: Any, operator: Any, provider: Any) -> JobState:
    state = book.create(submitter)
    return book.do("assign", state, provider, sender=operator)


@pytest.fixture
def submitted(book: Book, assigned: JobState, provider: Any) -> JobState:
    return book.do("submitResult", assigned, OUTPUT, sender=provider)


Factory = Callable[..., JobState]
