"""The EIP-1559 fee policy of the operator's transactions (docs/scheduler-chain.md, "Fees"):
the cap, the price of a new transaction, and the raised price of a replacement."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gridmarket.retry import ChainUnavailableError
from scheduler.chain import tx_metrics as metrics

log = logging.getLogger(__name__)


class FeeCapExceededError(ChainUnavailableError):
    """The chain's base fee is above ``FeePolicy.max_fee_per_gas``: nothing was sent; try later
    (a :class:`ChainUnavailableError`, so callers that retry outages retry this too)."""


@dataclass(frozen=True)
class FeePolicy:
    """How the sender prices its EIP-1559 transactions (docs/scheduler-chain.md, "Fees").

    ``max_fee_per_gas``: the cap in wei; no transaction (or replacement) offers more.
    ``priority_fee``: the tip in wei; ``None`` asks the node (``eth_maxPriorityFeePerGas``).
    ``base_fee_multiplier``: headroom over the latest base fee (2: six full blocks in a row).
    ``replace_after_s``: a transaction not mined this long is replaced with higher fees.
    """

    max_fee_per_gas: int = 200 * 10**9
    priority_fee: int | None = None
    base_fee_multiplier: float = 2.0
    replace_after_s: float = 90.0

    def __post_init__(self) -> None:
        if self.max_fee_per_gas <= 0:
            raise ValueError(f"max_fee_per_gas must be > 0, got {self.max_fee_per_gas}")
        if self.priority_fee is not None and not 0 <= self.priority_fee <= self.max_fee_per_gas:
            raise ValueError(
                f"priority_fee must be within [0, max_fee_per_gas], got {self.priority_fee}"
            )
        if self.base_fee_multiplier < 1:
            raise ValueError(f"base_fee_multiplier must be >= 1, got {self.base_fee_multiplier}")
        if self.replace_after_s <= 0:
            raise ValueError(f"replace_after_s must be > 0, got {self.replace_after_s}")


def bumped(fee: int) -> int:
    """``fee`` raised by at least 12.5% (geth asks +10%, others +12.5%), and by at least 1 wei."""
    return fee + fee // 8 + 1


def price(policy: FeePolicy, fn_name: str, base: int, tip: int) -> tuple[int, int]:
    """``(maxFeePerGas, maxPriorityFeePerGas)`` for a transaction now, given the latest ``base``
    fee and the ``tip``, within the cap.

    Raises :class:`FeeCapExceededError` when the base fee alone exceeds the cap."""
    cap = policy.max_fee_per_gas
    if base > cap:
        metrics.CAPPED.inc()
        log.warning(
            "%s: base fee %d wei/gas is above the cap max_fee_per_gas=%d: not sending; "
            "retrying when the chain is cheaper",
            fn_name,
            base,
            cap,
        )
        raise FeeCapExceededError(
            f"{fn_name}: base fee {base} wei/gas is above the cap {cap} (max_fee_per_gas)"
        )
    max_fee = min(int(base * policy.base_fee_multiplier) + tip, cap)
    return max_fee, min(tip, max_fee)


def replacement_price(
    policy: FeePolicy, old: tuple[int, int], asked: tuple[int, int]
) -> tuple[int, int] | None:
    """The fees of a replacement of a transaction that offered ``old`` (max fee, tip): both
    bumped, and at least what the chain ``asked`` now, capped; None when the cap leaves no room
    for a bump (counted)."""
    old_max, old_tip = old
    asked_max, asked_tip = asked
    max_fee = min(max(bumped(old_max), asked_max), policy.max_fee_per_gas)
    tip = min(max(bumped(old_tip), asked_tip), max_fee)
    if max_fee < bumped(old_max) or tip < bumped(old_tip):
        metrics.CAPPED.inc()
        return None
    return max_fee, tip
