"""What pages and the CLI send, checked field by field before anything is created.

A bad value raises :class:`FieldError` naming the field (``spec.resources.ram_mib``,
``bounty_eth``...). The API answers it with 400 and ``{"detail", "field"}``; the submit page puts
the message next to that field.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gridmarket import spot
from gridmarket.amounts import AmountError, parse_whole
from gridmarket.cuda import parse_version
from gridmarket.escrow import (
    FLAG_ON_VERIFY,
    FLAG_SPOT,
    MAX_REPLICAS,
    MAX_TIMESTAMP,
    MAX_WEI,
    ZERO_ADDRESS,
)
from gridmarket.spot import P_SCALE
from gridmarket.wire import MAX_SPEC_BYTES, JobSpec, QuoteRequest

from .currency import ETH_CURRENCY, Currency
from .format import parse_eth
from .values import parse_address, parse_bytes32

DEADLINE_MARGIN_S = 60
"""A deadline must leave this much more than the escrow's minimum duration: the transaction
is mined some time after it was built."""

_REPLICATE = re.compile(r"^replicate\s*[:=]\s*(\d+)$")
_SPOT = re.compile(r"^spot\s*[:=]\s*(\d*\.?\d+)\s*(%?)$")
SPOT_OFFERED = (1000, 2500)
"""The spot-check rates the submit page offers (basis points): spot:0.1 and spot:0.25."""


@dataclass(frozen=True, slots=True)
class Policy:
    """A verification choice: ``integrity`` (one provider), ``replicate:k`` (``replicas`` = k
    distinct providers) or ``spot:p`` (one provider, re-run by another with probability p per
    attempt: ``spot_bps`` = p in basis points; :mod:`gridmarket.spot`)."""

    replicas: int = 0
    spot_bps: int = 0

    @property
    def name(self) -> str:
        return verification_name(self.replicas, self.spot_bps)


def parse_policy(value: object) -> Policy:
    """The verification a choice asks for: ``integrity``, ``replicate:k`` (k =
    2..MAX_REPLICAS distinct providers) or ``spot:p`` (p = 0.0001..1, or a percentage
    ``spot:10%``). ValueError naming the ``verification`` field otherwise."""
    text = str(value if value is not None else "integrity").strip().lower()
    if text in ("", "integrity"):
        return Policy()
    spot = _SPOT.match(text)
    if spot is not None:
        p = Decimal(spot.group(1)) / (100 if spot.group(2) else 1)
        bps = p * P_SCALE
        if bps != bps.to_integral_value() or not 1 <= bps <= P_SCALE:
            raise ValueError(
                f"verification: spot:{spot.group(1)}{spot.group(2)} asks for a check "
                "probability p of 0.0001..1 in steps of 0.0001 (e.g. spot:0.1)"
            )
        return Policy(spot_bps=int(bps))
    match = _REPLICATE.match(text)
    if match is None:
        raise ValueError(
            f"verification: {value!r} is not integrity or replicate:k (k = 2..{MAX_REPLICAS}), "
            "nor spot:p (0 < p <= 1, e.g. spot:0.1)"
        )
    k = int(match.group(1))
    if not 2 <= k <= MAX_REPLICAS:
        raise ValueError(
            f"verification: replicate:{k} asks for {k} seats; k must be 2..{MAX_REPLICAS}"
        )
    return Policy(replicas=k)


def parse_verification(value: object) -> int:
    """The seat count a verification choice asks for (0 for integrity or spot:p); see
    :func:`parse_policy`."""
    return parse_policy(value).replicas


def spot_p(bps: int) -> str:
    """``0.1`` for 1000 basis points: p as the shortest decimal."""
    return format((Decimal(bps) / P_SCALE).normalize(), "f")


def verification_name(replicas: int, spot_bps: int = 0) -> str:
    """``integrity``, ``replicate:k`` or ``spot:p``: the name of a policy (see parse_policy)."""
    if spot_bps:
        return f"spot:{spot_p(spot_bps)}"
    return f"replicate:{replicas}" if replicas else "integrity"


class FieldError(ValueError):
    """A bad input value; ``field`` is its dotted name in the request."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def field_error(exc: ValueError, default: str) -> FieldError:
    """A :class:`FieldError` from a ``"field: message"`` ValueError of the helpers."""
    text = str(exc)
    name, sep, message = text.partition(": ")
    return FieldError(name, message) if sep and " " not in name else FieldError(default, text)


