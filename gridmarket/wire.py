"""The wire between scheduler, agent and submitter tools: one module, so they cannot drift.

Three kinds of document live here:

* :class:`JobSpec`: what a submitter asks for. It is stored on IPFS as JSON (``spec.json``); the
  on-chain ``createJob`` commits to its CID, so neither the scheduler nor a provider can change
  what was paid for.
* Node messages: :class:`NodeRegistration` (signed with the provider's wallet, EIP-712
  ``NodeRegistration``, see :func:`registration_typed_data`), heartbeats, assignments and results.
* :data:`API` paths, shared by the FastAPI routers and the clients.

Amounts are wei (ints; JSON carries them as strings only where a browser would lose precision:
pydantic accepts both). Memory and disk are MiB. Times are Unix seconds (floats where sub-second).

Why one module of ~800 lines: it is one concept, the protocol between the parts, and its
documents share the small types, limits and strict config above them; both ends import this one
file, so a change to the wire is one diff, reviewed in one place (split into files, a message and
the type it relies on could be changed apart).
"""

from __future__ import annotations

import hashlib
import json
import re
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from gridmarket.checkpoints import CheckpointPolicy, CheckpointRef
from gridmarket.cid import CidError, normalize_cid
from gridmarket.cuda import ComputeCapability, CudaVersion
from gridmarket.eip712 import DOMAIN_TYPE
from gridmarket.escrow import MAX_WEI, ZERO_ADDRESS, Job
from gridmarket.ethsig import Signer, is_hex_address, sign_typed_data, to_checksum_address
from gridmarket.tiers import REGIONS, TIERS

__all__ = [
    "API",
    "MAX_ADVERTISED_IMAGES",
    "PINNED_IMAGE_PATTERN",
    "SPEC_VERSION",
    "AcceptAck",
    "AcceptRequest",
    "Assignment",
    "ExecutorKind",
    "GpuGroup",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "IdleAdvice",
    "JobLimits",
    "JobResources",
    "JobSpec",
    "JobTerms",
    "NodeCapacityIn",
    "NodeRegistration",
    "QuoteRequest",
    "RegisterRequest",
    "RegisterResponse",
    "ResultAck",
    "ResultReport",
    "RunReason",
    "SchedulerInfo",
    "capacity_digest",
    "offered_price_wei_per_hour",
    "recover_registration_signer",
    "registration_typed_data",
    "sign_registration",
]

SPEC_VERSION = 1
MAX_SPEC_BYTES = 64 * 1024
"""A job spec document larger than this is refused (the watcher reads it from IPFS)."""

MAX_LOG_CHARS = 64 * 1024
"""Each of stdout/stderr tails a result may carry."""


class API:
    """URL paths of the scheduler's API (prefix included)."""

    PREFIX = "/v1"
    INFO = "/v1/info"
    REGISTER = "/v1/nodes/register"
    NODES = "/v1/nodes"
    NODE = "/v1/nodes/{node_id}"
    HEARTBEAT = "/v1/nodes/{node_id}/heartbeat"
    NEXT_JOB = "/v1/nodes/{node_id}/next-job"
    RESULT = "/v1/nodes/{node_id}/jobs/{job_id}/result"
    HAND_BACK = "/v1/nodes/{node_id}/jobs/{job_id}/hand-back"
    ACCEPT = "/v1/nodes/{node_id}/jobs/{job_id}/accept"
    JOBS = "/v1/jobs"
    JOB = "/v1/jobs/{job_id}"
    SPOT = "/v1/jobs/{job_id}/spot"
    """A spot job's policy and, once it is settled, its revealed seed (GET); POST a reveal."""
    QUOTE = "/v1/quote"
    METRICS = "/metrics"
    HEALTH = "/healthz"


def _strict() -> ConfigDict:
    return ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


# --------------------------------------------------------------------------- small types

