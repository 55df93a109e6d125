"""Matching: hard gates and best-fit ranking over an index of node capacity, plus reputation
and quotes. Pure code, no I/O (see docs/matching.md)."""

from gridmarket.wire import ExecutorKind

from .engine import (
    DEFAULT_BAN_BELOW,
    Match,
    MatchingEngine,
    NodeLike,
    NodeView,
    NoMatch,
    RankKey,
    WhyNot,
    first_failed_gate,
    rank_key,
    reference_match,
)
from .models import (
    ClaimError,
    DuplicateNodeError,
    Gate,
    GpuSpec,
    JobRequirements,
    MatchingError,
    NodeCapacity,
    UnknownJobError,
    UnknownNodeError,
)

# The old name of ExecutorKind, kept only while scheduler/dispatch.py and bench/matching.py
# (other owners' files) still import it: remove it with their one-line import change.
Executor = ExecutorKind

__all__ = [
    "DEFAULT_BAN_BELOW",
    "ClaimError",
    "DuplicateNodeError",
    "Executor",
    "Gate",
    "GpuSpec",
    "JobRequirements",
    "Match",
    "MatchingEngine",
    "MatchingError",
    "NoMatch",
    "NodeCapacity",
    "NodeLike",
    "NodeView",
    "RankKey",
    "UnknownJobError",
    "UnknownNodeError",
    "WhyNot",
    "first_failed_gate",
    "rank_key",
    "reference_match",
]
