"""The JSON API under ``/api``: the explorer's data, quotes, uploads, unsigned transactions, relay.

Wei amounts are decimal strings; times Unix seconds. Errors are ``{"detail", "field"}`` with 400
for a bad value (``field`` names it), 404, 413 for an upload over the cap, 422 for a malformed
body, 502 when the scheduler, the chain or IPFS failed. Uploads (datasets, WASM modules) are the
routes of :mod:`frontend_api.uploads`, under the same prefix.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated, Any

from eth_utils.address import to_checksum_address
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import Field

from gridmarket.amounts import AmountError, parse_whole
from gridmarket.escrow import FLAG_SPOT, MAX_REPLICAS, ZERO_ADDRESS, Terms, seat_ids
from gridmarket.escrow import job_id as compute_job_id
from gridmarket.tiers import REGIONS, TIERS
from gridmarket.wire import QuoteRequest, SpotReveal

from .backend import ON_VERIFY_TRUST, Backend
from .currency import ETH_CURRENCY, Currency
from .format import duration, parse_eth
from .forms import (
    AddressRequest,
    CheckedJob,
    FieldError,
    JobActionRequest,
    PrepareJobRequest,
    ProviderSignup,
    RelayRequest,
    check_job,
    check_quote,
    field_error,
    least_collateral,
    parse_policy,
    quote_fits,
    spot_p,
    verification_name,
)
from .live import JobFeeds, stream_response
from .records import NotFoundError, Payout, hexstr
from .scheduler import SchedulerError
from .txs import TxError
from .values import parse_address, parse_bytes32
from .waits import client_of

router = APIRouter(prefix="/api", tags=["api"])


def backend(request: Request) -> Backend:
    b: Backend = request.app.state.backend
    return b


BackendDep = Annotated[Backend, Depends(backend)]


def _address(value: str | None, name: str) -> str | None:
    if value is None or value == "":
        return None
    try:
        return parse_address(value, name)
    except ValueError as exc:
        raise field_error(exc, name) from None


def _required_address(value: str | None, name: str) -> str:
    address = _address(value, name)
    if address is None:
        raise FieldError(name, "an address is required (0x and 40 hex digits)")
    return address


def _job_id(value: str) -> str:
    try:
        return hexstr(parse_bytes32(value, "job_id"))
    except ValueError as exc:
        raise field_error(exc, "job_id") from None


# --------------------------------------------------------------------------- info


@router.get("/info")
async def info(b: BackendDep) -> dict[str, Any]:
    """The chain, the escrow and its parameters, the scheduler's info, where explorers are."""
    head = await b.refresh()
    try:
        sched: dict[str, Any] | None = await b.scheduler.info()
        sched_error = None
    except SchedulerError as exc:
        sched, sched_error = None, str(exc)
    return {
        "chain_id": b.deployment.chain_id,
        "escrow": b.escrow.address,
        "deploy_block": b.deployment.block,
        "head_block": head,
        "chain_time": b.chain_now(),
        "params": {k: str(v) if isinstance(v, int) else v for k, v in b.params.items()},
        "mediator": b.default_mediator(),
        "mediators": b.index.mediators(),
        "currencies": b.currencies.to_json(),
        "scheduler": sched,
        "scheduler_error": sched_error,
        "scheduler_url": b.settings.scheduler_url,
        "explorer_url": b.settings.explorer_url,
        "registry": b.settings.registry,
        "regions": sorted(REGIONS),
        "tiers": [{"key": t.key, "name": t.name, "vram_mib": t.vram_mib} for t in TIERS.values()],
    }


# --------------------------------------------------------------------------- explorer


@router.get("/payouts")
async def payouts(
    b: BackendDep,
    provider: str | None = None,
    submitter: str | None = None,
    job: str | None = None,
    limit: int = Query(100, ge=1, le=5000),
    offset: int = Query(0, ge=0),
    bucket_s: int | None = Query(None, ge=60, le=366 * 86400),
    currency: str | None = Query(None, max_length=64),
) -> dict[str, Any]:
    """Every payout (``JobReleased``), newest first, filtered (``currency``: ETH, a listed
    symbol or a token address); each in its job's token. The sums and the totals over time
    are per token (``by_token``); ``amount_wei``, ``fee_wei`` and ``totals`` are ETH's."""
    prov = _address(provider, "provider")
    sub = _address(submitter, "submitter")
    jid = _job_id(job) if job else None
    token = _currency(b, currency).address if currency else None
    await b.refresh()
    rows = b.index.payouts(provider=prov, submitter=sub, job=jid, token=token)
    by_token = payout_sums(b, rows, bucket_s)
    eth = by_token.get(ZERO_ADDRESS) or {}
    return {
        "count": len(rows),
        "amount_wei": eth.get("amount_wei", "0"),
        "fee_wei": eth.get("fee_wei", "0"),
        "by_token": by_token,
        "payouts": [payout_json(b, p) for p in rows[offset : offset + limit]],
        "totals": eth.get("totals", []),
        "head_block": b.index.head,
    }