Address = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{40}$")]
HexBytes32 = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{64}$")]
HexSignature = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{130}$")]
Region = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,31}$")]
NodeName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
Wei = Annotated[int, Field(ge=0, le=MAX_WEI)]
LogTail = Annotated[str, StringConstraints(strip_whitespace=False, max_length=MAX_LOG_CHARS)]
"""Log text is kept as the job wrote it (the models strip other strings)."""

MAX_PRICE_FLOORS = 8
"""Most ERC-20 tokens a node may name a price floor for."""
MAX_ADVERTISED_IMAGES = 64
"""Cached images a node may advertise (registration or heartbeat); an agent with more sends
its most recently used ones."""
PINNED_IMAGE_PATTERN = (
    r"^(?:[a-z0-9-]+(?:\.[a-z0-9-]+)+(?::[0-9]{1,5})?|[a-z0-9-]+:[0-9]{1,5}|localhost)"
    r"/[a-z0-9]+(?:(?:[._]|__|-+|/)[a-z0-9]+)*@sha256:[0-9a-f]{64}$"
)
PinnedImage = Annotated[str, StringConstraints(max_length=255, pattern=PINNED_IMAGE_PATTERN)]
"""An image a node has, as jobs name it: ``host[:port]/name@sha256:<64 hex>`` (the form
:func:`gridmarket.images.parse_pinned` accepts), at most 255 characters."""


def _cid(value: str) -> str:
    try:
        normalize_cid(value)
    except CidError as exc:
        raise ValueError(f"not a valid CID: {exc}") from None
    return value


def checksum(address: str) -> str:
    """EIP-55 form of a 0x address; ValueError naming the value if it is not one."""
    if not is_hex_address(address):
        raise ValueError(f"not a 0x address: {address!r}")
    return to_checksum_address(address)


class ExecutorKind(StrEnum):
    DOCKER = "docker"
    WASM = "wasm"


# --------------------------------------------------------------------------- job spec

