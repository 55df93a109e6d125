"""The front end's configuration (environment prefix ``GRIDMARKET_FRONTEND_``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gridmarket.registry_policy import RegistryPolicy


class Settings(BaseSettings):
    """Where the front end finds the scheduler, the chain and IPFS, and a few limits.

    The escrow is found through ``deployment_file`` only (written by ``gridmarket-deploy``), like
    every other component. ``explorer_url`` is a public block explorer (e.g.
    ``https://sepolia.etherscan.io``): when set, addresses and transactions also link there.
    """

    model_config = SettingsConfigDict(env_prefix="GRIDMARKET_FRONTEND_", extra="ignore")

    scheduler_url: str = "http://127.0.0.1:8700"
    rpc_url: str = "http://127.0.0.1:8545"
    deployment_file: Path = Path("deployments/local.json")
    ipfs_api: str = "/ip4/127.0.0.1/tcp/5001/http"
    explorer_url: str | None = None
    registry: str | None = Field(
        None,
        description="the OCI registry (host[:port]) submitters' image tags resolve against: "
        "advertised in /api/info, the CLI pins a tag to its digest there before funding; "
        "allowed for job images like the image_registries entries",
    )
    image_registries: list[str] = Field(
        default_factory=lambda: ["public"],
        description="registries a job's image may name: `public` (any but loopback, private, "
        "link-local, metadata and other non-public addresses, judged by the name, without "
        "DNS) and host or host:port entries allowed whatever their address",
    )

    request_timeout_s: float = Field(10.0, gt=0, description="one scheduler or RPC request")
    ipfs_timeout_s: float = Field(20.0, gt=0, description="finding a CID on IPFS")
    index_min_interval_s: float = Field(
        0.5, ge=0, description="the chain index is read again at most this often"
    )
    log_chunk_blocks: int = Field(5000, ge=1, description="blocks per eth_getLogs request")
    stream_poll_s: float = Field(1.0, gt=0, description="how often a job's live page polls")
    stream_max_s: float = Field(
        600.0, gt=0, description="a live stream closes after this long (the browser reconnects)"
    )
    streams_per_client: int = Field(
        8, ge=1, description="live job streams one client address holds open (429 past it)"
    )
    stream_ping_s: float = Field(
        15.0, gt=0, description="a live stream without news sends a comment line this often"
    )
    upload_max_bytes: int = Field(256 * 1024**2, ge=1, description="dataset or module upload cap")
    download_max_bytes: int = Field(1024**3, ge=1, description="cap on what the IPFS proxy serves")

    download_cache_bytes: int = Field(
        2 * 1024**3, ge=1, description="disk budget of the IPFS proxy's cache (LRU eviction)"
    )
    download_cache_grace_s: float = Field(
        30.0, ge=0, description="a cache entry used this recently is not evicted (being served)"
    )
    public_base_url: str | None = Field(
        None, description="the site's public URL (https://host): redirects and origin checks"
    )
    docs_enabled: bool = Field(True, description="serve /api/docs and /api/openapi.json")
    wait_threads: int = Field(
        64, ge=1, description="threads for blocking waits (IPFS reads), apart from page work"
    )
    waits_per_client: int = Field(
        8, ge=1, description="waiting requests (IPFS reads, receipts) per client at once"
    )

    # request limits (gridmarket/http_guard.py; docs/operator.md)
    max_body_bytes: int = Field(
        1024**2, ge=1, description="request body cap (413 past it); uploads: upload_max_bytes"
    )
    body_limits: dict[str, int] = Field(
        default_factory=dict, description="path prefix -> body cap in bytes, over the above"
    )
    rate_limit_per_s: float = Field(20.0, ge=0, description="requests per second per client")
    rate_limit_burst: int = Field(120, ge=1, description="bucket size of the per-client limit")
    rate_limit_exempt: list[str] = Field(
        default_factory=lambda: ["127.0.0.1", "::1"],
        description="client addresses never rate-limited",
    )

    # slow clients (gridmarket/conn_guard.py; docs/frontend.md); 0 turns one off
    conn_per_client: int = Field(
        16, ge=0, description="open connections per client address (429 past it)"
    )
    header_timeout_s: float = Field(
        10.0, ge=0, description="a request's line and headers must arrive within this (408)"
    )
    max_header_bytes: int = Field(65536, ge=0, description="request line and headers (431)")
    body_timeout_s: float = Field(
        30.0, ge=0, description="a request body's time, plus 1 s per body_min_bytes_per_s (408)"
    )
    body_min_bytes_per_s: float = Field(
        65536.0, ge=0, description="the slowest body rate accepted past body_timeout_s"
    )

    @field_validator("scheduler_url", "rpc_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http(s) URL, got {value!r}")
        return value.rstrip("/")

    @field_validator("image_registries")
    @classmethod
    def _registries(cls, value: list[str]) -> list[str]:
        RegistryPolicy.of(value, "image_registries")  # ValueError naming a bad entry
        return value

    def registry_policy(self) -> RegistryPolicy:
        """The registries a job's image may name: ``image_registries`` and ``registry``."""
        extra = [self.registry] if self.registry else []
        return RegistryPolicy.of([*self.image_registries, *extra], "image_registries")

    @field_validator("explorer_url", "public_base_url")
    @classmethod
    def _optional_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        return cls._http_url(value)
