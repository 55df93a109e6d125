"""How long a provider holds a job it accepted: the ``holdFor`` of its EIP-712 acceptance.

Since escrow version 5 an acceptance names ``holdFor``, the seconds the provider is given;
``assign`` stores ``holdUntil = now + holdFor`` and nobody but the provider can take the job
back before it (the operator's ``unassign`` and reassign wait for ``max(since +
reassignDelay, holdUntil)``). A run longer than the reassign delay can then no longer be taken
from the provider that is running it (issue 28, docs/trust.md).

The scheduler offers :func:`hold_for` of the spec's timeout; the agent refuses an offer whose
hold does not cover its run (:func:`hold_problem`). Both sides use these functions with the same
margin, the deployment file's ``hold_margin_s`` (:func:`margin_of`; :data:`HOLD_MARGIN_S` when
it names none), so they agree. The local devnet names a few seconds, so that a killed node's
job moves on within a test. A dead node keeps the job on-chain until its hold ends; the
scheduler's lease still moves the work on as soon as it may (docs/scheduler.md), and long jobs
are to be cut into bounded segments (issue 29).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

HOLD_MARGIN_S = 300
"""The margin when the deployment file does not record ``reassign_delay``: seconds added to a
run's timeout for what follows it (adding the output to IPFS, signing and posting the result;
the provider posts it itself if the operator's relay is late)."""
MAX_HOLD_FOR = 2**32 - 1
"""The longest ``holdFor`` an acceptance can carry (uint32 seconds)."""


def margin_of(params: Mapping[str, Any] | None) -> int:
    """The hold margin of a deployment (its file's ``params``): its ``hold_margin_s``, else
    :data:`HOLD_MARGIN_S`."""
    value = (params or {}).get("hold_margin_s")
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_HOLD_FOR:
        return value
    return HOLD_MARGIN_S


def hold_for(timeout_s: int, margin_s: int = HOLD_MARGIN_S) -> int:
    """The hold the scheduler offers for a run of at most ``timeout_s`` seconds: the timeout
    plus a tenth of it, and at least ``margin_s`` (:func:`margin_of`), for the upload and the
    result."""
    if timeout_s < 0 or margin_s < 0:
        raise ValueError(f"timeout_s {timeout_s} or margin_s {margin_s} is negative")
    return min(MAX_HOLD_FOR, timeout_s + max(margin_s, timeout_s // 10))


def hold_problem(
    offered: int, timeout_s: int, now: int, deadline: int, margin_s: int = HOLD_MARGIN_S
) -> str | None:
    """Why a provider must not accept a hold of ``offered`` seconds for a run of at most
    ``timeout_s`` seconds (the job's deadline ``deadline``, the time now ``now``), or None.

    The hold must cover the run and ``margin_s`` (:func:`margin_of`), or reach the deadline (no
    result counts after it anyway)."""
    if not 0 <= offered <= MAX_HOLD_FOR:
        return f"holdFor {offered} is not a uint32"
    needed = min(timeout_s + margin_s, max(0, deadline - now))
    if offered < needed:
        return (
            f"the hold of {offered} s does not cover the run: {timeout_s} s of timeout "
            f"and {margin_s} s to post the result need {needed} s"
        )
    return None