def _currency(b: Backend, text: str | None, field: str = "currency") -> Currency:
    try:
        return b.currencies.parse(text, field)
    except ValueError as exc:
        raise field_error(exc, field) from None


def payout_json(b: Backend, p: Payout) -> dict[str, Any]:
    """A payout with its currency (amounts in its smallest units)."""
    return {**p.to_json(), "currency": b.currency(p.token).to_json()}


def payout_sums(
    b: Backend, rows: list[Payout], bucket_s: int | None = None
) -> dict[str, dict[str, Any]]:
    """Payouts summed per token (address -> count, amount, fee, totals over time, the
    currency): never one token's units added to another's."""
    out: dict[str, dict[str, Any]] = {}
    for token in sorted({p.token for p in rows}):
        mine = [p for p in rows if p.token == token]
        currency = b.currency(token)
        amount, fee = sum(p.amount for p in mine), sum(p.fee for p in mine)
        out[token] = {
            "currency": currency.to_json(),
            "count": len(mine),
            "amount_wei": str(amount),
            "fee_wei": str(fee),
            "amount_text": currency.fmt(amount),
            "fee_text": currency.fmt(fee),
            "totals": [bucket.to_json() for bucket in b.index.totals(mine, bucket_s)],
        }
    return out


@router.get("/verdicts")
async def verdicts(b: BackendDep, limit: int = Query(100, ge=1, le=5000)) -> dict[str, Any]:
    """Replicated jobs (newest first) with their verdicts (``Resolved``: agreeing count and
    winning digest), and every slash (``ProviderSlashed``) on the escrow, newest first."""
    await b.refresh()
    return verdicts_body(b, limit)


def verdicts_body(b: Backend, limit: int) -> dict[str, Any]:
    groups = b.index.groups()
    slashes = b.index.events_named("ProviderSlashed")
    return {
        "group_count": len(groups),
        "groups": [g.to_json() for g in groups[:limit]],
        "slash_count": len(slashes),
        "slashes": [slash_json(e) for e in slashes[:limit]],
    }


def slash_json(e: Any) -> dict[str, Any]:
    """A ``ProviderSlashed`` as the explorer lists it (a hostile one shown as it came)."""

    def wei(value: Any) -> str | None:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else None

    return {
        "provider": str(e.args.get("provider")),
        "job_id": e.job_id,
        "amount_wei": wei(e.args.get("amount")),
        "to_mediator_wei": wei(e.args.get("toMediator")),
        "submitter": str(e.args.get("submitter")),
        "token": e.token,
        "tx_hash": e.tx_hash,
        "block": e.block,
        "time": e.time,
    }


@router.get("/address/{address}")
async def address(address: str, b: BackendDep) -> dict[str, Any]:
    """Earned, withdrawn, balance (``balanceOf``), stake (``providerOf``), slashes, jobs, nodes
    and events of one address."""
    addr = _required_address(address, "address")
    await b.refresh()
    return await b.address_view(addr)


@router.get("/jobs")
async def jobs(
    b: BackendDep,
    submitter: str | None = None,
    provider: str | None = None,
    status: str | None = Query(
        None, pattern="^(funded|assigned|submitted|disputed|released|refunded)$"
    ),
    limit: int = Query(100, ge=1, le=5000),
    offset: int = Query(0, ge=0),
) -> dict[str, Any]:
    """Jobs on the escrow, newest first, from the chain's events."""
    from .backend import job_summary

    sub = _address(submitter, "submitter")
    prov = _address(provider, "provider")
    await b.refresh()
    states = b.index.jobs(submitter=sub, provider=prov)
    if status:
        states = [s for s in states if s.status.name.lower() == status]
    return {
        "count": len(states),
        "counts": b.index.job_counts(),
        "jobs": [
            {**job_summary(s), "currency": b.currency(s.job.token).to_json()}
            for s in states[offset : offset + limit]
        ],
    }


@router.get("/jobs/{job_id}")
async def job(job_id: str, b: BackendDep) -> dict[str, Any]:
    """A job: on-chain state and every event, the scheduler's state, attempts and logs."""
    jid = _job_id(job_id)
    await b.refresh()
    return await b.job_view(jid)


