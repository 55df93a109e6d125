"""The agent's configuration: one :class:`AgentConfig`, from a file, the environment and flags.

Sources, highest priority first:

1. values passed to :func:`load_config` (the CLI's flags);
2. environment variables ``GRIDMARKET_AGENT_<FIELD>`` (e.g. ``GRIDMARKET_AGENT_SCHEDULER_URL``;
   lists as JSON: ``GRIDMARKET_AGENT_EXECUTORS='["wasm"]'``);
3. a TOML (``.toml``) or YAML (``.yaml``/``.yml``) file, given as ``--config`` or
   ``GRIDMARKET_AGENT_CONFIG``, whose keys are the field names below;
4. the defaults.

An unknown key in the file is an error naming it (a typo must not silently fall back to a
default). Nothing else in the agent reads ``os.environ``.
"""

from __future__ import annotations

import re
import socket
import tomllib
from contextvars import ContextVar
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from agent.errors import AgentError
from gridmarket.tiers import REGIONS
from gridmarket.wire import MAX_PRICE_FLOORS, ExecutorKind

if TYPE_CHECKING:
    from gridmarket.token import Token

__all__ = [
    "DEFAULT_HOME",
    "AgentConfig",
    "ConfigError",
    "default_node_name",
    "load_config",
    "multiaddr_to_url",
]

ENV_PREFIX = "GRIDMARKET_AGENT_"
DEFAULT_HOME = Path("~/.gridmarket")
_GiB = 1024**3
_DOCKER_SCHEMES = ("unix", "tcp", "http", "https", "ssh")
_NAME_BAD = re.compile(r"[^A-Za-z0-9._-]+")


class ConfigError(AgentError, ValueError):
    """The configuration is invalid or incomplete; the message names the field."""


def default_node_name() -> str:
    """This host's name, made to fit the registration's node-name rule (``[A-Za-z0-9._-]``)."""
    name = _NAME_BAD.sub("-", socket.gethostname()).strip("-._")[:64]
    return name or "gridmarket-node"


def multiaddr_to_url(addr: str) -> str:
    """``/ip4/127.0.0.1/tcp/5001/http`` -> ``http://127.0.0.1:5001``.

    Accepts ``ip4``, ``ip6``, ``dns``, ``dns4``, ``dns6`` hosts, a ``tcp`` port and an optional
    ``http``/``https`` suffix (``http`` when absent). ValueError naming the address otherwise.
    """
    parts = addr.strip("/").split("/")
    if len(parts) not in (4, 5) or parts[2] != "tcp":
        raise ValueError(f"not a TCP multiaddr like /ip4/127.0.0.1/tcp/5001/http: {addr!r}")
    proto, host, _, port = parts[:4]
    scheme = parts[4] if len(parts) == 5 else "http"
    if proto not in ("ip4", "ip6", "dns", "dns4", "dns6") or scheme not in ("http", "https"):
        raise ValueError(f"unsupported multiaddr {addr!r} (need ip4/ip6/dns, tcp, http/https)")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad TCP port {port!r} in multiaddr {addr!r}")
    if proto == "ip6":
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


_FILE_VALUES: ContextVar[dict[str, Any] | None] = ContextVar("gridmarket_agent_file", default=None)


