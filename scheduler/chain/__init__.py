"""The scheduler's side of the chain: a transaction sender for the operator key and the event
watcher feeding the store (:mod:`gridmarket.watcher`, shared with the mediator, re-exported
here with the RPC retry rules of :mod:`gridmarket.retry`). Neither touches the database: the
store implements the small protocols taken here (docs/scheduler-chain.md)."""

from gridmarket.chain import ChainError, Event, Sent
from gridmarket.retry import ChainUnavailableError, RetryPolicy, is_transient
from gridmarket.watcher import (
    ChainWatcher,
    CursorStore,
    EventSink,
    HeadTag,
    ReorgStore,
    ReorgTooDeepError,
    WatcherStatus,
)
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