@router.get("/jobs/{job_id}/spot")
async def job_spot(job_id: str, b: BackendDep) -> dict[str, Any]:
    """A spot job's checks: p and the commitment from its spec, each attempt's check state from
    the chain, and once it is settled the seed the scheduler holds, verified here against the
    commitment, with the attempts it draws. 404 for a job that is not a spot job."""
    jid = _job_id(job_id)
    await b.refresh()
    found = b.chain_job(jid)
    if found is None:
        raise NotFoundError(f"no job {jid} on escrow {b.escrow.address}")
    section = await b.spot_section(*found)
    if section is None:
        raise NotFoundError(f"job {jid} is not spot-checked")
    return {"job_id": jid, **section}


@router.post("/jobs/{job_id}/spot")
async def reveal_spot(job_id: str, body: SpotReveal, b: BackendDep) -> dict[str, Any]:
    """Reveal a settled spot job's seed: checked here against the commitment in the job's spec,
    then posted to the scheduler (``POST /v1/jobs/{job_id}/spot``), whose refusal passes
    through (409 while the job can still be assigned again)."""
    from gridmarket.spot import verify_reveal

    from .spotcheck import parse_spot

    jid = _job_id(job_id)
    await b.refresh()
    found = b.chain_job(jid)
    if found is None:
        raise NotFoundError(f"no job {jid} on escrow {b.escrow.address}")
    state, _ = found
    spec = await asyncio.to_thread(b.spec_of, state.spec_cid)
    check, problem = parse_spot(spec)
    if check is None:
        raise FieldError(
            "job_id", problem or f"job {jid}'s spec carries no spot commitment (or is unreadable)"
        )
    if not verify_reveal(bytes.fromhex(body.seed[2:]), check.commit_bytes, state.job.submitter):
        raise FieldError("seed", f"this seed does not open job {jid}'s commitment {check.commit}")
    try:
        answer = await b.scheduler.reveal_spot(jid, body.seed)
    except SchedulerError as exc:
        status = exc.status if 400 <= exc.status < 500 else 502
        raise HTTPException(status, str(exc)) from None
    return {"job_id": jid, "revealed": True, "scheduler": answer}


@router.get("/jobs/{job_id}/stream")
async def job_stream(job_id: str, request: Request) -> StreamingResponse:
    """Server-sent events: ``job`` with the job's view (and its live HTML fragment) each time it
    changes, ``end`` once it can no longer change. One producer per job reads the scheduler and
    the chain every ``stream_poll_s`` for all its streams (:mod:`frontend_api.live`); a client
    holds at most ``streams_per_client`` streams (429 past it)."""
    jid = _job_id(job_id)
    feeds: JobFeeds = request.app.state.feeds
    return stream_response(feeds.open(jid, client_of(request)))


@router.get("/tx/{tx_hash}")
async def tx(tx_hash: str, b: BackendDep) -> dict[str, Any]:
    """A transaction: sender, call decoded, status, and its escrow events decoded."""
    try:
        h = hexstr(parse_bytes32(tx_hash, "tx_hash"))
    except ValueError as exc:
        raise field_error(exc, "tx_hash") from None
    view = await asyncio.to_thread(b.index.tx, h)
    body = view.to_json()
    body["explorer"] = b.explorer_link("tx", h)
    body["error"] = None
    if view.status == "reverted" and view.block is not None:  # why, in words (a page says it)
        receipt = {"transactionHash": bytes.fromhex(h[2:]), "blockNumber": view.block}
        body["error"] = await asyncio.to_thread(b.txs.revert_reason, receipt)
    return body


@router.get("/fleet")
async def fleet(b: BackendDep) -> dict[str, Any]:
    """Nodes by tier, region and status (from the scheduler) and the providers' leaderboard
    (jobs paid and earnings from the chain)."""
    await b.refresh()
    return await b.fleet_view()


# --------------------------------------------------------------------------- submitting


class TokenQuoteRequest(QuoteRequest):
    """:class:`QuoteRequest` with the currency to quote in: ``token`` (a listed token's
    address or symbol; none or ``ETH``: wei)."""

    token: str | None = Field(None, max_length=64)


@router.post("/quote")
async def quote(body: TokenQuoteRequest, b: BackendDep) -> dict[str, Any]:
    """The scheduler's quote for these resources (by tier, with the fee), and the online nodes
    that offer them. With ``token`` the scheduler is asked for the price in that token's
    smallest units; when it refuses (it does not quote in that token), the answer has no
    quotes and says why (``quote_unavailable``)."""
    check_quote(body)
    currency = _currency(b, body.token, "token")
    request = body.model_dump(mode="json", exclude_none=True, exclude={"token"})
    if not currency.is_eth:
        request["token"] = currency.address
    unavailable: str | None = None
    try:
        answer = await b.scheduler.quote(request)
    except SchedulerError as exc:
        if not 400 <= exc.status < 500:
            raise
        reason = str(exc).removeprefix("scheduler: ")
        if currency.is_eth:
            raise FieldError("resources", reason) from None
        unavailable = f"the scheduler gives no quote in {currency.symbol}: {reason}"
        answer = {"quotes": [], "region": body.price_region}
    answer["currency"] = currency.to_json()
    answer["quote_unavailable"] = unavailable
    try:
        nodes = (await b.scheduler.nodes()).get("nodes", [])
    except SchedulerError:
        nodes = []
    fits = [
        {k: n.get(k) for k in ("node_id", "name", "wallet", "tier", "region", "reputation")}
        for n in nodes
        if quote_fits(body, n)
    ]
    answer["providers"] = fits
    answer["provider_count"] = len(fits)
    return answer


