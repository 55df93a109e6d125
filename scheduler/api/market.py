"""Quotes: what a job would cost by GPU tier and region, with the platform fee shown, in ETH or
in a listed ERC-20 token; for a spot-checked job, its check deposit and least collateral."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, HTTPException, Request

from gridmarket import spot
from gridmarket.escrow import ZERO_ADDRESS
from gridmarket.tiers import CPU_ONLY, TIERS, UnknownRegionError, classify_gpu
from gridmarket.token import Token
from gridmarket.wire import API, QuoteRequest, checksum
from scheduler.matching.pricing import QuoteError, quote
from scheduler.service import Replica
from scheduler.store import Store

from .deps import GridDep, StoreDep

router = APIRouter(tags=["market"])

_FLOORS_PAGE = 5000
Floors = dict[str, tuple[int, int]]


def token_floors(store: Store, token: str) -> Floors:
    """Per GPU tier key (``cpu`` for CPU-only nodes): the lowest floor in ``token`` among the
    online nodes that name one, and how many do. Read page by page from the node rows."""
    out: Floors = {}
    offset = 0
    while True:
        rows = store.nodes(status="online", limit=_FLOORS_PAGE, offset=offset)
        for node in rows:
            cap = node.capacity
            floor = cap.price_floors.get(token)
            if floor is None:
                continue
            key = (
                CPU_ONLY.key
                if cap.gpu is None
                else classify_gpu(cap.gpu.name or cap.gpu.model, cap.gpu.vram_mib).key
            )
            least, n = out.get(key, (floor, 0))
            out[key] = (min(least, floor), n + 1)
        if len(rows) < _FLOORS_PAGE:
            return out
        offset += _FLOORS_PAGE


async def _floors(request: Request, store: Store, token: str, ttl_s: float) -> Floors:
    """:func:`token_floors`, kept by the app for ``quote_floors_ttl_s`` (settings): a quote
    does not scan the fleet each time."""
    _floors_cache: dict[str, tuple[float, Floors]] = request.app.state.token_floors
    now = time.monotonic()
    hit = _floors_cache.get(token)
    if hit is not None and now - hit[0] < ttl_s:
        return hit[1]
    floors = await asyncio.to_thread(token_floors, store, token)
    if len(_floors_cache) > 64:
        _floors_cache.clear()
    _floors_cache[token] = (now, floors)
    return floors


def _listed(grid_tokens: dict[str, Token], address: str) -> Token | None:
    for token in grid_tokens.values():
        if token.address == address:
            return token
    return None


async def _spot_terms(grid: Replica, bounty: int, p_bps: int) -> dict[str, Any]:
    """What a spot-checked job of ``bounty`` with ``p_bps`` locks and asks: its funding is
    twice the bounty (the check deposit is the bounty), and its collateral at least
    :func:`gridmarket.spot.min_collateral` and the escrow's own minimum."""
    try:
        floor = await asyncio.to_thread(grid.chain.min_collateral, bounty)
    except Exception as exc:
        raise HTTPException(
            503, f"the escrow's minimum collateral could not be read: {exc}"
        ) from None
    least = max(floor, spot.min_collateral(bounty, p_bps))
    return {
        "p_bps": p_bps,
        "check_deposit_wei": str(bounty),
        "funding_wei": str(2 * bounty),
        "min_collateral_wei": str(least),
    }


@router.post(API.QUOTE)
async def get_quote(
    body: QuoteRequest, grid: GridDep, store: StoreDep, request: Request
) -> dict[str, Any]:
    """Quotes for each tier that can run the request (its ``gpu_models``, else all), cheapest
    first, for the request's region (any region: :attr:`QuoteRequest.PRICE_REGION`).

    With a ``token`` (a listed ERC-20's address) the prices are in that token's smallest units
    (the ``*_wei`` keys keep their names): the market rate comes from the token's base rate
    (settings ``base_rates``, by symbol) and the rate is at least the lowest floor in the token
    among the online nodes of the tier (``NodeCapacityIn.price_floors``); a tier no online
    node takes the token on is left out when the token has no base rate. ``nodes_taking_token``
    says how many online nodes of the tier name a floor in it.

    With ``spot_p_bps`` each quote has ``spot``: ``check_deposit_wei`` (the bounty again,
    locked at funding), ``funding_wei`` (what funding sends: twice the bounty) and
    ``min_collateral_wei`` (the least collateral the job must ask)."""
    problem = body.problem()
    if problem is not None:
        raise HTTPException(422, ": ".join(problem))
    region = body.price_region
    address = ZERO_ADDRESS if body.token is None else checksum(body.token)
    token = _listed(grid.tokens, address)
    if token is None:
        listed = ", ".join(f"{t.symbol} {t.address}" for t in grid.tokens.values() if not t.is_eth)
        raise HTTPException(
            422, f"token: {address} is not listed on this escrow (listed: {listed or 'none'})"
        )
    floors: Floors = {}
    base_rate: int | None = grid.settings.base_rate_wei_per_hour
    if not token.is_eth:
        base_rate = grid.settings.base_rates.get(token.symbol)
        floors = await _floors(request, store, token.address, grid.settings.quote_floors_ttl_s)
        if base_rate is None and not floors:
            raise HTTPException(
                422,
                f"token: no online node takes {token.symbol} and the scheduler has no base rate "
                f"for it: nothing to quote in {token.symbol}",
            )
    quotes = []
    for key in body.gpu_models or list(TIERS):
        tier = TIERS[key]
        if body.gpu_count == 0 and tier is not CPU_ONLY:
            continue
        if body.gpu_count > 0 and (tier is CPU_ONLY or tier.vram_mib < body.min_vram_mib):
            continue
        floor, taking = floors.get(tier.key, (0, 0))
        if not token.is_eth and base_rate is None and not taking:
            continue
        try:
            q = quote(
                tier,
                region,
                gpu_count=body.gpu_count,
                duration_s=body.duration_s,
                base_rate_wei_per_hour=base_rate or 0,
                fee_bps=grid.fee_bps,
                provider_floor_wei_per_hour=floor,
                ceiling_wei_per_hour=body.ceiling_wei_per_hour,
            )
        except (QuoteError, UnknownRegionError) as exc:
            raise HTTPException(422, str(exc)) from None
        row = q.to_dict()
        if body.spot_p_bps is not None:
            row["spot"] = await _spot_terms(grid, q.total_wei, body.spot_p_bps)
        if not token.is_eth:
            row["nodes_taking_token"] = taking
            row["total"] = token.fmt(q.total_wei)
        quotes.append(row)
    quotes.sort(key=lambda q: int(str(q["total_wei"])))
    return {
        "fee_bps": grid.fee_bps,
        "region": region,
        "token": token.address,
        "token_symbol": token.symbol,
        "token_decimals": token.decimals,
        "quotes": quotes,
    }
