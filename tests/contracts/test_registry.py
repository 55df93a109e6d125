"""Provider registry: registration, stake, delayed unstake, slashing only by the escrow."""

from __future__ import annotations

from typing import Any

import ape
import pytest

from gridmarket.escrow import Status

from .conftest import OUTPUT, SLASH_BPS, STAKE, UNSTAKE_DELAY, Book


@pytest.mark.parametrize("cid", ["", "m" * 129])
def test_register_rejects_bad_metadata(escrow: Any, stranger: Any, cid: str) -> None:
    with ape.reverts(escrow.ProviderRegistryBadMetadataCid, length=len(cid)):
        escrow.registerProvider(cid, sender=stranger)


def test_register_update_and_stake(escrow: Any, stranger: Any) -> None:
    assert not escrow.isEligible(stranger)
    receipt = escrow.registerProvider("bafkreione", sender=stranger)
    assert [e.event_name for e in receipt.events] == ["ProviderRegistered"]
    receipt = escrow.registerProvider("bafkreitwo", sender=stranger, value=STAKE)
    assert [e.event_name for e in receipt.events] == ["ProviderRegistered", "Staked"]
    info = escrow.providerOf(stranger)
    assert info.registered and info.stake == STAKE
    assert escrow.isEligible(stranger)
    escrow.stake(sender=stranger, value=5)
    assert escrow.providerOf(stranger).stake == STAKE + 5


def test_stake_rules(escrow: Any, stranger: Any, provider: Any) -> None:
    with ape.reverts(escrow.ProviderRegistryNotRegistered, provider=stranger.address):
        escrow.stake(sender=stranger, value=1)
    with ape.reverts(escrow.ProviderRegistryZeroAmount):
        escrow.stake(sender=provider, value=0)


def test_unstake_after_delay(book: Book, escrow: Any, provider: Any, stranger: Any) -> None:
    with ape.reverts(escrow.ProviderRegistryNotRegistered):
        escrow.requestUnstake(1, sender=stranger)
    with ape.reverts(escrow.ProviderRegistryZeroAmount):
        escrow.requestUnstake(0, sender=provider)
    with ape.reverts(escrow.ProviderRegistryUnstakeTooLarge):
        escrow.requestUnstake(STAKE + 1, sender=provider)
    with ape.reverts(escrow.ProviderRegistryNoUnstakePending):
        escrow.completeUnstake(sender=provider)
    escrow.requestUnstake(STAKE, sender=provider)
    assert not escrow.isEligible(provider)  # stake on its way out does not count
    with ape.reverts(escrow.ProviderRegistryUnstakeNotReady):
        escrow.completeUnstake(sender=provider)
    book.sleep(UNSTAKE_DELAY)
    escrow.completeUnstake(sender=provider)
    assert escrow.providerOf(provider).stake == 0
    assert escrow.balanceOf(provider) == STAKE


def test_slash_reaches_pending_unstake(
    book: Book, escrow: Any, submitted: Any, operator: Any, provider: Any
) -> None:
    escrow.requestUnstake(STAKE, sender=provider)
    state = book.do("reject", submitted, sender=operator)
    assert state.status is Status.FUNDED
    left = STAKE - STAKE * SLASH_BPS // 10_000
    info = escrow.providerOf(provider)
    assert info.stake == left and info.unstakePending == left
    book.sleep(UNSTAKE_DELAY)
    escrow.completeUnstake(sender=provider)
    assert escrow.balanceOf(provider) == left


def test_nobody_but_the_escrow_rules_can_slash(escrow: Any, owner: Any) -> None:
    """There is no admin slash: the only slashing path is `reject` (tested above)."""
    names = {a.name for a in escrow.contract_type.abi if a.type == "function"}
    assert not any("slash" in n.lower() for n in names - {"slashBps"})
    assert OUTPUT  # keep the shared constant import honest
