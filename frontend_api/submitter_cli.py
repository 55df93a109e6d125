"""``gridmarket``: the submitter's command line (typer), a client of the front end's JSON API.

    gridmarket init               create (or import) the encrypted wallet keystore
    gridmarket submit job.yaml    upload its files, fund it from the keystore, print the job
    gridmarket status JOB         state on-chain and at the scheduler (--follow to watch)
    gridmarket logs JOB           attempts and log lines (-f follows them live)
    gridmarket progress JOB       a checkpointing job's progress and checkpoints (-f follows)
    gridmarket get JOB|CID        download the output, checked against its CID
    gridmarket cancel JOB         take the bounty back before anyone is assigned
    gridmarket refund JOB         take the bounty back after the deadline
    gridmarket accept JOB         accept a submitted result now (pays the provider)
    gridmarket dispute JOB        dispute a submitted result within its challenge window
    gridmarket finalize JOB       pay a result nobody disputed, once its window has passed
    gridmarket reveal JOB         reveal a settled spot job's seed (kept by submit)
    gridmarket withdraw           send your escrow balance (refunds) to your wallet
    gridmarket jobs               your jobs

The front end (``--url``, ``$GRIDMARKET_URL``) builds each transaction; the CLI checks it (to the
escrow, the right function and job, spec, deadline, terms and value), signs it with the local key
and has the front end relay it. The key never leaves this process. Errors print one line on
stderr and exit with status 1. The front end's API, the wallet and the transaction checks are in
:mod:`frontend_api.submitter_client`; uploads and downloads in :mod:`frontend_api.submitter_files`.

Length: about 1,200 lines, far over the 500 the project aims for: ``submit`` alone is ~300.
Splitting the commands into modules of their own (as ``submitter_progress.py`` and
``submitter_logs.py`` already are) is issue 30's open work.
"""

from __future__ import annotations

import io
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from gridmarket.cmdline import command_app, root_options
from gridmarket.cmdline import friendly as cmdline_friendly
from gridmarket.escrow import ZERO_ADDRESS

from .format import ago, duration, eth, state_label, when
from .submitter_client import (
    CliError,
    Frontend,
    Options,
    check_create_job,
    check_create_job_with,
    check_job_call,
    check_resolve,
    check_token_dispute,
    dispute_value,
    job_call_signature,
    parse_job_id,
    read_password,
    relay,
    sign_permit,
    sign_tx,
    tx_link,
    unlock_account,
    wallet_address,
)
from .submitter_files import download, upload_dataset, upload_module
from .submitter_spot import SeedStore

app = command_app(
    "gridmarket",
    "GridMarket submitter: fund GPU jobs from your wallet, follow them, get the outputs.",
)

DEFAULT_URL = "http://127.0.0.1:8800"
DEFAULT_KEYSTORE = Path("~/.gridmarket/submitter.json")
FINAL_STATES = frozenset({"released", "refunded", "failed", "invalid", "expired"})


def _opts(ctx: typer.Context) -> Options:
    opts = root_options(ctx, Options)
    if opts is None:
        raise CliError("internal: options missing")
    return opts


def _expected_errors() -> tuple[type[Exception], ...]:
    from gridmarket.keystore import KeystoreError

    from .jobfile import JobFileError

    return (CliError, JobFileError, KeystoreError)


friendly = cmdline_friendly(_expected_errors, logging.getLogger(__name__))
"""Any failure of a command: one line on stderr, exit status 1."""


def money(units: int | str | None, currency: dict[str, Any] | None) -> str:
    """An amount in the currency an answer names (``5 tUSD``; ETH when it names none)."""
    from .currency import money as in_currency  # web3 underneath: imported when needed

    return in_currency(units, currency)


@app.callback()
def main(
    ctx: typer.Context,
    url: Annotated[
        str, typer.Option(envvar="GRIDMARKET_URL", help="the front end's base URL")
    ] = DEFAULT_URL,
    keystore: Annotated[
        Path, typer.Option(envvar="GRIDMARKET_KEYSTORE", help="your encrypted key file")
    ] = DEFAULT_KEYSTORE,
    password_file: Annotated[
        Path | None,
        typer.Option(
            envvar="GRIDMARKET_PASSWORD_FILE",
            help="file holding the keystore password ($GRIDMARKET_PASSWORD also works)",
        ),
    ] = None,
    ipfs_api: Annotated[
        str | None,
        typer.Option(
            envvar="GRIDMARKET_IPFS_API",
            help="an IPFS RPC API to download outputs from directly (default: via the front end)",
        ),
    ] = None,
) -> None:
    """GridMarket submitter CLI."""
    ctx.obj = Options(url.rstrip("/"), keystore.expanduser(), password_file, ipfs_api)


# --------------------------------------------------------------------------- init


@app.command()
@friendly
def init(
    ctx: typer.Context,
    private_key_file: Annotated[
        Path | None, typer.Option(help="import this hex private key instead of making a new one")
    ] = None,
    force: Annotated[bool, typer.Option(help="replace an existing keystore")] = False,
) -> None:
    """Create your wallet's encrypted keystore; print its address (fund it to submit jobs)."""
    from gridmarket.keystore import create_keystore

    opts = _opts(ctx)
    key = None
    if private_key_file is not None:
        try:
            key = private_key_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise CliError(f"cannot read {private_key_file}: {exc.strerror}") from None
    address = create_keystore(
        opts.keystore, read_password(opts, confirm=True), private_key=key, force=force
    )
    typer.echo(f"keystore {opts.keystore}")
    typer.echo(address)


# --------------------------------------------------------------------------- submit


