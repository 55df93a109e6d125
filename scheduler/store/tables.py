"""The scheduler's tables (SQLAlchemy Core). Alembic migrations in scheduler/migrations create them.

Wei amounts are stored as decimal strings (a bounty does not fit a 64-bit integer). Times are
Unix seconds as floats. JSON columns hold pydantic models dumped in ``mode="json"``.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    cast,
)

from gridmarket.escrow import ZERO_ADDRESS

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_name)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

wallets = Table(
    "wallets",
    metadata,
    Column("address", String(42), primary_key=True),
    Column("last_nonce", BigInteger, nullable=False),
    Column("updated_at", Float, nullable=False),
)

nodes = Table(
    "nodes",
    metadata,
    Column("node_id", String(24), primary_key=True),
    Column("wallet", String(42), nullable=False),
    Column("name", String(64), nullable=False),
    Column("capacity", JSON, nullable=False),  # wire.NodeCapacityIn
    Column("tier", String(32), nullable=False),
    Column("region", String(32), nullable=False),
    Column("slots", Integer, nullable=False),
    Column("running", Integer, nullable=False, default=0),
    Column("status", String(16), nullable=False),  # online | offline
    Column("agent_version", String(64), nullable=False, default=""),
    Column("registered_at", Float, nullable=False),
    Column("last_seen", Float, nullable=False),
    # reputation (scheduler.matching.reputation.ReputationState)
    Column("rep_good", Float, nullable=False, default=0.0),
    Column("rep_bad", Float, nullable=False, default=0.0),
    Column("rep_at", Float, nullable=False, default=0.0),
    Column("rep_streak", Integer, nullable=False, default=0),
    Column("rep_last_bad", Float, nullable=True),
    Column("jobs_done", Integer, nullable=False, default=0),
    Column("jobs_failed", Integer, nullable=False, default=0),
    Column("suspended", Boolean, nullable=False, default=False),
    Index("ix_nodes_wallet_name", "wallet", "name", unique=True),
    Index("ix_nodes_status_last_seen", "status", "last_seen"),
)

jobs = Table(
    "jobs",
    metadata,
    Column("job_id", String(66), primary_key=True),
    Column("submitter", String(42), nullable=False),
    Column("bounty_wei", String(40), nullable=False),
    Column("deadline", BigInteger, nullable=False),
    Column("fee_bps", Integer, nullable=False),
    Column("salt", String(66), nullable=False),
    Column("spec_cid", String(128), nullable=False),
    Column("spec", JSON, nullable=True),  # wire.JobSpec once fetched and valid
    # failed fetches of the spec, and when the next is due (pending_spec only)
    Column("spec_tries", Integer, nullable=False, default=0, server_default="0"),
    Column("spec_retry_at", Float, nullable=True),
    # pending_spec | queued | leased | verifying | settling | disputed | released | failed |
    # invalid | refunded | expired
    Column("state", String(16), nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("created_block", BigInteger, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("queued_at", Float, nullable=True),
    # the on-chain struct and status, folded from events (gridmarket.escrow.apply_event)
    Column("chain_status", Integer, nullable=False),
    Column("chain_job", JSON, nullable=False),
    # what the job is paid in (the struct's ``token``: the zero address for ETH, else a listed
    # ERC-20); every amount of the job, bounty_wei and chain_job's included, is in its units
    Column("token", String(42), nullable=False, server_default=ZERO_ADDRESS),
    Column("chain_pos", BigInteger, nullable=False),  # block * 100_000 + log index last applied
    Column("output_cid", String(128), nullable=True),
    # the current lease
    Column("node_id", String(24), ForeignKey("nodes.node_id"), nullable=True),
    Column("attempt", Integer, nullable=False, default=0),  # attempt of the lease (predicted)
    Column("lease_expires", Float, nullable=True),
    Column("excluded", JSON, nullable=False),  # node ids that must not get it again
    # provider wallets that must not get it again (NULL: none); every node of one is excluded
    Column("excluded_wallets", JSON, nullable=True),
    Column("failures", Integer, nullable=False, default=0),
    Column("result", JSON, nullable=True),  # wire.ResultReport of the last attempt
    # the node's EIP-712 Acceptance (0x hex) of the current lease; NULL while only offered
    Column("acceptance", String(132), nullable=True),
    # a spot job (JobSpec.spot): its commitment (unique per submitter: a seed is never shared
    # by two of its jobs; the commitment hashes the submitter in, so another wallet's copy is
    # no reuse: migration 0008), and the seed revealed once the job is settled
    # (POST /v1/jobs/{job_id}/spot)
    Column("spot_commit", String(66), nullable=True),
    Column("spot_seed", String(66), nullable=True),
    Column("spot_revealed_at", Float, nullable=True),
    Index("ix_jobs_submitter_spot_commit", "submitter", "spot_commit", unique=True),
    Index("ix_jobs_state_queued_at", "state", "queued_at"),
    # the collateral check's pending jobs of a wallet's nodes (migration 0007)
    Index("ix_jobs_node_id", "node_id", "chain_status", "chain_pos"),
    Index("ix_jobs_state_updated_at", "state", "updated_at"),
    Index("ix_jobs_state_deadline", "state", "deadline"),
    Index("ix_jobs_node_id_state", "node_id", "state"),  # a node's leased jobs (polls)
    Index("ix_jobs_state_lease_expires", "state", "lease_expires"),
)

job_columns = tuple(cast(c, Text).label(c.name) if c.name == "spec" else c for c in jobs.c)
"""The ``jobs`` columns as ``rows.JobRow.of`` reads them: ``spec`` as its JSON text, parsed
only when its CID is not in the spec cache (parsing it on every row read was most of the cost
of reading a job: 43 us of a row's 50, 144 queued rows a dispatch round; issue 12)."""

attempts = Table(
    "attempts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(66), ForeignKey("jobs.job_id"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("node_id", String(24), nullable=False),
    Column("wallet", String(42), nullable=False),
    Column("started_at", Float, nullable=False),
    Column("ended_at", Float, nullable=True),
    Column("outcome", String(24), nullable=True),  # success | failure | timeout | handed_back ...
    Column("detail", Text, nullable=False, default=""),
    # the checkpoint (CID) a checkpointing job's attempt started from (Assignment.resume)
    Column("resume_cid", String(128), nullable=True),
    Index("ix_attempts_job_id", "job_id"),
)

outbox = Table(
    "outbox",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(66), nullable=False),
    # assign | settle | release | relay | finalize | unassign
    Column("kind", String(24), nullable=False),
    Column("payload", JSON, nullable=False),
    Column("status", String(12), nullable=False),  # pending | done | failed
    Column("tries", Integer, nullable=False, default=0),
    Column("tx_hash", String(66), nullable=True),
    Column("error", Text, nullable=False, default=""),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("not_before", Float, nullable=True),  # chain time before which it is not sent
    Index("ix_outbox_status_id", "status", "id"),
    Index("ix_outbox_job_id", "job_id"),
    Index("ix_outbox_status_not_before", "status", "not_before"),
)

