"""What the store hands out and refuses with: rows of nodes, jobs and outbox items (frozen
dataclasses read from the tables), the dispatcher's claims, and the store's errors."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from gridmarket.escrow import Job, JobState, Status
from gridmarket.wire import JobSpec, NodeCapacityIn, ResultReport
from scheduler.matching.reputation import (
    DEFAULT_POLICY,
    ReputationPolicy,
    ReputationState,
    is_excluded,
    score,
)

__all__ = [
    "SPEC_CACHE",
    "Claim",
    "ClaimedJob",
    "ConflictError",
    "JobRow",
    "NodeRow",
    "NotFoundError",
    "OutboxItem",
    "ReplayError",
    "StoreError",
    "cached_spec",
    "job_to_json",
    "node_id_for",
    "pos_of",
]


class StoreError(Exception):
    """Base of the store's refusals."""


class NotFoundError(StoreError, LookupError):
    """No such node or job."""


class ConflictError(StoreError):
    """The request does not fit the current state (a stale attempt, a job not yours, ...)."""


class OfferRefusedError(ConflictError):
    """The offer cannot go on-chain for a reason of the provider's that is no fault of the node:
    the lease ends and the job goes to another wallet (:meth:`JobStore.offer_refused`)."""


class ShortOfCollateralError(OfferRefusedError):
    """The wallet's free collateral, less what its accepted jobs not yet assigned on-chain will
    lock, does not cover the job's collateral."""


class SeatTakenError(OfferRefusedError):
    """The job is a seat of a replicated job and the wallet already holds another of its seats:
    a replicated job's seats go to distinct providers."""


class ReplayError(StoreError):
    """A registration nonce at or below one already used by that wallet."""


def node_id_for(wallet: str, name: str) -> str:
    """Stable id of a wallet's node ``name`` (re-registering keeps it)."""
    return "n-" + hashlib.sha256(f"{wallet.lower()}/{name}".encode()).hexdigest()[:16]


def pos_of(block: int, log_index: int) -> int:
    """Total order of a log in the chain (block, then log index)."""
    return block * 100_000 + log_index


def block_of(pos: int) -> int:
    """The block of a :func:`pos_of` position."""
    return pos // 100_000


def job_to_json(state: JobState) -> dict[str, Any]:
    j = state.job
    return {
        "submitter": j.submitter,
        "bounty": str(j.bounty),
        "provider": j.provider,
        "deadline": j.deadline,
        "since": j.since,
        "fee_bps": j.fee_bps,
        "attempt": j.attempt,
        "result_digest": "0x" + j.result_digest.hex(),
        "operator": j.operator,
        "mediator": j.mediator,
        "collateral": str(j.collateral),
        "disputed_at": j.disputed_at,
        "flags": j.flags,
        "hold_until": j.hold_until,
        "output_cid": state.output_cid,
    }


@dataclass(frozen=True, slots=True)
class NodeRow:
    node_id: str
    wallet: str
    name: str
    capacity: NodeCapacityIn
    tier: str
    region: str
    slots: int
    running: int
    status: str
    agent_version: str
    registered_at: float
    last_seen: float
    reputation: ReputationState
    jobs_done: int
    jobs_failed: int
    suspended: bool

    def score(self, now: float, policy: ReputationPolicy = DEFAULT_POLICY) -> float:
        return score(self.reputation, now, policy)

    def excluded(self, now: float, policy: ReputationPolicy = DEFAULT_POLICY) -> bool:
        return self.suspended or is_excluded(self.reputation, now, policy)

    @classmethod
    def of(cls, r: Any) -> NodeRow:
        return cls(
            node_id=r.node_id,
            wallet=r.wallet,
            name=r.name,
            capacity=NodeCapacityIn.model_validate(r.capacity),
            tier=r.tier,
            region=r.region,
            slots=r.slots,
            running=r.running,
            status=r.status,
            agent_version=r.agent_version,
            registered_at=r.registered_at,
            last_seen=r.last_seen,
            reputation=ReputationState(
                good=r.rep_good,
                bad=r.rep_bad,
                at=r.rep_at,
                streak=r.rep_streak,
                last_bad_at=r.rep_last_bad,
            ),
            jobs_done=r.jobs_done,
            jobs_failed=r.jobs_failed,
            suspended=r.suspended,
        )


