"""Spot-checked jobs as the front end shows them (``spot:p``; :mod:`gridmarket.spot`).

- :func:`spot_price`: what a spot job costs, before it is funded: the bounty, the check deposit
  beside it (returned unless a check upholds the result, when it pays the re-run), the
  collateral asked of the provider and why (``C > B (1 - p) / p`` makes skipping the work
  unprofitable in expectation), and the expected compute ``1 + p`` runs.
- :func:`spot_view`: a spot job's page: p and the commitment from its spec, each attempt's check
  state from the chain's events (a ``ResultDisputed`` not sent by the submitter is the
  mediator's check), and once the job is settled the revealed seed, verified here against the
  commitment, with the attempts it draws (recomputed here, not taken from the scheduler).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from gridmarket import spot
from gridmarket.wire import SpotCheck

from .forms import least_collateral, min_collateral, spot_p
from .records import ChainEvent

MAX_SHOWN_ATTEMPTS = 64
"""Attempts a page lists one by one (the spec allows 10; a hostile chain may say more)."""


def spot_price(
    bounty: int,
    collateral: int,
    p_bps: int,
    params: dict[str, Any],
    money: Callable[[int], str],
) -> dict[str, Any]:
    """The price of a spot job of ``bounty`` with ``collateral``, each amount also as text."""
    p = spot_p(p_bps)
    least = least_collateral(bounty, params, p_bps)
    profit = spot.cheater_profit(bounty, collateral, p_bps)
    expected = bounty + bounty * p_bps // spot.P_SCALE
    return {
        "p": p,
        "p_bps": p_bps,
        "bounty_wei": str(bounty),
        "check_deposit_wei": str(bounty),
        "funding_wei": str(2 * bounty),
        "collateral_wei": str(collateral),
        "min_collateral_wei": str(least),
        "escrow_min_collateral_wei": str(min_collateral(bounty, params)),
        "spot_min_collateral_wei": str(spot.min_collateral(bounty, p_bps)),
        "expected_runs": f"1 + {p}",
        "expected_cost_wei": str(expected),
        "cheater_profit_wei": str(math.floor(profit)),
        "lines": [
            f"you send {money(2 * bounty)}: the bounty {money(bounty)} and a check deposit of "
            f"{money(bounty)}, returned to you unless a check upholds the result (it then pays "
            "the mediator's re-run)",
            f"each attempt is re-run by a second provider with probability {p}, drawn from a "
            "seed committed in the spec and sealed to the mediator: expected compute "
            f"1 + {p} runs, expected cost {money(expected)} when the provider is honest",
            f"the provider locks {money(collateral)} of collateral (at least {money(least)}): "
            f"cheating is unprofitable when C > B (1 - p) / p = {money(bounty)} x "
            f"{spot_ratio(p_bps)}; "
            + (
                "a provider that skips the work expects to lose on it"
                if profit < 0
                else f"a provider that skips the work expects {money(int(profit))} per job: "
                "raise the collateral"
            ),
        ],
    }


def spot_ratio(p_bps: int) -> str:
    """``(1 - p) / p`` as a short decimal (``9`` at p = 0.1)."""
    ratio = (spot.P_SCALE - p_bps) / p_bps
    return f"{ratio:.4g}"


def parse_spot(spec: dict[str, Any] | None) -> tuple[SpotCheck | None, str | None]:
    """The spec's ``spot`` (None when it has none) and, for a malformed one, why."""
    raw = (spec or {}).get("spot")
    if raw is None:
        return None, None
    try:
        return SpotCheck.model_validate(raw), None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return None, f"spot{'.' + where if where else ''}: {first.get('msg')}"


