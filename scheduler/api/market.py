"""Quotes: what a job would cost by GPU tier and region, with the platform fee shown."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException

from gridmarket.tiers import CPU_ONLY, TIERS, UnknownRegionError
from gridmarket.wire import API, QuoteRequest
from scheduler.matching.pricing import QuoteError, quote

from .deps import GridDep

router = APIRouter(tags=["market"])


@router.post(API.QUOTE)
async def get_quote(body: QuoteRequest, grid: GridDep) -> dict[str, Any]:
    """Quotes for each tier that can run the request (its ``gpu_models``, else all), cheapest
    first, for the request's region (any region: :attr:`QuoteRequest.PRICE_REGION`)."""
    problem = body.problem()
    if problem is not None:
        raise HTTPException(422, ": ".join(problem))
    region = body.price_region
    quotes = []
    for key in body.gpu_models or list(TIERS):
        tier = TIERS[key]
        if body.gpu_count == 0 and tier is not CPU_ONLY:
            continue
        if body.gpu_count > 0 and (tier is CPU_ONLY or tier.vram_mib < body.min_vram_mib):
            continue
        try:
            q = quote(
                tier,
                region,
                gpu_count=body.gpu_count,
                duration_s=body.duration_s,
                base_rate_wei_per_hour=grid.settings.base_rate_wei_per_hour,
                fee_bps=grid.fee_bps,
                ceiling_wei_per_hour=body.ceiling_wei_per_hour,
            )
        except (QuoteError, UnknownRegionError) as exc:
            raise HTTPException(422, str(exc)) from None
        quotes.append(q.to_dict())
    quotes.sort(key=lambda q: int(str(q["total_wei"])))
    return {"fee_bps": grid.fee_bps, "region": region, "quotes": quotes}
