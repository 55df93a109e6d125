"""The HTML pages (server-rendered Jinja2; small vanilla JS for the wallet and live updates) and
the IPFS download proxy.
"""

from __future__ import annotations

import asyncio
import mimetypes
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.background import BackgroundTask

from gridmarket.cid import CidError, normalize_cid
from gridmarket.escrow import MAX_REPLICAS, ZERO_ADDRESS
from gridmarket.ipfs import ContentTooLargeError, ContentVerificationError, IpfsError
from gridmarket.tiers import REGIONS, TIERS

from . import progress, svg
from .api import (
    VERIFICATIONS,
    BackendDep,
    _address,
    _currency,
    _job_id,
    _required_address,
    payout_sums,
    verdicts_body,
)
from .backend import ON_VERIFY_TRUST, Backend, job_summary
from .currency import Currency
from .forms import SPOT_OFFERED, FieldError
from .records import NotFoundError, Payout, hexstr
from .scheduler import SchedulerError
from .specdoc import job_spec
from .values import parse_bytes32
from .waits import client_of
from .web import templates

router = APIRouter(include_in_schema=False)

SAFE_INLINE = ("text/", "image/png", "image/jpeg", "image/gif", "image/webp", "application/json")


def render(request: Request, b: Backend, name: str, status_code: int = 200, **ctx: Any) -> Response:
    """A page with the context every page uses (chain, escrow, explorer)."""
    base = {
        "b": b,
        "chain_id": b.deployment.chain_id,
        "escrow": b.escrow.address,
        "explorer_url": b.settings.explorer_url,
        "scheduler_url": b.settings.scheduler_url,
        "path": request.url.path,
        "csp_nonce": getattr(request.state, "csp_nonce", ""),
    }
    return templates.TemplateResponse(request, name, {**base, **ctx}, status_code=status_code)


@router.get("/", response_class=HTMLResponse)
async def home(request: Request, b: BackendDep) -> Response:
    await b.refresh()
    payouts = b.index.payouts()
    sums = payout_sums(b, payouts)
    fleet = await b.fleet_view()
    try:
        sched_jobs: dict[str, Any] = await b.scheduler.jobs(limit=1)
    except SchedulerError:
        sched_jobs = {}
    return render(
        request,
        b,
        "home.html",
        payouts=payouts[:8],
        payout_count=len(payouts),
        sums=sums,
        charts=_charts(b, payouts),
        job_counts=b.index.job_counts(),
        sched_counts=sched_jobs.get("counts", {}),
        jobs=[job_summary(s) for s in b.index.jobs()[:8]],
        fleet=fleet,
        grid=svg.fleet_grid(fleet["nodes"]),
    )


@router.get("/payouts", response_class=HTMLResponse)
async def payouts_page(
    request: Request,
    b: BackendDep,
    provider: str | None = None,
    submitter: str | None = None,
    job: str | None = None,
    currency: str | None = Query(None, max_length=64),
) -> Response:
    prov = _address(provider, "provider")
    sub = _address(submitter, "submitter")
    jid = _job_id(job) if job else None
    chosen = _currency(b, currency) if currency else None
    await b.refresh()
    rows = b.index.payouts(
        provider=prov, submitter=sub, job=jid, token=chosen.address if chosen else None
    )
    return render(
        request,
        b,
        "payouts.html",
        rows=rows[:500],
        count=len(rows),
        sums=payout_sums(b, rows),
        charts=_charts(b, rows),
        filters={
            "provider": prov or "",
            "submitter": sub or "",
            "job": jid or "",
            "currency": chosen.symbol if chosen else "",
        },
        currencies=b.currencies.all(),
        verdicts=verdicts_body(b, 100),
    )


@router.get("/address/{address}", response_class=HTMLResponse)
async def address_page(address: str, request: Request, b: BackendDep) -> Response:
    addr = _required_address(address, "address")
    await b.refresh()
    view = await b.address_view(addr)
    rows = b.index.payouts(provider=addr)
    return render(request, b, "address.html", view=view, charts=_charts(b, rows))


