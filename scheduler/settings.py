"""The scheduler's one configuration object (env prefix ``GRIDMARKET_SCHEDULER_``)."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from scheduler.chain.sender import BATCH_MAX_CALLS, BATCH_MAX_GAS

Duty = Literal["chain", "verify"]
DUTIES: tuple[Duty, ...] = ("chain", "verify")
"""The leader duties (scheduler/service/leader.py): chain (watcher, outbox, specs), verify."""


class Settings(BaseSettings):
    """Everything an operator can set. Defaults run one replica on SQLite against the devnet.

    ``database_url``: ``sqlite:///path`` (embedded, one replica) or
    ``postgresql+psycopg://user@host/db`` (several replicas share it).
    ``token_secret`` must be the same on every replica (node tokens are HMACs); when unset, a
    random one is made at start (fine for one replica: nodes re-register after a restart).
    """

    model_config = SettingsConfigDict(env_prefix="GRIDMARKET_SCHEDULER_", extra="ignore")

    database_url: str = "sqlite:///.run/scheduler.db"
    replica_id: str = Field(default_factory=lambda: secrets.token_hex(4))

    # chain
    rpc_url: str = "http://127.0.0.1:8545"
    deployment_file: Path = Path("deployments/local.json")
    operator_key: SecretStr | None = None
    confirmations: int = Field(0, ge=0, le=64)
    chain_head: Literal["latest", "safe", "finalized"] = Field(
        "latest",
        description="the block the chain watcher reads up to: latest (minus confirmations) "
        "or the chain's safe/finalized block (then confirmations must be 0)",
    )
    chain_poll_s: float = Field(0.5, gt=0)
    require_stake: bool = True
    collateral_cache_s: float = Field(
        2.0,
        ge=0,
        le=60,
        description="how long a provider's free collateral read from the chain is reused by "
        "the acceptance check (0: read for every acceptance); scheduler/collateral.py",
    )
    # operator transactions (scheduler.chain.FeePolicy; docs/scheduler-chain.md, "Fees")
    max_fee_per_gas_wei: int = Field(200 * 10**9, gt=0)
    priority_fee_wei: int | None = Field(None, ge=0)
    base_fee_multiplier: float = Field(2.0, ge=1)
    tx_replace_after_s: float = Field(90.0, gt=0)
    tx_receipt_timeout_s: float = Field(600.0, gt=0)
    outbox_batch_calls: int = Field(
        BATCH_MAX_CALLS,
        ge=1,
        le=512,
        description="the most operator calls the outbox sends in one multicall transaction "
        "(rows of different jobs ready together; 1: every row a transaction of its own)",
    )
    outbox_batch_gas: int = Field(
        BATCH_MAX_GAS,
        ge=100_000,
        description="the most summed gas estimates of one multicall batch (keep it well under "
        "the chain's block gas limit)",
    )

    # IPFS
    ipfs_api: str = "/ip4/127.0.0.1/tcp/5001/http"
    ipfs_timeout_s: float = Field(20.0, gt=0)

    # nodes
    token_secret: SecretStr = Field(default_factory=lambda: SecretStr(secrets.token_hex(32)))
    token_ttl_s: float = Field(3600.0, gt=0)
    registration_max_ttl_s: float = Field(600.0, gt=0)
    heartbeat_interval_s: float = Field(5.0, gt=0)
    node_timeout_s: float = Field(20.0, gt=0)
    lease_ttl_s: float = Field(30.0, gt=0)
    long_poll_max_s: float = Field(30.0, gt=0)
    idle_retry_min_s: float = Field(0.5, ge=0)
    idle_retry_max_s: float = Field(30.0, gt=0)

    # matching
    ban_below: float = Field(0.2, ge=0, le=1)
    dispatch_batch: int = Field(256, ge=1)
    dispatch_tick_s: float = Field(0.2, gt=0)
    sweep_interval_s: float = Field(1.0, gt=0)

    # verification
    verify_timeout_s: float = Field(60.0, gt=0)
    verify_workers: int = Field(
        16,
        ge=1,
        le=256,
        description="outputs the leader's verifier fetches from IPFS at once (each check waits "
        "on the provider's IPFS node; one slow output holds up no other)",
    )
    verify_patience_s: float = Field(
        300.0,
        ge=0,
        description="how long an output the verifier's IPFS node cannot fetch is tried again "
        "(backing off) before the attempt is rejected: a network blip between the verifier and "
        "the provider's node is not the provider's fault; 0 rejects at the first miss",
    )
    duties: list[Duty] = Field(
        default_factory=lambda: list(DUTIES),
        description="the leader duties this replica takes when no other replica holds them: "
        "chain (the chain watcher, the outbox, the spec fetcher) and verify (the verifier); "
        "each has its own lock on PostgreSQL, so a busy grid runs them in processes of their "
        "own ([] : a replica that only serves the API). SQLite: both (one replica)",
    )
    work_dir: Path = Path(".run/scheduler-work")
    image_registries: list[str] = Field(
        default_factory=lambda: ["public"],
        description="registries a job's image may name (else the job goes invalid at spec "
        "intake): `public` (any but loopback, private, link-local, metadata and other non-public "
        "addresses, judged by the name, without DNS) and host or host:port entries allowed "
        "whatever their address (a devnet's registry)",
    )

    # market
    base_rate_wei_per_hour: int = Field(10**14, ge=0)
    base_rates: dict[str, int] = Field(
        default_factory=lambda: {"tUSD": 300_000},
        description="listed token symbol -> the market's base rate in that token's smallest "
        "units per GPU-hour, for quotes in it (POST /v1/quote with a token); a token without "
        "one is quoted from the online nodes' floors in it alone",
    )
    quote_floors_ttl_s: float = Field(
        10.0,
        ge=0,
        description="how long a quote in a token reuses the online nodes' floors in it it read "
        "(one pass over the node rows); 0: read them for every quote",
    )

    # request limits (gridmarket/http_guard.py; docs/operator.md)
    max_body_bytes: int = Field(1024**2, ge=1, description="request body cap (413 past it)")
    body_limits: dict[str, int] = Field(
        default_factory=lambda: {"/v1/quote": 64 * 1024, "/v1/nodes/register": 64 * 1024},
        description="path prefix -> body cap in bytes, over max_body_bytes",
    )
    rate_limit_per_s: float = Field(
        20.0, ge=0, description="unauthenticated requests per second per client; 0: no limit"
    )
    rate_limit_burst: int = Field(60, ge=1, description="bucket size of the per-client limit")
    rate_limit_exempt: list[str] = Field(
        default_factory=lambda: ["127.0.0.1", "::1"],
        description="client addresses never rate-limited (the local front end, benches)",
    )

    # what only operators should see (docs/operator.md)
    docs_enabled: bool = Field(True, description="serve /docs, /redoc and /openapi.json")
    metrics_token: SecretStr | None = Field(
        None, description="when set, /metrics needs 'Authorization: Bearer <token>'"
    )

    @field_validator("image_registries")
    @classmethod
    def _registries(cls, value: list[str]) -> list[str]:
        from gridmarket.registry_policy import RegistryPolicy

        RegistryPolicy.of(value, "image_registries")  # ValueError naming a bad entry
        return value
