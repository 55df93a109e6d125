"""The escrow's job model, in pure Python: no I/O.

The contract stores one commitment per job (``keccak256(abi.encode(Job))`` with the status in the
low byte); everything else is rebuilt from its events. :func:`apply_event` is that fold, shared by
the scheduler's chain watcher, the payouts explorer and the tests, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import Any, Protocol

from gridmarket.ethsig import keccak, to_checksum_address

ZERO_ADDRESS = "0x0000000000000000000000000000000000000000"
ZERO_HASH = b"\x00" * 32
JOB_ABI_TYPES = (
    "address",
    "uint96",
    "address",
    "uint40",
    "uint40",
    "uint16",
    "uint16",
    "bytes32",
    "address",
    "address",
    "uint96",
    "uint40",
    "uint8",
    "address",
    "uint40",
)
FLAG_ON_VERIFY = 1
"""JobEscrow.FLAG_ON_VERIFY: the job's operator may pay a result at once on its own check."""
FLAG_SPOT = 0x10
"""JobEscrow.FLAG_SPOT: a spot-checked job; funding locks a check deposit (the bounty) beside the
bounty, and the job's mediator may open a check of a result (``dispute``) sending nothing."""
FLAG_REPLICAS_MASK = 0x0E
"""JobEscrow.FLAG_REPLICAS_MASK: flags bits 1..3 hold a replicated job's seat count (0: single)."""
MAX_REPLICAS = 5
"""JobEscrow.MAX_REPLICAS: most seats a replicated job may have."""
MAX_FEE_BPS = 2000
"""JobEscrow.MAX_FEE_BPS: the platform fee is capped at 20 %."""
MAX_WEI = 2**96 - 1
"""The largest amount the escrow stores: bounties, stakes and payouts are uint96 wei."""
MAX_TIMESTAMP = 2**40 - 1
"""The latest time the escrow stores: deadlines are uint40 Unix seconds."""
JOB_EVENTS = frozenset(
    {
        "JobCreated",
        "JobAssigned",
        "JobUnassigned",
        "ResultSubmitted",
        "ResultDisputed",
        "Ruled",
        "JobReleased",
        "JobRefunded",
    }
)
"""Events that change a job's struct (:func:`apply_event` folds exactly these); others, like
ProviderSlashed, only mention a job."""
GROUP_EVENTS = frozenset({"ReplicasCreated", "Resolved"})
"""Events about a replicated job as a whole (indexed by ``groupId``, not a job id); each seat's
own changes come as job events in the same transaction."""


def replicas_of(flags: int) -> int:
    """The seat count a job's flags carry: 2..MAX_REPLICAS for a seat of a replicated job, 0
    for a single job."""
    return (flags & FLAG_REPLICAS_MASK) >> 1


MAX_TEXT_BYTES = 128
"""The longest string an escrow event may carry (``JobEscrow.MAX_CID_LENGTH``): longer ones are
decoded as :class:`InvalidText`, whatever the contract that emitted them allowed."""


class InvalidText(str):
    """A ``string`` event argument that does not hold a usable value (not UTF-8, empty, over
    :data:`MAX_TEXT_BYTES`, or not the printable ASCII every CID is spelled in).

    The chain accepts any bytes, so readers must not trust them. The decoder
    (:meth:`gridmarket.chain.EscrowClient.decode_logs`) puts one of these where the string would
    be: its text, ``invalid <field>: <problem>``, is at most 128 characters and can never be
    fetched as a CID, and :attr:`raw` keeps the bytes the contract hashed (a result's digest is
    ``keccak256(raw)``, needed to call the contract about that job again).
    """

    raw: bytes
    field: str
    problem: str

    def __new__(cls, field: str, raw: bytes, problem: str) -> InvalidText:
        self = super().__new__(cls, f"invalid {field}: {problem}"[:MAX_TEXT_BYTES])
        self.raw = bytes(raw)
        self.field = field
        self.problem = problem
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (InvalidText, (self.field, self.raw, self.problem))


def text_problem(raw: bytes) -> str | None:
    """Why ``raw`` (a ``string`` event argument) is not a usable CID-like text; None if it is."""
    if not raw:
        return "empty"
    if len(raw) > MAX_TEXT_BYTES:
        return f"{len(raw)} bytes, over the {MAX_TEXT_BYTES}-byte limit"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
    for i, ch in enumerate(text):
        if not "!" <= ch <= "~":
            return f"character U+{ord(ch):04X} at {i} (a CID is printable ASCII)"
    return None


def decode_text(field: str, raw: bytes) -> str:
    """``raw`` as text, or an :class:`InvalidText` saying why it is not usable."""
    problem = text_problem(raw)
    return raw.decode("utf-8") if problem is None else InvalidText(field, raw, problem)