def pin_image(job: Any, registry: str | None) -> Any:
    """``job`` with its Docker image named by digest (``host[:port]/name@sha256:<hex>``), as
    the agents pull it: a tag is resolved through its registry now, before anything is funded
    (a name without a registry host goes to ``registry``). A job without an image is as is."""
    from dataclasses import replace as dc_replace

    from gridmarket.images import ImageRefError, RegistryError, parse_image_ref, resolve_image

    image = job.spec.get("image")
    if not isinstance(image, str) or not image:
        return job
    try:
        ref = parse_image_ref(image)
        if ref.pinned and ref.tag is None:
            return job
        if ref.host is None:
            if not registry:
                raise CliError(
                    f"image: {image!r} names no registry and the front end advertises none: "
                    "name it by digest (host[:port]/name@sha256:<hex>) or give --registry"
                )
            ref = parse_image_ref(f"{registry}/{image}")
        pinned = resolve_image(str(ref))
    except (ImageRefError, RegistryError) as exc:
        raise CliError(f"image: {exc}") from None
    typer.echo(f"image {image} -> {pinned}", err=True)
    return dc_replace(job, spec={**job.spec, "image": pinned})


@app.command()
@friendly
def submit(
    ctx: typer.Context,
    job_file: Annotated[Path, typer.Argument(help="job spec file (YAML or JSON)")],
    bounty: Annotated[
        str | None,
        typer.Option(
            help="what to lock, in the currency, e.g. 0.01 (ETH) or 5 (tUSD); overrides the file"
        ),
    ] = None,
    currency: Annotated[
        str | None,
        typer.Option(
            help="what the job is paid in: ETH (default) or a token the escrow lists (its "
            "symbol, e.g. tUSD, or address); funded with your signed permit, one transaction"
        ),
    ] = None,
    deadline: Annotated[
        str | None, typer.Option(help="e.g. 2h, 1d or an ISO date (overrides the file)")
    ] = None,
    wait: Annotated[bool, typer.Option(help="follow the job until it is final")] = False,
    timeout: Annotated[float, typer.Option(help="seconds --wait waits at most")] = 3600,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="check everything, upload and fund nothing")
    ] = False,
    mediator: Annotated[
        str | None,
        typer.Option(
            help="who rules if you dispute a result: a listed mediator or your own address "
            "(default: the deployment's listed mediator)"
        ),
    ] = None,
    collateral: Annotated[
        str | None,
        typer.Option(
            help="what the provider locks while it holds the job, in the currency (default "
            "and minimum: minCollateral(bounty))"
        ),
    ] = None,
    payment: Annotated[
        str | None,
        typer.Option(
            help="after-window: paid when you accept, or when nobody disputed within the "
            "challenge window (trustless); on-verify: paid at once on the scheduler's check "
            "(you trust the scheduler)"
        ),
    ] = None,
    verification: Annotated[
        str | None,
        typer.Option(
            "--verification",
            "--verify",
            help="integrity: one provider (default); replicate:k (k = 2..5): k distinct "
            "providers each run it for bounty/k, the agreeing majority is paid and the others "
            "slashed (you pay k runs; --collateral is each seat's); spot:p (e.g. spot:0.1): "
            "one provider, each attempt re-run by the mediator with probability p, drawn from "
            "a seed kept here (you fund 2 x bounty: the second half is a check deposit)",
        ),
    ] = None,
    mediator_pubkey: Annotated[
        str | None,
        typer.Option(
            help="spot:p: the mediator's secp256k1 public key (0x hex) to seal the seed to "
            "(default: the deployment's, for its listed mediator; yours when you mediate)"
        ),
    ] = None,
    registry: Annotated[
        str | None,
        typer.Option(
            envvar="GRIDMARKET_REGISTRY",
            help="registry (host[:port]) an image tag without one resolves against "
            "(default: the one the front end advertises)",
        ),
    ] = None,
) -> None:
    """Upload the job's files to IPFS, fund it from your keystore, print its id and page."""
    from gridmarket.cid import bytes_cid
    from gridmarket.wire import JobSpec

    from .forms import parse_policy
    from .jobfile import load_job_file, parse_deadline

    opts = _opts(ctx)
    job = load_job_file(job_file)
    try:
        policy = parse_policy(verification or job.verification)
    except ValueError as exc:
        raise CliError(f"--{exc}") from None
    replicas = policy.replicas
    if replicas and payment is None and job.payment == "on-verify":
        raise CliError(
            f"{job_file}: payment: on-verify cannot be used with replicate:{replicas} "
            "(a replicated job is paid only when its seats agree)"
        )
    if policy.spot_bps and payment is None and job.payment == "on-verify":
        raise CliError(
            f"{job_file}: payment: on-verify cannot be used with {policy.name} "
            "(a spot job is paid after the challenge window: a check may be open)"
        )
    payment_mode = (payment or job.payment or "after-window").strip().lower().replace("_", "-")
    if payment_mode not in ("after-window", "on-verify"):
        raise CliError(f"--payment: {payment!r} is not after-window or on-verify")
    mediator = mediator if mediator is not None else job.mediator
    collateral = collateral if collateral is not None else job.collateral_eth
    bounty_eth, bounty_wei = (
        (bounty, None) if bounty is not None else (job.bounty_eth, job.bounty_wei)
    )
    if bounty_eth is None and bounty_wei is None:
        raise CliError(f"{job_file}: bounty: say how much to lock (bounty: 0.01)")
    currency_name = (currency if currency is not None else job.currency or "ETH").strip()
    in_token = currency_name.upper() != "ETH"
    abs_deadline, ttl_s = (
        parse_deadline(deadline) if deadline is not None else (job.deadline, job.ttl_s)
    )
    account = unlock_account(opts)
    fe = Frontend(opts.url)
    try:
        info = fe.get("/api/info")
        terms: dict[str, Any] = {"from": account.address}
        if in_token:
            _check_currency(info, currency_name)
            terms["currency"] = currency_name
        amount_key = "bounty" if in_token else "bounty_eth"
        if bounty_eth is not None:
            terms[amount_key] = bounty_eth
        else:
            terms["bounty_wei"] = bounty_wei
        if abs_deadline is not None:
            terms["deadline"] = abs_deadline
        if ttl_s is not None:
            terms["ttl_s"] = ttl_s
        terms["payment"] = payment_mode.replace("-", "_")
        terms["verification"] = policy.name
        seed: bytes | None = None
        if policy.spot_bps:  # the seed drawn here, sealed to the mediator, kept here
            mediator = _spot_mediator(mediator, info, account.address)
            spec_spot, seed = _spot_draw(policy.spot_bps, mediator, mediator_pubkey, info, account)
            job = _with_spot(job, spec_spot)  # refused here for a job that is not comparable
        elif mediator_pubkey is not None:
            raise CliError("--mediator-pubkey is for spot:p verification only")
        if mediator is not None:
            terms["mediator"] = mediator
        if collateral is not None:
            terms["collateral" if in_token else "collateral_eth"] = collateral
        # 1. everything checked (the transaction's dry run included) before any upload
        from .jobfile import PLACEHOLDER_CID

        if replicas:  # seats compare outputs: the image is pinned before the front end checks
            job = pin_image(job, registry or info.get("registry"))
        probe = job.spec_with(
            dataset_cid=PLACEHOLDER_CID if job.dataset else None,
            module_cid=PLACEHOLDER_CID if job.module else None,
        )
        checked = fe.post("/api/jobs/prepare", json={**terms, "spec": probe, "dry_run": True})
        asked = checked["terms"]
        if int(checked.get("replicas") or 0) != replicas or (
            checked.get("verification") != policy.name
        ):
            raise CliError(
                f"the front end prepared {checked.get('verification') or 'integrity'}, "
                f"not {policy.name}"
            )
        if policy.spot_bps:
            _check_spot_terms(asked, info, int(checked["bounty_wei"]), policy.spot_bps)
        if not replicas:
            job = pin_image(job, registry or info.get("registry"))  # the tag, to its digest
        if mediator is not None and asked["mediator"].lower() != mediator.strip().lower():
            raise CliError(f"the front end chose mediator {asked['mediator']}, not {mediator}")
        cur = checked.get("currency")
        funding = _funding(checked, policy.spot_bps)
        if dry_run:
            typer.echo(
                f"ok: {job_file} would lock {money(funding, cur)} from "
                f"{account.address} until {when(checked['deadline'])}"
            )
            typer.echo(f"  terms    {_terms_line(asked, checked)}")
            typer.echo(f"  operator {asked['operator']} (assigns it; funding expects this one)")
            typer.echo(f"  verify   {_verification_line(checked)}")
            return
        # the operator shown (the dry run's): the transaction must expect exactly this one
        terms["operator"] = asked["operator"]
        if in_token:  # the permit, signed here over the token's own domain (nothing sent yet)
            terms.update(_token_permit(account, info, checked))
        # 2. the files, then the spec and the transaction
        dataset_cid = upload_dataset(fe, job.dataset) if job.dataset else None
        module_cid = upload_module(fe, job.module) if job.module else None
        spec = job.spec_with(dataset_cid=dataset_cid, module_cid=module_cid)
        prepared = fe.post("/api/jobs/prepare", json={**terms, "spec": spec})
        if prepared.get("tx") is None:
            raise CliError("the front end built no transaction (the permit was not taken)")
        spec_cid = bytes_cid(JobSpec.model_validate(spec).to_bytes())
        if prepared["spec_cid"] != spec_cid:
            raise CliError(
                f"the front end stored the spec as {prepared['spec_cid']}, not {spec_cid}"
            )
        if in_token:
            check_create_job_with(
                prepared["tx"],
                info,
                str(cur["address"]),
                spec_cid,
                int(prepared["deadline"]),
                funding,
                {**asked, "replicas": replicas},
            )
        else:
            check_create_job(
                prepared["tx"],
                info,
                spec_cid,
                int(prepared["deadline"]),
                funding,  # the bounty, and a spot job's check deposit beside it
                {**asked, "replicas": replicas},  # the seat count it must fund
            )
        expected = _expected_seats(prepared, account.address, spec_cid, replicas)
        seed_file: Path | None = None
        store = SeedStore.beside(opts.keystore)
        if seed is not None:  # kept before the job exists: its funding may succeed
            if not as_json:  # the price, once more, before anything is sent
                for line in _spot_lines(prepared):
                    typer.echo(f"  spot     {line}")
            seed_file = store.save(
                expected[0],
                seed,
                job.spec["spot"],
                mediator=asked["mediator"],
                spec_cid=spec_cid,
                submitter=account.address,
            )
        # 3. signed here, relayed there
        try:
            result = relay(fe, sign_tx(account, prepared["tx"]))
            events = result.get("events", [])
            created = [e["args"]["jobId"] for e in events if e["name"] == "JobCreated"]
            if created != expected:
                raise CliError(f"transaction {result['tx_hash']} did not create the job")
        except CliError:
            if seed_file is not None:
                store.forget(expected[0])
            raise
        job_id = prepared["job_id"]
        out = {
            "job_id": job_id,
            "verification": policy.name,
            "funding_wei": str(funding),
            "spot": prepared.get("spot"),
            "seed_file": str(seed_file) if seed_file else None,
            "group_id": prepared.get("group_id"),
            "seat_ids": expected if replicas else [],
            "price": prepared.get("price"),
            "spec_cid": spec_cid,
            "tx_hash": result["tx_hash"],
            "bounty_wei": prepared["bounty_wei"],
            "currency": cur,
            "deadline": prepared["deadline"],
            "terms": asked,
            "url": f"{opts.url}/jobs/{job_id}",
            "tx_url": tx_link(info, opts.url, result["tx_hash"]),
        }
        if as_json:
            typer.echo(json.dumps(out, indent=2))
        else:
            typer.echo(job_id)
            typer.echo(
                f"  funded   {money(funding, cur)}, deadline {when(prepared['deadline'])}"
                + (
                    f" (bounty {money(prepared['bounty_wei'], cur)} + check deposit "
                    f"{money(prepared['bounty_wei'], cur)})"
                    if policy.spot_bps
                    else ""
                )
            )
            typer.echo(f"  terms    {_terms_line(asked, prepared)}")
            typer.echo(f"  operator {asked['operator']} (assigns it)")
            typer.echo(f"  verify   {_verification_line(prepared)}")
            if replicas:
                typer.echo(f"  group    {prepared['group_id']}")
                for n, seat in enumerate(expected):
                    typer.echo(f"  seat {n}   {seat}")
            typer.echo(f"  spec     {spec_cid}")
            if seed_file is not None:
                typer.echo(f"  seed     kept in {seed_file} (gridmarket reveal {job_id})")
            typer.echo(f"  tx       {out['tx_url']}")
            typer.echo(f"  follow   {out['url']}")
        if wait and replicas:
            group = _follow_group(fe, job_id, timeout, quiet=as_json)
            verdict = group.get("verdict") or {}
            if not verdict.get("majority"):
                raise typer.Exit(1)
        elif wait:
            final = _follow(fe, job_id, timeout, quiet=as_json)
            chain = final.get("chain") or {}
            if chain.get("status") == "released" and not as_json:
                c = chain.get("currency")
                typer.echo(
                    f"paid {money(chain['payout_wei'], c)} to {chain.get('provider')} "
                    f"(fee {money(chain['fee_wei'], c)})"
                )
            if seed_file is not None and final.get("chain_status") in ("released", "refunded"):
                _auto_reveal(fe, store, job_id, quiet=as_json)
            if final.get("chain_status") != "released" and final.get("state") != "released":
                raise typer.Exit(1)
    finally:
        fe.close()


