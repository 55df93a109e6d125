"""The payouts explorer's view of the chain: every escrow event, folded, held in memory.

The explorer reads chain events only. :class:`ChainIndex` reads the escrow's log from its
deployment block, in chunks, and then only the new blocks on each :meth:`ChainIndex.refresh`.
It folds each job's events with :func:`gridmarket.escrow.apply_event` (the same fold as the
scheduler's watcher, so the two cannot disagree) and keeps per-address totals as it goes. Block
times come from the blocks themselves (one ``eth_getBlockByNumber`` per block that holds events).

Live values that events cannot give (``balanceOf``, ``providerOf``) are read by
:meth:`ChainIndex.account`, at the moment of the request.

Reorganisations: each refresh keeps the hash of the head block it read up to (read before and
after its ``eth_getLogs``: unchanged, so the logs are of that chain), the last
:data:`KEEP_BLOCKS` of them. The next refresh first checks the chain still has the newest; if
not, it finds the newest one the chain still has and folds again the events it holds up to that
block (the events after it are forgotten, and read again from the chain). A reorg that replaced
every kept block rebuilds the index from the deployment block. Each reorg is logged (one
warning) and counted (:attr:`ChainIndex.reorgs`).

What it answers with (events, payouts, per-address totals, chart buckets, transactions) are the
records of :mod:`frontend_api.records`.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from eth_abi.abi import decode as abi_decode
from eth_utils.abi import function_abi_to_4byte_selector
from eth_utils.address import is_hex_address, to_checksum_address
from hexbytes import HexBytes
from web3.exceptions import BlockNotFound

from gridmarket.chain import EscrowClient, Event, abi_type
from gridmarket.escrow import (
    JOB_EVENTS,
    MAX_REPLICAS,
    JobState,
    Status,
    apply_event,
    decode_text,
    seat_ids,
)

from .records import (
    AddressStats,
    Amounts,
    Bucket,
    ChainEvent,
    NotFoundError,
    Payout,
    ReplicaGroup,
    TxView,
    group_id_of,
    hexstr,
    pick_bucket,
)

log = logging.getLogger(__name__)

KEEP_BLOCKS = 128
"""How many refreshed-up-to blocks (number, hash) the index keeps to find a reorg's fork."""


def _named(param: dict[str, Any], value: Any) -> Any:
    """A decoded argument with tuple components named after the ABI."""
    if str(param["type"]) == "tuple" and isinstance(value, tuple | list):
        return {c["name"]: _named(c, v) for c, v in zip(param["components"], value, strict=True)}
    return value