PROSE_FIELDS = frozenset({"reason"})
"""``string`` event arguments that are the contract's own words (``Credited.reason``), not CIDs:
decoded with :func:`decode_prose`, never as :class:`InvalidText`."""


def decode_prose(raw: bytes) -> str:
    """A contract-written ``string`` as text: UTF-8 (invalid bytes replaced), control
    characters dropped, at most :data:`MAX_TEXT_BYTES` characters."""
    text = bytes(raw[: MAX_TEXT_BYTES * 4]).decode("utf-8", errors="replace")
    return "".join(ch for ch in text if ch.isprintable())[:MAX_TEXT_BYTES]


def text_digest(value: str) -> bytes:
    """keccak256 of the bytes the contract saw for a decoded string argument."""
    if isinstance(value, InvalidText):
        return keccak(value.raw)
    return cid_digest(value)


class Status(IntEnum):
    """Mirror of ``IJobEscrow.Status``."""

    NONE = 0
    FUNDED = 1
    ASSIGNED = 2
    SUBMITTED = 3
    RELEASED = 4
    REFUNDED = 5
    DISPUTED = 6

    @property
    def terminal(self) -> bool:
        return self in (Status.RELEASED, Status.REFUNDED)


@dataclass(frozen=True, slots=True)
class Job:
    """Mirror of ``IJobEscrow.Job``: the full state a caller passes back to the contract.

    The first eight fields are the progress and price; ``operator``, ``mediator``,
    ``collateral``, ``flags`` and ``token`` are the terms fixed at funding (docs/trust.md).
    ``token`` is what every amount of the job is in: the zero address for ETH, else an ERC-20."""

    submitter: str
    bounty: int
    provider: str = ZERO_ADDRESS
    deadline: int = 0
    since: int = 0
    """When the current assignment (ASSIGNED) or result (SUBMITTED and after) began."""
    fee_bps: int = 0
    attempt: int = 0
    result_digest: bytes = ZERO_HASH
    operator: str = ZERO_ADDRESS
    mediator: str = ZERO_ADDRESS
    collateral: int = 0
    disputed_at: int = 0
    flags: int = 0
    token: str = ZERO_ADDRESS
    hold_until: int = 0
    """ASSIGNED: the end of the time the provider signed for (``holdFor`` after the assignment);
    nobody but the provider can take the job back before it. Zero in every other status but
    REFUNDED from ASSIGNED."""

    def as_tuple(self) -> tuple[Any, ...]:
        """The ABI tuple for contract calls."""
        return (
            self.submitter,
            self.bounty,
            self.provider,
            self.deadline,
            self.since,
            self.fee_bps,
            self.attempt,
            self.result_digest,
            self.operator,
            self.mediator,
            self.collateral,
            self.disputed_at,
            self.flags,
            self.token,
            self.hold_until,
        )

    @property
    def submitted_at(self) -> int:
        """When the pending (or paid) result was submitted; 0 before any result."""
        return self.since if self.result_digest != ZERO_HASH else 0

    @property
    def on_verify(self) -> bool:
        """Whether the submitter let the operator pay at once on its own check."""
        return bool(self.flags & FLAG_ON_VERIFY)

    @property
    def replicas(self) -> int:
        """Seats of the replicated job this job is a seat of; 0 for a single job."""
        return replicas_of(self.flags)

    @property
    def fee(self) -> int:
        """Platform fee taken at release, in wei."""
        return self.bounty * self.fee_bps // 10_000

    @property
    def payout(self) -> int:
        """What the provider is credited at release, in wei."""
        return self.bounty - self.fee


@dataclass(frozen=True, slots=True)
class Terms:
    """What a submitter fixes at funding besides price and deadline (``createJob``'s
    ``mediator``, ``collateral`` and ``flags``, the token ``createJobWith`` takes, and the
    ``expectedOperator`` both take): who may rule on the result, what the provider must lock,
    whether the operator may pay at once on its own check, what the job is paid in, and which
    operator assigns it (docs/trust.md)."""

    mediator: str
    collateral: int
    flags: int = 0
    token: str = ZERO_ADDRESS
    """What the job is paid in: the zero address for ETH, else an allow-listed ERC-20."""
    operator: str = ZERO_ADDRESS
    """The operator the submitter expects (``createJob``'s ``expectedOperator``: funding
    reverts if another one is in office). The zero address: the chain clients read the one in
    office just before they send (a ``setOperator`` mined in between still makes it revert)."""

    @property
    def on_verify(self) -> bool:
        return bool(self.flags & FLAG_ON_VERIFY)

    @property
    def spot(self) -> bool:
        return bool(self.flags & FLAG_SPOT)

    def funding(self, bounty: int) -> int:
        """What funding a job with this bounty sends (or pulls, in a token): the bounty, and for
        a spot job as much again, its check deposit."""
        return 2 * bounty if self.spot else bounty