class _FileSource(PydanticBaseSettingsSource):
    """The values read from the config file by :func:`load_config` (lowest-priority source)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return (_FILE_VALUES.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE_VALUES.get() or {})


class AgentConfig(BaseSettings):
    """Everything the provider agent needs to know. Paths may start with ``~``."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        validate_default=True,
        case_sensitive=False,
        populate_by_name=True,
    )

    # where to talk to
    scheduler_url: str = Field(
        "http://127.0.0.1:8000", description="base URL of the scheduler's API (http or https)"
    )
    ipfs_api: str = Field(
        "/ip4/127.0.0.1/tcp/5001/http", description="multiaddr of the IPFS daemon's RPC API"
    )
    docker_host: str | None = Field(
        None,
        validation_alias=AliasChoices("docker_host", f"{ENV_PREFIX}DOCKER_HOST", "DOCKER_HOST"),
        description="Docker engine, e.g. unix:///run/docker.sock (also read from DOCKER_HOST)",
    )

    # identity
    keystore: Path = Field(DEFAULT_HOME / "keystore.json", description="encrypted key file")
    password: SecretStr | None = Field(None, description="keystore password (prefer the file)")
    password_file: Path | None = Field(None, description="file holding the keystore password")

    # what this node offers
    name: str = Field(
        default_factory=default_node_name, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
    )
    region: str | None = Field(None, description="pricing region code (gridmarket.tiers)")
    price_floor_wei_per_hour: int = Field(0, ge=0, lt=2**96)
    price_floors: dict[str, Decimal] = Field(
        default_factory=dict,
        max_length=MAX_PRICE_FLOORS,
        description="jobs paid in a listed ERC-20: token symbol (the deployment's `tokens`) or "
        "address -> the lowest price per GPU-hour (job-hour without GPUs) in that token, e.g. "
        '{tUSD: "0.50"}; a token without a floor is not taken (needs deployment)',
    )
    slots: int = Field(1, ge=1, le=64, description="jobs run at the same time")
    executors: list[ExecutorKind] | None = Field(
        None, description="executors to serve; default: wasm, plus docker when the engine answers"
    )
    cpu_cores: int | None = Field(None, ge=1, description="cores offered (default: all logical)")
    ram_mib: int | None = Field(None, ge=64, description="RAM offered (default: all)")

    # local resources and limits
    work_dir: Path = Field(DEFAULT_HOME / "work", description="per-job directories live here")
    max_dataset_bytes: int = Field(
        64 * _GiB, ge=1, description="this node's own cap on a dataset, below the job's own cap"
    )
    max_module_bytes: int = Field(256 * 1024**2, ge=1, description="cap on a WASM module")
    # image pulls (agent/executors/_pull.py): only host[:port]/name@sha256:<hex> is pulled
    pull_images: bool = Field(True, description="pull images named by digest the engine lacks")
    pull_max_bytes: int = Field(4 * _GiB, ge=1, description="largest download (layers + config)")
    pull_max_image_bytes: int = Field(16 * _GiB, ge=1, description="largest image once unpacked")
    pull_timeout_s: float = Field(600.0, gt=0, description="time limit of one pull")
    image_cache_bytes: int = Field(50 * _GiB, ge=1, description="pulled images kept (LRU beyond)")
    registry_auth_file: Path | None = Field(
        None, description="a Docker config.json whose `auths` hold registry credentials"
    )
    pull_registries: list[str] = Field(
        default_factory=lambda: ["public"],
        description="registries images are pulled from: `public` (any on public addresses "
        "only) and host or host:port entries allowed whatever their address (e.g. a LAN "
        "mirror); loopback, private, link-local and metadata addresses are otherwise refused",
    )

    # the pull loop
    heartbeat_interval_s: float | None = Field(
        None, gt=0, description="override the scheduler's heartbeat interval"
    )
    poll_wait_s: float = Field(20.0, gt=0, le=300, description="longest long-poll to ask for")
    stop_grace_s: float = Field(
        60.0, ge=0, description="on SIGTERM, how long running jobs may finish before cancelling"
    )
    report_flush_s: float = Field(
        30.0, ge=0, description="on shutdown, how long to keep retrying unsent results"
    )
    request_timeout_s: float = Field(15.0, gt=0, description="timeout of one API request")
    backoff_base_s: float = Field(0.5, gt=0)
    backoff_cap_s: float = Field(60.0, gt=0)

    # chain (`register --stake`, and results submitted on-chain by the node itself)
    rpc_url: str | None = Field(None, description="Ethereum JSON-RPC URL for on-chain staking")
    deployment: Path | None = Field(None, description="deployment JSON written by the deploy step")
    submit_on_chain: bool = Field(
        False,
        description="submit each result on-chain from this wallet (pays gas) before reporting it",
    )
    guard_results: bool = Field(
        True,
        description="with rpc_url and deployment: submit a result on-chain from this wallet "
        "when the scheduler has not relayed it after guard_delay_s",
    )
    hold_margin_s: int | None = Field(
        None,
        ge=0,
        lt=2**32,
        description="seconds a job's hold must leave after the run's timeout to post the result "
        "(default: the deployment file's hold_margin_s, else 300; the scheduler offers the "
        "same margin)",
    )
    guard_delay_s: float | None = Field(
        None,
        gt=0,
        description="how long the scheduler gets to relay a result (default: half the "
        "deployment's reassign_delay, else 60 s; never past 60 s before the job's holdUntil "
        "or its deadline)",
    )
    finalize_interval_s: float = Field(
        300.0,
        ge=0,
        description="with rpc_url and deployment: how often to finalize this wallet's results "
        "whose challenge window passed (0: never)",
    )

    # acceptance policy (what the node signs before a job is assigned to it on-chain)
    accepted_mediators: list[str] = Field(
        default_factory=list,
        description="the allow-list of mediators to accept; empty (default): the deployment's "
        "listed ones (its file's mediator, or isListedMediator on-chain with rpc_url)",
    )
    accept_self_mediated: bool = Field(
        False,
        description="accept jobs whose mediator is their submitter (off: such a submitter "
        "could rule an honest result wrong and take the collateral)",
    )
    max_collateral_wei: int | None = Field(
        None,
        ge=0,
        lt=2**96,
        description="largest collateral one ETH job may lock (default: no cap)",
    )
    stake_tokens: dict[str, Decimal] = Field(
        default_factory=dict,
        description="stake kept in listed ERC-20 tokens (the collateral of jobs paid in them): "
        'symbol or address -> amount, e.g. {tUSD: "100"}; `register` stakes it and `run` tops '
        "it up at start (needs deployment, and rpc_url to stake)",
    )

    _tokens: dict[str, Token] = PrivateAttr(default_factory=dict)
    _floor_units: dict[str, int] = PrivateAttr(default_factory=dict)
    _stake_units: dict[str, int] = PrivateAttr(default_factory=dict)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags, then the environment, then the config file (no .env, no secrets dir)."""
        return (init_settings, env_settings, _FileSource(settings_cls))

    @field_validator("scheduler_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"must be an http(s) URL like http://127.0.0.1:8000, not {value!r}")
        return value.rstrip("/")

    @field_validator("region")
    @classmethod
    def _known_region(cls, value: str | None) -> str | None:
        if value is not None and value not in REGIONS:
            raise ValueError(f"unknown region {value!r}; use one of {', '.join(sorted(REGIONS))}")
        return value

    @field_validator("docker_host")
    @classmethod
    def _docker_url(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            return None
        if value is not None and urlsplit(value).scheme not in (
            "unix",
            "tcp",
            "http",
            "https",
            "ssh",
        ):
            raise ValueError(f"must be unix:///path, tcp://host:port or ssh://..., not {value!r}")
        return value

    @field_validator("ipfs_api")
    @classmethod
    def _multiaddr(cls, value: str) -> str:
        multiaddr_to_url(value)
        return value

    @field_validator("keystore", "password_file", "work_dir", "deployment", "registry_auth_file")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser()

    @field_validator("accepted_mediators")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        from gridmarket.wire import checksum

        return [checksum(v) for v in value]

    @field_validator("pull_registries")
    @classmethod
    def _registries(cls, value: list[str]) -> list[str]:
        from gridmarket.registry_policy import RegistryPolicy

        RegistryPolicy.of(value, "pull_registries")  # ValueError naming a bad entry
        return value

    @field_validator("executors")
    @classmethod
    def _unique(cls, value: list[ExecutorKind] | None) -> list[ExecutorKind] | None:
        if value is not None and (not value or len(set(value)) != len(value)):
            raise ValueError("list docker and/or wasm, each at most once")
        return value

    @model_validator(mode="after")
    def _backoff(self) -> AgentConfig:
        if self.backoff_cap_s < self.backoff_base_s:
            raise ValueError("backoff_cap_s must be >= backoff_base_s")
        if self.submit_on_chain and (self.rpc_url is None or self.deployment is None):
            raise ValueError("submit_on_chain needs rpc_url and deployment")
        return self

    @model_validator(mode="after")
    def _token_amounts(self) -> AgentConfig:
        """Resolve ``price_floors`` and ``stake_tokens`` against the deployment's listed tokens
        (symbol or address), each amount to the token's smallest units."""
        if not self.price_floors and not self.stake_tokens:
            return self
        if self.deployment is None:
            used = " and ".join(k for k in ("price_floors", "stake_tokens") if getattr(self, k))
            raise ValueError(f"{used} name tokens: set deployment (the file listing them)")
        self._tokens = _listed_tokens(self.deployment)
        for field_name, out in (
            ("price_floors", self._floor_units),
            ("stake_tokens", self._stake_units),
        ):
            for key, amount in getattr(self, field_name).items():
                token = _resolve_token(self._tokens, field_name, key)
                try:
                    units = token.to_units(amount)
                except ValueError as exc:
                    raise ValueError(f"{field_name}.{key}: {exc}") from None
                if units >= 2**96:
                    raise ValueError(f"{field_name}.{key}: {amount} {token.symbol} is too large")
                if token.address in out:
                    raise ValueError(f"{field_name}.{key}: {token.symbol} is named twice")
                out[token.address] = units
        return self

    def require_region(self) -> str:
        """The region, which registering needs; ConfigError saying how to set it."""
        if self.region is None:
            raise ConfigError(
                f"region is not set: set {ENV_PREFIX}REGION or `region` in the config file "
                f"to one of {', '.join(sorted(REGIONS))}"
            )
        return self.region

    @property
    def tokens(self) -> dict[str, Token]:
        """The deployment's listed tokens by symbol (ETH included) when ``price_floors`` or
        ``stake_tokens`` is set, else empty."""
        return dict(self._tokens)

    @property
    def token_floors(self) -> dict[str, int]:
        """``price_floors`` resolved: token address -> smallest units per hour (the wire's
        ``NodeCapacityIn.price_floors``)."""
        return dict(self._floor_units)

    @property
    def token_stakes(self) -> dict[str, int]:
        """``stake_tokens`` resolved: token address -> smallest units to keep staked."""
        return dict(self._stake_units)

    def token(self, address: str) -> Token:
        """The listed token at ``address`` (unknown ones show by address, 18 decimals)."""
        from gridmarket.token import ETH_TOKEN, by_address

        if int(address, 16) == 0:
            return ETH_TOKEN
        return by_address(self._tokens, address)

    @property
    def ipfs_url(self) -> str:
        """The IPFS RPC API as an http(s) URL."""
        return multiaddr_to_url(self.ipfs_api)

    def read_password(self) -> str | None:
        """The keystore password: ``password``, else the first line of ``password_file``."""
        if self.password is not None:
            return self.password.get_secret_value()
        if self.password_file is None:
            return None
        try:
            text = self.password_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"password_file {self.password_file}: {exc.strerror}") from None
        lines = text.splitlines()
        return lines[0] if lines else ""