@router.get("/terms")
async def terms(
    b: BackendDep,
    bounty_wei: str | None = None,
    bounty_eth: str | None = None,
    submitter: str | None = None,
    verification: str | None = None,
) -> dict[str, Any]:
    """The terms a job funded now gets unless its submitter chooses others: the default
    mediator (and every listed one), the least collateral for the bounty (for each seat's
    share with ``verification=replicate:k``), the challenge window, the dispute deposit (an
    ETH job's bounty, at least the escrow's floor; the floor alone without a bounty; none for
    a replicated job, whose seats cannot be disputed), and what each payment mode and
    verification choice means."""
    sub = _address(submitter, "submitter")
    try:
        policy = parse_policy(verification)
    except ValueError as exc:
        raise field_error(exc, "verification") from None
    bounty: int | None = None
    try:
        if bounty_wei not in (None, ""):
            bounty = parse_whole(str(bounty_wei), field="bounty_wei")
        elif bounty_eth not in (None, ""):
            bounty = parse_eth(str(bounty_eth), "bounty_eth")
    except AmountError as exc:
        raise FieldError(str(exc.field), exc.message) from None
    await b.refresh()
    params = b.params
    return await asyncio.to_thread(
        terms_body, b, params, bounty, sub, policy.replicas, policy.spot_bps
    )


VERIFICATIONS = {
    "integrity": (
        "One provider runs the job; the scheduler checks its output exists and hashes to the "
        "CID it signed (not that the computation was right). You pay one run."
    ),
    "replicate": (
        "k distinct providers (2..5) each run the job for bounty/k; the escrow pays the seats "
        "whose outputs agree in a strict majority and slashes the collateral of the others. "
        "You pay k runs; a majority of colluding providers can still agree on a wrong output."
    ),
    "spot": (
        "One provider runs the job; each attempt is re-run by a second provider (the "
        "mediator's check) with probability p, drawn from a seed committed in the job spec and "
        "sealed to the mediator, so the provider cannot know whether its attempt is checked. "
        "You fund twice the bounty: the second half is a check deposit, returned unless a "
        "check upholds the result (it then pays the re-run); expected compute 1 + p runs. "
        "The provider locks collateral above bounty x (1 - p) / p, so that skipping the work "
        "loses money in expectation. Needs a WASM job or a deterministic Docker job."
    ),
}
"""What each verification choice means, as the submit page and the CLI say it."""


def terms_body(
    b: Backend,
    params: dict[str, Any],
    bounty: int | None,
    submitter: str | None,
    replicas: int = 0,
    spot_bps: int = 0,
) -> dict[str, Any]:
    from gridmarket.escrow import FLAG_SPOT

    from .spotcheck import spot_price

    window = int(params.get("challenge_window", 0))
    share = None if bounty is None else bounty // (replicas or 1)
    floor = int(params.get("dispute_deposit", 0))
    flags = FLAG_SPOT if spot_bps else 0
    least = None if share is None else least_collateral(share, params, spot_bps)
    spot = None
    if spot_bps and bounty is not None and least is not None:
        spot = spot_price(bounty, least, spot_bps, params, b.currency(ZERO_ADDRESS).fmt)
    return {
        "mediator": b.default_mediator(submitter),
        "mediators": b.index.mediators(),
        # who assigns the job (the owner may replace it): a funding names the one approved
        "operator": b.operator(),
        "min_collateral_bps": int(params.get("min_collateral_bps", 10_000)),
        "min_collateral_wei": None if least is None else str(least),
        "verification": verification_name(replicas, spot_bps),
        "replicas": replicas,
        "spot": spot,
        "mediator_pubkey": params.get("mediator_pubkey"),
        "max_replicas": MAX_REPLICAS,
        "share_wei": None if share is None else str(share),
        "verifications": VERIFICATIONS,
        "challenge_window_s": window,
        # an ETH job's deposit is its bounty, at least the floor (JobEscrow.depositOf); a
        # replicated job's seats cannot be disputed
        "dispute_deposit_wei": (
            None
            if replicas
            else str(floor if bounty is None else b.deposit_for(bounty, ZERO_ADDRESS, flags))
        ),
        "dispute_deposit_floor_wei": str(floor),
        "mediation_window_s": int(params.get("mediation_window", 0)),
        "payments": {
            "after_window": (
                f"Paid when you accept the result, or when nobody disputed it within "
                f"{duration(window)} of its submission (trustless: you can dispute it before)."
            ),
            "on_verify": ON_VERIFY_TRUST,
        },
    }


