"""Quotes (scheduler.matching.pricing)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gridmarket.tiers import CPU_ONLY, TIERS, UnknownRegionError
from scheduler.matching.pricing import MAX_BOUNTY_WEI, QuoteError, quote

BASE = 10**14  # wei per GPU-hour at 1.0x
HOUR = 3600


def test_quote_multiplies_tier_and_region() -> None:
    q = quote(
        TIERS["rtx-4090"],
        "us",
        gpu_count=1,
        duration_s=HOUR,
        base_rate_wei_per_hour=BASE,
        fee_bps=500,
    )
    assert q.tier_multiplier_bps == 30_000 and q.region_multiplier_bps == 10_000
    assert q.market_rate_wei_per_hour == 3 * BASE == q.rate_wei_per_hour
    assert q.total_wei == 3 * BASE
    assert q.fee_wei == 3 * BASE * 500 // 10_000
    assert q.provider_payout_wei == q.total_wei - q.fee_wei
    assert not q.floor_applied and q.within_ceiling


def test_region_lowers_the_market_rate() -> None:
    us = quote(
        TIERS["rtx-3090"],
        "us",
        gpu_count=1,
        duration_s=HOUR,
        base_rate_wei_per_hour=BASE,
        fee_bps=0,
    )
    india = quote(
        TIERS["rtx-3090"],
        "in",
        gpu_count=1,
        duration_s=HOUR,
        base_rate_wei_per_hour=BASE,
        fee_bps=0,
    )
    assert india.region_multiplier_bps == 6_200
    assert india.market_rate_wei_per_hour == BASE * 22_000 * 6_200 // 10**8
    assert india.total_wei < us.total_wei


def test_cpu_only_counts_one_unit_and_gpus_multiply() -> None:
    cpu = quote(
        CPU_ONLY, "us", gpu_count=0, duration_s=HOUR, base_rate_wei_per_hour=BASE, fee_bps=0
    )
    assert cpu.units == 1 and cpu.total_wei == BASE * 8 // 10
    eight = quote(
        TIERS["h100-sxm"],
        "us",
        gpu_count=8,
        duration_s=HOUR,
        base_rate_wei_per_hour=BASE,
        fee_bps=0,
    )
    assert eight.units == 8 and eight.total_wei == 8 * 8 * BASE


def test_provider_floor_wins_over_a_lower_market_rate() -> None:
    q = quote(
        TIERS["rtx-3060"],
        "in",
        gpu_count=1,
        duration_s=HOUR,
        base_rate_wei_per_hour=BASE,
        fee_bps=0,
        provider_floor_wei_per_hour=BASE,
    )
    assert q.floor_applied and q.rate_wei_per_hour == BASE


def test_ceiling_is_reported_not_enforced() -> None:
    q = quote(
        TIERS["rtx-4090"],
        "us",
        gpu_count=1,
        duration_s=HOUR,
        base_rate_wei_per_hour=BASE,
        fee_bps=0,
        ceiling_wei_per_hour=2 * BASE,
    )
    assert not q.within_ceiling
    assert q.to_dict()["within_ceiling"] is False
    assert q.to_dict()["total_wei"] == str(3 * BASE)


def test_total_rounds_up_per_second() -> None:
    q = quote(
        TIERS["rtx-4090"], "us", gpu_count=1, duration_s=1, base_rate_wei_per_hour=7, fee_bps=0
    )
    assert q.rate_wei_per_hour == 21 and q.total_wei == 1  # ceil(21 / 3600)


def test_fee_rounds_down_like_the_escrow() -> None:
    q = quote(
        TIERS["rtx-4090"],
        "us",
        gpu_count=1,
        duration_s=HOUR,
        base_rate_wei_per_hour=333,
        fee_bps=2000,
    )
    assert q.total_wei == 999 and q.fee_wei == 199 and q.provider_payout_wei == 800


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"fee_bps": 2001}, "fee_bps"),
        ({"fee_bps": -1}, "fee_bps"),
        ({"duration_s": 0}, "duration_s"),
        ({"gpu_count": -1}, "gpu_count"),
        ({"base_rate_wei_per_hour": -1}, "rates"),
        ({"ceiling_wei_per_hour": -1}, "ceiling"),
        ({"base_rate_wei_per_hour": 2**96}, "uint96"),
    ],
)
def test_bad_inputs(kwargs: dict[str, int], match: str) -> None:
    args = {"gpu_count": 1, "duration_s": HOUR, "base_rate_wei_per_hour": BASE, "fee_bps": 0}
    with pytest.raises(QuoteError, match=match):
        quote(TIERS["rtx-4090"], "us", **{**args, **kwargs})


def test_unknown_region() -> None:
    with pytest.raises(UnknownRegionError):
        quote(
            TIERS["rtx-4090"],
            "mars",
            gpu_count=1,
            duration_s=HOUR,
            base_rate_wei_per_hour=BASE,
            fee_bps=0,
        )


@given(
    st.sampled_from(sorted(TIERS)),
    st.sampled_from(["us", "eu-west", "in", "br"]),
    st.integers(0, 8),
    st.integers(1, 30 * 24 * HOUR),
    st.integers(0, 10**16),
    st.integers(0, 2000),
    st.integers(0, 10**16),
)
def test_quote_invariants(
    key: str, region: str, gpus: int, duration: int, base: int, fee_bps: int, floor: int
) -> None:
    q = quote(
        TIERS[key],
        region,
        gpu_count=gpus,
        duration_s=duration,
        base_rate_wei_per_hour=base,
        fee_bps=fee_bps,
        provider_floor_wei_per_hour=floor,
    )
    assert q.rate_wei_per_hour >= floor
    assert q.total_wei * HOUR >= q.rate_wei_per_hour * q.units * duration  # never undercharges
    assert q.fee_wei + q.provider_payout_wei == q.total_wei
    assert q.fee_wei * 10_000 <= q.total_wei * fee_bps
    assert 0 <= q.total_wei <= MAX_BOUNTY_WEI