_IMAGE_RE = re.compile(r"^[a-z0-9]+([._/:@-][A-Za-z0-9_.-]+)*$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_PINNED_RE = re.compile(r"@sha256:[0-9a-f]{64}$")
MAX_EXCLUDED = 32
"""The most provider wallets a job spec may exclude (``exclude_providers``)."""


class JobResources(BaseModel):
    """What one node must offer to run the job. VRAM is per GPU."""

    model_config = _strict()

    gpu_count: int = Field(0, ge=0, le=16)
    min_vram_mib: int = Field(0, ge=0, le=1024 * 1024)
    gpu_models: list[str] | None = Field(None, min_length=1, max_length=32)
    cpu_cores: int = Field(1, ge=1, le=512)
    ram_mib: int = Field(512, ge=16, le=8 * 1024 * 1024)
    disk_mib: int = Field(1024, ge=0, le=64 * 1024 * 1024)
    region: Region | None = None
    min_cuda: CudaVersion | None = None
    """The least CUDA version the node's driver must support, ``"12.2"`` (gridmarket.cuda)."""
    min_compute_capability: ComputeCapability | None = None
    """The least compute capability of every GPU the job uses, ``"8.0"``."""

    @model_validator(mode="after")
    def _gpu_fields_need_gpus(self) -> JobResources:
        if self.gpu_count == 0 and (
            self.min_vram_mib or self.gpu_models or self.min_cuda or self.min_compute_capability
        ):
            raise ValueError(
                "min_vram_mib, gpu_models, min_cuda and min_compute_capability need gpu_count > 0"
            )
        return self


class JobLimits(BaseModel):
    """Terms the run and its result must stay within (checked by agent and scheduler)."""

    model_config = _strict()

    timeout_s: int = Field(600, ge=1, le=7 * 24 * 3600)
    output_max_bytes: int = Field(256 * 1024 * 1024, ge=1, le=64 * 1024**3)
    dataset_max_bytes: int = Field(1024 * 1024 * 1024, ge=1, le=256 * 1024**3)
    pids: int = Field(256, ge=8, le=65536)


class SpotCheck(BaseModel):
    """A spot-checked job's policy and hidden draw (:mod:`gridmarket.spot`, docs/trust.md): each
    attempt is re-run by a second provider with probability ``p_bps`` / 10,000; which attempts
    are drawn is fixed by a seed the submitter committed to (``commit``) and sealed to the
    job's mediator (``sealed``), revealed once the job is settled. The on-chain job must carry
    ``FLAG_SPOT`` (a check deposit of its bounty) and a collateral of at least
    :func:`gridmarket.spot.min_collateral`."""

    model_config = _strict()

    p_bps: int = Field(ge=1, le=10_000)
    commit: HexBytes32
    sealed: Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{186}$")]

    @property
    def commit_bytes(self) -> bytes:
        return bytes.fromhex(self.commit[2:])

    @property
    def sealed_bytes(self) -> bytes:
        return bytes.fromhex(self.sealed[2:])


class SpotReveal(BaseModel):
    """``POST API.SPOT``: the seed of a settled spot job (anyone holding it may post it: the
    submitter's client or the mediator). The scheduler checks it against the spec's commitment
    and refuses it while the job can still be assigned again (a seed seen early would tell the
    next provider whether its attempt is checked)."""

    model_config = _strict()

    seed: HexBytes32


class SpotStatus(BaseModel):
    """``GET API.SPOT``: a spot job's policy from its spec, and once revealed the seed and the
    attempts it draws for a check (recomputable by anyone: :func:`gridmarket.spot.checked`)."""

    model_config = _strict()

    job_id: HexBytes32
    p_bps: int = Field(ge=1, le=10_000)
    commit: HexBytes32
    attempts: int = Field(ge=0, lt=2**16)
    """Assignments the job has had (the on-chain ``attempt``)."""
    seed: HexBytes32 | None = None
    checked_attempts: list[int] | None = None
    """The attempts the revealed seed draws for a check (None until revealed)."""


class JobSpec(BaseModel):
    """A job as the submitter specifies it (the JSON document whose CID goes on-chain).

    Exactly one of ``image`` (executor ``docker``) or ``module_cid`` (executor ``wasm``: the CID
    of a ``.wasm`` WASI command on IPFS). ``dataset_cid`` is mounted read-only at ``/input``; the
    job writes its result under ``/output``. The price the job offers per GPU-hour is what its
    on-chain bounty pays for the whole timeout (:func:`offered_price_wei_per_hour`).
    """

    model_config = _strict()

    version: Literal[1] = 1
    name: str = Field("job", min_length=1, max_length=80)
    executor: ExecutorKind
    image: str | None = Field(None, max_length=255)
    module_cid: str | None = None
    command: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list, max_length=256
    )
    env: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict, max_length=64
    )
    dataset_cid: str | None = None
    resources: JobResources = Field(default_factory=lambda: JobResources())
    limits: JobLimits = Field(default_factory=lambda: JobLimits())
    max_attempts: int = Field(3, ge=1, le=10)
    deterministic: bool = False
    """The submitter declares that the job's output depends only on its inputs, so two runs
    give the same output CID (docs/submitter.md). A Docker job may declare it only with an
    image pinned by digest (``...@sha256:<64 hex>``); a WASM job is deterministic whether it
    says so or not (:attr:`comparable`). Only comparable jobs are re-run on a dispute."""
    exclude_providers: list[Address] = Field(default_factory=list, max_length=MAX_EXCLUDED)
    """Provider wallets that may not take the job (the mediator's re-run excludes the disputed
    provider and the disputing submitter). The scheduler honours it when it matches and when
    a node accepts; the escrow does not know of it."""
    spot: SpotCheck | None = None
    """Spot checks (:class:`SpotCheck`); only a comparable job may ask for them."""
    checkpoint: CheckpointPolicy | None = None
    """The job keeps its state in ``/checkpoint``; the agent copies it on an interval and the
    next attempt starts from the newest copy (:mod:`gridmarket.checkpoints`). Docker jobs."""

    @field_validator("module_cid", "dataset_cid")
    @classmethod
    def _valid_cid(cls, value: str | None) -> str | None:
        return None if value is None else _cid(value)

    @field_validator("image")
    @classmethod
    def _valid_image(cls, value: str | None) -> str | None:
        if value is not None and not _IMAGE_RE.match(value):
            raise ValueError(f"not a Docker image reference: {value!r}")
        return value

    @field_validator("env")
    @classmethod
    def _valid_env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if not _ENV_KEY_RE.match(key):
                raise ValueError(f"bad environment variable name {key!r}")
            if "\0" in item:
                raise ValueError(f"environment variable {key} holds a NUL byte")
        return value

    @model_validator(mode="after")
    def _one_workload(self) -> JobSpec:
        if self.executor is ExecutorKind.DOCKER:
            if self.image is None or self.module_cid is not None:
                raise ValueError("a docker job needs image (and no module_cid)")
        elif self.module_cid is None or self.image is not None:
            raise ValueError("a wasm job needs module_cid (and no image)")
        if self.executor is ExecutorKind.WASM and self.resources.gpu_count:
            raise ValueError("a wasm job cannot ask for GPUs")
        if (
            self.deterministic
            and self.executor is ExecutorKind.DOCKER
            and not _PINNED_RE.search(self.image or "")
        ):
            raise ValueError(
                f"a deterministic docker job must pin its image by digest "
                f"(name@sha256:<64 hex>), not {self.image!r}"
            )
        if self.checkpoint is not None and self.executor is not ExecutorKind.DOCKER:
            raise ValueError("checkpoint: only docker jobs can checkpoint (not wasm)")
        if self.spot is not None and not self.comparable:
            raise ValueError(
                "spot checks need a job whose honest runs agree: a wasm job, or a docker job "
                "that declares deterministic (image pinned by digest)"
            )
        return self

    @property
    def comparable(self) -> bool:
        """Whether two honest runs give the same output CID, so that a re-run can judge a
        result: every WASM job (the agent runs WASM deterministically), and Docker jobs that
        declare ``deterministic`` (their image is then pinned by digest)."""
        return self.executor is ExecutorKind.WASM or self.deterministic

    def excludes(self, wallet: str) -> bool:
        """Whether ``wallet`` is in :attr:`exclude_providers` (any letter case)."""
        return wallet.lower() in {w.lower() for w in self.exclude_providers}

    def to_bytes(self) -> bytes:
        """Canonical JSON (sorted keys, no spaces): the bytes to add to IPFS."""
        body = self.model_dump(mode="json")
        # the fields added later are left out while unset, so a spec that does not use them
        # has the bytes (and the CID) it had before they existed
        later: dict[str, Any] = {
            "deterministic": False,
            "exclude_providers": [],
            "spot": None,
            "checkpoint": None,
        }
        for key, unset in later.items():
            if body.get(key) == unset:
                del body[key]
        for key in ("min_cuda", "min_compute_capability"):
            if body["resources"].get(key) is None:
                del body["resources"][key]
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> JobSpec:
        """Parse a spec document; ValueError (pydantic's, naming the field) if it is invalid."""
        if len(data) > MAX_SPEC_BYTES:
            raise ValueError(f"job spec is {len(data)} bytes, more than {MAX_SPEC_BYTES}")
        return cls.model_validate_json(data)