def attempt_checks(
    events: list[ChainEvent], submitter: str, senders: dict[str, str]
) -> list[dict[str, Any]]:
    """Each attempt of a job (1 for the first assignment) with its result and check state,
    from its events in order: ``running`` (no result yet), ``unchecked`` (a result nobody
    disputed), ``check open`` (the mediator disputed it: a spot check), ``disputed`` (the
    submitter disputed it), then ``upheld`` or ``not upheld`` once ruled. ``senders`` maps a
    ``ResultDisputed``'s transaction to its sender (unknown: ``disputed (sender unknown)``)."""
    rows: dict[int, dict[str, Any]] = {}
    current = 0
    for e in events:
        attempt = e.args.get("attempt")
        if e.name == "JobAssigned" and isinstance(attempt, int):
            current = attempt
            rows.setdefault(
                current,
                {
                    "attempt": current,
                    "provider": str(e.args.get("provider")),
                    "output_cid": None,
                    "state": "running",
                    "checked_by_mediator": False,
                    "dispute_tx": None,
                    "ruling_tx": None,
                },
            )
        elif e.name == "JobUnassigned" and current in rows:
            rows[current]["state"] = "handed back"
        elif e.name == "ResultSubmitted" and current in rows:
            rows[current]["output_cid"] = e.args.get("outputCid")
            rows[current]["state"] = "unchecked"
        elif e.name == "ResultDisputed" and current in rows:
            sender = senders.get(e.tx_hash)
            row = rows[current]
            row["dispute_tx"] = e.tx_hash
            if sender is None:
                row["state"] = "disputed (sender unknown)"
            elif sender.lower() == submitter.lower():
                row["state"] = "disputed by the submitter"
            else:
                row["state"] = "check open"
                row["checked_by_mediator"] = True
        elif e.name == "Ruled" and isinstance(attempt, int) and attempt in rows:
            row = rows[attempt]
            row["ruling_tx"] = e.tx_hash
            upheld = bool(e.args.get("upheld"))
            what = "check" if row["checked_by_mediator"] else "ruling"
            row["state"] = f"{what}: upheld" if upheld else f"{what}: not upheld (slashed)"
    return [rows[a] for a in sorted(rows)][:MAX_SHOWN_ATTEMPTS]


def reveal_view(
    check: SpotCheck, status: dict[str, Any] | None, attempts: int, submitter: str
) -> dict[str, Any] | None:
    """The scheduler's reveal (``wire.SpotStatus``) checked here: the seed must open the spec's
    commitment; the attempts it draws are recomputed (1..``attempts``). None before a reveal."""
    seed_hex = (status or {}).get("seed")
    if not isinstance(seed_hex, str):
        return None
    try:
        seed = bytes.fromhex(seed_hex.removeprefix("0x"))
    except ValueError:
        return {"seed": seed_hex[:80], "verified": False, "checked_attempts": []}
    verified = spot.verify_reveal(seed, check.commit_bytes, submitter)
    shown = min(max(attempts, 0), MAX_SHOWN_ATTEMPTS)
    drawn = (
        [a for a in range(1, shown + 1) if spot.checked(seed, a, check.p_bps)] if verified else []
    )
    return {
        "seed": "0x" + seed.hex(),
        "verified": verified,
        "checked_attempts": drawn,
        "scheduler_checked_attempts": (status or {}).get("checked_attempts"),
    }


def spot_view(
    spec: dict[str, Any] | None,
    flags_spot: bool,
    attempts: int,
    events: list[ChainEvent],
    submitter: str,
    senders: dict[str, str],
    status: dict[str, Any] | None,
    status_error: str | None,
    spec_problem: str | None = None,
) -> dict[str, Any] | None:
    """A spot job's section of its page; None for a job that is not one (neither the on-chain
    flag nor the spec says so). ``spec_problem``: why the spec (None) is invalid
    (:mod:`frontend_api.specdoc`)."""
    check, problem = parse_spot(spec)
    if check is None and not flags_spot and problem is None:
        return None
    rows = attempt_checks(events, submitter, senders)
    reveal = reveal_view(check, status, attempts, submitter) if check is not None else None
    if reveal is not None and reveal["verified"]:
        for row in rows:
            row["drawn"] = row["attempt"] in reveal["checked_attempts"]
    return {
        "p": spot_p(check.p_bps) if check else None,
        "p_bps": check.p_bps if check else None,
        "commit": check.commit if check else None,
        "flagged": flags_spot,
        "problem": problem
        or (
            None
            if check
            else f"{spec_problem}: its commitment cannot be shown"
            if spec is None and spec_problem
            else "the spec could not be read: its commitment cannot be shown"
            if spec is None
            else "flagged FLAG_SPOT on-chain, but its spec carries no spot commitment"
        ),
        "attempts": rows,
        "checks": sum(1 for r in rows if r["checked_by_mediator"]),
        "reveal": reveal,
        "status_error": status_error,
    }
