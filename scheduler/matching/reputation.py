"""Node reputation: a time-decayed Beta posterior over job outcomes. Pure functions, no I/O.

Only outcomes that are the node's doing are recorded: a run that fails because of the job
itself (``scheduler.lifecycle.fault_of``: the submitter's command exits non-zero, its image is
missing, ...) records nothing. Each outcome adds weighted evidence: a success adds to
``alpha``; a failure, a timeout (the node took the job and went silent) or a rejected result
(verification failed) adds to ``beta``, with weights that make silence and bad results cost
more than an honest failure. Evidence halves every ``half_life_s``, so old history fades and a
node can recover. The score is the posterior mean

    score = (prior_alpha + A) / (prior_alpha + prior_beta + A + B)

where ``A`` and ``B`` are the decayed evidence sums. A new node starts at the prior mean (2/3
with the defaults): above the matching ban line, below a proven node.

Exclusion (:func:`is_excluded`): ``max_consecutive_failures`` bad outcomes in a row, within
``failure_cooldown_s`` of the last one; or a score under ``exclude_below`` once the decayed
evidence weighs at least ``min_evidence``. Both lift with time: the streak rule after the
cooldown, the score rule as evidence decays below ``min_evidence`` (a probation, after which
one more bad outcome excludes the node again).

The state is a small frozen value (two floats, a time, a streak): :func:`record` returns the
next one, so it can be stored in a row and updated in the same transaction as the job.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

__all__ = [
    "DEFAULT_POLICY",
    "Outcome",
    "ReputationPolicy",
    "ReputationState",
    "decayed",
    "is_excluded",
    "record",
    "score",
]


class Outcome(StrEnum):
    """How a job ended for the node that held it."""

    SUCCESS = "success"
    FAILURE = "failure"  # a failed run that is the node's fault (agent error, timeout, ...)
    TIMEOUT = "timeout"  # lease lost: the node went silent with the job
    REJECTED = "rejected"  # the result failed verification


@dataclass(frozen=True, slots=True)
class ReputationPolicy:
    """Weights, prior, decay and exclusion thresholds."""

    half_life_s: float = 7 * 24 * 3600.0
    prior_alpha: float = 2.0
    prior_beta: float = 1.0
    success_weight: float = 1.0
    failure_weight: float = 1.0
    timeout_weight: float = 1.5
    rejected_weight: float = 3.0
    max_consecutive_failures: int = 3
    failure_cooldown_s: float = 24 * 3600.0
    exclude_below: float = 0.3
    min_evidence: float = 5.0

    def __post_init__(self) -> None:
        if self.half_life_s <= 0:
            raise ValueError("half_life_s must be positive")
        if self.prior_alpha <= 0 or self.prior_beta <= 0:
            raise ValueError("the prior must be positive")
        weights = (
            self.success_weight,
            self.failure_weight,
            self.timeout_weight,
            self.rejected_weight,
        )
        if min(weights) < 0:
            raise ValueError("weights must not be negative")
        if self.max_consecutive_failures < 1:
            raise ValueError("max_consecutive_failures must be at least 1")

    def weight(self, outcome: Outcome) -> float:
        return {
            Outcome.SUCCESS: self.success_weight,
            Outcome.FAILURE: self.failure_weight,
            Outcome.TIMEOUT: self.timeout_weight,
            Outcome.REJECTED: self.rejected_weight,
        }[outcome]


DEFAULT_POLICY = ReputationPolicy()


@dataclass(frozen=True, slots=True)
class ReputationState:
    """Decayed evidence as of ``at`` (unix seconds), and the current run of bad outcomes."""

    good: float = 0.0
    bad: float = 0.0
    at: float = 0.0
    streak: int = 0
    last_bad_at: float | None = None


def decayed(state: ReputationState, now: float, policy: ReputationPolicy) -> ReputationState:
    """``state`` with its evidence decayed to ``now`` (an earlier ``now`` changes nothing)."""
    if now <= state.at:
        return state
    factor = 0.5 ** ((now - state.at) / policy.half_life_s)
    return replace(state, good=state.good * factor, bad=state.bad * factor, at=now)


def record(
    state: ReputationState,
    outcome: Outcome,
    now: float,
    policy: ReputationPolicy = DEFAULT_POLICY,
) -> ReputationState:
    """The state after ``outcome`` happened at ``now``."""
    state = decayed(state, now, policy)
    weight = policy.weight(outcome)
    if outcome is Outcome.SUCCESS:
        return replace(state, good=state.good + weight, streak=0)
    return replace(state, bad=state.bad + weight, streak=state.streak + 1, last_bad_at=now)


def score(state: ReputationState, now: float, policy: ReputationPolicy = DEFAULT_POLICY) -> float:
    """Posterior mean of the success probability at ``now``, in [0, 1]."""
    s = decayed(state, now, policy)
    alpha = policy.prior_alpha + s.good
    return alpha / (alpha + policy.prior_beta + s.bad)


def is_excluded(
    state: ReputationState, now: float, policy: ReputationPolicy = DEFAULT_POLICY
) -> bool:
    """Should the node be kept out of matching at ``now``? (see the module doc)."""
    if (
        state.streak >= policy.max_consecutive_failures
        and state.last_bad_at is not None
        and now - state.last_bad_at < policy.failure_cooldown_s
    ):
        return True
    s = decayed(state, now, policy)
    return s.good + s.bad >= policy.min_evidence and score(s, now, policy) < policy.exclude_below
