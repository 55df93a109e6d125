"""Quotes: what a job costs on a tier in a region. Pure integer arithmetic in wei, no I/O.

    market rate = base rate x tier multiplier x region multiplier       (wei per GPU-hour)
    rate        = max(market rate, provider floor)
    total       = ceil(rate x units x duration_s / 3600)                 (the escrow bounty)
    fee         = floor(total x fee_bps / 10_000)                        (as JobEscrow does)
    payout      = total - fee

``units`` is the GPU count, or 1 for a CPU-only job (the matching engine's price unit).
Multipliers are turned into basis points (3.0x -> 30_000) so every step is an exact integer
operation; the total is rounded up so a provider's floor is never undercut by rounding. A quote
over the submitter's ceiling is still returned, with ``within_ceiling=False``, so the caller can
show the gap.
"""

from __future__ import annotations

from dataclasses import dataclass

from gridmarket.tiers import Tier, region_multiplier

__all__ = ["MAX_BOUNTY_WEI", "MAX_FEE_BPS", "Quote", "QuoteError", "quote"]

MAX_FEE_BPS = 2000
"""The escrow's cap on the platform fee (20%)."""
MAX_BOUNTY_WEI = 2**96 - 1
"""A bounty is a ``uint96`` on-chain."""
_BPS = 10_000


class QuoteError(ValueError):
    """The inputs cannot make a quote (negative amounts, fee above the cap, bounty too big)."""


@dataclass(frozen=True, slots=True)
class Quote:
    """A priced job, every step shown."""

    tier_key: str
    region: str
    units: int
    duration_s: int
    base_rate_wei_per_hour: int
    tier_multiplier_bps: int
    region_multiplier_bps: int
    market_rate_wei_per_hour: int
    provider_floor_wei_per_hour: int
    rate_wei_per_hour: int
    total_wei: int
    fee_bps: int
    fee_wei: int
    provider_payout_wei: int
    ceiling_wei_per_hour: int | None

    @property
    def floor_applied(self) -> bool:
        """The provider's floor, not the market rate, set the price."""
        return self.rate_wei_per_hour > self.market_rate_wei_per_hour

    @property
    def within_ceiling(self) -> bool:
        """The rate is at or below the submitter's ceiling (or there is none)."""
        return self.ceiling_wei_per_hour is None or (
            self.rate_wei_per_hour <= self.ceiling_wei_per_hour
        )

    def to_dict(self) -> dict[str, object]:
        """JSON-ready; wei amounts as decimal strings (JavaScript numbers lose precision)."""
        return {
            "tier": self.tier_key,
            "region": self.region,
            "units": self.units,
            "duration_s": self.duration_s,
            "base_rate_wei_per_hour": str(self.base_rate_wei_per_hour),
            "tier_multiplier_bps": self.tier_multiplier_bps,
            "region_multiplier_bps": self.region_multiplier_bps,
            "market_rate_wei_per_hour": str(self.market_rate_wei_per_hour),
            "provider_floor_wei_per_hour": str(self.provider_floor_wei_per_hour),
            "rate_wei_per_hour": str(self.rate_wei_per_hour),
            "floor_applied": self.floor_applied,
            "total_wei": str(self.total_wei),
            "fee_bps": self.fee_bps,
            "fee_wei": str(self.fee_wei),
            "provider_payout_wei": str(self.provider_payout_wei),
            "ceiling_wei_per_hour": (
                None if self.ceiling_wei_per_hour is None else str(self.ceiling_wei_per_hour)
            ),
            "within_ceiling": self.within_ceiling,
        }


def _bps(multiplier: float) -> int:
    return round(multiplier * _BPS)


def quote(
    tier: Tier,
    region: str,
    *,
    gpu_count: int,
    duration_s: int,
    base_rate_wei_per_hour: int,
    fee_bps: int,
    provider_floor_wei_per_hour: int = 0,
    ceiling_wei_per_hour: int | None = None,
) -> Quote:
    """Price ``duration_s`` seconds of ``gpu_count`` GPUs of ``tier`` in ``region``.

    Raises :class:`QuoteError` for bad inputs and
    :class:`gridmarket.tiers.UnknownRegionError` for an unknown region.
    """
    if gpu_count < 0 or duration_s <= 0:
        raise QuoteError("gpu_count must not be negative and duration_s must be positive")
    if base_rate_wei_per_hour < 0 or provider_floor_wei_per_hour < 0:
        raise QuoteError("rates must not be negative")
    if ceiling_wei_per_hour is not None and ceiling_wei_per_hour < 0:
        raise QuoteError("the ceiling must not be negative")
    if not 0 <= fee_bps <= MAX_FEE_BPS:
        raise QuoteError(f"fee_bps must be within [0, {MAX_FEE_BPS}]")
    tier_bps = _bps(tier.price_multiplier)
    region_bps = _bps(region_multiplier(region))
    market = base_rate_wei_per_hour * tier_bps * region_bps // (_BPS * _BPS)
    rate = max(market, provider_floor_wei_per_hour)
    units = max(1, gpu_count)
    total = -(-rate * units * duration_s // 3600)  # ceiling division
    if total > MAX_BOUNTY_WEI:
        raise QuoteError(f"total {total} wei does not fit a uint96 bounty")
    fee = total * fee_bps // _BPS
    return Quote(
        tier_key=tier.key,
        region=region,
        units=units,
        duration_s=duration_s,
        base_rate_wei_per_hour=base_rate_wei_per_hour,
        tier_multiplier_bps=tier_bps,
        region_multiplier_bps=region_bps,
        market_rate_wei_per_hour=market,
        provider_floor_wei_per_hour=provider_floor_wei_per_hour,
        rate_wei_per_hour=rate,
        total_wei=total,
        fee_bps=fee_bps,
        fee_wei=fee,
        provider_payout_wei=total - fee,
        ceiling_wei_per_hour=ceiling_wei_per_hour,
    )