def _charts(b: Backend, rows: list[Payout]) -> list[tuple[Currency, str]]:
    """One totals chart per token the payouts are in (ETH first): earnings over time."""
    tokens = sorted({p.token for p in rows}, key=lambda t: (t != ZERO_ADDRESS, t))
    out: list[tuple[Currency, str]] = []
    for token in tokens:
        currency = b.currency(token)
        mine = [p for p in rows if p.token == token]
        chart = svg.totals_chart(b.index.totals(mine), currency=currency)
        out.append((currency, chart))
    return out


@router.get("/jobs", response_class=HTMLResponse)
async def jobs_page(
    request: Request, b: BackendDep, submitter: str | None = None, provider: str | None = None
) -> Response:
    sub = _address(submitter, "submitter")
    prov = _address(provider, "provider")
    await b.refresh()
    states = b.index.jobs(submitter=sub, provider=prov)
    return render(
        request,
        b,
        "jobs.html",
        jobs=[job_summary(s) for s in states[:500]],
        count=len(states),
        counts=b.index.job_counts(),
        filters={"submitter": sub or "", "provider": prov or ""},
    )


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
async def job_page(job_id: str, request: Request, b: BackendDep) -> Response:
    jid = _job_id(job_id)
    await b.refresh(force=True)
    try:
        view = await b.job_view(jid)
        await progress.attach(b.scheduler, view)
    except NotFoundError:
        # Just sent: the page waits for JobCreated (the stream picks it up).
        view = {"job_id": jid, "missing": "waiting for the job to appear on-chain"}
    spec = None  # a valid JobSpec's JSON only: a hostile spec is the notice's (specdoc)
    if view.get("spec_cid") and not (view.get("chain") or {}).get("problem"):
        doc = await b.waits.run(
            client_of(request), job_spec, b.specs, view["spec_cid"], view.get("scheduler")
        )
        spec = doc.spec
    return render(request, b, "job.html", view=view, spec=spec)


@router.get("/tx/{tx_hash}", response_class=HTMLResponse)
async def tx_page(tx_hash: str, request: Request, b: BackendDep) -> Response:
    try:
        h = hexstr(parse_bytes32(tx_hash, "tx_hash"))
    except ValueError as exc:
        raise FieldError("tx_hash", str(exc).partition(": ")[2]) from None
    view = await asyncio.to_thread(b.index.tx, h)
    body = view.to_json()
    body["error"] = None
    if view.status == "reverted" and view.block is not None:  # why, in words
        receipt = {"transactionHash": bytes.fromhex(h[2:]), "blockNumber": view.block}
        body["error"] = await asyncio.to_thread(b.txs.revert_reason, receipt)
    return render(request, b, "tx.html", tx=body, explorer=b.explorer_link("tx", h))


@router.get("/submit", response_class=HTMLResponse)
async def submit_page(request: Request, b: BackendDep) -> Response:
    await b.refresh()
    return render(
        request,
        b,
        "submit.html",
        regions=sorted(REGIONS.values(), key=lambda r: r.code),
        tiers=[t for t in TIERS.values() if t.key != "cpu"],
        params=b.params,
        mediator=b.default_mediator() or "",
        mediators=b.index.mediators(),
        operator=await asyncio.to_thread(b.operator) or "",
        currencies=b.currencies.all(),
        token_mins={
            str(symbol): str(entry.get("minBounty", ""))
            for symbol, entry in b.deployment.tokens.items()
            if isinstance(entry, dict)
        },
        on_verify_trust=ON_VERIFY_TRUST,
        verifications=VERIFICATIONS,
        max_replicas=MAX_REPLICAS,
        spot_offered=SPOT_OFFERED,
        spot_sealable=bool(b.params.get("mediator_pubkey")),
    )


@router.get("/providers", response_class=HTMLResponse)
async def providers_page(request: Request, b: BackendDep) -> Response:
    await b.refresh()
    fleet = await b.fleet_view()
    return render(
        request,
        b,
        "providers.html",
        fleet=fleet,
        grid=svg.fleet_grid(fleet["nodes"]),
        tier_bars=svg.hbars(list(fleet["by_tier"].items())),
        region_bars=svg.hbars(list(fleet["by_region"].items())),
        regions=sorted(REGIONS),
        params=b.params,
    )