def check_mediator(b: Backend, checked: CheckedJob) -> None:
    """A job's mediator must be listed on the escrow, or be its submitter, and never the
    operator in office (``createJob``'s checks, asked first to name the field)."""
    mediator = checked.mediator
    if mediator == checked.sender:
        return
    operator = str(b.escrow.call("operator"))
    if mediator.lower() == operator.lower():
        raise FieldError("mediator", f"{mediator} is the operator (the scheduler): it cannot rule")
    if not bool(b.escrow.call("isListedMediator", mediator)):
        listed = b.index.mediators()
        raise FieldError(
            "mediator",
            f"{mediator} is not a listed mediator; choose one of {', '.join(listed) or 'none'} "
            "or yourself",
        )


@router.post("/jobs/prepare")
async def prepare_job(req: PrepareJobRequest, b: BackendDep) -> dict[str, Any]:
    """Check a job, add its spec to IPFS, and build the ``createJob`` transaction for the
    submitter's wallet, with its terms (mediator, collateral, payment, and the operator it
    expects: ``operator``, default the one in office now, answered in ``terms.operator``; the
    funding reverts with ``JobEscrowOperatorChanged`` if another is in office when it is
    mined); with ``verification: replicate:k`` it funds k seats (``createJob(...,
    replicas)``; ``job_id`` is then seat 0's, ``group_id`` and ``seat_ids`` name the group and
    every seat). Nothing is created when
    a check fails: the spec is added to IPFS only once the transaction's dry run passed (the
    spec's CID is computed locally first)."""
    from gridmarket.cid import bytes_cid

    await b.refresh(force=True)
    params = b.params
    currency = _currency(b, req.currency)
    least: int | None = None
    if not currency.is_eth:
        least = int(await asyncio.to_thread(b.escrow.call, "tokenMinBounty", currency.address))
        if least == 0:
            raise FieldError(
                "currency", f"{currency.symbol} is not allowed for bounties on this escrow"
            )
    elif req.permit is not None:
        raise FieldError("permit", "a job paid in ETH takes no permit")
    checked = check_job(
        req, chain_now=b.chain_now(), params=params, currency=currency, min_bounty=least
    )
    refused = b.settings.registry_policy().refusal(checked.spec.image or "")
    if refused:  # a registry no agent would pull from (loopback, private, metadata, ...)
        raise FieldError("spec.image", refused)
    await asyncio.to_thread(check_mediator, b, checked)
    spec_bytes = checked.spec.to_bytes()
    spec_cid = bytes_cid(spec_bytes)
    # the operator the submitter approved (shown by /api/terms or a dry run before), or the one
    # in office now: the wallet's transaction names exactly this one (expectedOperator)
    operator = checked.operator
    if operator == ZERO_ADDRESS:
        operator = to_checksum_address(str(await asyncio.to_thread(b.escrow.call, "operator")))
    job_terms = Terms(
        mediator=checked.mediator,
        collateral=checked.collateral_wei,
        flags=checked.flags,
        token=checked.token,
        operator=operator,
    )
    # (a spot job's spec carries its commitment and sealed seed, never the seed: whoever drew
    # it, the CLI or check_job, keeps it or forgot it; nothing here logs the spec)
    fields = {
        "collateral": checked.collateral_field,
        "bounty": checked.bounty_field,
        "deadline": "deadline" if req.deadline is not None else "ttl_s",
        "operator": "operator",
    }
    # a single job's id, or a replicated job's group id (the same formula)
    jid = hexstr(compute_job_id(checked.sender, spec_cid, checked.salt))
    seats: list[str] = []
    if checked.replicas:
        seats = [hexstr(s) for s in seat_ids(bytes.fromhex(jid[2:]), checked.replicas)]
    funding: dict[str, Any] = {}
    tx: dict[str, str] | None
    if not currency.is_eth:
        tx, funding = await asyncio.to_thread(
            fund_in_token, b, req, checked, currency, spec_cid, job_terms, fields
        )
    else:  # a replicated ETH job is createJob(..., replicas) too
        tx = await asyncio.to_thread(
            b.txs.create_job,
            checked.sender,
            checked.salt,
            spec_cid,
            checked.deadline,
            checked.bounty_wei,
            job_terms,
            fields,
            checked.replicas,
        )
    if not req.dry_run and tx is not None:  # a token job waiting for its permit adds nothing
        stored = await asyncio.to_thread(add_spec, b, spec_bytes)
        if stored != spec_cid:
            raise HTTPException(502, f"IPFS stored the spec as {stored}, expected {spec_cid}")
    k = checked.replicas
    return {
        "dry_run": req.dry_run,
        "job_id": seats[0] if seats else jid,
        "group_id": jid if seats else None,
        "seat_ids": seats,
        "verification": checked.verification,
        "replicas": k,
        "price": price_view(checked, params, currency),
        "currency": currency.to_json(),
        "token": currency.address,
        "funding": funding or None,
        "spec_cid": spec_cid,
        "spec": checked.spec.model_dump(mode="json"),
        "salt": hexstr(checked.salt),
        "bounty_wei": str(checked.bounty_wei),
        "funding_wei": str(checked.funding_wei),
        "spot": spot_summary(checked),
        "deadline": checked.deadline,
        "terms": {
            "mediator": checked.mediator,
            "collateral_wei": str(checked.collateral_wei),
            "flags": checked.flags,
            "payment": checked.payment,
            "token": checked.token,
            "operator": operator,
        },
        "challenge_window_s": int(params.get("challenge_window", 0)),
        # what disputing its result would deposit (JobEscrow.depositOf): the bounty, for an
        # ETH job at least the escrow's floor (a spot job's was locked at funding); a
        # replicated job's seats cannot be disputed
        "dispute_deposit_wei": (
            None if k else str(b.deposit_for(checked.bounty_wei, currency.address, checked.flags))
        ),
        "tx": tx,
        "job_url": f"/jobs/{seats[0] if seats else jid}",
    }