class QuoteRequest(BaseModel):
    """What a job would cost: ``POST /v1/quote`` at the scheduler (a price per GPU tier) and
    ``POST /api/quote`` at the front end, which passes it on and adds the online nodes that
    could run it. The fields are a job spec's ``executor``, ``resources`` and a duration.

    ``region`` None asks for any region; prices are then quoted for :attr:`PRICE_REGION`.
    ``gpu_models`` (tier keys) limits the quote to those tiers. ``token`` (a listed ERC-20's
    address; None or the zero address: ETH) asks for the price in that token's smallest units,
    ``ceiling_wei_per_hour`` then being in them too. ``spot_p_bps`` quotes a spot-checked job.
    """

    model_config = ConfigDict(extra="forbid")

    PRICE_REGION: ClassVar[str] = "us"

    executor: ExecutorKind = ExecutorKind.DOCKER
    region: str | None = Field(None, max_length=32)
    gpu_count: int = Field(0, ge=0, le=16)
    min_vram_mib: int = Field(0, ge=0, le=1024 * 1024)
    gpu_models: list[str] | None = Field(None, max_length=32)
    min_cuda: CudaVersion | None = None
    min_compute_capability: ComputeCapability | None = None
    cpu_cores: int = Field(1, ge=1, le=512)
    ram_mib: int = Field(512, ge=16, le=8 * 1024 * 1024)
    disk_mib: int = Field(0, ge=0, le=64 * 1024 * 1024)
    duration_s: int = Field(3600, ge=1, le=30 * 24 * 3600)
    ceiling_wei_per_hour: Wei | None = None
    token: Address | None = None
    spot_p_bps: int | None = Field(None, ge=1, le=10_000)
    """A spot-checked job (:class:`SpotCheck`) with this ``p``: each quote then says what its
    funding locks beside the bounty (the check deposit, equal to the bounty) and the least
    collateral such a job must ask (:func:`gridmarket.spot.min_collateral`, at least the
    escrow's own minimum)."""

    def problem(self) -> tuple[str, str] | None:
        """The first field the models cannot check alone, and what is wrong with it; None
        when the request is good."""
        if self.region is not None and self.region not in REGIONS:
            known = ", ".join(sorted(REGIONS))
            return "region", f"{self.region!r} is unknown; use one of {known}"
        unknown = [m for m in self.gpu_models or [] if m not in TIERS]
        if unknown:
            return "gpu_models", f"unknown GPU tiers {unknown}"
        if self.gpu_count == 0 and (
            self.min_vram_mib or self.gpu_models or self.min_cuda or self.min_compute_capability
        ):
            return "gpu_count", "GPU requirements (VRAM, models, CUDA) need gpu_count > 0"
        return None

    @property
    def price_region(self) -> str:
        """The region prices are quoted for."""
        return self.region or self.PRICE_REGION


