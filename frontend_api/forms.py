"""What pages and the CLI send, checked field by field before anything is created.

A bad value raises :class:`FieldError` naming the field (``spec.resources.ram_mib``,
``bounty_eth``...). The API answers it with 400 and ``{"detail", "field"}``; the submit page puts
the message next to that field.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gridmarket.escrow import FLAG_ON_VERIFY, MAX_REPLICAS, MAX_TIMESTAMP, MAX_WEI, ZERO_ADDRESS
from gridmarket.wire import MAX_SPEC_BYTES, JobSpec, QuoteRequest

from .currency import ETH_CURRENCY, Currency
from .format import parse_eth
from .values import parse_address, parse_bytes32

DEADLINE_MARGIN_S = 60
"""A deadline must leave this much more than the escrow's minimum duration: the transaction
is mined some time after it was built."""

_REPLICATE = re.compile(r"^replicate\s*[:=]\s*(\d+)$")


def parse_verification(value: object) -> int:
    """The seat count a verification choice asks for: 0 for ``integrity`` (one provider),
    k for ``replicate:k`` (k = 2..MAX_REPLICAS distinct providers). ValueError naming the
    ``verification`` field otherwise."""
    text = str(value if value is not None else "integrity").strip().lower()
    if text in ("", "integrity"):
        return 0
    match = _REPLICATE.match(text)
    if match is None:
        raise ValueError(
            f"verification: {value!r} is not integrity or replicate:k (k = 2..{MAX_REPLICAS})"
        )
    k = int(match.group(1))
    if not 2 <= k <= MAX_REPLICAS:
        raise ValueError(
            f"verification: replicate:{k} asks for {k} seats; k must be 2..{MAX_REPLICAS}"
        )
    return k


def verification_name(replicas: int) -> str:
    """``integrity`` or ``replicate:k``: the name of a seat count (see parse_verification)."""
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
    CID) or ``replicate:k`` (k = 2..5 seats run by distinct providers, each funded with
    ``bounty / k`` and backed by ``collateral`` of its own; ``resolve`` pays the agreeing
    majority and slashes the others). Replicated jobs are paid after the window only."""
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
    bounty_field: str = "bounty_eth"
    token: str = ZERO_ADDRESS
    """What the job is paid in (zero: ETH); every amount here is in its smallest units."""

    @property
    def payment(self) -> str:
        return "on_verify" if self.flags & FLAG_ON_VERIFY else "after_window"

    @property
    def share_wei(self) -> int:
        """What each seat is funded with (the whole bounty for a single job)."""
        return self.bounty_wei // self.replicas if self.replicas else self.bounty_wei

    @property
    def verification(self) -> str:
        return verification_name(self.replicas)


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
        try:
            return int(str(value).strip()), field
        except ValueError:
            raise FieldError(field, f"{value!r} is not a whole number") from None
    if field.endswith("_eth") or currency.is_eth:
        if not currency.is_eth:
            raise FieldError(
                field,
                f"the job is paid in {currency.symbol}: give {name} (in {currency.symbol}) or "
                f"{name}_wei (its smallest units)",
            )
        try:
            return parse_eth(str(value), field), field
        except ValueError as exc:
            raise field_error(exc, field) from None
    try:
        return currency.token.to_units(str(value).strip()), field
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
        replicas = parse_verification(req.verification)
    except ValueError as exc:
        raise field_error(exc, "verification") from None
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

    mediator, collateral, collateral_field = check_terms(
        req, sender, share, params, replicas, currency
    )
    return CheckedJob(
        sender=sender,
        spec=spec,
        bounty_wei=bounty,
        deadline=deadline,
        salt=salt,
        mediator=mediator,
        collateral_wei=collateral,
        flags=FLAG_ON_VERIFY if req.payment == "on_verify" else 0,
        collateral_field=collateral_field,
        replicas=replicas,
        bounty_field=bounty_field,
        token=currency.address,
    )


def check_terms(
    req: PrepareJobRequest,
    sender: str,
    bounty: int,
    params: dict[str, Any],
    replicas: int = 0,
    currency: Currency = ETH_CURRENCY,
) -> tuple[str, int, str]:
    """The mediator, collateral (wei) and the collateral's field name, checked against what
    the deployment allows (``bounty``: one seat's share for a replicated job, whose collateral
    is each seat's). Whether the mediator is listed on-chain is the caller's check."""
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
    least = min_collateral(bounty, params)
    unit = "wei" if currency.is_eth else f"units of {currency.symbol}"
    given, field = parse_amount(
        currency, "collateral", req.collateral, req.collateral_wei, req.collateral_eth
    )
    collateral = least if given is None else given
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
    return True


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