def _spot_mediator(mediator: str | None, info: dict[str, Any], me: str) -> str:
    """A spot job's mediator, known before the seed is sealed: the one asked for, else the
    deployment's listed one, else the submitter itself."""
    from gridmarket.ethsig import to_checksum_address

    chosen = mediator or info.get("mediator") or me
    try:
        return to_checksum_address(str(chosen).strip())
    except ValueError:
        raise CliError(f"--mediator: {chosen!r} is not a 0x address") from None


def _spot_draw(
    p_bps: int, mediator: str, given_key: str | None, info: dict[str, Any], account: Any
) -> tuple[dict[str, Any], bytes]:
    """The spec's ``spot`` field and its seed: drawn here, sealed to ``mediator``'s checked
    public key (:func:`frontend_api.submitter_spot.mediator_key`)."""
    from .submitter_spot import draw, mediator_key

    key = mediator_key(mediator, given_key, info, bytes(account.key), account.address)
    seed, field = draw(p_bps, key, account.address)
    return field, seed


def _with_spot(job: Any, spec_spot: dict[str, Any]) -> Any:
    """``job`` whose spec carries ``spot``; the spec's own error (a job whose honest runs may
    differ cannot be spot-checked) before anything is asked of the front end."""
    from dataclasses import replace as dc_replace

    from pydantic import ValidationError

    from gridmarket.wire import JobSpec

    from .forms import spec_error
    from .jobfile import PLACEHOLDER_CID

    job = dc_replace(job, spec={**job.spec, "spot": spec_spot})
    probe = job.spec_with(
        dataset_cid=PLACEHOLDER_CID if job.dataset else None,
        module_cid=PLACEHOLDER_CID if job.module else None,
    )
    try:
        JobSpec.model_validate(probe)
    except ValidationError as exc:
        err = spec_error(exc, prefix="")
        raise CliError(f"{job.path}: {err.field.lstrip('.') or 'spec'}: {err.message}") from None
    return job