def offered_price_wei_per_hour(bounty_wei: int, spec: JobSpec) -> int:
    """What a job offers per GPU-hour (per job-hour without GPUs): its bounty spread over its
    timeout and GPU count. Provider floors compare against it (the matching engine's price gate);
    it comes from the on-chain bounty, so nobody can inflate it off-chain."""
    units = max(1, spec.resources.gpu_count)
    return bounty_wei * 3600 // (spec.limits.timeout_s * units)


# --------------------------------------------------------------------------- registration


class GpuGroup(BaseModel):
    """``count`` GPUs of one model (tier key, e.g. ``rtx4090``; ``name`` is what NVML said)."""

    model_config = _strict()

    model: str = Field(min_length=1, max_length=64)
    name: str = Field("", max_length=128)
    vram_mib: int = Field(ge=1, le=1024 * 1024)
    count: int = Field(ge=1, le=64)
    driver_version: str | None = Field(None, max_length=32)
    cuda_version: CudaVersion | None = None
    """The highest CUDA version the driver supports (NVML); None: unknown (an old agent)."""
    compute_capability: ComputeCapability | None = None
    """The lowest compute capability of the group's GPUs (NVML); None: unknown."""


class NodeCapacityIn(BaseModel):
    """What a node offers, as its agent reports it. One GPU model per node (see the agent)."""

    model_config = _strict()

    gpu: GpuGroup | None = None
    cpu_cores: int = Field(ge=1, le=4096)
    ram_mib: int = Field(ge=64, le=64 * 1024 * 1024)
    disk_mib: int = Field(ge=0, le=1024 * 1024 * 1024)
    region: Region
    price_floor_wei_per_hour: Wei = 0
    executors: list[ExecutorKind] = Field(min_length=1, max_length=2)
    slots: int = Field(1, ge=1, le=64)
    images: list[PinnedImage] = Field(default_factory=list, max_length=MAX_ADVERTISED_IMAGES)
    """Images the node has cached (pinned references): matching prefers such a node for a job
    naming one of them (docs/matching.md). Heartbeats bring it up to date."""
    price_floors: dict[Address, Wei] = Field(default_factory=dict, max_length=MAX_PRICE_FLOORS)
    """The node's floor for jobs paid in an ERC-20 token: token address -> the token's smallest
    units per hour. A node takes jobs in ETH (``price_floor_wei_per_hour``) and in the tokens
    named here only; a token job is never matched to a node without a floor for its token."""

    @field_validator("price_floors")
    @classmethod
    def _token_floors(cls, value: dict[str, int]) -> dict[str, int]:
        out = {to_checksum_address(k): v for k, v in value.items()}
        if ZERO_ADDRESS in out:
            raise ValueError("price_floors names tokens; ETH's floor is price_floor_wei_per_hour")
        return dict(sorted(out.items()))

    @field_validator("executors")
    @classmethod
    def _unique(cls, value: list[ExecutorKind]) -> list[ExecutorKind]:
        if len(set(value)) != len(value):
            raise ValueError("executors must not repeat")
        return sorted(value)

    @field_validator("images")
    @classmethod
    def _distinct_images(cls, value: list[str]) -> list[str]:
        return sorted(set(value))