class ChainIndex:
    """The escrow's whole event log, folded per job and per address; refreshed incrementally.

    Thread-safe: the FastAPI handlers call it from worker threads (web3 is synchronous).
    Readers get copies, never the live structures.
    """

    def __init__(
        self,
        escrow: EscrowClient,
        *,
        chunk_blocks: int = 5000,
        min_interval_s: float = 0.5,
        keep_blocks: int = KEEP_BLOCKS,
    ) -> None:
        self.escrow = escrow
        self.keep_blocks = keep_blocks
        self.w3 = escrow.w3
        self.chunk_blocks = chunk_blocks
        self.min_interval_s = min_interval_s
        self._lock = threading.RLock()
        self._next_block = escrow.deployment.block
        self._head = escrow.deployment.block - 1
        self._head_time = 0
        self._last_refresh = 0.0
        self._checkpoints: list[tuple[int, bytes]] = []  # (block, hash) read up to, oldest first
        self.reorgs = 0  # reorgs rolled back since start
        self.last_reorg: str | None = None  # the warning logged for the latest one
        self._block_times: dict[int, int] = {}
        self._reset()
        self._selectors: dict[bytes, dict[str, Any]] = {
            function_abi_to_4byte_selector(f): f  # type: ignore[arg-type]
            for f in escrow.deployment.abi
            if f["type"] == "function"
        }

    def _reset(self) -> None:
        """Forget every event folded (what a rollback or a rebuild starts from)."""
        self._raw: list[Event] = []
        self._events: list[ChainEvent] = []
        self._jobs: dict[str, JobState] = {}
        self._job_events: dict[str, list[int]] = {}
        self._job_order: list[str] = []
        self._payouts: list[Payout] = []
        self._addresses: dict[str, AddressStats] = {}
        self._mediators: dict[str, bool] = {}  # MediatorListed, in log order
        self._bad_events: list[tuple[int, str]] = []  # (seq, why) events that did not fold
        self._groups: dict[str, ReplicaGroup] = {}  # replicated jobs by group id (0x hex)
        self._group_order: list[str] = []
        self._group_events: dict[str, list[int]] = {}

    # ------------------------------------------------------------------ reading the chain
    @property
    def head(self) -> int:
        """The last block read."""
        return self._head

    @property
    def head_time(self) -> int:
        """The timestamp of the last block read (the chain's idea of now)."""
        return self._head_time

    def refresh(self, *, force: bool = False) -> int:
        """Read the blocks mined since the last call; the head block. At most once per
        ``min_interval_s`` unless ``force`` (a page that just sent a transaction)."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self._last_refresh < self.min_interval_s:
                return self._head
            self._follow()
            for _ in range(5):
                head_block = self.w3.eth.get_block("latest")
                head = int(head_block["number"])
                start = self._next_block
                while start <= head:
                    end = min(head, start + self.chunk_blocks - 1)
                    for event in self.escrow.events(start, end):
                        self._ingest(event)
                    start = end + 1
                self._next_block = max(self._next_block, head + 1)
                self._checkpoints = [c for c in self._checkpoints if c[0] < head]
                self._checkpoints.append((head, bytes(head_block["hash"])))
                del self._checkpoints[: -self.keep_blocks]
                if self._hash_of(head) == bytes(head_block["hash"]):
                    break
                self._follow()  # the head changed while its logs were read: roll back, again
            self._head = head
            self._head_time = int(head_block["timestamp"])
            self._last_refresh = time.monotonic()
            return head

    def _hash_of(self, number: int) -> bytes | None:
        try:
            return bytes(self.w3.eth.get_block(number)["hash"])
        except BlockNotFound:
            return None

    def _follow(self) -> None:
        """Roll back what a reorg removed: see the module's docstring."""
        if not self._checkpoints:
            return
        tip, tip_hash = self._checkpoints[-1]
        if self._hash_of(tip) == tip_hash:
            return
        fork: int | None = None
        while self._checkpoints:
            number, known = self._checkpoints[-1]
            if self._hash_of(number) == known:
                fork = number
                break
            self._checkpoints.pop()
        first = self.escrow.deployment.block
        keep = [e for e in self._raw if fork is not None and e.block <= fork]
        dropped = len(self._raw) - len(keep)
        self._reset()
        last_kept = -1 if fork is None else fork
        self._block_times = {b: t for b, t in self._block_times.items() if b <= last_kept}
        for event in keep:
            self._ingest(event)
        self._next_block = first if fork is None else fork + 1
        self.reorgs += 1
        self.last_reorg = (
            f"chain reorg: block {tip} (0x{tip_hash.hex()[:8]}) is gone; "
            + (
                f"rolled back to block {fork} (depth <= {tip - fork})"
                if fork is not None
                else (
                    f"none of the {self.keep_blocks} kept blocks is left: "
                    f"rebuilding from block {first}"
                )
            )
            + f", {dropped} events forgotten"
        )
        log.warning(self.last_reorg)

    def _block_time(self, block: int) -> int:
        cached = self._block_times.get(block)
        if cached is None:
            cached = int(self.w3.eth.get_block(block)["timestamp"])
            self._block_times[block] = cached
        return cached

    def _stats(self, address: str) -> AddressStats:
        return self._addresses.setdefault(address, AddressStats())

    def _ingest(self, raw: Event) -> None:
        self._raw.append(raw)
        seq = len(self._events)
        args, problems = dict(raw.args), dict(raw.problems)
        event = ChainEvent(
            seq=seq,
            name=raw.name,
            args=args,
            block=raw.block,
            time=self._block_time(raw.block),
            tx_hash=raw.tx_hash,
            log_index=raw.log_index,
            problems=problems,
            token=self._currency_of(raw.name, args),
        )
        self._events.append(event)
        args = event.args
        named: set[str] = {
            to_checksum_address(v)
            for v in args.values()
            if isinstance(v, str) and is_hex_address(v)
        }
        for address in named:
            self._stats(address).events.append(seq)
        job_id = event.job_id
        if job_id is not None and (event.name in JOB_EVENTS or job_id in self._jobs):
            self._job_events.setdefault(job_id, []).append(seq)
        group_id = group_id_of(event)
        if group_id is not None:
            self._group_events.setdefault(group_id, []).append(seq)
        try:
            if event.name in JOB_EVENTS and job_id is not None:
                previous = self._jobs.get(job_id)
                self._jobs[job_id] = apply_event(previous, event.name, args)
                if previous is None:
                    self._job_order.append(job_id)
            self._account(event)
        except Exception as exc:  # one bad event never stops the index: it is shown, not folded
            why = f"{type(exc).__name__}: {exc}"
            self._bad_events.append((seq, why))
            log.warning("event %s #%d (tx %s) not folded: %s", event.name, seq, event.tx_hash, why)

    def _currency_of(self, name: str, args: dict[str, Any]) -> str | None:
        """The token an event's amounts are in (the zero address: ETH): its own ``token``
        argument (JobCreated, Staked, Withdrawn, FeesCollected...), else its job's token (a
        payout, refund, slash or credit moves in the job's token); None when it names neither
        (or a token argument that is not an address: hostile, left to the fold to refuse)."""
        token = args.get("token")
        if "token" in args:
            return (
                to_checksum_address(token)
                if isinstance(token, str) and is_hex_address(token)
                else None
            )
        raw = args.get("jobId")
        if isinstance(raw, bytes | bytearray):
            state = self._jobs.get(hexstr(bytes(raw)))
            if state is not None:
                return state.job.token
        return None

    def _money(self, address: str, event: ChainEvent) -> AddressStats | Amounts:
        """Where ``address``'s amounts in the event's token are summed (ValueError when the
        event's token is unknown: such an event is kept and counted nowhere)."""
        if event.token is None:
            raise ValueError(f"{event.name}: no token to count its amounts in")
        return self._stats(address).money(event.token)

    def _account(self, event: ChainEvent) -> None:
        """Per-address totals for one event, each amount in the event's token."""
        args, name = event.args, event.name
        if name == "JobCreated":
            submitter = to_checksum_address(args["submitter"])
            self._money(submitter, event).funded += int(args["bounty"])
            self._stats(submitter).jobs_funded += 1
        elif name == "JobReleased":
            payout, fee = int(args["payout"]), int(args["fee"])
            provider = to_checksum_address(args["provider"])
            submitter = to_checksum_address(args["submitter"])
            self._money(provider, event).earned += payout
            self._stats(provider).jobs_paid += 1
            self._money(submitter, event).paid_out += payout + fee
            self._payouts.append(
                Payout(
                    job_id=hexstr(args["jobId"]),
                    provider=provider,
                    submitter=submitter,
                    amount=payout,
                    fee=fee,
                    tx_hash=event.tx_hash,
                    block=event.block,
                    time=event.time,
                    token=str(event.token),
                )
            )
        elif name == "JobRefunded":
            submitter = to_checksum_address(args["submitter"])
            self._money(submitter, event).refunded += int(args["amount"])
        elif name == "Withdrawn":
            account = to_checksum_address(args["account"])
            self._money(account, event).withdrawn += int(args["amount"])
        elif name == "ProviderSlashed":
            amount, to_mediator = int(args["amount"]), int(args["toMediator"])
            provider = to_checksum_address(args["provider"])
            p = self._money(provider, event)
            p.slashed += amount
            p.staked = max(0, p.staked - amount)
            self._stats(provider).slash_count += 1
            s = self._money(to_checksum_address(args["submitter"]), event)
            s.slash_credits += amount - to_mediator
            state = job_of(self._jobs, event)
            if to_mediator and state is not None:
                self._money(state.job.mediator, event).mediator_fees += to_mediator
        elif name == "Credited":
            account = to_checksum_address(args["account"])
            self._money(account, event).credited += int(args["amount"])
        elif name == "Ruled":
            m = self._stats(to_checksum_address(args["mediator"]))
            m.rulings += 1
            if not args["upheld"]:
                m.rulings_against += 1
        elif name == "ReplicasCreated":
            self._group_created(event)
        elif name == "Resolved":
            self._group_resolved(event)
        elif name == "MediatorListed":
            self._mediators[to_checksum_address(args["mediator"])] = bool(args["listed"])
        elif name == "ProviderRegistered":
            s = self._stats(to_checksum_address(args["provider"]))
            s.registered = True
            problem = event.problems.get("metadataCid")
            s.metadata_problem = f"metadataCid {problem}" if problem else None
        elif name in ("Staked", "Unstaked"):
            provider = to_checksum_address(args["provider"])
            self._money(provider, event).staked = int(args["totalStake"])
        elif name == "FeesCollected":
            treasury = to_checksum_address(args["treasury"])
            self._money(treasury, event).fees_collected += int(args["amount"])

    def _group_created(self, event: ChainEvent) -> None:
        """A ``ReplicasCreated``: a group of ``replicas`` seats (their JobCreated follow)."""
        group_id = group_id_of(event)
        replicas = event.args["replicas"]
        if group_id is None:
            raise ValueError("ReplicasCreated without a 32-byte groupId")
        if not isinstance(replicas, int) or not 2 <= replicas <= MAX_REPLICAS:
            raise ValueError(f"ReplicasCreated with {replicas!r} replicas (2..{MAX_REPLICAS})")
        if group_id in self._groups:
            raise ValueError(f"ReplicasCreated for a group already known: {group_id}")
        self._groups[group_id] = ReplicaGroup(
            group_id=group_id,
            submitter=to_checksum_address(event.args["submitter"]),
            replicas=replicas,
            seat_ids=[hexstr(s) for s in seat_ids(bytes.fromhex(group_id[2:]), replicas)],
            created_tx=event.tx_hash,
            created_time=event.time,
        )
        self._group_order.append(group_id)

    def _group_resolved(self, event: ChainEvent) -> None:
        """A ``Resolved``: the verdict of a group the log created (its seats' payouts, refunds
        and slashes follow as job events)."""
        group_id = group_id_of(event)
        group = self._groups.get(group_id) if group_id is not None else None
        if group is None:
            raise ValueError(f"Resolved for a group the log never created: {group_id}")
        digest, agreeing, replicas = (
            event.args["resultDigest"],
            event.args["agreeing"],
            event.args["replicas"],
        )
        if not isinstance(digest, bytes | bytearray) or len(digest) != 32:
            raise ValueError("Resolved without a 32-byte resultDigest")
        if replicas != group.replicas or not isinstance(agreeing, int):
            raise ValueError(f"Resolved for {replicas!r} seats, the group has {group.replicas}")
        if not 0 <= agreeing <= replicas:
            raise ValueError(f"Resolved with {agreeing!r} agreeing of {replicas} seats")
        if group.resolved_tx is not None:
            raise ValueError(f"a second Resolved for {group_id}")
        group.result_digest = hexstr(bytes(digest))
        group.agreeing = agreeing
        group.resolved_tx = event.tx_hash
        group.resolved_time = event.time

    # ------------------------------------------------------------------ queries
    def group(self, group_id: str) -> tuple[ReplicaGroup, list[JobState | None], list[ChainEvent]]:
        """A replicated job: the group, its seats' folded states in seat order (None for a
        seat the log has not created) and the group's own events; :class:`NotFoundError`."""
        with self._lock:
            group = self._groups.get(group_id)
            if group is None:
                raise NotFoundError(f"no replicated job {group_id} on escrow {self.escrow.address}")
            seats = [self._jobs.get(s) for s in group.seat_ids]
            events = [self._events[i] for i in self._group_events.get(group_id, [])]
            return replace(group, seat_ids=list(group.seat_ids)), seats, events

    def group_of(self, state: JobState) -> str | None:
        """The group id of a seat (its JobCreated's ``salt``), when the log created that group
        and the job is one of its seats; None for a single job."""
        if not state.job.replicas:
            return None
        group_id = hexstr(state.salt)
        with self._lock:
            group = self._groups.get(group_id)
            if group is None or hexstr(state.job_id) not in group.seat_ids:
                return None
        return group_id

    def groups(self) -> list[ReplicaGroup]:
        """Replicated jobs, newest first (copies)."""
        with self._lock:
            return [
                replace(self._groups[g], seat_ids=list(self._groups[g].seat_ids))
                for g in reversed(self._group_order)
            ]

    def events_named(self, *names: str, limit: int | None = None) -> list[ChainEvent]:
        """Events with one of these names (``ProviderSlashed``, ``Resolved``...), newest first."""
        with self._lock:
            rows = [e for e in reversed(self._events) if e.name in names]
        return rows[:limit] if limit is not None else rows

    def mediators(self) -> list[str]:
        """Mediators listed now (``MediatorListed`` events), in the order they were listed."""
        with self._lock:
            return [m for m, listed in self._mediators.items() if listed]

    def bad_events(self) -> dict[int, str]:
        """Events the index could not fold (``seq`` -> why): shown, counted nowhere."""
        with self._lock:
            return dict(self._bad_events)

    def payouts(
        self,
        *,
        provider: str | None = None,
        submitter: str | None = None,
        job: str | None = None,
        token: str | None = None,
    ) -> list[Payout]:
        """Payouts, newest first, filtered by any of provider, submitter, job id and token."""
        with self._lock:
            rows = list(self._payouts)
        if token:
            rows = [p for p in rows if p.token == token]
        if provider:
            rows = [p for p in rows if p.provider == provider]
        if submitter:
            rows = [p for p in rows if p.submitter == submitter]
        if job:
            rows = [p for p in rows if p.job_id == job]
        rows.reverse()
        return rows

    def totals(
        self, payouts: Iterable[Payout], width_s: int | None = None, min_buckets: int = 12
    ) -> list[Bucket]:
        """``payouts`` summed per time bucket, oldest first, with running totals, up to the
        chain's head, all in one token (ValueError for payouts in several: filter them with
        :meth:`payouts`' ``token``). ``width_s`` defaults to :func:`pick_bucket` over their time
        span; at least ``min_buckets`` are given (empty ones before the first payout)."""
        rows = sorted(payouts, key=lambda p: (p.block, p.time))
        if not rows:
            return []
        if len({p.token for p in rows}) > 1:
            raise ValueError("payouts in several tokens cannot be summed together")
        first = rows[0].time
        last = max(rows[-1].time, self._head_time)
        width = width_s or pick_bucket(last - first)
        count = (last - (first - first % width)) // width + 1
        count = max(count, min_buckets)  # a few empty buckets before the first: some context
        origin = last - last % width - (count - 1) * width
        starts = [origin + i * width for i in range(count)]
        amounts = [0] * count
        fees = [0] * count
        counts = [0] * count
        for p in rows:
            i = bisect.bisect_right(starts, p.time) - 1
            amounts[i] += p.amount
            fees[i] += p.fee
            counts[i] += 1
        out: list[Bucket] = []
        cum_a = cum_f = 0
        for i, start in enumerate(starts):
            cum_a += amounts[i]
            cum_f += fees[i]
            out.append(Bucket(start, width, counts[i], amounts[i], fees[i], cum_a, cum_f))
        return out

    def job(self, job_id: str) -> tuple[JobState, list[ChainEvent]]:
        """A job's folded state and its events; :class:`NotFoundError` if it has none."""
        with self._lock:
            state = self._jobs.get(job_id)
            if state is None:
                raise NotFoundError(f"no job {job_id} on escrow {self.escrow.address}")
            return state, [self._events[i] for i in self._job_events[job_id]]

    def jobs(self, *, submitter: str | None = None, provider: str | None = None) -> list[JobState]:
        """Jobs, newest first; ``provider`` matches the current (or last paid) provider."""
        with self._lock:
            states = [self._jobs[j] for j in reversed(self._job_order)]
        if submitter:
            states = [s for s in states if s.job.submitter == submitter]
        if provider:
            states = [s for s in states if s.job.provider == provider]
        return states

    def job_counts(self) -> dict[str, int]:
        """Jobs by on-chain status (lower-case names)."""
        with self._lock:
            counts: dict[str, int] = {}
            for state in self._jobs.values():
                key = state.status.name.lower()
                counts[key] = counts.get(key, 0) + 1
            return counts

    def stats(self, address: str) -> AddressStats:
        """A copy of ``address``'s totals (zeros for an address the log never named)."""
        with self._lock:
            found = self._addresses.get(address)
            return _copy(found, list(found.events)) if found else AddressStats()

    def events(
        self, seqs: Iterable[int] | None = None, *, limit: int | None = None
    ) -> list[ChainEvent]:
        """Events by ``seq`` (all when None), newest first, at most ``limit``."""
        with self._lock:
            chosen = self._events if seqs is None else [self._events[i] for i in seqs]
            rows = list(reversed(chosen))
        return rows[:limit] if limit is not None else rows

    def providers(self) -> dict[str, AddressStats]:
        """Every address that registered as a provider or was paid as one."""
        with self._lock:
            return {
                a: _copy(s, []) for a, s in self._addresses.items() if s.registered or s.jobs_paid
            }

    # ------------------------------------------------------------------ live reads
    def account(self, address: str) -> dict[str, Any]:
        """Live contract reads for ``address``: withdrawable balance and registry entry."""
        balance = int(self.escrow.call("balanceOf", address))
        stake, locked, unstake_at, registered, unstake_pending = self.escrow.call(
            "providerOf", address
        )
        eligible = bool(self.escrow.call("isEligible", address))
        return {
            "balance_wei": str(balance),
            "stake_wei": str(int(stake)),
            "locked_wei": str(int(locked)),
            "free_collateral_wei": str(int(stake) - int(locked)),
            "unstake_pending_wei": str(int(unstake_pending)),
            "unstake_at": int(unstake_at),
            "registered": bool(registered),
            "eligible": eligible,
            "wallet_balance_wei": str(int(self.w3.eth.get_balance(address))),  # type: ignore[arg-type]
        }

    def tx(self, tx_hash: str) -> TxView:
        """A transaction with its call decoded and its escrow logs decoded (and timed)."""
        try:
            tx = self.w3.eth.get_transaction(tx_hash)  # type: ignore[arg-type]
        except Exception as exc:  # web3 raises TransactionNotFound, or a RPC error for junk
            raise NotFoundError(f"no transaction {tx_hash}: {exc}") from None
        to = tx.get("to")
        data = bytes(HexBytes(tx.get("input", b"")))
        function: str | None = None
        inputs: dict[str, Any] = {}
        if to is not None and to_checksum_address(to) == self.escrow.address and len(data) >= 4:
            abi = self._selectors.get(data[:4])
            if abi is not None:
                function = str(abi["name"])
                try:  # strings as bytes, decoded like event strings: calldata is hostile too
                    types = [
                        "bytes" if i["type"] == "string" else abi_type(i) for i in abi["inputs"]
                    ]
                    values = abi_decode(types, data[4:])
                    inputs = {
                        i["name"] or f"arg{n}": _named(i, v)
                        if i["type"] != "string"
                        else decode_text(i["name"] or f"arg{n}", v)
                        for n, (i, v) in enumerate(zip(abi["inputs"], values, strict=True))
                    }
                except Exception:  # malformed calldata: show the name only
                    inputs = {}
        try:
            receipt = self.w3.eth.get_transaction_receipt(tx_hash)  # type: ignore[arg-type]
        except Exception:
            receipt = None
        events: list[ChainEvent] = []
        block: int | None = None
        when: int | None = None
        gas_used: int | None = None
        status = "pending"
        if receipt is not None:
            block = int(receipt["blockNumber"])
            with self._lock:
                when = self._block_time(block)
            gas_used = int(receipt["gasUsed"])
            status = "success" if receipt["status"] == 1 else "reverted"
            for n, raw in enumerate(self.escrow.decode_logs(receipt["logs"])):
                args, problems = dict(raw.args), dict(raw.problems)
                with self._lock:
                    token = self._currency_of(raw.name, args)
                events.append(
                    ChainEvent(
                        n,
                        raw.name,
                        args,
                        raw.block,
                        when,
                        raw.tx_hash,
                        raw.log_index,
                        problems,
                        token,
                    )
                )
        return TxView(
            tx_hash=hexstr(bytes(HexBytes(tx["hash"]))),
            sender=to_checksum_address(tx["from"]),
            to=to_checksum_address(to) if to else None,
            value=int(tx.get("value", 0)),
            function=function,
            inputs=inputs,
            status=status,
            block=block,
            time=when,
            gas_used=gas_used,
            events=events,
        )


def _copy(stats: AddressStats, events: list[int]) -> AddressStats:
    """A reader's copy of an address's totals (its per-token amounts copied too)."""
    tokens = {t: replace(a) for t, a in stats.tokens.items()}
    return replace(stats, events=events, tokens=tokens)


def job_of(jobs: dict[str, JobState], event: ChainEvent) -> JobState | None:
    """The folded job an event names, if the index has it."""
    job_id = event.job_id
    return jobs.get(job_id) if job_id is not None else None


def status_name(status: Status) -> str:
    """The lower-case name of an on-chain status (``funded``, ``released``...)."""
    return status.name.lower()