SPEC_CACHE: dict[str, JobSpec] = {}


def cached_spec(cid: str, data: Any) -> JobSpec:
    """Parsed job specs by CID: a CID's content never changes, so each is validated once.
    ``data``: the stored spec, parsed or as its JSON text (``tables.job_columns``; a spec
    never stored reads as SQL NULL or as JSON ``null``: the caller's to tell apart)."""
    spec = SPEC_CACHE.get(cid)
    if spec is None:
        if len(SPEC_CACHE) > 50_000:
            SPEC_CACHE.clear()
        parsed = json.loads(data) if isinstance(data, str | bytes) else data
        spec = SPEC_CACHE[cid] = JobSpec.model_validate(parsed)
    return spec


@dataclass(frozen=True, slots=True)
class JobRow:
    job_id: str
    submitter: str
    bounty_wei: int
    deadline: int
    fee_bps: int
    salt: str
    spec_cid: str
    spec: JobSpec | None
    state: str
    reason: str
    created_block: int
    created_at: float
    updated_at: float
    queued_at: float | None
    chain: JobState
    chain_pos: int
    output_cid: str | None
    node_id: str | None
    attempt: int
    lease_expires: float | None
    excluded: tuple[str, ...]
    excluded_wallets: tuple[str, ...]
    failures: int
    result: ResultReport | None
    spec_tries: int = 0
    spec_retry_at: float | None = None
    acceptance: str | None = None
    """The node's signed acceptance of the current lease (0x hex); None while only offered."""
    spot_seed: str | None = None
    """A spot job's seed (0x hex), once revealed after its settlement; None before."""

    @classmethod
    def of(cls, r: Any) -> JobRow:
        cj = r.chain_job
        chain = JobState(
            job_id=bytes.fromhex(r.job_id[2:]),
            job=Job(
                submitter=cj["submitter"],
                bounty=int(cj["bounty"]),
                provider=cj["provider"],
                deadline=cj["deadline"],
                since=cj["since"],
                fee_bps=cj["fee_bps"],
                attempt=cj["attempt"],
                result_digest=bytes.fromhex(cj["result_digest"][2:]),
                operator=cj["operator"],
                mediator=cj["mediator"],
                collateral=int(cj["collateral"]),
                disputed_at=cj["disputed_at"],
                flags=cj["flags"],
                token=r.token,
                hold_until=cj.get("hold_until", 0),  # none before escrow version 5
            ),
            status=Status(r.chain_status),
            spec_cid=r.spec_cid,
            salt=bytes.fromhex(r.salt[2:]),
            output_cid=cj.get("output_cid"),
        )
        return cls(
            job_id=r.job_id,
            submitter=r.submitter,
            bounty_wei=int(r.bounty_wei),
            deadline=r.deadline,
            fee_bps=r.fee_bps,
            salt=r.salt,
            spec_cid=r.spec_cid,
            spec=None if r.spec is None or r.spec == "null" else cached_spec(r.spec_cid, r.spec),
            state=r.state,
            reason=r.reason,
            created_block=r.created_block,
            created_at=r.created_at,
            updated_at=r.updated_at,
            queued_at=r.queued_at,
            chain=chain,
            chain_pos=r.chain_pos,
            output_cid=r.output_cid,
            node_id=r.node_id,
            attempt=r.attempt,
            lease_expires=r.lease_expires,
            excluded=tuple(r.excluded or ()),
            excluded_wallets=tuple(r.excluded_wallets or ()),
            failures=r.failures,
            result=None if r.result is None else ResultReport.model_validate(r.result),
            spec_tries=r.spec_tries,
            spec_retry_at=r.spec_retry_at,
            acceptance=r.acceptance,
            spot_seed=r.spot_seed,
        )


@dataclass(frozen=True, slots=True)
class Claim:
    """A decision of the dispatcher: give ``job_id`` to ``node_id``."""

    job_id: str
    node_id: str


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A claim that won: the job (as leased) and the node's wallet."""

    job: JobRow
    node_id: str
    wallet: str


@dataclass(frozen=True, slots=True)
class OutboxItem:
    id: int
    job_id: str
    kind: str
    payload: dict[str, Any]
    tries: int
    created_at: float
    not_before: float | None = None