def _check_spot_terms(asked: dict[str, Any], info: dict[str, Any], bounty: int, p_bps: int) -> None:
    """The terms a front end prepared for a spot job, checked here: FLAG_SPOT alone, and a
    collateral that makes skipping the work unprofitable (``spot.min_collateral``) and that the
    escrow accepts (``minCollateral``)."""
    from gridmarket import spot
    from gridmarket.escrow import FLAG_SPOT, min_collateral

    if int(asked["flags"]) != FLAG_SPOT:
        raise CliError(f"the front end prepared flags {asked['flags']}, not FLAG_SPOT")
    bps = int((info.get("params") or {}).get("min_collateral_bps", 10_000))
    least = max(min_collateral(bounty, bps), spot.min_collateral(bounty, p_bps))
    if int(asked["collateral_wei"]) < least:
        raise CliError(
            f"the front end prepared a collateral of {asked['collateral_wei']} wei, less than "
            f"{least} (cheating is unprofitable only above bounty x (1 - p) / p)"
        )


def _funding(prepared: dict[str, Any], spot_bps: int) -> int:
    """What the funding transaction must send: the bounty, twice it for a spot job (computed
    here from the bounty, not taken from the front end)."""
    bounty = int(prepared["bounty_wei"])
    return 2 * bounty if spot_bps else bounty


def _spot_lines(prepared: dict[str, Any]) -> list[str]:
    """A spot job's price, as the front end's price view words it (its numbers are checked
    here: the funding by :func:`_funding`, the collateral by :func:`_check_spot_terms`)."""
    spot_price = (prepared.get("price") or {}).get("spot") or {}
    return [str(line) for line in spot_price.get("lines") or []]


def _auto_reveal(fe: Frontend, store: Any, job_id: str, quiet: bool = False) -> None:
    """After ``--wait`` saw the job settled: reveal its seed (a failure is a warning, the
    mediator reveals it too)."""
    try:
        record = store.load(job_id)
        answer = fe.post(f"/api/jobs/{job_id}/spot", json={"seed": record["seed"]})
    except CliError as exc:
        typer.echo(
            f"warning: the seed was not revealed: {exc} (gridmarket reveal {job_id})", err=True
        )
        return
    store.mark_revealed(job_id)
    if not quiet:
        typer.echo(f"revealed the seed {record['seed']} ({_drawn_text(answer, record)})")


def _drawn_text(answer: dict[str, Any], record: dict[str, Any]) -> str:
    from .submitter_spot import drawn_attempts

    attempts = int(((answer.get("scheduler") or {}).get("attempts")) or 0)
    drawn = drawn_attempts(str(record["seed"]), int(record["p_bps"]), attempts)
    if not attempts:
        return "it draws the attempts anyone can now recompute"
    shown = ", ".join(str(a) for a in drawn) or "none"
    return f"of {attempts} attempt(s) it drew for a check: {shown}"