def spot_summary(checked: CheckedJob) -> dict[str, Any] | None:
    """A spot job's policy as prepared: p, the commitment its spec carries, the check deposit
    (never the seed)."""
    if not checked.spot_bps:
        return None
    return {
        "p": spot_p(checked.spot_bps),
        "p_bps": checked.spot_bps,
        "commit": checked.spec.spot.commit if checked.spec.spot else None,
        "check_deposit_wei": str(checked.bounty_wei),
    }


def fund_in_token(
    b: Backend,
    req: PrepareJobRequest,
    checked: CheckedJob,
    currency: Currency,
    spec_cid: str,
    terms: Terms,
    fields: dict[str, str],
) -> tuple[dict[str, str] | None, dict[str, Any]]:
    """The funding of a token job: ``(tx or None, funding)``. The submitter's token balance
    must cover the bounty (else a 400 on the bounty's field, nothing built). With ``permit``:
    ``multicall([permitToken, createJobWith])``; with the allowance already there:
    ``createJobWith``; else no ``tx`` yet, and ``funding`` says what to sign first: the
    permit's typed data (``permit``) or, for a wallet without typed data, ``approve_tx``."""
    amount = checked.funding_wei  # a spot job's check deposit is pulled with its bounty
    balance, allowance = b.txs.token_state(currency.address, checked.sender)
    funding: dict[str, Any] = {
        "method": "createJobWith",
        "amount_wei": str(amount),
        "balance_wei": str(balance),
        "allowance_wei": str(allowance),
        "spender": b.escrow.address,
        "permit": None,
        "permit_unavailable": None,
        "approve_tx": None,
    }
    if balance < amount:
        raise FieldError(
            checked.bounty_field,
            f"{checked.sender} holds {currency.fmt(balance)}, less than the "
            + ("bounty and check deposit " if checked.spot_bps else "bounty ")
            + f"{currency.fmt(amount)}: nothing was funded",
        )
    permit = None
    if req.permit is not None:
        value, v, r, s_ = req.permit.parts()
        if value < amount:
            raise FieldError(
                "permit.value",
                f"the permit allows {currency.fmt(value)}, less than the funding "
                f"{currency.fmt(amount)}",
            )
        permit = (value, req.permit.deadline, v, r, s_)
        funding["method"] = "multicall(permitToken, createJobWith)"
    elif allowance < amount:
        funding["permit"], funding["permit_unavailable"] = b.txs.permit_request(
            currency.address, checked.sender, amount, b.chain_now()
        )
        funding["approve_tx"] = b.txs.approve_tx(checked.sender, currency.address, amount)
        return None, funding
    tx = b.txs.create_job_with(
        checked.sender,
        currency.address,
        amount,
        checked.salt,
        spec_cid,
        checked.deadline,
        checked.replicas,
        terms,
        permit,
        fields,
    )
    return tx, funding


