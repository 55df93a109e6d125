"""Matching: hard gates and best-fit ranking over an index of node capacity, plus reputation
and quotes. Pure code, no I/O (see docs/matching.md)."""

from gridmarket.wire import ExecutorKind  # the executor a node offers and a job needs

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

__all__ = [
    "DEFAULT_BAN_BELOW",
    "ClaimError",
    "DuplicateNodeError",
    "ExecutorKind",
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