def cid_digest(cid: str) -> bytes:
    """The on-chain digest of a CID string: keccak256 of its UTF-8 bytes."""
    return keccak(cid.encode())


def job_id(submitter: str, spec_cid: str, salt: bytes) -> bytes:
    """The id the contract gives a job: ``keccak256(abi.encode(submitter, specDigest, salt))``."""
    if len(salt) != 32:
        raise ValueError(f"salt must be 32 bytes, got {len(salt)}")
    from eth_abi.abi import encode  # here: the agent's daemon loads this module, not eth-abi

    return keccak(
        encode(
            ["address", "bytes32", "bytes32"],
            [to_checksum_address(submitter), cid_digest(spec_cid), salt],
        )
    )


def seat_ids(group_id: bytes, replicas: int) -> list[bytes]:
    """The job ids of a replicated job's seats: ``keccak256(abi.encode(groupId, i))``."""
    if len(group_id) != 32:
        raise ValueError(f"group id must be 32 bytes, got {len(group_id)}")
    if not 2 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"replicas must be 2..{MAX_REPLICAS}, got {replicas}")
    from eth_abi.abi import encode

    return [keccak(encode(["bytes32", "uint256"], [group_id, i])) for i in range(replicas)]


def assign_target(state: JobState) -> tuple[bytes, int]:
    """The ``(id, seat)`` that ``assign`` takes for this job: ``(job id, 0)`` for a single
    job, ``(group id, i)`` for seat i of a replicated job (a seat's JobCreated names the group
    id as its salt)."""
    replicas = state.job.replicas
    if not replicas:
        return state.job_id, 0
    for i, seat in enumerate(seat_ids(state.salt, replicas)):
        if seat == state.job_id:
            return state.salt, i
    raise ValueError(f"job 0x{state.job_id.hex()} is not a seat of group 0x{state.salt.hex()}")


def rule_args(state: JobState, seats: Sequence[JobState] = ()) -> tuple[bytes, list[Any], int]:
    """``rule``'s ``(id, jobs, i)`` for this job: ``(job id, [job], 0)`` for a single job; for
    a seat, ``(group id, every seat's struct in order, its index)`` (``seats``: the group's
    seats, in seat order)."""
    group, i = assign_target(state)
    if not state.job.replicas:
        return state.job_id, [state.job.as_tuple()], 0
    if len(seats) != state.job.replicas or seats[i].job_id != state.job_id:
        raise ValueError(f"rule on seat {i} needs all {state.job.replicas} seats in order")
    return group, [s.job.as_tuple() for s in seats], i


def deposit_of(bounty: int, token: str, floor: int, flags: int = 0) -> int:
    """What disputing a job's result deposits, ``JobEscrow.depositOf`` mirrored: the job's
    ``bounty`` (the price of the mediator's re-run, which is funded at the job's own bounty),
    in its ``token``; for an ETH job (``token`` the zero address) that is not a spot job at
    least ``floor``, the escrow's ``disputeDeposit`` wei. Whoever the ruling finds wrong pays the
    re-run. A spot job's deposit (its bounty) was locked at funding: see :func:`dispute_value`."""
    if int(token, 16) != 0 or flags & FLAG_SPOT:
        return bounty
    return max(bounty, floor)


def dispute_value(bounty: int, token: str, floor: int, flags: int = 0) -> int:
    """The ETH a ``dispute`` call sends: the deposit for an ETH job, nothing for a token job
    (the deposit is pulled in the token) or a spot job (it was locked at funding)."""
    if int(token, 16) != 0 or flags & FLAG_SPOT:
        return 0
    return deposit_of(bounty, token, floor, flags)


def min_collateral(bounty: int, min_collateral_bps: int) -> int:
    """``JobEscrow``'s least collateral for a job with this bounty:
    ``bounty * minCollateralBps / 10_000``, rounded down."""
    return bounty * min_collateral_bps // 10_000


def commitment(job: Job, status: Status) -> int:
    """The storage word the contract keeps for ``job`` in ``status``."""
    from eth_abi.abi import encode

    digest = int.from_bytes(keccak(encode(list(JOB_ABI_TYPES), list(job.as_tuple()))), "big")
    return (digest & ~0xFF) | int(status)


@dataclass(frozen=True, slots=True)
class JobState:
    """A job as an indexer sees it: the contract's struct plus what only the events carry."""

    job_id: bytes
    job: Job
    status: Status
    spec_cid: str
    salt: bytes
    output_cid: str | None = None
    spec_problem: str | None = None
    """Why ``spec_cid`` is unusable (it did not decode: see :class:`InvalidText`); the job can
    never run."""
    output_problem: str | None = None
    """Why ``output_cid`` is unusable (it did not decode); the result can never verify."""

    @property
    def problem(self) -> str | None:
        """What makes this job invalid as its events say, naming the field; None if nothing."""
        parts = [
            f"{name} {why}"
            for name, why in (("specCid", self.spec_problem), ("outputCid", self.output_problem))
            if why
        ]
        return "; ".join(parts) or None


