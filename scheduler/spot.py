"""Spot checks at the scheduler (issue 10, ``spot: p``; :mod:`gridmarket.spot`): which spot jobs
are not offered, and what ``GET API.SPOT`` shows. Pure: no I/O.

A job is a spot job when its on-chain flags carry ``FLAG_SPOT`` (its funding locked a check
deposit of its bounty) and its spec carries ``spot`` (the policy, the commitment and the seed
sealed to the mediator). The two must agree, and the collateral must make cheating unprofitable
in expectation (:func:`gridmarket.spot.min_collateral`); otherwise the job is not offered to any
provider (it goes ``invalid`` with the reason, and the submitter can cancel it).
"""

from __future__ import annotations

from gridmarket import spot
from gridmarket.escrow import FLAG_SPOT, Job, Status
from gridmarket.wire import JobSpec, SpotStatus

__all__ = ["SETTLED", "intake_refusal", "spot_status"]

SETTLED = (Status.RELEASED, Status.REFUNDED)
"""On-chain states after which a spot job's seed may be revealed (it can never be assigned
again)."""


def intake_refusal(spec: JobSpec, job: Job) -> str | None:
    """Why a job with ``spec`` and on-chain struct ``job`` is not offered as it stands (its
    spot policy and its flags or collateral disagree); None when it may be."""
    flagged = bool(job.flags & FLAG_SPOT)
    policy = spec.spot
    if flagged and policy is None:
        return (
            "spot: the job carries FLAG_SPOT on-chain (a check deposit was locked) but its spec "
            "has no spot policy, so no attempt could be drawn for a check; not offered, the "
            "submitter can cancel"
        )
    if policy is not None and not flagged:
        return (
            "spot: the spec asks for spot checks but the on-chain job lacks FLAG_SPOT (no check "
            "deposit, and its mediator may not open a check); not offered, the submitter can "
            "cancel"
        )
    if policy is not None:
        need = spot.min_collateral(job.bounty, policy.p_bps)
        if job.collateral < need:
            return (
                f"spot: collateral {job.collateral} is under {need}, the least a spot job with "
                f"bounty {job.bounty} and p = {policy.p_bps} bps needs (below it a provider "
                "that skips the work profits in expectation); not offered, the submitter can "
                "cancel"
            )
    return None


def spot_status(job_id: str, spec: JobSpec, attempts: int, seed: str | None) -> SpotStatus:
    """``GET API.SPOT``'s answer for a spot job (``spec.spot`` set) with ``attempts``
    assignments so far and its revealed ``seed`` (0x hex) or None."""
    policy = spec.spot
    if policy is None:
        raise ValueError(f"job {job_id} is not a spot job")
    checked = None
    if seed is not None:
        raw = bytes.fromhex(seed.removeprefix("0x"))
        checked = [a for a in range(1, attempts + 1) if spot.checked(raw, a, policy.p_bps)]
    return SpotStatus(
        job_id=job_id,
        p_bps=policy.p_bps,
        commit=policy.commit.lower(),
        attempts=attempts,
        seed=seed,
        checked_attempts=checked,
    )