def spec_error(exc: ValidationError, prefix: str = "spec") -> FieldError:
    """The first error of a :class:`JobSpec` validation, named ``spec.<location>``."""
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "__root__")
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    if not loc or loc == "resources":  # a model-level check: name the field its message names
        for hint, name in _MODEL_ERRORS:
            if hint in message:
                loc = name
                break
    name = f"{prefix}.{loc}" if loc else prefix
    return FieldError(name, message)


_MODEL_ERRORS = (
    ("docker job needs image", "image"),
    ("wasm job needs module_cid", "module_cid"),
    ("cannot ask for GPUs", "resources.gpu_count"),
    ("need gpu_count", "resources.gpu_count"),
    ("spot checks need", "deterministic"),
)
"""Messages of :class:`JobSpec`'s cross-field checks and the field each is about."""


class PermitIn(BaseModel):
    """The submitter's EIP-2612 permit for the escrow (signed over the typed data a prepare
    answered with, ``permit.typed_data``): ``value`` of the token, valid until ``deadline``;
    ``signature`` is 65 bytes as 0x hex (r, s, v), as ``eth_signTypedData_v4`` returns it."""

    model_config = ConfigDict(extra="forbid")

    value: int | str
    deadline: int = Field(ge=0, le=2**64)
    signature: str = Field(max_length=200)

    def parts(self) -> tuple[int, int, bytes, bytes]:
        """``(value, v, r, s)``; :class:`FieldError` naming ``permit`` for a malformed one."""
        try:
            value = int(str(self.value).strip())
        except ValueError:
            raise FieldError("permit.value", f"{self.value!r} is not a whole number") from None
        text = self.signature.strip().lower()
        if not text.startswith("0x"):
            raise FieldError("permit.signature", "must be 0x and 130 hex digits (r, s, v)")
        try:
            raw = bytes.fromhex(text[2:])
        except ValueError:
            raise FieldError("permit.signature", "is not hex") from None
        if len(raw) != 65:
            raise FieldError("permit.signature", f"is {len(raw)} bytes, not 65 (r, s, v)")
        if not 0 <= value <= 2**256 - 1:
            raise FieldError("permit.value", "is out of range")
        v = raw[64] if raw[64] >= 27 else raw[64] + 27
        return value, v, raw[:32], raw[32:64]


