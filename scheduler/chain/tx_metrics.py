"""Prometheus counters of what the operator key spends: gas, fees in wei, replacements, stuck
transactions, fee-cap refusals, transactions in flight. Kept by :mod:`scheduler.chain.sender`,
exposed by the scheduler's /metrics (:data:`REGISTRY`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

REGISTRY = CollectorRegistry()
SENT = Counter(
    "gridmarket_tx_sent", "Transactions broadcast (not replacements)", ["fn"], registry=REGISTRY
)
MINED = Counter(
    "gridmarket_tx_mined", "Transactions mined, by outcome", ["fn", "status"], registry=REGISTRY
)
GAS = Counter("gridmarket_tx_gas_used", "Gas used by mined transactions", registry=REGISTRY)
FEES = Counter(
    "gridmarket_tx_fees_paid_wei", "Fees paid: gasUsed x effectiveGasPrice", registry=REGISTRY
)
REPLACED = Counter(
    "gridmarket_tx_replacements", "Stuck transactions re-sent with higher fees", registry=REGISTRY
)
STUCK = Counter(
    "gridmarket_tx_stuck", "Transactions not mined within replace_after_s", registry=REGISTRY
)
CAPPED = Counter(
    "gridmarket_tx_fee_cap_hits",
    "Sends or replacements refused because the fee would exceed the cap",
    registry=REGISTRY,
)
IN_FLIGHT = Gauge(
    "gridmarket_tx_in_flight", "Transactions broadcast and not yet mined", registry=REGISTRY
)
MAX_FEE = Gauge(
    "gridmarket_tx_max_fee_per_gas_wei", "maxFeePerGas of the last transaction", registry=REGISTRY
)
CAP = Gauge("gridmarket_tx_fee_cap_wei", "The configured max fee per gas", registry=REGISTRY)
BATCHED = Counter(
    "gridmarket_tx_batched_calls",
    "Operator calls that took effect inside a tryMulticall batch (one transaction for several)",
    registry=REGISTRY,
)
BATCH_SKIPPED = Counter(
    "gridmarket_tx_batch_skipped_calls",
    "Operator calls a tryMulticall batch skipped (someone else took the step first, or the "
    "state moved): each then settled as a single send",
    registry=REGISTRY,
)
BATCH_FALLBACKS = Counter(
    "gridmarket_tx_batch_fallbacks",
    "Multicall batches refused as a whole and sent again call by call",
    registry=REGISTRY,
)