def _listed_tokens(deployment: Path) -> dict[str, Token]:
    """The tokens the deployment file lists (``tokens``), ETH included, by symbol."""
    import json

    from gridmarket.token import tokens_of

    try:
        body = json.loads(deployment.read_text(encoding="utf-8"))
        listed = body.get("tokens") or {}
        if not isinstance(listed, dict):
            raise TypeError("tokens is not a mapping")
        return tokens_of(listed)
    except OSError as exc:
        raise ValueError(f"deployment {deployment}: {exc.strerror}") from None
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"deployment {deployment}: unreadable tokens ({exc})") from None


def _resolve_token(tokens: dict[str, Token], field_name: str, key: str) -> Token:
    """The listed token ``key`` names (its symbol, any case, or its address); ValueError naming
    ``field_name.key`` otherwise. ETH is refused: its floor and stake have their own settings."""
    from gridmarket.token import ETH

    found: Token | None = tokens.get(key)
    if found is None and re.fullmatch(r"0x[0-9a-fA-F]{40}", key):
        found = next((t for t in tokens.values() if t.address.lower() == key.lower()), None)
    if found is None:
        same = [t for s, t in tokens.items() if s.lower() == key.lower()]
        found = same[0] if len(same) == 1 else None
    if found is None:
        names = ", ".join(s for s in tokens if s != ETH) or "none"
        raise ValueError(f"{field_name}.{key}: not a token the deployment lists (listed: {names})")
    if found.is_eth:
        other = "price_floor_wei_per_hour" if field_name == "price_floors" else "register --stake"
        raise ValueError(f"{field_name}.{key}: ETH is not a token here; use {other}")
    return found