# --------------------------------------------------------------------------- IPFS proxy


def _cid(value: str) -> str:
    try:
        return normalize_cid(value)
    except CidError as exc:
        raise FieldError("cid", f"{value!r} is not a CID: {exc}") from None


async def _tree(b: Backend, cid: str, request: Request) -> Path:
    try:
        return await b.waits.run(client_of(request), b.fetch_tree, cid)
    except ContentTooLargeError as exc:
        raise HTTPException(413, str(exc)) from None
    except ContentVerificationError as exc:
        raise HTTPException(502, f"IPFS returned bad content: {exc}") from None
    except IpfsError as exc:
        raise HTTPException(504, f"IPFS: {exc}") from None


def _serve_file(path: Path, name: str, kind: str) -> Response:
    media, _ = mimetypes.guess_type(name)
    media = media or "application/octet-stream"
    inline = media.startswith(SAFE_INLINE)
    if media.startswith("text/"):
        media = "text/plain; charset=utf-8"  # never render job output as HTML on this origin
    return FileResponse(
        path,
        media_type=media,
        filename=name,
        content_disposition_type="inline" if inline else "attachment",
        headers={
            "X-Ipfs-Kind": kind,
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "sandbox; default-src 'none'",
            "Cache-Control": "public, max-age=31536000, immutable",
        },
    )


def _listing(root: Path, base: Path) -> list[dict[str, Any]]:
    out = []
    for entry in sorted(base.iterdir()):
        rel = entry.relative_to(root).as_posix()
        out.append(
            {
                "name": entry.name,
                "path": rel,
                "dir": entry.is_dir(),
                "size": entry.stat().st_size if entry.is_file() else None,
            }
        )
    return out


def _tar(root: Path) -> Path:
    fd, name = tempfile.mkstemp(suffix=".tar")
    with (
        open(fd, "wb") as raw,
        tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for entry in sorted(root.rglob("*")):
            tar.add(entry, arcname=entry.relative_to(root).as_posix(), recursive=False)
    return Path(name)


@router.get("/ipfs/{cid}")
async def ipfs_root(
    cid: str,
    request: Request,
    b: BackendDep,
    archive: str | None = Query(None, pattern="^tar$"),
    format: str | None = Query(None, pattern="^json$"),
) -> Response:
    """Content from IPFS, integrity-checked (its bytes hash to its CID): a file as is; a
    directory as a listing page, as JSON (``?format=json``) or as one tar file
    (``?archive=tar``). The ``X-Ipfs-Kind`` header says which (``file``/``directory``)."""
    cid = _cid(cid)
    target = await _tree(b, cid, request)
    if target.is_file():
        return _serve_file(target, cid, "file")
    if archive == "tar":
        tar = await b.waits.run(client_of(request), _tar, target)
        return FileResponse(
            tar,
            media_type="application/x-tar",
            filename=f"{cid}.tar",
            headers={"X-Ipfs-Kind": "directory"},
            background=BackgroundTask(tar.unlink, missing_ok=True),
        )
    entries = _listing(target, target)
    if format == "json":
        return JSONResponse({"cid": cid, "entries": entries}, headers={"X-Ipfs-Kind": "directory"})
    return render(request, b, "ipfs_dir.html", cid=cid, sub="", entries=entries)


@router.get("/ipfs/{cid}/{path:path}")
async def ipfs_path(cid: str, path: str, request: Request, b: BackendDep) -> Response:
    """A file (or sub-directory listing) inside a directory CID, from the integrity-checked tree."""
    cid = _cid(cid)
    root = await _tree(b, cid, request)
    if root.is_file():
        raise HTTPException(404, f"{cid} is a file, not a directory")
    target = (root / path).resolve()
    if not target.is_relative_to(root.resolve()) or not target.exists():
        raise HTTPException(404, f"{cid} has no {path!r}")
    if target.is_dir():
        return render(
            request,
            b,
            "ipfs_dir.html",
            cid=cid,
            sub=path.strip("/"),
            entries=_listing(root, target),
        )
    return _serve_file(target, target.name, "file")