def capacity_digest(capacity: NodeCapacityIn) -> bytes:
    """SHA-256 of the capacity's canonical JSON: what the registration signature covers (an
    empty ``images`` or ``price_floors`` is left out, as is a GPU's unknown driver, CUDA version
    or compute capability: the digest of a capacity without them is unchanged)."""
    exclude = {k for k in ("images", "price_floors") if not getattr(capacity, k)}
    doc = capacity.model_dump(mode="json", exclude=exclude or None)
    if doc.get("gpu"):
        doc["gpu"] = {k: v for k, v in doc["gpu"].items() if v is not None}
    data = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(data.encode()).digest()


class NodeRegistration(BaseModel):
    """The signed part of a registration. ``nonce`` must grow per wallet; ``expiry`` is soon."""

    model_config = _strict()

    wallet: Address
    name: NodeName
    capacity: NodeCapacityIn
    agent_version: str = Field("", max_length=64)
    nonce: int = Field(ge=0, lt=2**63)
    expiry: int = Field(ge=0, lt=2**63)


class RegisterRequest(BaseModel):
    model_config = _strict()

    registration: NodeRegistration
    signature: HexSignature


class RegisterResponse(BaseModel):
    model_config = _strict()

    node_id: str
    token: str
    token_expires_at: float
    heartbeat_interval_s: float
    lease_ttl_s: float


def registration_typed_data(
    chain_id: int, escrow: str, registration: NodeRegistration
) -> dict[str, Any]:
    """EIP-712 ``NodeRegistration`` for the scheduler of ``escrow`` on ``chain_id``.

    The domain binds the registration to one deployment; the nonce and expiry keep it from being
    replayed; the capacity is covered by its digest (:func:`capacity_digest`).
    """
    return {
        "types": {
            "EIP712Domain": DOMAIN_TYPE,
            "NodeRegistration": [
                {"name": "wallet", "type": "address"},
                {"name": "name", "type": "string"},
                {"name": "capacityDigest", "type": "bytes32"},
                {"name": "agentVersion", "type": "string"},
                {"name": "nonce", "type": "uint64"},
                {"name": "expiry", "type": "uint64"},
            ],
        },
        "primaryType": "NodeRegistration",
        "domain": {
            "name": "GridMarket Scheduler",
            "version": "1",
            "chainId": chain_id,
            "verifyingContract": checksum(escrow),
        },
        "message": {
            "wallet": checksum(registration.wallet),
            "name": registration.name,
            "capacityDigest": capacity_digest(registration.capacity),
            "agentVersion": registration.agent_version,
            "nonce": registration.nonce,
            "expiry": registration.expiry,
        },
    }