class EventOrderError(ValueError):
    """An event arrived that cannot follow the job's current state (a gap in the log)."""


def apply_event(state: JobState | None, name: str, args: Mapping[str, Any]) -> JobState:
    """Fold one decoded escrow event into a job's state.

    ``state`` is None only for ``JobCreated``. Raises :class:`EventOrderError` for an event that
    cannot follow ``state``, which means the caller skipped part of the log.
    """
    if name == "JobCreated":
        if state is not None:
            raise EventOrderError(f"JobCreated for a job already known: 0x{state.job_id.hex()}")
        job = Job(
            submitter=to_checksum_address(args["submitter"]),
            bounty=int(args["bounty"]),
            deadline=int(args["deadline"]),
            fee_bps=int(args["feeBps"]),
            operator=to_checksum_address(args["operator"]),
            mediator=to_checksum_address(args["mediator"]),
            collateral=int(args["collateral"]),
            flags=int(args["flags"]),
            token=to_checksum_address(args.get("token") or ZERO_ADDRESS),
        )
        spec = args["specCid"]
        return JobState(
            job_id=bytes(args["jobId"]),
            job=job,
            status=Status.FUNDED,
            spec_cid=str(spec),
            salt=bytes(args["salt"]),
            spec_problem=spec.problem if isinstance(spec, InvalidText) else None,
        )
    if state is None:
        raise EventOrderError(f"{name} before JobCreated")
    job = state.job
    if name == "JobAssigned":
        _expect(state, name, Status.FUNDED, Status.ASSIGNED)
        job = replace(
            job,
            provider=to_checksum_address(args["provider"]),
            attempt=int(args["attempt"]),
            since=int(args["since"]),
            hold_until=int(args["holdUntil"]),
        )
        return replace(state, job=job, status=Status.ASSIGNED)
    if name == "JobUnassigned":
        _expect(state, name, Status.ASSIGNED)
        job = replace(job, provider=ZERO_ADDRESS, since=0, hold_until=0)
        return replace(state, job=job, status=Status.FUNDED)
    if name == "ResultSubmitted":
        _expect(state, name, Status.ASSIGNED)
        cid = args["outputCid"]
        digest = text_digest(cid)
        job = replace(job, since=int(args["submittedAt"]), result_digest=digest, hold_until=0)
        problem = cid.problem if isinstance(cid, InvalidText) else None
        return replace(
            state, job=job, status=Status.SUBMITTED, output_cid=str(cid), output_problem=problem
        )
    if name == "ResultDisputed":
        _expect(state, name, Status.SUBMITTED)
        job = replace(job, disputed_at=int(args["disputedAt"]))
        return replace(state, job=job, status=Status.DISPUTED)
    if name == "Ruled":
        _expect(state, name, Status.SUBMITTED, Status.DISPUTED)
        if args["upheld"]:
            return state  # JobReleased follows in the same transaction
        job = replace(job, provider=ZERO_ADDRESS, since=0, result_digest=ZERO_HASH, disputed_at=0)
        return replace(state, job=job, status=Status.FUNDED, output_cid=None, output_problem=None)
    if name == "JobReleased":
        _expect(state, name, Status.SUBMITTED, Status.DISPUTED)
        return replace(state, status=Status.RELEASED)
    if name == "JobRefunded":
        if job.replicas:  # `resolve` refunds a seat whose result it did not pay
            _expect(state, name, Status.FUNDED, Status.ASSIGNED, Status.SUBMITTED)
        else:
            _expect(state, name, Status.FUNDED, Status.ASSIGNED)
        return replace(state, status=Status.REFUNDED)
    raise ValueError(f"not a job event: {name}")


class _JobEvent(Protocol):
    """A decoded escrow event as both chain clients give it (name and decoded args)."""

    @property
    def name(self) -> str: ...

    @property
    def args(self) -> Mapping[str, Any]: ...


def fold_events(state: JobState, events: Iterable[_JobEvent]) -> JobState:
    """``state`` after ``events``, in the order given: the events of this job folded with
    :func:`apply_event`, those of other jobs and the registry's skipped (a transaction may
    carry several jobs' events: a ``multicall``, a replicated job's ``resolve``)."""
    for event in events:
        if event.name in JOB_EVENTS and bytes(event.args["jobId"]) == state.job_id:
            state = apply_event(state, event.name, event.args)
    return state


def _expect(state: JobState, name: str, *allowed: Status) -> None:
    if state.status not in allowed:
        raise EventOrderError(
            f"{name} for job 0x{state.job_id.hex()} in status {state.status.name}"
        )