def read_config_file(path: Path) -> dict[str, Any]:
    """The mapping in a TOML or YAML file (by extension); ConfigError naming the file."""
    path = path.expanduser()
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            data: Any = tomllib.loads(raw.decode("utf-8"))
        elif suffix in (".yaml", ".yml"):
            import yaml  # only when a YAML file is used

            data = yaml.safe_load(raw) or {}
        else:
            raise ConfigError(f"config file {path}: use a .toml, .yaml or .yml file")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except ConfigError:
        raise
    except Exception as exc:  # yaml.YAMLError and friends
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    values: dict[str, Any] = {str(k).replace("-", "_"): v for k, v in data.items()}
    unknown = sorted(set(values) - set(AgentConfig.model_fields))
    if unknown:
        raise ConfigError(f"config file {path}: unknown setting(s) {', '.join(unknown)}")
    return values


def load_config(path: Path | None = None, **overrides: Any) -> AgentConfig:
    """Build the configuration from ``overrides`` > environment > the file at ``path`` > defaults.

    ``overrides`` whose value is ``None`` are ignored (an unset CLI flag). Raises
    :class:`ConfigError` with every bad field named.
    """
    file_values = read_config_file(path) if path is not None else {}
    token = _FILE_VALUES.set(file_values)
    try:
        return AgentConfig(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(f"invalid configuration: {_describe(exc)}") from None
    finally:
        _FILE_VALUES.reset(token)


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"])
        msg = str(error["msg"]).removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts)
