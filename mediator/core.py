"""The mediator's configuration, the shapes its roles share, and :class:`MediatorBase`: the
attributes every role (a mixin in its own module) reads (docs/mediator.md).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import httpx
from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress

from gridmarket.chain import EscrowClient
from gridmarket.ipfs import IpfsStore
from gridmarket.retry import RetryPolicy
from gridmarket.watcher import ChainWatcher
from gridmarket.wire import JobLimits, JobSpec
from mediator.state import MediatorState
from mediator.tasks import Kind

__all__ = ["Decision", "MediatorBase", "MediatorConfig", "MediatorError"]


class MediatorError(RuntimeError):
    """The mediator cannot run as configured (wrong key, wrong state file)."""


@dataclass(frozen=True)
class MediatorConfig:
    """How the mediator checks and how hard it tries (defaults suit a public testnet)."""

    fetch_timeout_s: float = 60.0
    """Time limit of one integrity check (the whole fetch from IPFS)."""
    fetch_attempts: int = 3
    """Checks that must find the output unreachable before it is ruled wrong (fewer if the
    challenge window would close before the next one)."""
    retry_delay_s: float = 30.0
    """Wait between two checks of an unreachable output."""
    max_output_bytes: int = JobLimits().output_max_bytes
    """The most this mediator fetches. An output over it is ruled wrong only when the job spec's
    own cap (``limits.output_max_bytes``) is known and not larger."""
    spec_timeout_s: float = 10.0
    """Time limit of fetching a job spec (for its output cap)."""
    window_margin_s: float = 30.0
    """A ruling within a window is sent no later than this before the window closes."""
    poll_interval_s: float = 2.0
    confirmations: int = 0
    batch_blocks: int = 2000
    error_backoff: RetryPolicy = field(
        default_factory=lambda: RetryPolicy(initial_delay_s=1.0, max_delay_s=60.0)
    )
    """Waits after transient RPC or IPFS errors (exponential, jittered)."""
    work_dir: Path | None = None
    """Where outputs are fetched to (always emptied); default: beside the state file."""
    rerun: bool = True
    """Re-run a disputed deterministic job on another provider and compare outputs (else
    every dispute is ruled on integrity alone)."""
    rerun_min_s: float = 60.0
    """A re-run is funded only if at least this long is left before the mediation window
    closes (less ``window_margin_s``); else the dispute is ruled on integrity."""
    rerun_poll_s: float = 5.0
    """How often a dispute waiting for its re-run looks at the re-run's state."""
    rerun_max_bounty_wei: int | None = None
    """The most this mediator pays for one re-run of a job paid in ETH (it offers the disputed
    job's own bounty, the price the market already accepted); None: no cap. Over it: integrity
    only."""
    rerun_max_bounty_token: int | None = None
    """The same for a job paid in an ERC-20 token (escrow v4): the re-run is paid in the job's
    token, from this mediator's own balance of it (a permit in the same transaction), so the cap
    is in that token's smallest units, whatever the token; None: no cap."""
    scheduler_url: str | None = None
    """Where a settled spot job's seed is revealed (``POST {scheduler_url}/v1/jobs/{id}/spot``);
    None: seeds are kept in the state file, revealed by nobody but the submitter."""
    reveal_retry_s: float = 60.0
    """Wait before posting a reveal again (the scheduler down, or not yet aware that the job
    is settled)."""
    reveal_attempts: int = 30
    """Reveals the scheduler answers "unknown job" before the mediator gives up on it."""

    def __post_init__(self) -> None:
        if self.fetch_attempts < 1:
            raise ValueError(f"fetch_attempts must be >= 1, got {self.fetch_attempts}")
        for name in ("fetch_timeout_s", "spec_timeout_s", "poll_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.retry_delay_s < 0 or self.window_margin_s < 0:
            raise ValueError("retry_delay_s and window_margin_s must be >= 0")
        if self.max_output_bytes < 1:
            raise ValueError(f"max_output_bytes must be >= 1, got {self.max_output_bytes}")
        if self.rerun_min_s < 0 or self.rerun_poll_s <= 0:
            raise ValueError("rerun_min_s must be >= 0 and rerun_poll_s > 0")
        if self.reveal_retry_s <= 0 or self.reveal_attempts < 1:
            raise ValueError("reveal_retry_s must be > 0 and reveal_attempts >= 1")


@dataclass(frozen=True)
class Decision:
    """What the mediator concluded about one job attempt (one log line each)."""

    job_id: bytes
    attempt: int
    kind: Kind
    verdict: str  # "upheld", "not upheld", "no ruling" or "disputed" (a spot check opened)
    reason: str
    tx_hash: str | None = None

    @property
    def upheld(self) -> bool | None:
        return {"upheld": True, "not upheld": False}.get(self.verdict)


@dataclass(frozen=True)
class _Draw:
    """A spot job attempt's draw: checked or not, and the words the decision line carries."""

    drawn: bool
    note: str
    retry: bool = False  # the spec could not be read yet: try again (within the window)


class _Outcome(Enum):
    INTACT = "intact"  # the output is intact
    FAIL = "fail"  # the output fails for a reason that is the provider's
    UNSURE = "unsure"  # the check cannot say whose fault it is: never rule on it
    RETRY = "retry"  # try again later


@dataclass(frozen=True)
class _Check:
    outcome: _Outcome
    reason: str
    tried: bool = False  # a retry that counts as one "unreachable" try against the provider


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class MediatorBase:
    """What every role of the mediator reads and writes, set by
    :meth:`mediator.service.Mediator.__init__`. The roles are mixins over it, each in its own
    module: :class:`mediator.rulings.Rulings` <- :class:`mediator.checks.Checks` <-
    :class:`mediator.reruns.Reruns` <- :class:`mediator.tiebreaks.TieBreaks` <-
    :class:`mediator.spot.SpotChecks` <- :class:`mediator.service.Mediator` (following the
    chain, and the tasks each kind's handler runs)."""

    config: MediatorConfig
    client: EscrowClient
    account: LocalAccount
    address: ChecksumAddress
    _key: bytes
    ipfs: IpfsStore
    challenge_window: int
    mediation_window: int
    min_duration: int
    state: MediatorState
    work_dir: Path
    watcher: ChainWatcher
    counters: Counter[str]
    decisions: list[Decision]
    _specs: dict[bytes, JobSpec]
    _errors: dict[tuple[bytes, int, str], Any]
    _probe: Any
    _http: httpx.Client | None
    _stop: threading.Event
    _thread: threading.Thread | None
