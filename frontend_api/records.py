"""The payouts explorer's records, as :class:`~frontend_api.index.ChainIndex` answers with them:
an event with its block time, a payout, what the events say about one address, a bucket of the
totals chart, a transaction; each with its JSON form (wei as decimal strings, bytes as 0x hex)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hexbytes import HexBytes

from gridmarket.escrow import ZERO_ADDRESS

WEI_FIELDS = frozenset(
    {"bounty", "payout", "fee", "amount", "slashed", "totalStake", "collateral", "deposit"}
    | {"toMediator"}
)
"""Event arguments that are wei: JSON carries them as decimal strings (JavaScript numbers lose
precision past 2**53)."""

BUCKETS_S = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400)
"""Bucket widths the totals chart picks from (the smallest that gives at most 48 buckets)."""


class NotFoundError(LookupError):
    """No such job, transaction or address in the escrow's history."""


def hexstr(value: bytes) -> str:
    """``0x``-prefixed lower-case hex of ``value``."""
    return "0x" + bytes(value).hex()


def jsonable(value: Any, name: str = "") -> Any:
    """An event or call value made JSON-ready: bytes as 0x hex, wei as decimal strings."""
    if isinstance(value, bytes | bytearray | HexBytes):
        return hexstr(bytes(value))
    if isinstance(value, str):
        return str(value)  # an InvalidText as its plain text
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return str(value) if name in WEI_FIELDS or abs(value) >= 2**53 else value
    if isinstance(value, dict):
        return {k: jsonable(v, k) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


@dataclass(frozen=True)
class ChainEvent:
    """One escrow event with the time of its block; ``seq`` is its place in the whole log."""

    seq: int
    name: str
    args: dict[str, Any]
    block: int
    time: int
    tx_hash: str
    log_index: int
    problems: dict[str, str] = field(default_factory=dict)
    """String arguments that did not decode (field -> why): see :class:`gridmarket.chain.Event`."""
    token: str | None = None
    """The token its amounts are in (the zero address: ETH): its own ``token`` argument, else
    its job's; None when neither is known."""

    @property
    def job_id(self) -> str | None:
        raw = self.args.get("jobId")
        return hexstr(bytes(raw)) if isinstance(raw, bytes | bytearray) else None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "args": jsonable(self.args),
            "block": self.block,
            "time": self.time,
            "tx_hash": self.tx_hash,
            "log_index": self.log_index,
            "problems": dict(self.problems),
            "token": self.token,
        }


def group_id_of(event: ChainEvent) -> str | None:
    """The ``groupId`` a ReplicasCreated or Resolved names, as 0x hex; None when it has none
    (or a malformed one: hostile logs are shown, never trusted)."""
    raw = event.args.get("groupId")
    if isinstance(raw, bytes | bytearray) and len(raw) == 32:
        return hexstr(bytes(raw))
    return None


@dataclass
class ReplicaGroup:
    """A replicated job (``createJob(..., replicas)``) as its ReplicasCreated and Resolved say."""

    group_id: str
    submitter: str
    replicas: int
    seat_ids: list[str]
    """The seats' job ids, seat i at index i: ``keccak256(abi.encode(groupId, i))``."""
    created_tx: str
    created_time: int
    result_digest: str | None = None
    """The digest the majority agreed on (0x00..00: no majority); None until Resolved."""
    agreeing: int | None = None
    resolved_tx: str | None = None
    resolved_time: int | None = None

    @property
    def resolved(self) -> bool:
        return self.resolved_tx is not None

    @property
    def majority(self) -> bool:
        """Whether Resolved named a majority (False before it, or when none was reached)."""
        return bool(self.agreeing) and self.result_digest != "0x" + "00" * 32

    def to_json(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "submitter": self.submitter,
            "replicas": self.replicas,
            "seat_ids": list(self.seat_ids),
            "created_tx": self.created_tx,
            "created_time": self.created_time,
            "resolved": self.resolved,
            "result_digest": self.result_digest,
            "agreeing": self.agreeing,
            "majority": self.majority,
            "resolved_tx": self.resolved_tx,
            "resolved_time": self.resolved_time,
        }


@dataclass(frozen=True)
class Payout:
    """A ``JobReleased``: the provider was credited ``amount`` and the platform ``fee``, both
    in ``token`` (the job's: the zero address for ETH)."""

    job_id: str
    provider: str
    submitter: str
    amount: int
    fee: int
    tx_hash: str
    block: int
    time: int
    token: str = ZERO_ADDRESS

    def to_json(self) -> dict[str, Any]:
        """``amount_wei``/``fee_wei`` are in the smallest units of ``token`` (wei for ETH)."""
        return {
            "job_id": self.job_id,
            "provider": self.provider,
            "submitter": self.submitter,
            "token": self.token,
            "amount_wei": str(self.amount),
            "fee_wei": str(self.fee),
            "tx_hash": self.tx_hash,
            "block": self.block,
            "time": self.time,
        }


MONEY_FIELDS = (
    "earned",
    "withdrawn",
    "slashed",
    "slash_credits",
    "credited",
    "mediator_fees",
    "staked",
    "funded",
    "paid_out",
    "refunded",
    "fees_collected",
)
"""The amounts :class:`AddressStats` keeps per token (in ETH on itself, in each ERC-20 in an
:class:`Amounts` of :attr:`AddressStats.tokens`)."""


