"""Quotes: what a job would cost by GPU tier and region, with the platform fee shown."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from gridmarket.tiers import CPU_ONLY, REGIONS, TIERS, UnknownRegionError
from gridmarket.wire import API
from scheduler.matching.pricing import QuoteError, quote

from .deps import GridDep

router = APIRouter(tags=["market"])


class QuoteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    region: str = Field("us", max_length=32)
    gpu_count: int = Field(0, ge=0, le=16)
    min_vram_mib: int = Field(0, ge=0)
    tiers: list[str] | None = Field(None, max_length=64, description="tier keys; default: all")
    duration_s: int = Field(3600, ge=1, le=30 * 24 * 3600)
    ceiling_wei_per_hour: int | None = Field(None, ge=0)


@router.post(API.QUOTE)
async def get_quote(body: QuoteRequest, grid: GridDep) -> dict[str, Any]:
    """Quotes for each tier that can run the request, cheapest first."""
    if body.region not in REGIONS:
        raise HTTPException(
            422, f"region {body.region!r} is unknown; use one of {', '.join(sorted(REGIONS))}"
        )
    keys = body.tiers or list(TIERS)
    unknown = [k for k in keys if k not in TIERS]
    if unknown:
        raise HTTPException(422, f"tiers: unknown tier keys {unknown}")
    quotes = []
    for key in keys:
        tier = TIERS[key]
        if body.gpu_count == 0 and tier is not CPU_ONLY:
            continue
        if body.gpu_count > 0 and (tier is CPU_ONLY or tier.vram_mib < body.min_vram_mib):
            continue
        try:
            q = quote(
                tier,
                body.region,
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
    return {"fee_bps": grid.fee_bps, "region": body.region, "quotes": quotes}