def _check_currency(info: dict[str, Any], name: str) -> None:
    """A currency the front end lists (its symbol in any case, or its address), before
    anything is asked of the chain; :class:`CliError` naming the choices otherwise."""
    listed = info.get("currencies") or []
    names = {str(c.get("symbol", "")).lower() for c in listed}
    names |= {str(c.get("address", "")).lower() for c in listed}
    if name.lower() not in names:
        choices = ", ".join(str(c.get("symbol")) for c in listed) or "ETH"
        raise CliError(f"--currency: {name!r} is not a currency of this escrow (choose {choices})")


def _token_permit(account: Any, info: dict[str, Any], checked: dict[str, Any]) -> dict[str, Any]:
    """What a token job's prepare needs besides the terms: ``{"permit": ...}`` signed here
    when the escrow's allowance does not cover the bounty yet; nothing when it does."""
    funding = checked.get("funding") or {}
    amount = int(funding.get("amount_wei") or checked["bounty_wei"])  # a spot job's: 2 x bounty
    if amount not in (int(checked["bounty_wei"]), 2 * int(checked["bounty_wei"])):
        raise CliError(f"the front end asks a permit for {amount}, not the job's funding")
    if int(funding.get("allowance_wei") or 0) >= amount:
        return {}
    typed = funding.get("permit")
    if not typed:
        symbol = (checked.get("currency") or {}).get("symbol")
        raise CliError(
            f"{symbol} cannot be allowed by a permit ({funding.get('permit_unavailable')}): "
            f"approve the escrow {info['escrow']} for {money(amount, checked.get('currency'))} "
            "from your wallet first, then submit again"
        )
    return {"permit": sign_permit(account, typed, str(info["escrow"]), amount)}


def _terms_line(terms: dict[str, Any], prepared: dict[str, Any]) -> str:
    """``mediator 0x…, collateral 0.01 ETH, paid after the challenge window (1 h)``."""
    window = int(prepared.get("challenge_window_s") or 0)
    mode = (
        "paid on the scheduler's check (instant; you trust the scheduler, no dispute)"
        if terms["payment"] == "on_verify"
        else f"paid after the challenge window ({duration(window)}; you may dispute before)"
    )
    collateral = money(terms["collateral_wei"], prepared.get("currency"))
    return f"mediator {terms['mediator']}, collateral {collateral}, {mode}"


def _verification_line(prepared: dict[str, Any]) -> str:
    """``replicate:3: you pay 0.03 ETH for 3 runs (0.01 ETH per seat), each provider locks
    0.01 ETH of collateral`` (or ``integrity: one run``)."""
    price = prepared.get("price") or {}
    runs = int(price.get("runs") or 1)
    cur = prepared.get("currency")
    spot_price = price.get("spot")
    if spot_price:
        b = int(prepared["bounty_wei"])
        return (
            f"spot:{spot_price['p']}: you send {money(2 * b, cur)} (bounty {money(b, cur)} + "
            f"check deposit {money(b, cur)}, returned unless a check upholds the result); "
            f"expected compute 1 + {spot_price['p']} runs; the provider locks "
            f"{money(price['collateral_per_seat_wei'], cur)} (cheating is unprofitable above "
            f"bounty x (1 - p) / p)"
        )
    if runs == 1:
        return f"integrity: one provider, you pay {money(prepared['bounty_wei'], cur)} for one run"
    return (
        f"{price['verification']}: you pay {money(price['total_wei'], cur)} for {runs} runs by "
        f"distinct providers ({money(price['per_seat_wei'], cur)} per seat), each provider "
        f"locks {money(price['collateral_per_seat_wei'], cur)} of collateral"
    )


def _expected_seats(
    prepared: dict[str, Any], submitter: str, spec_cid: str, replicas: int
) -> list[str]:
    """The job ids the funding transaction must create, computed here (not taken from the
    front end): the job's id, or the seats of the group ``keccak256(submitter, spec, salt)``."""
    from gridmarket.escrow import job_id as compute_job_id
    from gridmarket.escrow import seat_ids

    salt = bytes.fromhex(str(prepared["salt"])[2:])
    base = compute_job_id(submitter, spec_cid, salt)
    if not replicas:
        return ["0x" + base.hex()]
    return ["0x" + s.hex() for s in seat_ids(base, replicas)]


# --------------------------------------------------------------------------- following


def _spot_rows(sp: dict[str, Any] | None) -> list[tuple[str, str]]:
    """A spot job's lines of ``status``: commitment, each attempt's check, the reveal."""
    if not sp:
        return []
    rows = [("commit", str(sp.get("commit") or sp.get("problem") or "-"))]
    for a in sp.get("attempts") or []:
        drawn = a.get("drawn")
        extra = "" if drawn is None else ("  (drawn)" if drawn else "  (not drawn)")
        rows.append((f"attempt {a['attempt']}", f"{a['state']}{extra}"))
    reveal = sp.get("reveal")
    if reveal:
        ok = "opens the commitment" if reveal.get("verified") else "DOES NOT open the commitment"
        drawn_list = ", ".join(str(x) for x in reveal.get("checked_attempts") or []) or "none"
        rows.append(("seed", f"{reveal['seed']} ({ok}; drew attempts: {drawn_list})"))
    else:
        rows.append(("seed", "not revealed yet"))
    return rows


def _seat_fields(seat: dict[str, Any]) -> str:
    """A seat's state, provider, output CID and verdict on one line, nothing wrapped."""
    agrees = seat.get("agrees")
    verdict = (
        "slashed"
        if seat.get("slashed")
        else "agrees"
        if agrees is True
        else "disagrees"
        if agrees is False
        else "-"
    )
    return (
        f"{seat.get('status') or '-':<9}  {seat.get('provider') or '-':<42}  "
        f"{seat.get('output_cid') or '-'}  {verdict}"
    )


def _seat_line(seat: dict[str, Any]) -> str:
    """``seat 0  released   0xPROVIDER  CID  agrees``."""
    return f"seat {seat['seat']}  {_seat_fields(seat)}"