@dataclass
class Amounts:
    """What the events say about one address in one ERC-20 token (the fields of
    :class:`AddressStats` that are amounts, in that token's smallest units)."""

    earned: int = 0
    withdrawn: int = 0
    slashed: int = 0
    slash_credits: int = 0
    credited: int = 0
    mediator_fees: int = 0
    staked: int = 0
    funded: int = 0
    paid_out: int = 0
    refunded: int = 0
    fees_collected: int = 0

    def to_json(self) -> dict[str, str]:
        return {name: str(getattr(self, name)) for name in MONEY_FIELDS}


@dataclass
class AddressStats:
    """What the events say about one address, summed as they are read."""

    earned: int = 0
    """Payouts credited to it as a provider."""
    jobs_paid: int = 0
    withdrawn: int = 0
    slashed: int = 0
    """Collateral it lost to mediators' rulings against its results."""
    slash_count: int = 0
    slash_credits: int = 0
    """Slashed collateral credited to it as the submitter of the job (less the mediator's
    re-run fee)."""
    credited: int = 0
    """Dispute deposits credited to it (``Credited``): returned to it as a submitter, or paid
    to it as the mediator of an upheld dispute."""
    mediator_fees: int = 0
    """Slashed collateral paid to it as the mediator of a dispute it ruled against."""
    rulings: int = 0
    """``Ruled`` events it emitted as a job's mediator."""
    rulings_against: int = 0
    """Of its rulings, those that did not uphold the result (the provider was slashed)."""
    staked: int = 0
    """Current stake according to the last ``Staked``/``Unstaked`` event (slashes subtracted)."""
    registered: bool = False
    metadata_problem: str | None = None
    """Why its last registration's metadata CID is unusable (it did not decode); None if fine."""
    funded: int = 0
    """Bounties it locked as a submitter."""
    jobs_funded: int = 0
    paid_out: int = 0
    """Bounties of its jobs that were released (payout plus fee)."""
    refunded: int = 0
    fees_collected: int = 0
    events: list[int] = field(default_factory=list)
    """``seq`` of every event that names it."""
    tokens: dict[str, Amounts] = field(default_factory=dict)
    """The same amounts in each ERC-20 (token address -> :class:`Amounts`); the amount fields
    above are ETH only, so wei and token units are never added together."""

    def money(self, token: str) -> AddressStats | Amounts:
        """Where amounts in ``token`` are summed: this record for ETH, else the token's."""
        if token == ZERO_ADDRESS:
            return self
        return self.tokens.setdefault(token, Amounts())

    def to_json(self) -> dict[str, Any]:
        return {
            "earned_wei": str(self.earned),
            "jobs_paid": self.jobs_paid,
            "withdrawn_wei": str(self.withdrawn),
            "slashed_wei": str(self.slashed),
            "slash_count": self.slash_count,
            "slash_credits_wei": str(self.slash_credits),
            "credited_wei": str(self.credited),
            "mediator_fees_wei": str(self.mediator_fees),
            "rulings": self.rulings,
            "rulings_against": self.rulings_against,
            "staked_wei": str(self.staked),
            "registered": self.registered,
            "metadata_problem": self.metadata_problem,
            "funded_wei": str(self.funded),
            "jobs_funded": self.jobs_funded,
            "paid_out_wei": str(self.paid_out),
            "refunded_wei": str(self.refunded),
            "fees_collected_wei": str(self.fees_collected),
            "tokens": {t: a.to_json() for t, a in sorted(self.tokens.items())},
        }


@dataclass(frozen=True)
class Bucket:
    """Payouts within ``[start, start + width)``, and everything paid up to its end."""

    start: int
    width: int
    count: int
    amount: int
    fee: int
    cumulative_amount: int
    cumulative_fee: int

    def to_json(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "width_s": self.width,
            "count": self.count,
            "amount_wei": str(self.amount),
            "fee_wei": str(self.fee),
            "cumulative_amount_wei": str(self.cumulative_amount),
            "cumulative_fee_wei": str(self.cumulative_fee),
        }


@dataclass(frozen=True)
class TxView:
    """A transaction to the escrow (or any transaction: foreign logs are simply not decoded)."""

    tx_hash: str
    sender: str
    to: str | None
    value: int
    function: str | None
    inputs: dict[str, Any]
    status: str
    block: int | None
    time: int | None
    gas_used: int | None
    events: list[ChainEvent]

    def to_json(self) -> dict[str, Any]:
        return {
            "tx_hash": self.tx_hash,
            "from": self.sender,
            "to": self.to,
            "value_wei": str(self.value),
            "function": self.function,
            "inputs": jsonable(self.inputs),
            "status": self.status,
            "block": self.block,
            "time": self.time,
            "gas_used": self.gas_used,
            "events": [e.to_json() for e in self.events],
        }


def pick_bucket(span_s: int, max_buckets: int = 48) -> int:
    """The smallest width of :data:`BUCKETS_S` that covers ``span_s`` in ``max_buckets``."""
    for width in BUCKETS_S:
        if span_s <= width * max_buckets:
            return width
    return BUCKETS_S[-1]