def price_view(
    checked: CheckedJob, params: dict[str, Any], currency: Currency | None = None
) -> dict[str, Any]:
    """What the submitter pays and what backs each run: the bounty locked now (k seats' shares
    for ``replicate:k``), each seat's share, the platform fee taken from each payout, and the
    collateral each provider locks; all in the job's currency."""
    runs = checked.replicas or 1
    share = checked.share_wei
    fee_bps = int(params.get("fee_bps", 0))
    money = (currency or ETH_CURRENCY).fmt
    spot = None
    if checked.spot_bps:
        from .spotcheck import spot_price

        spot = spot_price(
            checked.bounty_wei, checked.collateral_wei, checked.spot_bps, params, money
        )
    return {
        "verification": checked.verification,
        "runs": runs,
        "total_wei": str(checked.bounty_wei),
        "per_seat_wei": str(share),
        "fee_bps": fee_bps,
        "payout_per_seat_wei": str(share - share * fee_bps // 10_000),
        "collateral_per_seat_wei": str(checked.collateral_wei),
        "min_collateral_per_seat_wei": str(least_collateral(share, params, checked.spot_bps)),
        "funding_wei": str(checked.funding_wei),
        "spot": spot,
        "summary": "; ".join(spot["lines"])
        if spot
        else (
            f"you lock {money(checked.bounty_wei)} for {runs} runs by distinct providers "
            f"({money(share)} each); each provider locks {money(checked.collateral_wei)} of "
            "collateral, lost if its result disagrees with the majority"
            if checked.replicas
            else f"you lock {money(checked.bounty_wei)} for one run; the provider locks "
            f"{money(checked.collateral_wei)} of collateral"
        ),
    }


def add_spec(b: Backend, data: bytes) -> str:
    """``data`` added to IPFS as one file (a spec, metadata, a module); its CID."""
    with b.ipfs() as store:
        return store.add_bytes(data)


@router.post("/jobs/{job_id}/{action}/prepare")
async def prepare_job_action(
    job_id: str, action: str, req: JobActionRequest, b: BackendDep
) -> dict[str, Any]:
    """``cancel`` (before assignment, by the submitter; a seat of a replicated job: the whole
    job, ``resolve(groupId, seats)``, while every seat is Funded: ``action`` is then
    ``resolve`` and ``group_id`` names the group), ``refund`` (after the deadline, by
    anyone), ``release`` (accept a submitted result now, by the submitter; ``accept`` is the
    same), ``dispute`` (within the challenge window, by the submitter, with the dispute deposit
    as value: ``depositOf``, the job's bounty, at least the escrow's floor) or ``finalize``
    (pay a result nobody disputed once the window passed, by anyone) as an unsigned
    transaction from ``from``; refused with the contract's reason when it would revert. A
    token job's dispute deposits the job's bounty in its token, pulled by the
    escrow: with ``permit`` the transaction is ``multicall([permitToken, dispute])``; with the
    allowance there, ``dispute``; else there is no ``tx`` yet and ``funding`` holds the permit
    to sign (or the approval to send) first."""
    actions = ("cancel", "refund", "release", "accept", "dispute", "finalize")
    if action not in actions:
        raise HTTPException(404, f"no action {action!r}: use {', '.join(actions)}")
    fn_name = "release" if action == "accept" else action
    jid = _job_id(job_id)
    sender = _required_address(req.sender, "from")
    await b.refresh(force=True)
    found = b.chain_job(jid)
    if found is None:
        raise NotFoundError(f"no job {jid} on escrow {b.escrow.address}")
    state, _ = found
    currency = b.currency(state.job.token)
    if req.permit is not None and (fn_name != "dispute" or currency.is_eth):
        raise FieldError("permit", f"{fn_name} of this job takes no permit")
    body: dict[str, Any] = {"job_id": jid, "action": fn_name, "currency": currency.to_json()}
    spot_job = bool(state.job.flags & FLAG_SPOT)
    if spot_job and req.permit is not None:
        raise FieldError("permit", "a spot job's deposit was locked at funding: no permit")
    if fn_name == "cancel" and state.job.replicas:
        # cancel refuses a seat: the submitter cancels the whole replicated job with
        # resolve(groupId, seats), allowed while every seat is still Funded
        found_group, problem = b.cancel_problem(state, sender)
        if found_group is None:
            raise TxError("from", f"cannot cancel {jid}: {problem}")
        group_id, seats = found_group
        body["action"] = "resolve"
        body["group_id"] = group_id
        body["seat_ids"] = [hexstr(s.job_id) for s in seats]
        body["tx"] = await asyncio.to_thread(
            b.txs.resolve_cancel, sender, bytes.fromhex(group_id[2:]), seats
        )
        return body
    if fn_name == "dispute" and not currency.is_eth and not spot_job:
        body["tx"], body["funding"] = await asyncio.to_thread(
            dispute_in_token, b, sender, state, currency, req
        )
    else:  # a spot job's dispute sends nothing: its deposit was locked at funding
        value = b.dispute_value(state) if fn_name == "dispute" else 0
        body["tx"] = await asyncio.to_thread(b.txs.job_call, sender, fn_name, state, value)
    if fn_name == "dispute":
        body["deposit_wei"] = str(b.dispute_deposit(state))
        body["deposit_text"] = currency.fmt(b.dispute_deposit(state))
        body["mediator"] = state.job.mediator
    return body


def dispute_in_token(
    b: Backend, sender: str, state: Any, currency: Currency, req: JobActionRequest
) -> tuple[dict[str, str] | None, dict[str, Any]]:
    """A token job's dispute (see :func:`prepare_job_action`): ``(tx or None, funding)``."""
    deposit = b.dispute_deposit(state)
    balance, allowance = b.txs.token_state(currency.address, sender)
    funding: dict[str, Any] = {
        "method": "dispute",
        "amount_wei": str(deposit),
        "balance_wei": str(balance),
        "allowance_wei": str(allowance),
        "spender": b.escrow.address,
        "permit": None,
        "permit_unavailable": None,
        "approve_tx": None,
    }
    if balance < deposit:
        raise FieldError(
            "from",
            f"{sender} holds {currency.fmt(balance)}, less than the dispute deposit "
            f"{currency.fmt(deposit)} (the job's bounty)",
        )
    if req.permit is not None:
        value, v, r, s_ = req.permit.parts()
        if value < deposit:
            raise FieldError("permit.value", f"the permit allows less than {currency.fmt(deposit)}")
        funding["method"] = "multicall(permitToken, dispute)"
        tx = b.txs.dispute_with_permit(sender, state, (value, req.permit.deadline, v, r, s_))
        return tx, funding
    if allowance >= deposit or deposit == 0:
        return b.txs.job_call(sender, "dispute", state, 0), funding
    funding["permit"], funding["permit_unavailable"] = b.txs.permit_request(
        currency.address, sender, deposit, b.chain_now()
    )
    funding["approve_tx"] = b.txs.approve_tx(sender, currency.address, deposit)
    return None, funding


@router.post("/withdraw/prepare")
async def prepare_withdraw(req: AddressRequest, b: BackendDep) -> dict[str, Any]:
    """``withdraw()`` of ``from``'s whole balance, as an unsigned transaction."""
    sender = _required_address(req.sender, "from")
    balance = await asyncio.to_thread(b.escrow.call, "balanceOf", sender)
    if int(balance) == 0:
        raise FieldError("from", f"{sender} has nothing to withdraw (balance 0)")
    tx = await asyncio.to_thread(b.txs.unsigned, sender, "withdraw")
    return {"balance_wei": str(int(balance)), "tx": tx}


@router.post("/providers/prepare")
async def prepare_provider(req: ProviderSignup, b: BackendDep) -> dict[str, Any]:
    """Provider sign-up: a metadata document on IPFS and ``registerProvider(metadataCid)`` with
    the stake as value, for the provider's wallet to sign."""
    from gridmarket.cid import bytes_cid

    sender = _required_address(req.sender, "from")
    try:
        stake = parse_eth(str(req.stake_eth), "stake_eth")
    except AmountError as exc:
        raise FieldError("stake_eth", exc.message) from None
    if req.region is not None and req.region not in REGIONS:
        raise FieldError("region", f"{req.region!r} is unknown; use one of {sorted(REGIONS)}")
    metadata = json.dumps(
        {"wallet": sender, "name": req.name, "region": req.region, "contact": req.contact},
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    cid = bytes_cid(metadata)
    tx = await asyncio.to_thread(
        b.txs.unsigned, sender, "registerProvider", cid, value=stake, field="stake_eth"
    )
    stored = await asyncio.to_thread(add_spec, b, metadata)
    if stored != cid:
        raise HTTPException(502, f"IPFS stored the metadata as {stored}, expected {cid}")
    return {"metadata_cid": cid, "stake_wei": str(stake), "tx": tx}


@router.post("/tx/relay")
async def relay(req: RelayRequest, request: Request, b: BackendDep) -> dict[str, Any]:
    """Relay a signed raw transaction to the escrow (refused, with the reason, when it is for
    another contract or chain, or would revert); with ``wait_s``, wait for its receipt (on the
    event loop, counted against the client's cap on waiting requests)."""
    result = await asyncio.to_thread(b.txs.relay, req.raw_tx)
    if req.wait_s > 0:
        async with b.waits.slot(client_of(request)):
            deadline = time.monotonic() + req.wait_s
            while True:
                mined = await asyncio.to_thread(b.txs.receipt_of, result["tx_hash"])
                if mined is not None:
                    result.update(mined)
                    break
                if time.monotonic() >= deadline:
                    break
                await asyncio.sleep(0.2)
    if result.get("block") is not None:
        await b.refresh(force=True)
    return result