def _verdict_lines(group: dict[str, Any]) -> list[str]:
    """The Resolved verdict: agreeing count, winning output and digest, who was slashed."""
    v = group.get("verdict")
    if not v:
        return ["verdict  not resolved yet"]
    if not v.get("majority"):
        return [f"verdict  no majority of {v['replicas']}: open seats refunded, nobody slashed"]
    lines = [
        f"verdict  {v['agreeing']} of {v['replicas']} agree  output {v.get('output_cid') or '-'}"
        f"  digest {v['result_digest']}",
        f"paid     {len(v.get('paid') or [])} seat(s)",
    ]
    for x in v.get("slashed") or []:
        amount = money(x["amount_wei"], group.get("currency"))
        lines.append(f"slashed  seat {x['seat']}  {x['provider']}  {amount}")
    if not v.get("slashed"):
        lines.append("slashed  none")
    return lines


def _follow_group(fe: Frontend, job_id: str, timeout: float, quiet: bool = False) -> dict[str, Any]:
    """Follow every seat of the replicated job ``job_id`` is a seat of until all are final;
    print each seat line as it changes, then the verdict. The group's last view."""
    deadline = time.monotonic() + timeout
    shown: dict[int, str] = {}
    group: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            view = fe.get(f"/api/jobs/{job_id}")
        except CliError as exc:
            if "not on escrow" not in str(exc):
                raise
            time.sleep(1)
            continue
        group = view.get("group") or {}
        for seat in group.get("seats") or []:
            line = _seat_line(seat)
            if shown.get(seat["seat"]) != line and not quiet:
                typer.echo(f"{time.strftime('%H:%M:%S')}  {line}")
            shown[seat["seat"]] = line
        if group.get("final"):  # resolve settles every seat and says Resolved in one tx
            if not quiet:
                for line in _verdict_lines(group):
                    typer.echo(line)
            return group
        time.sleep(1)
    raise CliError(f"the seats of {job_id} are not all final after {timeout:.0f} s")


def _follow(fe: Frontend, job_id: str, timeout: float, quiet: bool = False) -> dict[str, Any]:
    """Print each change of state until the job is final (or ``timeout``); its last view."""
    deadline = time.monotonic() + timeout
    last = ""
    view: dict[str, Any] = {}
    catch_up: float | None = None
    while time.monotonic() < deadline:
        try:
            view = fe.get(f"/api/jobs/{job_id}")
        except CliError as exc:
            if "not on escrow" not in str(exc):
                raise
            time.sleep(1)
            continue
        line = f"{state_label(view.get('state'))} (on-chain {view.get('chain_status')})"
        reason = (view.get("scheduler") or {}).get("reason")
        if reason:
            line += f": {reason}"
        if line != last and not quiet:
            typer.echo(f"{time.strftime('%H:%M:%S')}  {line}")
        last = line
        paid_off = view.get("state") in ("released", "refunded")  # the scheduler's word
        settled = view.get("chain_status") in ("released", "refunded") or not paid_off
        if view.get("final") and not settled and catch_up is None:
            # the scheduler saw it final before the front end's index read the block: give the
            # chain's side a few seconds, so the last line (and the payment) is the chain's
            catch_up = time.monotonic() + 10
        if view.get("final") and (settled or time.monotonic() >= (catch_up or 0)):
            if view.get("output_cid") and not quiet:
                typer.echo(f"output {view['output_cid']}  (gridmarket get {job_id})")
            return view
        time.sleep(1)
    raise CliError(f"job {job_id} is still {view.get('state')} after {timeout:.0f} s")


@app.command()
@friendly
def status(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="the job id (0x...)")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="watch until final")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the whole view as JSON")] = False,
) -> None:
    """The job's state at the scheduler and on-chain, its terms, provider and output."""
    opts = _opts(ctx)
    jid = parse_job_id(job_id)
    fe = Frontend(opts.url)
    try:
        if follow:
            _follow(fe, jid, 24 * 3600)
        view = fe.get(f"/api/jobs/{jid}")
    finally:
        fe.close()
    if as_json:
        typer.echo(json.dumps(view, indent=2))
        return
    chain = view.get("chain") or {}
    cur = chain.get("currency")
    sched = view.get("scheduler") or {}
    rows = [
        ("job", jid),
        (
            "state",
            f"{state_label(view.get('state'))}  "
            f"(on-chain: {view.get('chain_status') or 'not yet'})",
        ),
    ]
    if sched.get("reason"):
        rows.append(("why", sched["reason"]))
    if chain:
        rows += [
            (
                "bounty",
                f"{money(chain['bounty_wei'], cur)}  "
                f"(provider gets {money(chain['payout_wei'], cur)})",
            ),
            ("deadline", f"{when(chain['deadline'])}  ({ago(chain['deadline'])})"),
            ("submitter", chain["submitter"]),
            ("provider", chain.get("provider") or "not assigned"),
            ("spec", chain["spec_cid"]),
        ]
        t = chain.get("terms") or {}
        if t:
            rows += [
                ("mediator", t["mediator"]),
                ("collateral", money(t["collateral_wei"], cur)),
                (
                    "payment",
                    "on the scheduler's check"
                    if t["payment"] == "on_verify"
                    else f"after the challenge window ({duration(t['challenge_window_s'])})",
                ),
            ]
            if t.get("window_ends"):
                verb = "closes" if t.get("window_open") else "closed"
                rows.append(
                    ("window", f"{verb} {when(t['window_ends'])} ({ago(t['window_ends'])})")
                )
            if t.get("mediation_ends"):
                rows.append(
                    (
                        "disputed",
                        f"the mediator rules; finalizable from {when(t['mediation_ends'])}",
                    )
                )
        for r in chain.get("rulings") or []:
            verdict = (
                "upheld"
                if r["upheld"]
                else f"not upheld: provider slashed {money(r['slashed_wei'], cur)}"
            )
            rows.append(("ruling", f"attempt {r['attempt']}: {verdict}"))
    if sched.get("progress"):  # a checkpointing job's newest progress (gridmarket progress)
        from .progress import normalize_progress, summary

        rows.append(("progress", summary(normalize_progress(sched["progress"]))))
    rows.append(("output", view.get("output_cid") or "-"))
    group = view.get("group")
    if group:
        rows.append(("verify", f"{group['verification']}  group {group['group_id']}"))
        for seat in group.get("seats") or []:
            rows.append((f"seat {seat['seat']}", f"{seat['job_id']}  {_seat_fields(seat)}"))
        for line in _verdict_lines(group):
            key, _, value = line.partition("  ")
            rows.append((key.strip(), value.strip()))
    elif chain:
        rows.append(("verify", chain.get("verification") or "integrity"))
    rows += _spot_rows(view.get("spot"))
    commands = {"release": "accept"}  # the CLI's name for the submitter's release
    allowed = [commands.get(name, name) for name, ok in (view.get("actions") or {}).items() if ok]
    if allowed:
        rows.append(("you may", ", ".join(allowed)))
    rows.append(("page", f"{opts.url}/jobs/{jid}"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        typer.echo(f"{key:<{width}}  {value}")


@app.command()
@friendly
def logs(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="the job id (0x...)")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="print new lines until no run is left")
    ] = False,
    timeout: Annotated[float, typer.Option(help="seconds --follow waits at most")] = 86400.0,
) -> None:
    """Every attempt (node, outcome) and the job's log lines (time, attempt, node, stream);
    a replicated job's per seat. ``-f`` follows them live (frontend_api/submitter_logs.py)."""
    from .submitter_logs import show_logs

    fe = Frontend(_opts(ctx).url)
    try:
        show_logs(fe, parse_job_id(job_id), follow=follow, timeout=timeout, echo=typer.echo)
    finally:
        fe.close()


