"""The scheduler's side of the chain: a transaction sender for the operator key and an event
watcher feeding the store. Neither touches the database: the store implements the small
protocols taken here (docs/scheduler-chain.md)."""

from gridmarket.chain import ChainError, Event, Sent
from scheduler.chain.retry import ChainUnavailableError, RetryPolicy, is_transient
from scheduler.chain.sender import (
    BATCH_MAX_CALLS,
    BATCH_MAX_GAS,
    Call,
    FeeCapExceededError,
    FeePolicy,
    TxOutcomeUnknownError,
    TxSender,
    apply_sent,
)
from scheduler.chain.watcher import (
    ChainWatcher,
    CursorStore,
    EventSink,
    HeadTag,
    ReorgStore,
    ReorgTooDeepError,
    WatcherStatus,
)

__all__ = [
    "BATCH_MAX_CALLS",
    "BATCH_MAX_GAS",
    "Call",
    "ChainError",
    "ChainUnavailableError",
    "ChainWatcher",
    "CursorStore",
    "Event",
    "EventSink",
    "FeeCapExceededError",
    "FeePolicy",
    "HeadTag",
    "ReorgStore",
    "ReorgTooDeepError",
    "RetryPolicy",
    "Sent",
    "TxOutcomeUnknownError",
    "TxSender",
    "WatcherStatus",
    "apply_sent",
    "is_transient",
]
