"""The submitter's job file (YAML or JSON): a :class:`gridmarket.wire.JobSpec` plus how to fund it.

A job file holds the spec's fields (``name``, ``executor``, ``image`` or ``module_cid``,
``command``, ``env``, ``dataset_cid``, ``resources``, ``limits``, ``max_attempts``) and these
submission fields, which are not part of the spec:

``dataset``
    a local file or folder, uploaded to IPFS as the job's ``/input`` (instead of ``dataset_cid``);
``module``
    a local ``.wasm`` (or ``.wat``, compiled here) WASI module (instead of ``module_cid``);
``currency``
    what the job is paid in: ``ETH`` (default) or a token the escrow lists (``tUSD``);
``bounty``
    in the currency, e.g. ``0.01`` (ETH) or ``5`` (tUSD) (or ``bounty_wei``, an integer of its
    smallest units);
``deadline``
    ``90m``, ``2h``, ``1d``, ``3600s``; a bare number under 10^9 is seconds from now, above it a
    Unix time; or an ISO 8601 date (``2026-12-01T12:00:00Z``);
``mediator``
    who rules if the result is disputed: a listed mediator or the submitter's own address
    (default: the deployment's listed mediator);
``collateral``
    what the provider locks while it holds the job, in the currency (default and minimum:
    ``minCollateral``);
``payment``
    ``after-window`` (default: paid when accepted, or when nobody disputed within the challenge
    window) or ``on-verify`` (paid at once on the scheduler's check: you trust the scheduler);
``verification``
    ``integrity`` (default: one provider), ``replicate:k`` (k = 2..5 distinct providers, each
    paid ``bounty / k`` when their outputs agree in a majority; ``collateral`` is each seat's)
    or ``spot:p`` (one provider, each attempt re-run by the mediator with probability p, e.g.
    ``spot:0.1``; a WASM job or a deterministic Docker job; see docs/submitter.md).

Relative paths are relative to the job file. See docs/submitter.md and examples/.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gridmarket.wire import JobSpec

from .forms import parse_policy, spec_error

VERSION_FIELDS = ("min_cuda", "min_compute_capability")
"""``resources`` fields written ``"major.minor"``: quoted, or YAML would read a number."""

SUBMISSION_FIELDS = (
    "dataset",
    "module",
    "bounty",
    "bounty_wei",
    "currency",
    "deadline",
    "mediator",
    "collateral",
    "payment",
    "verification",
)
PAYMENTS = ("after-window", "on-verify")
PLACEHOLDER_CID = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
"""The CID of zero bytes: stands in for a file still to upload when the spec is checked."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?\s*$")
_UNITS = {"s": 1, None: 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


class JobFileError(ValueError):
    """The job file is missing, unreadable, or a field in it is wrong (the message names it)."""


@dataclass(frozen=True)
class JobFile:
    """A parsed job file: the spec's fields, local files to upload, and the funding terms."""

    path: Path
    spec: dict[str, Any]
    dataset: Path | None
    module: Path | None
    bounty_eth: str | None
    bounty_wei: str | None
    deadline: int | None
    ttl_s: int | None
    mediator: str | None = None
    collateral_eth: str | None = None
    payment: str | None = None
    """``after-window`` or ``on-verify``; None: the default (after the window)."""
    verification: str | None = None
    """``integrity``, ``replicate:k`` or ``spot:p``; None: the default (integrity)."""
    currency: str | None = None
    """``ETH`` or a listed token's symbol (or address); None: ETH. ``bounty_eth`` and
    ``collateral_eth`` are then amounts in it."""

    def spec_with(
        self, *, dataset_cid: str | None = None, module_cid: str | None = None
    ) -> dict[str, Any]:
        """The spec with the uploaded files' CIDs filled in."""
        spec = dict(self.spec)
        if dataset_cid is not None:
            spec["dataset_cid"] = dataset_cid
        if module_cid is not None:
            spec["module_cid"] = module_cid
        return spec


def parse_deadline(value: Any) -> tuple[int | None, int | None]:
    """``(deadline, ttl_s)``: one of them set, from a job file's ``deadline`` value."""
    if isinstance(value, bool):
        raise JobFileError(f"deadline: {value!r} is not a time")
    if isinstance(value, datetime):
        return int(value.timestamp()), None
    if isinstance(value, int | float):
        return (int(value), None) if value >= 1_000_000_000 else (None, int(value))
    text = str(value).strip()
    match = _DURATION.match(text)
    if match:
        number, unit = float(match.group(1)), match.group(2)
        seconds = number * _UNITS[unit]
        if unit is None and seconds >= 1_000_000_000:
            return int(seconds), None
        return None, int(seconds)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise JobFileError(
            f"deadline: {text!r} is neither a duration (90m, 2h, 1d) nor a date"
        ) from None
    if when.tzinfo is None:
        raise JobFileError(f"deadline: {text!r} needs a time zone (e.g. Z for UTC)")
    return int(when.timestamp()), None


def load_job_file(path: Path) -> JobFile:
    """Read and check a job file; :class:`JobFileError` naming the file and the field."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JobFileError(f"{path}: no such file") from None
    except OSError as exc:
        raise JobFileError(f"{path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise JobFileError(
            f"{path}: not valid {path.suffix.lstrip('.') or 'YAML'}: {exc}"
        ) from None
    if not isinstance(data, dict):
        raise JobFileError(f"{path}: must be a mapping of fields (name, executor, ...)")
    base = path.parent
    spec = {k: v for k, v in data.items() if k not in SUBMISSION_FIELDS}

    def local(name: str) -> Path | None:
        raw = data.get(name)
        if raw is None:
            return None
        found = (base / str(raw)).expanduser()
        if not found.exists():
            raise JobFileError(f"{path}: {name}: {found} does not exist")
        return found

    dataset, module = local("dataset"), local("module")
    if dataset is not None and spec.get("dataset_cid"):
        raise JobFileError(f"{path}: dataset: give dataset or dataset_cid, not both")
    if module is not None and spec.get("module_cid"):
        raise JobFileError(f"{path}: module: give module or module_cid, not both")
    if module is not None and not module.is_file():
        raise JobFileError(f"{path}: module: {module} is not a file")
    bounty, bounty_wei = data.get("bounty"), data.get("bounty_wei")
    if bounty is not None and bounty_wei is not None:
        raise JobFileError(f"{path}: bounty: give bounty (ETH) or bounty_wei, not both")
    deadline, ttl_s = (None, None)
    if data.get("deadline") is not None:
        try:
            deadline, ttl_s = parse_deadline(data["deadline"])
        except JobFileError as exc:
            raise JobFileError(f"{path}: {exc}") from None

    payment = data.get("payment")
    if payment is not None:
        payment = str(payment).strip().lower().replace("_", "-")
        if payment not in PAYMENTS:
            raise JobFileError(f"{path}: payment: {data['payment']!r} is not one of {PAYMENTS}")
    mediator = data.get("mediator")
    if isinstance(mediator, int) and not isinstance(mediator, bool) and 0 <= mediator < 2**160:
        mediator = f"0x{mediator:040x}"  # YAML reads an unquoted 0x address as a number
    if mediator is not None and not isinstance(mediator, str):
        raise JobFileError(f"{path}: mediator: {mediator!r} is not a 0x address")
    collateral = data.get("collateral")
    currency = data.get("currency")
    if currency is not None and (not isinstance(currency, str) or not currency.strip()):
        raise JobFileError(f"{path}: currency: {currency!r} is not a currency name (ETH, tUSD)")
    verification = data.get("verification")
    if verification is not None:
        try:
            verification = parse_policy(verification).name
        except ValueError as exc:
            raise JobFileError(f"{path}: {exc}") from None
    resources = spec.get("resources")
    for key in VERSION_FIELDS:
        value = resources.get(key) if isinstance(resources, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise JobFileError(
                f'{path}: resources.{key}: write the version quoted, as "major.minor" '
                f"(YAML reads an unquoted {value} as a number, and 12.10 as 12.1)"
            )
    if "spot" in spec:
        raise JobFileError(
            f"{path}: spot: the seed is drawn at submission, not written in the file: "
            "say verification: spot:0.1 (the check probability)"
        )

    # The spec is checked here, with placeholders for what is still to upload, so that a typo
    # is reported before anything is uploaded or signed.
    probe = dict(spec)
    if dataset is not None:
        probe["dataset_cid"] = PLACEHOLDER_CID
    if module is not None:
        probe["module_cid"] = PLACEHOLDER_CID
    try:
        JobSpec.model_validate(probe)
    except ValidationError as exc:
        err = spec_error(exc, prefix="")
        raise JobFileError(f"{path}: {err.field.lstrip('.') or 'spec'}: {err.message}") from None
    return JobFile(
        path=path,
        spec=spec,
        dataset=dataset,
        module=module,
        bounty_eth=None if bounty is None else str(bounty),
        bounty_wei=None if bounty_wei is None else str(bounty_wei),
        deadline=deadline,
        ttl_s=ttl_s,
        mediator=mediator,
        collateral_eth=None if collateral is None else str(collateral),
        payment=payment,
        verification=verification,
        currency=None if currency is None else currency.strip(),
    )