@app.command()
@friendly
def progress(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="the job id (0x...)")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="keep showing it until no run is left")
    ] = False,
    timeout: Annotated[float, typer.Option(help="seconds --follow waits at most")] = 86400.0,
) -> None:
    """A checkpointing job's progress (step/total, metrics), its newest checkpoint and what a
    new attempt resumes from; ``-f`` follows it (frontend_api/submitter_progress.py)."""
    from .submitter_progress import show_progress

    fe = Frontend(_opts(ctx).url)
    try:
        show_progress(fe, parse_job_id(job_id), follow=follow, timeout=timeout, echo=typer.echo)
    finally:
        fe.close()


@app.command()
@friendly
def get(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(help="a job id (its output) or a CID")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="where to put it (default: ./<CID>)")
    ] = None,
) -> None:
    """Download a job's output (or any CID), integrity-checked: its bytes must hash back to
    the CID (which says it is the output submitted, not that it is correct)."""
    from gridmarket.cid import normalize_cid, path_cid

    opts = _opts(ctx)
    fe = Frontend(opts.url, timeout=600)
    try:
        if target.startswith("0x"):
            view = fe.get(f"/api/jobs/{parse_job_id(target)}")
            cid = view.get("output_cid")
            if not cid:
                raise CliError(f"job {target} has no output yet (it is {view.get('state')})")
        else:
            cid = target
        cid = normalize_cid(str(cid))
        dest = (output or Path(cid)).expanduser()
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise CliError(f"{dest} exists and is not an empty folder")
        if opts.ipfs_api:
            from gridmarket.ipfs import IpfsError, IpfsStore

            try:
                with IpfsStore(opts.ipfs_api) as store:
                    got = store.fetch(cid, dest, max_bytes=64 * 1024**3)
            except (IpfsError, ValueError) as exc:
                raise CliError(str(exc)) from None
        else:
            got = download(fe, cid, dest)
        computed = path_cid(got)
        if computed != cid:
            shutil.rmtree(dest, ignore_errors=True)
            raise CliError(f"downloaded bytes hash to {computed}, not {cid}: discarded")
    finally:
        fe.close()
    typer.echo(f"integrity-checked: the bytes hash to {cid}", err=True)
    typer.echo(str(got))


# --------------------------------------------------------------------------- money back


def _job_action(ctx: typer.Context, job_id: str, action: str, done: str) -> dict[str, Any]:
    """Prepare ``action`` on the job from the keystore's address, check it is that call on that
    job (with the dispute deposit as value for a dispute, nothing otherwise), sign, relay."""
    opts = _opts(ctx)
    jid = parse_job_id(job_id)
    account = unlock_account(opts)
    fe = Frontend(opts.url)
    try:
        info = fe.get("/api/info")
        path = f"/api/jobs/{jid}/{action}/prepare"
        prepared = fe.post(path, json={"from": account.address})
        cur = prepared.get("currency") or {}
        in_token = str(cur.get("address") or ZERO_ADDRESS) != ZERO_ADDRESS
        if action == "dispute" and in_token:
            # the deposit is the job's bounty in its token, pulled by the escrow: a permit
            # signed here first when the allowance does not cover it
            deposit = int(prepared["deposit_wei"])
            funding = prepared.get("funding") or {}
            if prepared.get("tx") is None:
                typed = funding.get("permit")
                if not typed:
                    raise CliError(
                        f"the deposit cannot be allowed by a permit "
                        f"({funding.get('permit_unavailable')}): approve the escrow "
                        f"{info['escrow']} for {money(deposit, cur)} first"
                    )
                permit = sign_permit(account, typed, str(info["escrow"]), deposit)
                prepared = fe.post(path, json={"from": account.address, "permit": permit})
            tx = prepared["tx"]
            check_token_dispute(tx, info, str(cur["address"]), jid, deposit)
        else:
            tx = prepared["tx"]
            value = 0
            if action == "dispute":  # the job's bounty, at least the escrow's floor; nothing
                value, deposit = dispute_value(tx, info)  # sent for a spot job (locked)
                if int(prepared["deposit_wei"]) != deposit:
                    raise CliError(
                        f"the front end says the deposit is {prepared['deposit_wei']} wei, "
                        f"the job's is {deposit}"
                    )
            if prepared["action"] == "resolve":  # a replicated job's cancel: every seat
                check_resolve(tx, info, str(prepared["group_id"]), list(prepared["seat_ids"]))
            else:
                check_job_call(tx, info, job_call_signature(prepared["action"]), jid, value)
        result = relay(fe, sign_tx(account, tx))
    finally:
        fe.close()
    typer.echo(f"{done} (tx {result['tx_hash']})")
    return dict(prepared)


