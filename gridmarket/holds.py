"""How long a provider holds a job it accepted: the ``holdFor`` of its EIP-712 acceptance.

Since escrow version 5 an acceptance names ``holdFor``, the seconds the provider is given;
``assign`` stores ``holdUntil = now + holdFor`` and nobody but the provider can take the job
back before it (the operator's ``unassign`` and reassign wait for ``max(since +
reassignDelay, holdUntil)``). A run longer than the reassign delay can then no longer be taken
from the provider that is running it (issue 28, docs/trust.md).

The scheduler offers :func:`hold_for` of the spec's timeout; the agent refuses an offer whose
hold does not cover its run (:func:`hold_problem`). Both sides use these two functions, so they
agree. A dead node keeps the job on-chain until its hold ends; the scheduler's lease still moves
the work on as soon as it may (docs/scheduler.md), and long jobs are to be cut into bounded
segments (issue 29).
"""

from __future__ import annotations

HOLD_MARGIN_S = 300
"""Seconds added to a run's timeout for what follows it: adding the output to IPFS, signing and
posting the result (the provider posts it itself if the operator's relay is late)."""
MAX_HOLD_FOR = 2**32 - 1
"""The longest ``holdFor`` an acceptance can carry (uint32 seconds)."""


def hold_for(timeout_s: int) -> int:
    """The hold the scheduler offers for a run of at most ``timeout_s`` seconds: the timeout
    plus a tenth of it, and at least :data:`HOLD_MARGIN_S`, for the upload and the result."""
    if timeout_s < 0:
        raise ValueError(f"timeout_s {timeout_s} is negative")
    return min(MAX_HOLD_FOR, timeout_s + max(HOLD_MARGIN_S, timeout_s // 10))


def hold_problem(offered: int, timeout_s: int, now: int, deadline: int) -> str | None:
    """Why a provider must not accept a hold of ``offered`` seconds for a run of at most
    ``timeout_s`` seconds (the job's deadline ``deadline``, the time now ``now``), or None.

    The hold must cover the run and :data:`HOLD_MARGIN_S`, or reach the deadline (no result
    counts after it anyway)."""
    if not 0 <= offered <= MAX_HOLD_FOR:
        return f"holdFor {offered} is not a uint32"
    needed = min(timeout_s + HOLD_MARGIN_S, max(0, deadline - now))
    if offered < needed:
        return (
            f"the hold of {offered} s does not cover the run: {timeout_s} s of timeout "
            f"and {HOLD_MARGIN_S} s to post the result need {needed} s"
        )
    return None
