"""Checkpoints and progress of long jobs on the wire: the spec's policy, the job's progress file,
what a node reports, what the next node resumes from.

A job spec may carry a :class:`CheckpointPolicy`. The agent then mounts a writable, size-capped
directory at :data:`CHECKPOINT_PATH` (``/checkpoint``; also in the job's environment as
:data:`ENV_DIR`) and every ``interval_s`` (and once more when a run is stopped before it ends)
copies it, adds the copy to its IPFS node and posts a :class:`CheckpointReport` to
:data:`NODE_CHECKPOINTS`: the CID, its size, the job's own progress (:data:`PROGRESS_FILE`, a
small JSON file the job writes in that directory: ``{"step": 120, "total": 1000, "metrics":
{"loss": 0.31}}``), signed by the node's wallet for ``(job, attempt, seq, cid, size)``
(EIP-712 ``Checkpoint``, :func:`sign_checkpoint`).

The scheduler keeps the newest checkpoint of each job on its own IPFS node (fetched within the
policy's ``max_bytes`` and checked against its CID, so a node that dies takes nothing with it)
and hands it to the next attempt as :attr:`gridmarket.wire.Assignment.resume`
(:class:`CheckpointRef`): that node fetches it, checks its CID and size, and mounts it at
``/checkpoint`` before the job starts. A job that finds files there resumes from them.

Everything here is hostile input on one side or the other: a progress file is at most
:data:`MAX_PROGRESS_BYTES` and anything malformed in it is dropped (the job still runs);
metric names and values are bounded; a checkpoint is content-addressed and size-capped.

How a job writes a checkpoint (docs/submitter.md): each file by writing a temporary name and
renaming it, ``progress.json`` last; the agent may copy the directory at any moment.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from gridmarket.cid import CidError, normalize_cid
from gridmarket.eip712 import DOMAIN_NAME, DOMAIN_TYPE, DOMAIN_VERSION
from gridmarket.ethsig import Signer, hash_typed_data, recover_digest, sign_typed_data

__all__ = [
    "CHECKPOINT_PATH",
    "ENV_DIR",
    "ENV_INTERVAL",
    "JOB_CHECKPOINTS",
    "MAX_METRICS",
    "MAX_PROGRESS_BYTES",
    "NODE_CHECKPOINTS",
    "PROGRESS_FILE",
    "CheckpointPolicy",
    "CheckpointRef",
    "CheckpointReport",
    "Progress",
    "checkpoint_typed_data",
    "parse_progress",
    "recover_checkpoint_signer",
    "sign_checkpoint",
]

CHECKPOINT_PATH = "/checkpoint"
"""Where the job finds its checkpoint directory (read-write; the last checkpoint when resumed)."""
PROGRESS_FILE = "progress.json"
"""The job's progress, in the checkpoint directory: ``{"step", "total", "metrics"}``."""
ENV_DIR = "GRIDMARKET_CHECKPOINT_DIR"
"""Environment variable holding :data:`CHECKPOINT_PATH` (set only for a checkpointing job)."""
ENV_INTERVAL = "GRIDMARKET_CHECKPOINT_INTERVAL_S"
"""Environment variable holding the policy's ``interval_s``: how often the agent copies."""

NODE_CHECKPOINTS = "/v1/nodes/{node_id}/jobs/{job_id}/checkpoints"
"""POST: a node's :class:`CheckpointReport` for an attempt it runs (node bearer token)."""
JOB_CHECKPOINTS = "/v1/jobs/{job_id}/checkpoints"
"""GET: the job's newest kept checkpoint and its progress points, oldest first (public)."""

MAX_PROGRESS_BYTES = 4096
"""The largest progress file read; a larger one is ignored (the checkpoint still counts)."""
MAX_METRICS = 16
"""Metrics kept from one progress file (the first ones, by name order)."""
MIN_INTERVAL_S = 10
MAX_CHECKPOINT_BYTES = 64 * 1024**3

MetricName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,31}$")]
_METRIC_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,31}$")
MAX_STEP = 2**53  # exact in a float and in JavaScript


def _strict() -> ConfigDict:
    return ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


def _valid_cid(value: str) -> str:
    try:
        normalize_cid(value)
    except CidError as exc:
        raise ValueError(f"not a valid CID: {exc}") from None
    return value


class CheckpointPolicy(BaseModel):
    """``JobSpec.checkpoint``: the job keeps its state in :data:`CHECKPOINT_PATH`; the agent
    copies it every ``interval_s`` seconds (and when the run is stopped early) and the next
    attempt starts with the newest copy. ``max_bytes`` caps the directory (the job gets
    ``output_too_large`` past it, like ``/output``) and what a resuming node fetches."""

    model_config = _strict()

    interval_s: int = Field(300, ge=MIN_INTERVAL_S, le=24 * 3600)
    max_bytes: int = Field(1024**3, ge=1024, le=MAX_CHECKPOINT_BYTES)


class Progress(BaseModel):
    """What the job says about itself in :data:`PROGRESS_FILE` (all optional but ``step``)."""

    model_config = _strict()

    step: int = Field(ge=0, le=MAX_STEP)
    total: int | None = Field(None, ge=1, le=MAX_STEP)
    metrics: dict[MetricName, float] = Field(default_factory=dict, max_length=MAX_METRICS)

    @field_validator("metrics")
    @classmethod
    def _finite(cls, value: dict[str, float]) -> dict[str, float]:
        for name, number in value.items():
            if not math.isfinite(number):
                raise ValueError(f"metric {name} is not a finite number")
        return value

    @property
    def fraction(self) -> float | None:
        """``step / total`` in [0, 1], None without a total."""
        if not self.total:
            return None
        return min(1.0, self.step / self.total)