class PrepareJobRequest(BaseModel):
    """``POST /api/jobs/prepare``: a job to fund from ``from``'s wallet.

    Exactly one of ``bounty_wei`` and ``bounty_eth``; at most one of ``deadline`` (Unix seconds)
    and ``ttl_s`` (seconds from now; default: one day). ``salt`` (0x + 64 hex) is random when
    left out.

    ``currency`` is what the job is paid in: ``ETH`` (default) or a listed token (its symbol or
    address). ``bounty`` and ``collateral`` are decimal amounts in it (``5``, ``0.25``);
    ``bounty_wei`` and ``collateral_wei`` its smallest units; ``bounty_eth`` and
    ``collateral_eth`` are for ETH only. A token job is funded with ``createJobWith`` after the
    submitter's ``permit`` (``multicall``) or an approval.

    The terms (docs/trust.md): ``mediator`` (default: the deployment's listed mediator, or the
    submitter itself when none is listed), the provider's collateral (at most one of
    ``collateral_wei`` and ``collateral_eth``; default and minimum ``minCollateral(bounty)``)
    and ``payment``: ``after_window`` (default: paid when the submitter accepts, or when nobody
    disputed within the challenge window) or ``on_verify`` (``FLAG_ON_VERIFY``: the scheduler
    may pay at once on its own check).
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    sender: str = Field(alias="from")
    spec: dict[str, Any]
    bounty_wei: int | str | None = None
    bounty_eth: str | float | None = None
    bounty: str | None = Field(None, max_length=80)
    currency: str | None = Field(None, max_length=64)
    permit: PermitIn | None = None
    deadline: int | None = None
    ttl_s: int | None = None
    salt: str | None = None
    mediator: str | None = None
    collateral_wei: int | str | None = None
    collateral_eth: str | float | None = None
    collateral: str | None = Field(None, max_length=80)
    payment: Literal["after_window", "on_verify"] = "after_window"
    verification: str = Field("integrity", max_length=32)
    """``integrity`` (one provider; the scheduler checks the output exists and hashes to its
    CID), ``replicate:k`` (k = 2..5 seats run by distinct providers, each funded with
    ``bounty / k`` and backed by ``collateral`` of its own; ``resolve`` pays the agreeing
    majority and slashes the others) or ``spot:p`` (one provider; each attempt is re-run by
    the mediator with probability p, drawn from a seed committed in the spec and sealed to the
    mediator: ``FLAG_SPOT``, funded with twice the bounty, the second half the check deposit;
    the collateral at least ``spot.min_collateral``). Replicated and spot jobs are paid after
    the window only. A spec that carries ``spot`` already (the CLI draws its own seed) is
    taken as is; otherwise the server draws the seed, seals it, and forgets it."""
    mediator_pubkey: str | None = Field(None, max_length=200)
    """A spot job's mediator's secp256k1 public key (0x hex, compressed or not), checked
    against the mediator's address; default: the deployment's ``mediator_pubkey`` for its
    listed mediator. Used only when the server seals the seed."""
    operator: str | None = None
    """The operator the submitter was shown and approved (``createJob``'s
    ``expectedOperator``): the funding reverts (``JobEscrowOperatorChanged``) if another one is
    in office when it is mined. Default: the one in office now, as the answer's
    ``terms.operator`` says; a page or CLI that showed the terms first sends it back here."""
    dry_run: bool = False
    """Check everything (the transaction's dry run included) but add nothing to IPFS."""


class CheckedJob(BaseModel):
    """A :class:`PrepareJobRequest` that passed every check."""

    sender: str
    spec: JobSpec
    bounty_wei: int
    deadline: int
    salt: bytes
    mediator: str
    collateral_wei: int
    flags: int
    collateral_field: str = "collateral_eth"
    """The request field the collateral came from (or would have: it was left out)."""
    replicas: int = 0
    """Seats of a replicated job (2..5); 0 for a single job (``integrity``)."""
    spot_bps: int = 0
    """A spot job's check probability in basis points (``spec.spot.p_bps``); 0 otherwise."""
    bounty_field: str = "bounty_eth"
    token: str = ZERO_ADDRESS
    """What the job is paid in (zero: ETH); every amount here is in its smallest units."""
    operator: str = ZERO_ADDRESS
    """The operator the submitter approved (``expectedOperator``); zero: the one in office."""

    @property
    def payment(self) -> str:
        return "on_verify" if self.flags & FLAG_ON_VERIFY else "after_window"

    @property
    def share_wei(self) -> int:
        """What each seat is funded with (the whole bounty for a single job)."""
        return self.bounty_wei // self.replicas if self.replicas else self.bounty_wei

    @property
    def verification(self) -> str:
        return verification_name(self.replicas, self.spot_bps)

    @property
    def funding_wei(self) -> int:
        """What the funding transaction sends: the bounty, and a spot job's check deposit."""
        return 2 * self.bounty_wei if self.spot_bps else self.bounty_wei


def min_collateral(bounty: int, params: dict[str, Any]) -> int:
    """``JobEscrow.minCollateral(bounty)`` from the deployment's ``min_collateral_bps``."""
    return bounty * int(params.get("min_collateral_bps", 10_000)) // 10_000


def default_mediator(params: dict[str, Any], sender: str) -> str:
    """The mediator a job gets unless its submitter names one (``EscrowClient.default_terms``):
    the one listed at deployment, or the submitter itself when none was."""
    listed = params.get("mediator")
    if listed and str(listed).lower() != ZERO_ADDRESS:
        return parse_address(str(listed), "mediator")
    return sender


def parse_amount(
    currency: Currency,
    name: str,
    decimal: Any,
    units: Any,
    eth: Any,
) -> tuple[int | None, str]:
    """An amount given as ``<name>`` (decimal in ``currency``), ``<name>_wei`` (its smallest
    units) or ``<name>_eth`` (ETH only): ``(units or None when none was given, the field)``.
    :class:`FieldError` naming the field for two at once or a bad value."""
    given = [
        (f, v)
        for f, v in ((name, decimal), (f"{name}_wei", units), (f"{name}_eth", eth))
        if v is not None and str(v).strip() != ""
    ]
    if len(given) > 1:
        raise FieldError(given[1][0], f"give the {name} once: {name}, {name}_eth or {name}_wei")
    if not given:
        return None, f"{name}_eth" if currency.is_eth else name
    field, value = given[0]
    if field.endswith("_wei"):
        smallest = "wei" if currency.is_eth else f"units of {currency.symbol}"
        try:
            return parse_whole(value, field=field, smallest=smallest), field
        except AmountError as exc:
            raise FieldError(field, exc.message) from None
    if field.endswith("_eth") or currency.is_eth:
        if not currency.is_eth:
            raise FieldError(
                field,
                f"the job is paid in {currency.symbol}: give {name} (in {currency.symbol}) or "
                f"{name}_wei (its smallest units)",
            )
        try:
            return parse_eth(str(value), field), field
        except AmountError as exc:
            raise FieldError(field, exc.message) from None
    try:
        return currency.token.to_units(str(value)), field
    except ValueError as exc:
        raise FieldError(field, str(exc)) from None


def check_job(
    req: PrepareJobRequest,
    *,
    chain_now: int,
    params: dict[str, Any],
    currency: Currency = ETH_CURRENCY,
    min_bounty: int | None = None,
) -> CheckedJob:
    """Every check that can be made before touching IPFS or the chain; :class:`FieldError`.

    ``params`` are the escrow's deployment parameters (``min_bounty``, ``min_duration``,
    ``max_duration``); ``chain_now`` the chain's current time. ``currency`` is the job's
    (resolved from ``req.currency`` by the caller) and ``min_bounty`` the escrow's least bounty
    in it (``tokenMinBounty``; ETH's is ``params["min_bounty"]``).
    """
    try:
        sender = parse_address(req.sender, "from")
    except ValueError as exc:
        raise field_error(exc, "from") from None
    try:
        spec = JobSpec.model_validate(req.spec)
    except ValidationError as exc:
        raise spec_error(exc) from None
    if len(spec.to_bytes()) > MAX_SPEC_BYTES:
        raise FieldError("spec", f"the job spec is larger than {MAX_SPEC_BYTES} bytes")

    given, bounty_field = parse_amount(
        currency, "bounty", req.bounty, req.bounty_wei, req.bounty_eth
    )
    if given is None:
        raise FieldError(bounty_field, "give the bounty once: bounty, bounty_eth or bounty_wei")
    bounty = given
    unit = "wei" if currency.is_eth else f"units of {currency.symbol}"
    try:
        policy = parse_policy(req.verification)
    except ValueError as exc:
        raise field_error(exc, "verification") from None
    replicas = policy.replicas
    check_spot_policy(req, spec, policy)
    if min_bounty is None:
        min_bounty = int(params.get("min_bounty", 0))
    if bounty < max(1, min_bounty):
        raise FieldError(
            bounty_field,
            f"the bounty must be at least {min_bounty} {unit} (the escrow's minimum"
            + ("" if currency.is_eth else f": {currency.fmt(min_bounty)}")
            + ")",
        )
    if bounty > MAX_WEI:
        raise FieldError(bounty_field, f"the bounty must be at most {MAX_WEI} {unit} (uint96)")
    share = bounty
    if replicas:
        if req.payment == "on_verify":
            raise FieldError(
                "payment",
                f"replicate:{replicas} is paid only when the seats' results agree (resolve): "
                "choose after_window, or integrity verification for on_verify",
            )
        if bounty % replicas:
            raise FieldError(
                bounty_field,
                f"the bounty ({bounty} {unit}) must divide by {replicas} (replicate:{replicas}: "
                f"each seat gets an equal share); e.g. {bounty - bounty % replicas} {unit}",
            )
        share = bounty // replicas
        image = spec.image or ""
        if spec.executor.value == "docker" and "@sha256:" not in image:
            raise FieldError(
                "spec.image",
                f"replicate:{replicas} compares the seats' outputs: a Docker image must be "
                f"pinned by digest (name@sha256:<hex>), not {image!r}",
            )
        if not spec.comparable:
            raise FieldError(
                "spec.deterministic",
                f"replicate:{replicas} compares the seats' outputs by CID: declare the Docker "
                "job deterministic: true (its output depends only on its inputs; the agent runs "
                "it with a fixed environment), or choose integrity verification",
            )
        if share < max(1, min_bounty):
            raise FieldError(
                bounty_field,
                f"each of the {replicas} seats gets {share} {unit}, less than the escrow's "
                f"minimum bounty ({min_bounty} {unit}): fund at least {min_bounty * replicas} "
                f"{unit}",
            )

    if req.deadline is not None and req.ttl_s is not None:
        raise FieldError("deadline", "give deadline or ttl_s, not both")
    deadline_field = "deadline" if req.deadline is not None else "ttl_s"
    if req.deadline is not None:
        deadline = int(req.deadline)
    else:
        deadline = chain_now + int(req.ttl_s if req.ttl_s is not None else 86400)
    earliest = chain_now + int(params.get("min_duration", 0)) + DEADLINE_MARGIN_S
    latest = min(chain_now + int(params.get("max_duration", MAX_TIMESTAMP)), MAX_TIMESTAMP)
    if deadline < earliest:
        raise FieldError(
            deadline_field,
            f"the deadline must be at least {earliest - chain_now} s from now "
            "(the escrow's minimum duration plus a minute)",
        )
    if deadline > latest:
        raise FieldError(
            deadline_field, f"the deadline must be at most {latest - chain_now} s from now"
        )
    if deadline - chain_now < spec.limits.timeout_s:
        raise FieldError(
            deadline_field,
            f"the job may run {spec.limits.timeout_s} s (spec.limits.timeout_s): the deadline "
            "must leave at least that long",
        )

    if req.salt is None:
        salt = os.urandom(32)
    else:
        try:
            salt = parse_bytes32(req.salt, "salt")
        except ValueError as exc:
            raise field_error(exc, "salt") from None
    operator = ZERO_ADDRESS
    if req.operator is not None:
        try:
            operator = parse_address(req.operator, "operator")
        except ValueError as exc:
            raise field_error(exc, "operator") from None
        if operator == ZERO_ADDRESS:
            raise FieldError("operator", "the zero address cannot be the job's operator")

    mediator, collateral, collateral_field = check_terms(
        req, sender, share, params, replicas, currency, policy.spot_bps
    )
    if policy.spot_bps and spec.spot is None:  # drawn and sealed here, the seed forgotten
        key = spot_public_key(req.mediator_pubkey, mediator, sender, params)
        spec = seal_draw(spec, policy.spot_bps, key, sender)
    return CheckedJob(
        sender=sender,
        spec=spec,
        bounty_wei=bounty,
        deadline=deadline,
        salt=salt,
        mediator=mediator,
        collateral_wei=collateral,
        flags=FLAG_SPOT if policy.spot_bps else FLAG_ON_VERIFY if req.payment == "on_verify" else 0,
        collateral_field=collateral_field,
        replicas=replicas,
        spot_bps=policy.spot_bps,
        bounty_field=bounty_field,
        token=currency.address,
        operator=operator,
    )


def check_spot_policy(req: PrepareJobRequest, spec: JobSpec, policy: Policy) -> None:
    """A spot job is a single, comparable job paid after the window, and a spec's own
    ``spot`` must be the one the verification names (:class:`FieldError` otherwise)."""
    if spec.spot is not None and spec.spot.p_bps != policy.spot_bps:
        raise FieldError(
            "verification",
            f"the spec asks for spot checks at p = {spot_p(spec.spot.p_bps)}, but verification "
            f"is {policy.name}: say verification spot:{spot_p(spec.spot.p_bps)}",
        )
    if not policy.spot_bps:
        return
    if req.payment == "on_verify":
        raise FieldError(
            "payment",
            f"{policy.name} is paid after the challenge window (a check may still be open): "
            "choose after_window, or integrity verification for on_verify",
        )
    if not spec.comparable:
        raise FieldError(
            "spec.deterministic",
            f"{policy.name}: spot checks need a job whose honest runs agree: a wasm job, or a "
            "docker job that declares deterministic: true (image pinned by digest)",
        )


def spot_public_key(given: str | None, mediator: str, sender: str, params: dict[str, Any]) -> bytes:
    """The public key to seal a spot job's seed to: ``given`` (``mediator_pubkey``), else the
    deployment's ``mediator_pubkey`` when ``mediator`` is its listed mediator; always checked
    against ``mediator``'s address. :class:`FieldError` when none is known or it is not the
    mediator's key."""
    text = (given or "").strip()
    field = "mediator_pubkey"
    if not text:
        listed = str(params.get("mediator") or "")
        if listed.lower() == mediator.lower() and params.get("mediator_pubkey"):
            text, field = str(params["mediator_pubkey"]).strip(), "mediator"
    if not text:
        who = "yourself" if mediator.lower() == sender.lower() else mediator
        raise FieldError(
            "mediator",
            f"a spot job's seed is sealed to its mediator's public key, and none is known for "
            f"{who}: give mediator_pubkey (0x hex), or choose the listed mediator",
        )
    try:
        raw = bytes.fromhex(text.removeprefix("0x").removeprefix("0X"))
        return spot.check_public_key(raw, mediator)
    except (ValueError, spot.SpotError) as exc:
        raise FieldError(field, f"not the mediator's public key: {exc}") from None


def seal_draw(spec: JobSpec, p_bps: int, public_key: bytes, submitter: str) -> JobSpec:
    """``spec`` with a fresh spot draw (``spec.spot``: commitment and sealed seed); the seed
    itself is not kept anywhere."""
    from gridmarket.wire import SpotCheck

    seed = spot.new_seed()
    check = SpotCheck(
        p_bps=p_bps,
        commit="0x" + spot.commit_of(seed, submitter).hex(),
        sealed="0x" + spot.seal(seed, public_key, submitter).hex(),
    )
    return spec.model_copy(update={"spot": check})


def least_collateral(bounty: int, params: dict[str, Any], spot_bps: int = 0) -> int:
    """The least collateral for a job (one seat's share for a replicated one): the escrow's
    ``minCollateral``, and for a spot job :func:`gridmarket.spot.min_collateral` if more."""
    least = min_collateral(bounty, params)
    return max(least, spot.min_collateral(bounty, spot_bps)) if spot_bps else least


def check_terms(
    req: PrepareJobRequest,
    sender: str,
    bounty: int,
    params: dict[str, Any],
    replicas: int = 0,
    currency: Currency = ETH_CURRENCY,
    spot_bps: int = 0,
) -> tuple[str, int, str]:
    """The mediator, collateral (wei) and the collateral's field name, checked against what
    the deployment allows (``bounty``: one seat's share for a replicated job, whose collateral
    is each seat's; a spot job's at least :func:`gridmarket.spot.min_collateral`). Whether the
    mediator is listed on-chain is the caller's check."""
    if req.mediator is None or str(req.mediator).strip() == "":
        mediator = default_mediator(params, sender)
    else:
        try:
            mediator = parse_address(str(req.mediator), "mediator")
        except ValueError as exc:
            raise field_error(exc, "mediator") from None
        if mediator.lower() == ZERO_ADDRESS:
            raise FieldError("mediator", "the zero address cannot rule on a result")
    operator = params.get("operator")
    if operator and mediator.lower() == str(operator).lower():
        raise FieldError(
            "mediator", f"{mediator} is the operator (the scheduler): it cannot also rule"
        )
    least = least_collateral(bounty, params, spot_bps)
    unit = "wei" if currency.is_eth else f"units of {currency.symbol}"
    given, field = parse_amount(
        currency, "collateral", req.collateral, req.collateral_wei, req.collateral_eth
    )
    collateral = least if given is None else given
    if collateral < least and spot_bps and least > min_collateral(bounty, params):
        p = spot_p(spot_bps)
        raise FieldError(
            field,
            f"the collateral must be at least {least} {unit} "
            + ("" if currency.is_eth else f"= {currency.fmt(least)} ")
            + f"(spot:{p}: a provider that skips the work keeps the bounty unless checked, "
            f"with probability {p}; cheating is unprofitable only when the collateral C > "
            f"bounty x (1 - p) / p)",
        )
    if collateral < least:
        raise FieldError(
            field,
            f"the collateral must be at least {least} {unit} "
            + ("" if currency.is_eth else f"= {currency.fmt(least)} ")
            + f"(minCollateral: {int(params.get('min_collateral_bps', 10_000)) / 100:g}% of "
            + ("each seat's share of the bounty)" if replicas else "the bounty)"),
        )
    if collateral > MAX_WEI:
        raise FieldError(field, f"the collateral must be at most {MAX_WEI} {unit} (uint96)")
    return mediator, collateral, field


def check_quote(req: QuoteRequest) -> None:
    """Names the bad field (:class:`FieldError`) before the scheduler is asked."""
    problem = req.problem()
    if problem is not None:
        raise FieldError(*problem)


def quote_fits(req: QuoteRequest, node: dict[str, Any]) -> bool:
    """Whether ``node`` (a scheduler ``/v1/nodes`` entry) is online and offers these
    resources: an indication for the submitter; the scheduler's matching decides."""
    cap = node.get("capacity") or {}
    if node.get("status") != "online" or node.get("excluded"):
        return False
    if req.executor.value not in (cap.get("executors") or []):
        return False
    if req.region and node.get("region") != req.region:
        return False
    if int(cap.get("cpu_cores", 0)) < req.cpu_cores:
        return False
    if int(cap.get("ram_mib", 0)) < req.ram_mib or int(cap.get("disk_mib", 0)) < req.disk_mib:
        return False
    if req.gpu_count:
        gpu = cap.get("gpu") or {}
        if int(gpu.get("count", 0)) < req.gpu_count:
            return False
        if int(gpu.get("vram_mib", 0)) < req.min_vram_mib:
            return False
        if req.gpu_models and node.get("tier") not in req.gpu_models:
            return False
        for need, reported in (
            (req.min_cuda, gpu.get("cuda_version")),
            (req.min_compute_capability, gpu.get("compute_capability")),
        ):
            if need is not None and not _at_least(reported, need):
                return False
    return True


def _at_least(reported: object, need: str) -> bool:
    """Whether a node's reported ``"major.minor"`` is at least ``need`` (unknown: no)."""
    try:
        return isinstance(reported, str) and parse_version(reported, major_max=99) >= parse_version(
            need, major_max=99
        )
    except ValueError:
        return False


class AddressRequest(BaseModel):
    """A transaction from ``from`` that takes no other input (withdraw, cancel, refund...)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    sender: str = Field(alias="from")


class JobActionRequest(AddressRequest):
    """A job's action from ``from``; a dispute of a token job may carry the submitter's
    ``permit`` for the deposit (the job's bounty in its token)."""

    permit: PermitIn | None = None


class ProviderSignup(BaseModel):
    """``POST /api/providers/prepare``: register ``from`` as a provider and stake.

    ``name``, ``region`` and ``contact`` go into a small metadata document on IPFS whose CID the
    registry records.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    sender: str = Field(alias="from")
    stake_eth: str | float = "0"
    name: str = Field("", max_length=64)
    region: str | None = Field(None, max_length=32)
    contact: str = Field("", max_length=200)


class RelayRequest(BaseModel):
    """``POST /api/tx/relay``: a signed raw transaction to the escrow."""

    model_config = ConfigDict(extra="forbid")

    raw_tx: str = Field(max_length=300_000)
    wait_s: float = Field(0, ge=0, le=120)