def sign_registration(
    account: Signer, chain_id: int, escrow: str, registration: NodeRegistration
) -> str:
    """The 0x signature of ``registration`` by ``account`` (its wallet must be the account)."""
    full_message = registration_typed_data(chain_id, escrow, registration)
    return "0x" + sign_typed_data(account, full_message).hex()


def recover_registration_signer(
    chain_id: int, escrow: str, registration: NodeRegistration, signature: str
) -> str:
    """The checksummed address that signed ``registration``; ValueError if it is malformed."""
    from eth_account import Account
    from eth_account.messages import encode_typed_data

    message = encode_typed_data(
        full_message=registration_typed_data(chain_id, escrow, registration)
    )
    try:
        return str(Account.recover_message(message, signature=bytes.fromhex(signature[2:])))
    except Exception as exc:  # eth-keys raises several types for a malformed signature
        raise ValueError(f"signature does not recover: {exc}") from None


# --------------------------------------------------------------------------- scheduler info


class SchedulerInfo(BaseModel):
    """``GET /v1/info``: what an agent or a wallet needs to talk to this scheduler."""

    model_config = _strict()

    chain_id: int
    escrow: Address
    operator: Address
    require_stake: bool
    heartbeat_interval_s: float
    lease_ttl_s: float
    long_poll_max_s: float
    fee_bps: int
    version: str


# --------------------------------------------------------------------------- node loop


class HeartbeatRequest(BaseModel):
    """A node's pulse: the jobs it is running (their leases are renewed), and the images it has
    cached now (``None``: unchanged since the last pulse or the registration)."""

    model_config = _strict()

    running: list[HexBytes32] = Field(default_factory=list, max_length=64)
    load: float | None = Field(None, ge=0, le=100_000)
    images: list[PinnedImage] | None = Field(None, max_length=MAX_ADVERTISED_IMAGES)


class HeartbeatResponse(BaseModel):
    """Leases renewed (job id -> new expiry) and jobs the node must stop (no longer its own)."""

    model_config = _strict()

    leases: dict[str, float]
    cancel: list[str]
    next_heartbeat_s: float


class JobTerms(BaseModel):
    """A job's on-chain terms as the provider accepts them (EIP-712 ``Acceptance``, see
    :func:`gridmarket.eip712.acceptance_typed_data`): the price, the deadline, the collateral it
    locks while it holds the job, who may rule on its result, whether the operator may pay at
    once (``on_verify``), what it is paid in (``token``: the zero address for ETH; then
    ``bounty_wei`` and ``collateral_wei`` are in that token's smallest units), and how long it
    holds the job (``hold_for``)."""

    model_config = _strict()

    bounty_wei: Wei
    fee_bps: int = Field(ge=0, le=10_000)
    deadline: int = Field(ge=0, lt=2**40)
    collateral_wei: Wei
    mediator: Address
    flags: int = Field(ge=0, le=255)
    operator: Address
    token: Address = ZERO_ADDRESS
    hold_for: int = Field(ge=0, lt=2**32)
    """Seconds the provider is given (EIP-712 ``Acceptance.holdFor``): nobody but it can take
    the job back before they pass (:mod:`gridmarket.holds`)."""

    def as_job(self) -> Job:
        """The job struct the acceptance covers: only the terms enter the EIP-712 digest
        (:func:`gridmarket.eip712.sign_acceptance`), so the submitter is left zero."""
        return Job(
            submitter=ZERO_ADDRESS,
            bounty=self.bounty_wei,
            deadline=self.deadline,
            fee_bps=self.fee_bps,
            collateral=self.collateral_wei,
            mediator=to_checksum_address(self.mediator),
            flags=self.flags,
            token=to_checksum_address(self.token),
        )