def parse_progress(data: bytes) -> tuple[Progress | None, str | None]:
    """The job's progress file as :class:`Progress`, forgivingly: ``(progress, None)``, or
    ``(None, why)`` when it is too large, not JSON or has no usable ``step``. Metrics that are
    not a finite number under a short name are dropped, the rest kept (at most
    :data:`MAX_METRICS`, by name); a ``total`` below 1 or under ``step`` is dropped."""
    if len(data) > MAX_PROGRESS_BYTES:
        return None, f"{PROGRESS_FILE} is {len(data)} bytes, more than {MAX_PROGRESS_BYTES}"
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return None, f"{PROGRESS_FILE} is not JSON: {str(exc)[:120]}"
    if not isinstance(doc, dict):
        return None, f"{PROGRESS_FILE} is not a JSON object"
    step = _integer(doc.get("step"))
    if step is None:
        return None, f"{PROGRESS_FILE} has no step (a whole number from 0 to 2^53)"
    total = _integer(doc.get("total"))
    if total is not None and (total < 1 or total < step):
        total = None
    metrics: dict[str, float] = {}
    raw = doc.get("metrics")
    if isinstance(raw, dict):
        for name in sorted(k for k in raw if isinstance(k, str) and _METRIC_NAME.match(k)):
            value = raw[name]
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            number = float(value) if abs(value) < 1e300 else math.inf
            if math.isfinite(number):
                metrics[name] = number
            if len(metrics) == MAX_METRICS:
                break
    return Progress(step=step, total=total, metrics=metrics), None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number here")


def _integer(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_STEP:
        value = int(value)
    if isinstance(value, int) and 0 <= value <= MAX_STEP:
        return value
    return None


class CheckpointReport(BaseModel):
    """A node's report of one checkpoint of an attempt it runs; ``seq`` counts the attempt's
    checkpoints from 1. ``final`` marks the copy taken after the run stopped (drain, lease
    lost, timeout, the job failed). ``signature``: EIP-712 ``Checkpoint(jobId, attempt, seq,
    cid, size)`` by the node's wallet (:func:`sign_checkpoint`)."""

    model_config = _strict()

    attempt: int = Field(ge=1, lt=2**16)
    seq: int = Field(ge=1, lt=2**31)
    cid: str
    size: int = Field(ge=0, le=MAX_CHECKPOINT_BYTES)
    files: int = Field(ge=0, le=1_000_000)
    progress: Progress | None = None
    final: bool = False
    taken_at: float = Field(ge=0, lt=2**40)
    signature: Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{130}$")]

    @field_validator("cid")
    @classmethod
    def _cid(cls, value: str) -> str:
        return _valid_cid(value)


class CheckpointRef(BaseModel):
    """``Assignment.resume``: the checkpoint an attempt starts from, kept by the scheduler.
    ``attempt``/``seq`` name the report it came from, ``wallet`` the provider that signed it
    (``signature``, so the resuming node and the submitter can check who made it)."""

    model_config = _strict()

    cid: str
    size: int = Field(ge=0, le=MAX_CHECKPOINT_BYTES)
    attempt: int = Field(ge=1, lt=2**16)
    seq: int = Field(ge=1, lt=2**31)
    wallet: Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{40}$")]
    signature: Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{130}$")]
    progress: Progress | None = None

    @field_validator("cid")
    @classmethod
    def _cid(cls, value: str) -> str:
        return _valid_cid(value)


CHECKPOINT_TYPE = [
    {"name": "jobId", "type": "bytes32"},
    {"name": "attempt", "type": "uint16"},
    {"name": "seq", "type": "uint32"},
    {"name": "cid", "type": "string"},
    {"name": "size", "type": "uint64"},
]


def checkpoint_typed_data(
    chain_id: int, escrow: str, job_id: bytes, attempt: int, seq: int, cid: str, size: int
) -> dict[str, Any]:
    """The EIP-712 message a node signs for one checkpoint (the escrow's domain: it names the
    chain and the deployment; the escrow itself never sees it)."""
    return {
        "types": {"EIP712Domain": DOMAIN_TYPE, "Checkpoint": CHECKPOINT_TYPE},
        "primaryType": "Checkpoint",
        "domain": {
            "name": DOMAIN_NAME,
            "version": DOMAIN_VERSION,
            "chainId": chain_id,
            "verifyingContract": escrow,
        },
        "message": {"jobId": job_id, "attempt": attempt, "seq": seq, "cid": cid, "size": size},
    }


def sign_checkpoint(
    account: Signer,
    chain_id: int,
    escrow: str,
    job_id: bytes,
    attempt: int,
    seq: int,
    cid: str,
    size: int,
) -> bytes:
    """The node's 65-byte ``r || s || v`` signature over one checkpoint."""
    return sign_typed_data(
        account, checkpoint_typed_data(chain_id, escrow, job_id, attempt, seq, cid, size)
    )


def recover_checkpoint_signer(
    signature: bytes,
    chain_id: int,
    escrow: str,
    job_id: bytes,
    attempt: int,
    seq: int,
    cid: str,
    size: int,
) -> str:
    """The wallet that signed a checkpoint (ValueError for a malformed or high-``s``
    signature)."""
    message = checkpoint_typed_data(chain_id, escrow, job_id, attempt, seq, cid, size)
    return recover_digest(hash_typed_data(message), signature)