@app.command()
@friendly
def cancel(
    ctx: typer.Context, job_id: Annotated[str, typer.Argument(help="the job id (0x...)")]
) -> None:
    """Cancel a job nobody was assigned yet: the bounty goes back to your escrow balance. A
    seat of a replicated job cancels the whole job (``resolve``), only while no seat is held
    or delivered."""
    prepared = _job_action(ctx, job_id, "cancel", "cancelled: the bounty is in your escrow balance")
    if prepared.get("action") == "resolve":
        typer.echo(f"  group    {prepared['group_id']}: every seat refunded")


@app.command()
@friendly
def refund(
    ctx: typer.Context, job_id: Annotated[str, typer.Argument(help="the job id (0x...)")]
) -> None:
    """After the deadline with no result pending, return the bounty to your escrow balance."""
    _job_action(ctx, job_id, "refund", "refunded: the bounty is in your escrow balance")


@app.command()
@friendly
def accept(
    ctx: typer.Context, job_id: Annotated[str, typer.Argument(help="the job id (0x...)")]
) -> None:
    """Accept the job's submitted result now: the provider is paid without waiting for the
    challenge window (you give up disputing it)."""
    _job_action(ctx, job_id, "accept", "accepted: the provider is paid")


@app.command()
@friendly
def dispute(
    ctx: typer.Context, job_id: Annotated[str, typer.Argument(help="the job id (0x...)")]
) -> None:
    """Dispute the job's submitted result within its challenge window, paying the dispute
    deposit: the job's mediator re-checks it. Upheld, the deposit pays the mediator; not upheld,
    you get the deposit back and the provider's collateral, and the job is offered again."""
    prepared = _job_action(ctx, job_id, "dispute", "disputed")
    deposit = money(prepared["deposit_wei"], prepared.get("currency"))
    typer.echo(f"  deposit  {deposit}\n  mediator {prepared['mediator']} rules")


@app.command()
@friendly
def finalize(
    ctx: typer.Context, job_id: Annotated[str, typer.Argument(help="the job id (0x...)")]
) -> None:
    """Pay a submitted result nobody disputed once its challenge window has passed (or a
    disputed one the mediator left unruled past the mediation window). Anyone may."""
    _job_action(ctx, job_id, "finalize", "finalized: the provider is paid")


@app.command()
@friendly
def reveal(
    ctx: typer.Context, job_id: Annotated[str, typer.Argument(help="the job id (0x...)")]
) -> None:
    """Reveal a settled spot job's seed (kept by ``submit --verification spot:p``): the front
    end checks it against the spec's commitment and posts it to the scheduler, so anyone can
    recompute which attempts were drawn for a check. Refused while the job is not settled."""
    from .submitter_spot import SeedStore

    opts = _opts(ctx)
    jid = parse_job_id(job_id)
    store = SeedStore.beside(opts.keystore)
    record = store.load(jid)
    fe = Frontend(opts.url)
    try:
        answer = fe.post(f"/api/jobs/{jid}/spot", json={"seed": record["seed"]})
    finally:
        fe.close()
    store.mark_revealed(jid)
    typer.echo(f"revealed the seed {record['seed']} of {jid}")
    typer.echo(f"  {_drawn_text(answer, record)}")


@app.command()
@friendly
def withdraw(ctx: typer.Context) -> None:
    """Send your whole escrow balance (refunds, slashed stake credited to you) to your wallet."""
    opts = _opts(ctx)
    account = unlock_account(opts)
    fe = Frontend(opts.url)
    try:
        prepared = fe.post("/api/withdraw/prepare", json={"from": account.address})
        result = relay(fe, sign_tx(account, prepared["tx"]))
    finally:
        fe.close()
    typer.echo(f"withdrew {eth(prepared['balance_wei'])} (tx {result['tx_hash']})")


# --------------------------------------------------------------------------- jobs


@app.command()
@friendly
def jobs(
    ctx: typer.Context,
    submitter: Annotated[
        str | None, typer.Option(help="whose jobs (default: your keystore's address)")
    ] = None,
    everyone: Annotated[bool, typer.Option("--all", help="every job on the escrow")] = False,
    limit: Annotated[int, typer.Option(help="at most this many")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Your jobs, newest first: id, on-chain status, bounty, payment mode, deadline, output."""
    opts = _opts(ctx)
    who = None if everyone else (submitter or wallet_address(opts))
    fe = Frontend(opts.url)
    try:
        params: dict[str, Any] = {"limit": limit}
        if who:
            params["submitter"] = who
        body = fe.get("/api/jobs", params=params)
    finally:
        fe.close()
    if as_json:
        typer.echo(json.dumps(body, indent=2))
        return
    rows = body["jobs"]
    if not rows:
        typer.echo("no jobs" + (f" from {who}" if who else ""))
        return
    buf = io.StringIO()
    buf.write(
        f"{'job':<66}  {'status':<9}  {'bounty':>14}  {'paid':<12}  {'deadline':<23}  output\n"
    )
    for j in rows:
        paid = (
            f"replicate:{j['replicas']}"
            if j.get("replicas")
            else "spot"
            if j.get("spot")
            else "on check"
            if j.get("payment") == "on_verify"
            else "after window"
        )
        bounty = money(j["bounty_wei"], j.get("currency"))
        buf.write(
            f"{j['job_id']:<66}  {j['status']:<9}  {bounty:>14}  {paid:<12}  "
            f"{when(j['deadline']):<23}  {j.get('output_cid') or '-'}\n"
        )
    typer.echo(buf.getvalue().rstrip("\n"))


if __name__ == "__main__":
    app()