cursors = Table(
    "cursors",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("block", Integer, nullable=False),
)

audit = Table(
    "audit",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ts", Float, nullable=False),
    Column("entity", String(8), nullable=False),  # job | node
    Column("entity_id", String(66), nullable=False),
    Column("event", String(32), nullable=False),
    Column("detail", JSON, nullable=False),
    Index("ix_audit_entity_id", "entity_id", "id"),
)

job_logs = Table(
    "job_logs",
    metadata,
    # one row per batch a node posted (gridmarket.joblogs.LogBatch): the id orders a job's log
    # and is the readers' cursor (GET /v1/jobs/{job_id}/logs?after=<id>)
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(66), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("node_id", String(24), nullable=False),
    Column("received_at", Float, nullable=False),
    Column("chars", Integer, nullable=False),  # text characters of its chunks (retention)
    Column("chunks", JSON, nullable=False),  # [{stream, ts, text}], text already cleaned
    Index("ix_job_logs_job_id", "job_id", "attempt", "seq", unique=True),
    Index("ix_job_logs_job_id_id", "job_id", "id"),
)

job_checkpoints = Table(
    "job_checkpoints",
    metadata,
    # one row per checkpoint a node reported (gridmarket.checkpoints.CheckpointReport); the
    # scheduler's keeper copies the newest of a job to its own IPFS node (kept_at), or says why
    # not (keep_error), and unpins what it no longer needs (unpinned_at)
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(66), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("node_id", String(24), nullable=False),
    Column("wallet", String(42), nullable=False),  # the node's wallet, the report's signer
    Column("cid", String(128), nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("files", Integer, nullable=False),
    Column("step", BigInteger, nullable=True),  # the job's progress (NULL: none reported)
    Column("total", BigInteger, nullable=True),
    Column("metrics", JSON, nullable=True),
    Column("final", Boolean, nullable=False),
    Column("taken_at", Float, nullable=False),  # the node's clock
    Column("received_at", Float, nullable=False),
    Column("kept_at", Float, nullable=True),  # pinned on the scheduler's IPFS node
    Column("keep_error", Text, nullable=True),  # why it is not (given up, or superseded)
    Column("unpinned_at", Float, nullable=True),  # unpinned again (superseded, retention)
    Column("signature", String(132), nullable=False),
    Index("ix_job_checkpoints_job_id", "job_id", "attempt", "seq", unique=True),
    Index("ix_job_checkpoints_kept_at", "kept_at", "keep_error"),
)