class Assignment(BaseModel):
    """A job offered to a node: everything it needs to accept it (``terms``: it signs an
    acceptance and posts it to ``API.ACCEPT`` before the scheduler assigns it on-chain), to run
    it and to sign its result."""

    model_config = _strict()

    job_id: HexBytes32
    attempt: int = Field(ge=1, lt=2**16)
    spec_cid: str
    spec: JobSpec
    bounty_wei: int
    deadline: int
    lease_expires_at: float
    chain_id: int
    escrow: Address
    terms: JobTerms
    resume: CheckpointRef | None = None
    """The checkpoint this attempt starts from (a checkpointing job whose earlier attempt
    reported one, kept by the scheduler); the node fetches it, checks its CID and size, and
    mounts it at ``/checkpoint``."""


class AcceptRequest(BaseModel):
    """A node's acceptance of assignment ``attempt`` of a job: the EIP-712 ``Acceptance``
    signature by its wallet over the job's terms. The scheduler relays it in ``assign``."""

    model_config = _strict()

    attempt: int = Field(ge=1, lt=2**16)
    signature: HexSignature


class AcceptAck(BaseModel):
    """The scheduler's answer to an acceptance: ``accepted`` false means the offer is gone
    (lease lost or reassigned) and the node must not run the job."""

    model_config = _strict()

    job_id: str
    accepted: bool
    message: str = ""


class IdleAdvice(BaseModel):
    """``next-job`` answered with nothing: when to ask again (adaptive backoff)."""

    model_config = _strict()

    retry_after_s: float
    reason: str


class RunReason(StrEnum):
    """How the run ended (mirrors ``agent.executors.Reason``, plus the agent's own failures)."""

    SUCCEEDED = "succeeded"
    EXIT_CODE = "exit_code"
    TIMEOUT = "timeout"
    OUT_OF_MEMORY = "out_of_memory"
    OUTPUT_TOO_LARGE = "output_too_large"
    OUTPUT_INVALID = "output_invalid"
    TRAPPED = "trapped"
    CANCELLED = "cancelled"
    DATASET_ERROR = "dataset_error"  # the dataset could not be fetched or failed its CID
    WORKLOAD_ERROR = "workload_error"  # image missing, module invalid, GPU unavailable
    AGENT_ERROR = "agent_error"  # the agent itself failed (IPFS down on upload, ...)


class ResultReport(BaseModel):
    """What a node sends when a run ends. On success ``output_cid`` and ``signature`` (EIP-712
    ``Result(jobId, attempt, outputCid)`` by the node's wallet) are required."""

    model_config = _strict()

    attempt: int = Field(ge=1, lt=2**16)
    reason: RunReason
    message: str = Field("", max_length=2000)
    exit_code: int | None = None
    duration_s: float = Field(ge=0)
    output_cid: str | None = None
    output_bytes: int = Field(0, ge=0)
    signature: HexSignature | None = None
    stdout_tail: LogTail = ""
    stderr_tail: LogTail = ""

    @field_validator("output_cid")
    @classmethod
    def _valid_cid(cls, value: str | None) -> str | None:
        return None if value is None else _cid(value)

    @model_validator(mode="after")
    def _success_is_signed(self) -> ResultReport:
        if self.reason is RunReason.SUCCEEDED and (
            self.output_cid is None or self.signature is None
        ):
            raise ValueError("a succeeded result needs output_cid and signature")
        return self


class ResultAck(BaseModel):
    model_config = _strict()

    job_id: str
    accepted: bool
    status: str
    message: str
