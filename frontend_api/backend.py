"""The front end's connections (scheduler, chain, IPFS) and the views built from them.

A view is data put side by side for a page or an API answer (the chain's fold next to the
scheduler's state); nothing is decided here that the contract or the scheduler decides.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from eth_utils.address import to_checksum_address

from gridmarket.chain import Deployment, EscrowClient
from gridmarket.escrow import (
    FLAG_SPOT,
    ZERO_ADDRESS,
    JobState,
    Status,
    deposit_of,
    dispute_value,
)
from gridmarket.ipfs import IpfsStore

from .currency import Currencies, Currency
from .index import ChainIndex
from .records import ChainEvent, NotFoundError, hexstr, jsonable
from .scheduler import SchedulerClient, SchedulerError
from .settings import Settings
from .specdoc import SpecReader, job_spec
from .txs import TxBuilder
from .waits import Waits

ON_VERIFY_TRUST = (
    "The scheduler pays the provider as soon as its own integrity check passes (the output "
    "exists and hashes to its CID): you trust the scheduler's operator to pay only a result "
    "you would accept, and you cannot dispute it afterwards."
)
"""The one sentence the submit page and the CLI show about FLAG_ON_VERIFY's trust."""

CONSTANTS = {
    "challenge_window": "challengeWindow",
    "dispute_deposit": "disputeDeposit",
    "mediation_window": "mediationWindow",
    "min_collateral_bps": "minCollateralBps",
    "reassign_delay": "reassignDelay",
}
"""Deployment parameters the escrow also has as immutable views (read once, params as fallback)."""

TERMINAL_STATES = frozenset({"released", "refunded", "failed", "invalid", "expired"})
"""Scheduler states after which a job's page stops changing (with the chain's terminal ones)."""

SPEC_CACHE_MAX = 512
log = logging.getLogger(__name__)


class Backend:
    """Everything a request handler needs; one per app, made at start-up."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.deployment = Deployment.load(settings.deployment_file)
        self.escrow = EscrowClient.connect(
            settings.rpc_url, self.deployment, timeout=settings.request_timeout_s
        )
        self.index = ChainIndex(
            self.escrow,
            chunk_blocks=settings.log_chunk_blocks,
            min_interval_s=settings.index_min_interval_s,
        )
        self.txs = TxBuilder(self.escrow)
        self.currencies = Currencies(self.deployment.tokens)
        """ETH and the tokens the deployment file lists: every amount is shown in its own."""
        self.scheduler = SchedulerClient(settings.scheduler_url, settings.request_timeout_s)
        self.specs = SpecReader(self.ipfs)
        """Job specs from IPFS, decoded defensively (:mod:`frontend_api.specdoc`)."""
        self.cache_dir = Path(tempfile.mkdtemp(prefix="gridmarket-frontend-"))
        self._fetch_locks: dict[str, threading.Lock] = {}
        self._fetch_lock = threading.Lock()
        self.waits = Waits(settings.wait_threads, settings.waits_per_client)
        # the IPFS proxy's cache: CID -> (bytes on disk, last use), least recently used first
        self._cached: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self._constants: dict[str, int] | None = None
        self._senders: dict[str, str] = {}  # tx hash -> sender (a spot job's disputes)

    async def aclose(self) -> None:
        self.waits.close()
        await self.scheduler.aclose()
        shutil.rmtree(self.cache_dir, ignore_errors=True)

    # ------------------------------------------------------------------ plumbing
    def ipfs(self) -> IpfsStore:
        """A fresh IPFS client (the HTTP client underneath is not shared between threads)."""
        return IpfsStore(
            self.settings.ipfs_api,
            timeout=max(60.0, self.settings.ipfs_timeout_s),
            resolve_timeout=self.settings.ipfs_timeout_s,
        )

    async def refresh(self, *, force: bool = False) -> int:
        """Read new blocks into the chain index (rate-limited unless ``force``)."""
        return await asyncio.to_thread(self.index.refresh, force=force)

    def chain_now(self) -> int:
        """The chain's time as the next block will see it (anvil and real chains: wall time
        or later)."""
        return max(int(time.time()), self.index.head_time)

    @property
    def params(self) -> dict[str, Any]:
        """The deployment's parameters, with the escrow's immutable values read from the
        contract (a deployment file written by an older tool may lack them)."""
        out = dict(self.deployment.params)
        out.update(self.constants())
        return out

    def constants(self) -> dict[str, int]:
        """``challengeWindow``, ``disputeDeposit``... read from the contract once (they are
        immutable); the deployment file's values while the chain cannot be asked."""
        if self._constants is not None:
            return dict(self._constants)
        found: dict[str, int] = {}
        try:
            for key, view in CONSTANTS.items():
                found[key] = int(self.escrow.call(view))
        except Exception as exc:  # the chain is down: the file's values, asked again later
            log.warning("escrow constants unreadable (%s); using the deployment file", exc)
            return {k: int(v) for k, v in self.deployment.params.items() if k in CONSTANTS and v}
        self._constants = found
        return dict(found)

    def operator(self) -> str | None:
        """The operator in office now (``operator()``: the owner may replace it at any time,
        and a funding names the one its submitter approved); the deployment file's while the
        chain cannot be asked."""
        try:
            return str(to_checksum_address(str(self.escrow.call("operator"))))
        except Exception as exc:  # the chain is down: what the deployment file says
            log.warning("operator() unreadable (%s); using the deployment file", exc)
            known = self.deployment.params.get("operator")
            return str(known) if known else None

    def default_mediator(self, sender: str | None = None) -> str | None:
        """The deployment's listed mediator; else ``sender`` (a submitter may rule itself)."""
        listed = self.deployment.params.get("mediator")
        if listed and str(listed).lower() != ZERO_ADDRESS:
            return str(listed)
        return sender

    def currency(self, token: str) -> Currency:
        """The currency of a job's ``token`` (an unlisted one by its address)."""
        return self.currencies.of(token)

    def dispute_deposit(self, state: JobState) -> int:
        """What disputing this job deposits, in its token (``JobEscrow.depositOf``, mirrored:
        tests/frontend/test_token_api.py checks the two agree): the job's bounty (the price of
        the mediator's re-run), for an ETH job that is not a spot job at least the escrow's
        ``disputeDeposit`` wei. A spot job's was locked at funding (its check deposit)."""
        return self.deposit_for(state.job.bounty, state.job.token, state.job.flags)

    def dispute_value(self, state: JobState) -> int:
        """The ETH a dispute of this job sends (``gridmarket.escrow.dispute_value``): the
        deposit for an ETH job, nothing for a token job or a spot job."""
        floor = int(self.constants().get("dispute_deposit", 0))
        return dispute_value(state.job.bounty, state.job.token, floor, state.job.flags)

    def deposit_for(self, bounty: int, token: str = ZERO_ADDRESS, flags: int = 0) -> int:
        """The dispute deposit of a job of ``bounty`` in ``token`` (:meth:`dispute_deposit`
        before the job exists: a quote)."""
        return deposit_of(bounty, token, int(self.constants().get("dispute_deposit", 0)), flags)

    def tx_sender(self, tx_hash: str) -> str | None:
        """Who sent ``tx_hash`` (cached: a mined transaction's sender never changes); None when
        the chain cannot say. Tells a spot job's check (the mediator's dispute) from the
        submitter's own dispute."""
        cached = self._senders.get(tx_hash)
        if cached is not None:
            return cached
        try:
            sender = str(self.escrow.w3.eth.get_transaction(tx_hash)["from"])  # type: ignore[arg-type]
        except Exception as exc:  # web3 raises TransactionNotFound, or an RPC error
            log.info("sender of %s unreadable: %s", tx_hash, exc)
            return None
        if len(self._senders) >= SPEC_CACHE_MAX:
            self._senders.clear()
        self._senders[tx_hash] = sender
        return sender

    def terms_view(self, state: JobState, now: int) -> dict[str, Any]:
        """A job's terms and where it stands in its challenge or mediation window; amounts in
        the job's currency (``currency``)."""
        job = state.job
        c = self.constants()
        window = int(c.get("challenge_window", 0))
        mediation = int(c.get("mediation_window", 0))
        out: dict[str, Any] = {
            "token": job.token,
            "currency": self.currency(job.token).to_json(),
            "operator": job.operator,
            "mediator": job.mediator,
            "mediator_is_submitter": job.mediator == job.submitter,
            "collateral_wei": str(job.collateral),
            "flags": job.flags,
            "payment": "on_verify" if job.on_verify else "after_window",
            "spot": bool(job.flags & FLAG_SPOT),
            "challenge_window_s": window,
            "dispute_deposit_wei": str(self.dispute_deposit(state)),
            "since": job.since or None,
            "window_ends": None,
            "window_open": False,
            "disputed_at": job.disputed_at or None,
            "mediation_ends": None,
        }
        if state.status is Status.SUBMITTED:
            out["window_ends"] = job.since + window
            out["window_open"] = now < job.since + window
        elif state.status is Status.DISPUTED:
            out["mediation_ends"] = job.disputed_at + mediation
        return out

    def explorer_link(self, kind: str, value: str) -> str | None:
        """``<explorer_url>/tx/<hash>`` or ``/address/<addr>`` when a public explorer is set."""
        base = self.settings.explorer_url
        return f"{base}/{kind}/{value}" if base else None

    # ------------------------------------------------------------------ IPFS
    def spec_of(self, spec_cid: str) -> dict[str, Any] | None:
        """The job spec at ``spec_cid`` as a valid ``JobSpec``'s JSON (integrity-checked against
        its CID, capped, decoded by :func:`frontend_api.specdoc.decode_spec`), cached by CID;
        None if IPFS does not have it or it is invalid."""
        return self.specs.read(spec_cid).spec

    def fetch_tree(self, cid: str) -> Path:
        """``cid`` fetched (integrity-checked against its CID, capped) into the cache; its path:
        the directory itself, or the single file. Content-addressed, so fetched once."""
        with self._fetch_lock:
            lock = self._fetch_locks.setdefault(cid, threading.Lock())
        with lock:
            dest = self.cache_dir / cid
            done = dest / ".complete"
            if done.exists():
                with self._fetch_lock:
                    size = self._cached.pop(cid, (0, 0.0))[0]
                    self._cached[cid] = (size, time.monotonic())
                return Path(done.read_text())
            staging = self.cache_dir / f".{cid}.{threading.get_ident()}"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            try:
                with self.ipfs() as store:
                    got = store.fetch(cid, staging / "root", self.settings.download_max_bytes)
                shutil.rmtree(dest, ignore_errors=True)
                staging.rename(dest)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            target = dest / got.relative_to(staging)
            done.write_text(str(target))
        self._account_cache(cid, dest)
        return target

    def _account_cache(self, cid: str, dest: Path) -> None:
        """Count ``dest`` in the cache and evict the least recently used entries past the
        budget (``download_cache_bytes``). Entries used in the last ``download_cache_grace_s``
        are kept (they may be being served): the budget can be passed for that long."""
        size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
        now = time.monotonic()
        evict: list[str] = []
        with self._fetch_lock:
            self._cached.pop(cid, None)
            self._cached[cid] = (size, now)
            total = sum(s for s, _ in self._cached.values())
            for old, (old_size, used) in list(self._cached.items()):
                if total <= self.settings.download_cache_bytes:
                    break
                if old == cid or now - used < self.settings.download_cache_grace_s:
                    continue
                del self._cached[old]
                total -= old_size
                evict.append(old)
        for old in evict:
            lock = self._fetch_locks.get(old)
            if lock is None or not lock.acquire(blocking=False):
                continue  # being fetched again right now: leave it
            try:
                shutil.rmtree(self.cache_dir / old, ignore_errors=True)
            finally:
                lock.release()
            log.info("IPFS cache: evicted %s (budget %d bytes)", old, total)

    def cache_usage(self) -> tuple[int, int]:
        """(entries, bytes) in the IPFS proxy's cache."""
        with self._fetch_lock:
            return len(self._cached), sum(s for s, _ in self._cached.values())

    # ------------------------------------------------------------------ views
    async def scheduler_job(self, job_id: str) -> tuple[dict[str, Any] | None, str | None]:
        """The scheduler's view of a job and, when it could not be asked, why."""
        try:
            return await self.scheduler.job(job_id), None
        except SchedulerError as exc:
            return None, str(exc)

    def chain_job(self, job_id: str) -> tuple[JobState, list[ChainEvent]] | None:
        try:
            return self.index.job(job_id)
        except NotFoundError:
            return None

    async def job_view(self, job_id: str) -> dict[str, Any]:
        """A job as the chain and the scheduler see it, with what its submitter may do now.

        :class:`NotFoundError` when neither knows it.
        """
        found = self.chain_job(job_id)
        sched, sched_error = await self.scheduler_job(job_id)
        if found is None and sched is None:
            raise NotFoundError(
                f"job {job_id} is not on escrow {self.escrow.address}"
                + (f" ({sched_error})" if sched_error else "")
            )
        view: dict[str, Any] = {
            "job_id": job_id,
            "chain": None,
            "scheduler": sched,
            "scheduler_error": sched_error,
        }
        now = self.chain_now()
        actions = {
            "cancel": False,
            "refund": False,
            "release": False,
            "dispute": False,
            "finalize": False,
        }
        if found is not None:
            state, events = found
            job = state.job
            terms = self.terms_view(state, now)
            view["chain"] = {
                "status": state.status.name.lower(),
                "submitter": job.submitter,
                "token": job.token,
                "currency": self.currency(job.token).to_json(),
                "bounty_wei": str(job.bounty),
                "fee_bps": job.fee_bps,
                "fee_wei": str(job.fee),
                "payout_wei": str(job.payout),
                "deadline": job.deadline,
                "provider": None if int(job.provider, 16) == 0 else job.provider,
                "attempt": job.attempt,
                "since": job.since or None,
                # while Assigned: until when only the provider may hand it back (its holdFor)
                "hold_until": job.hold_until or None,
                "terms": terms,
                "spec_cid": state.spec_cid,
                "salt": hexstr(state.salt),
                "output_cid": state.output_cid,
                "problem": state.problem,
                "events": [e.to_json() for e in events],
                "rulings": rulings(events),
                "credits": [
                    {
                        "account": str(e.args.get("account")),
                        "amount_wei": str(e.args.get("amount")),
                        "reason": str(e.args.get("reason")),
                        "tx_hash": e.tx_hash,
                        "time": e.time,
                    }
                    for e in events
                    if e.name == "Credited"
                ],
            }
            # What the contract allows now (the preconditions of JobEscrow.cancel, refund,
            # release, dispute, finalize); who may is the dry run's check, from the wallet's
            # address, before a transaction is offered.
            actions["cancel"] = state.status is Status.FUNDED
            actions["refund"] = state.status in (Status.FUNDED, Status.ASSIGNED) and (
                now > job.deadline
            )
            actions["release"] = state.status is Status.SUBMITTED
            actions["dispute"] = state.status is Status.SUBMITTED and bool(terms["window_open"])
            actions["finalize"] = (
                state.status is Status.SUBMITTED and not terms["window_open"]
            ) or (state.status is Status.DISPUTED and now >= int(terms["mediation_ends"] or 0))
            view["spot"] = await self.spot_section(state, events)
            if job.replicas:  # a seat is settled with its group (resolve), never on its own
                actions["dispute"] = actions["finalize"] = False
                # cancel refuses a seat: the submitter resolves the group while every seat is
                # still Funded (cancel_problem says why not otherwise)
                why_not = self.cancel_problem(state)[1]
                actions["cancel"] = why_not is None
                group_id = self.index.group_of(state)
                view["chain"]["replicas"] = job.replicas
                # why the submitter cannot cancel the replicated job now (none once final)
                view["chain"]["cancel_problem"] = (
                    why_not if state.status in (Status.FUNDED, Status.ASSIGNED) else None
                )
                view["chain"]["verification"] = f"replicate:{job.replicas}"
                view["group"] = self.group_view(group_id) if group_id else None
            else:
                view["chain"]["replicas"] = 0
                view["chain"]["cancel_problem"] = None
                spot_p = (view["spot"] or {}).get("p")
                view["chain"]["verification"] = (
                    f"spot:{spot_p}" if spot_p else "spot" if view["spot"] else "integrity"
                )
        chain = view["chain"]
        view.setdefault("group", None)
        view.setdefault("spot", None)
        view["state"] = (sched or {}).get("state") or (chain or {}).get("status")
        if (
            view["group"] is not None
            and (chain or {}).get("status") in ("released", "refunded")
            and view["state"] not in TERMINAL_STATES
        ):  # a seat settled by `resolve` (sent by anyone): the chain is final before the
            view["state"] = chain["status"]  # scheduler has folded it
        view["chain_status"] = (chain or {}).get("status")
        view["output_cid"] = (chain or {}).get("output_cid") or (sched or {}).get("output_cid")
        view["spec_cid"] = (chain or {}).get("spec_cid") or (sched or {}).get("spec_cid")
        view["spec_problem"] = None  # a spec the scheduler has not taken: why (specdoc)
        if (
            view["spec_cid"]
            and not (chain or {}).get("problem")
            and view["state"] != "pending_spec"
        ):
            doc = await asyncio.to_thread(job_spec, self.specs, view["spec_cid"], sched)
            view["spec_problem"] = doc.problem
        view["actions"] = actions
        view["chain_time"] = now
        view["final"] = (chain or {}).get("status") in ("released", "refunded") or (
            view["state"] in TERMINAL_STATES and chain is not None
        )
        if view["group"] is not None and not view["group"]["final"]:
            view["final"] = False  # a seat's page follows its group until every seat is final
        txs: dict[str, dict[str, Any]] = {}
        for event in (chain or {}).get("events", []):
            entry = txs.setdefault(
                event["tx_hash"],
                {
                    "tx_hash": event["tx_hash"],
                    "block": event["block"],
                    "time": event["time"],
                    "events": [],
                },
            )
            entry["events"].append(event["name"])
        view["transactions"] = list(txs.values())
        return view

    async def spot_section(
        self, state: JobState, events: list[ChainEvent]
    ) -> dict[str, Any] | None:
        """A spot job's section (:func:`frontend_api.spotcheck.spot_view`); None for a job not
        funded with ``FLAG_SPOT``. Its spec comes from IPFS (cached); the reveal from the
        scheduler once the job is settled (its errors shown, never fatal: the page renders from
        the chain alone)."""
        from .spotcheck import spot_view

        flagged = bool(state.job.flags & FLAG_SPOT)
        if not flagged:  # (a spec's `spot` without the flag was funded as a plain job)
            return None
        doc = await asyncio.to_thread(self.specs.read, state.spec_cid) if state.spec_cid else None
        senders: dict[str, str] = {}
        for e in events:
            if e.name == "ResultDisputed":
                sender = await asyncio.to_thread(self.tx_sender, e.tx_hash)
                if sender is not None:
                    senders[e.tx_hash] = sender
        status: dict[str, Any] | None = None
        status_error: str | None = None
        if state.status in (Status.RELEASED, Status.REFUNDED):
            try:
                status = await self.scheduler.spot(hexstr(state.job_id))
            except SchedulerError as exc:
                status_error = str(exc)
            except ValueError as exc:  # not JSON
                status_error = f"scheduler: unreadable answer ({exc})"
            if status is not None and not isinstance(status, dict):
                status, status_error = None, "scheduler: unreadable answer"
        return spot_view(
            doc.spec if doc else None,
            flagged,
            state.job.attempt,
            events,
            state.job.submitter,
            senders,
            status,
            status_error,
            doc.problem if doc else None,
        )

    def cancel_problem(
        self, state: JobState, sender: str | None = None
    ) -> tuple[tuple[str, list[JobState]] | None, str | None]:
        """How a replicated job (one of its seats: ``state``) is cancelled, or why it cannot
        be: ``((group id, every seat's state in order), None)`` when ``resolve(groupId,
        seats)`` from its submitter refunds every seat now (JobEscrow version 5: ``cancel``
        refuses a seat; ``resolve`` cancels while every seat is Funded), else ``(None, why)``
        in words. ``sender``: who asks (only the submitter may)."""
        group_id = self.index.group_of(state)
        if group_id is None:
            return None, "the replicated job's group is not in the escrow's log yet: try again"
        _, seats, _ = self.index.group(group_id)
        if sender is not None and sender.lower() != state.job.submitter.lower():
            return None, (
                f"only the job's submitter {state.job.submitter} may cancel it, not {sender}"
            )
        known: list[JobState] = []
        for n, seat in enumerate(seats):
            if seat is None:
                return None, f"seat {n} is not in the escrow's log yet: try again"
            if seat.status is not Status.FUNDED:
                doing = {
                    Status.ASSIGNED: "is held by a provider",
                    Status.SUBMITTED: "has a result",
                }.get(seat.status, f"is {seat.status.name.lower()}")
                return None, (
                    f"seat {n} of this replicated job {doing}: a replicated job can be "
                    "cancelled only while no seat is held or delivered. Wait for the seats' "
                    "results, or for the deadline to pass: resolve then pays the agreeing "
                    "majority, or refunds what nobody earned"
                )
            known.append(seat)
        return (group_id, known), None

    def group_view(self, group_id: str) -> dict[str, Any]:
        """A replicated job: its seats (state, provider, output CID, whether its result is the
        majority's), and the verdict of Resolved: agreeing count, winning digest and output,
        the seats paid and the providers slashed. :class:`NotFoundError` for an unknown group."""
        group, seats, group_events = self.index.group(group_id)
        rows: list[dict[str, Any]] = []
        slashed: list[dict[str, Any]] = []
        paid: list[str] = []
        winning_cid: str | None = None
        for n, (seat_id, state) in enumerate(zip(group.seat_ids, seats, strict=True)):
            if state is None:
                rows.append({"seat": n, "job_id": seat_id, "status": "unknown"})
                continue
            job = state.job
            digest = hexstr(job.result_digest) if int.from_bytes(job.result_digest) else None
            agrees = None
            if group.resolved and group.majority and digest is not None:
                agrees = digest == group.result_digest
                if agrees and winning_cid is None:
                    winning_cid = state.output_cid
            _, events = self.index.job(seat_id)
            slash = next(
                (
                    e
                    for e in events
                    if e.name == "ProviderSlashed" and e.tx_hash == group.resolved_tx
                ),
                None,
            )
            provider = None if int(job.provider, 16) == 0 else job.provider
            if slash is not None:
                slashed.append(
                    {
                        "seat": n,
                        "job_id": seat_id,
                        "provider": str(slash.args.get("provider")),
                        "amount_wei": str(slash.args.get("amount")),
                        "tx_hash": slash.tx_hash,
                    }
                )
            if state.status is Status.RELEASED and provider:
                paid.append(provider)
            rows.append(
                {
                    "seat": n,
                    "job_id": seat_id,
                    "status": state.status.name.lower(),
                    "provider": provider,
                    "output_cid": state.output_cid,
                    "result_digest": digest,
                    "agrees": agrees,
                    "slashed": slash is not None,
                    "problem": state.problem,
                }
            )
        final = all(r["status"] in ("released", "refunded") for r in rows)
        token = next((st.job.token for st in seats if st is not None), ZERO_ADDRESS)
        verdict: dict[str, Any] | None = None
        if group.resolved:
            verdict = {
                "majority": group.majority,
                "agreeing": group.agreeing,
                "replicas": group.replicas,
                "result_digest": group.result_digest,
                "output_cid": winning_cid,
                "paid": paid,
                "slashed": slashed,
                "tx_hash": group.resolved_tx,
                "time": group.resolved_time,
            }
        return {
            **group.to_json(),
            "verification": f"replicate:{group.replicas}",
            "token": token,
            "currency": self.currency(token).to_json(),
            "seats": rows,
            "final": final,
            "verdict": verdict,
            "events": [e.to_json() for e in group_events],
        }

    async def address_view(self, address: str) -> dict[str, Any]:
        """Totals from the events, live balance and stake, jobs and nodes of one address."""
        stats = self.index.stats(address)
        account = await asyncio.to_thread(self.index.account, address)
        nodes: list[dict[str, Any]] = []
        nodes_error = None
        try:
            fleet = await self.scheduler.nodes()
            nodes = [n for n in fleet.get("nodes", []) if n.get("wallet") == address]
        except SchedulerError as exc:
            nodes_error = str(exc)
        events = self.index.events(stats.events, limit=200)
        as_submitter = self.index.jobs(submitter=address)
        payouts = self.index.payouts(provider=address)
        totals = stats.to_json()
        totals["tokens"] = {
            t: {**amounts, "currency": self.currency(t).to_json()}
            for t, amounts in totals["tokens"].items()
        }
        account["tokens"] = await asyncio.to_thread(
            self.token_accounts, address, set(totals["tokens"])
        )
        return {
            "address": address,
            "totals": totals,
            "account": account,
            "nodes": nodes,
            "nodes_error": nodes_error,
            "payouts": [p.to_json() for p in payouts],
            "jobs_submitted": [
                {**job_summary(s), "currency": self.currency(s.job.token).to_json()}
                for s in as_submitter
            ],
            "events": [e.to_json() for e in events],
            "explorer": self.explorer_link("address", address),
        }

    def token_accounts(self, address: str, seen: set[str]) -> dict[str, dict[str, Any]]:
        """Live reads per ERC-20 (the listed ones and any ``seen`` in the address's events):
        withdrawable balance (``balanceOfToken``), stake and the part jobs lock (``stakeOf``)
        and free collateral (``freeCollateralIn``), with the currency."""
        tokens = {c.address for c in self.currencies.all() if not c.is_eth} | seen
        out: dict[str, dict[str, Any]] = {}
        for token in sorted(tokens):
            balance = int(self.escrow.call("balanceOfToken", address, token))
            stake, locked, unstake_at, _, unstake_pending = self.escrow.call(
                "stakeOf", address, token
            )
            free = int(self.escrow.call("freeCollateralIn", address, token))
            out[token] = {
                "currency": self.currency(token).to_json(),
                "balance_wei": str(balance),
                "stake_wei": str(int(stake)),
                "locked_wei": str(int(locked)),
                "free_collateral_wei": str(free),
                "unstake_pending_wei": str(int(unstake_pending)),
                "unstake_at": int(unstake_at),
            }
        return out

    async def fleet_view(self) -> dict[str, Any]:
        """Nodes from the scheduler and a leaderboard of providers from the chain."""
        nodes: list[dict[str, Any]] = []
        counts: dict[str, int] = {}
        error = None
        try:
            fleet = await self.scheduler.nodes()
            nodes, counts = fleet.get("nodes", []), fleet.get("counts", {})
        except SchedulerError as exc:
            error = str(exc)
        by_wallet: dict[str, list[dict[str, Any]]] = {}
        for n in nodes:
            by_wallet.setdefault(str(n.get("wallet")), []).append(n)
        providers = self.index.providers()
        board: list[dict[str, Any]] = []
        for wallet in set(providers) | set(by_wallet):
            stats = providers.get(wallet)
            mine = by_wallet.get(wallet, [])
            board.append(
                {
                    "wallet": wallet,
                    "jobs_paid": stats.jobs_paid if stats else 0,
                    "earned_wei": str(stats.earned if stats else 0),
                    "slash_count": stats.slash_count if stats else 0,
                    "staked_wei": str(stats.staked if stats else 0),
                    "nodes": len(mine),
                    "online": sum(1 for n in mine if n.get("status") == "online"),
                    "jobs_done": sum(int(n.get("jobs_done") or 0) for n in mine),
                    "reputation": max(
                        (float(n.get("reputation") or 0) for n in mine), default=None
                    ),
                }
            )
        board.sort(key=lambda r: (-int(r["earned_wei"]), -int(r["jobs_done"]), r["wallet"]))
        leaderboards: dict[str, dict[str, Any]] = {}
        for wallet, stats in providers.items():
            for token, amounts in stats.tokens.items():
                entry = leaderboards.setdefault(
                    token, {"currency": self.currency(token).to_json(), "rows": []}
                )
                entry["rows"].append(
                    {
                        "wallet": wallet,
                        "earned_wei": str(amounts.earned),
                        "staked_wei": str(amounts.staked),
                        "slashed_wei": str(amounts.slashed),
                    }
                )
        for entry in leaderboards.values():
            entry["rows"].sort(key=lambda r: (-int(r["earned_wei"]), r["wallet"]))
        tiers: dict[str, int] = {}
        regions: dict[str, int] = {}
        for n in nodes:
            tiers[str(n.get("tier"))] = tiers.get(str(n.get("tier")), 0) + 1
            regions[str(n.get("region"))] = regions.get(str(n.get("region")), 0) + 1
        return {
            "nodes": nodes,
            "counts": counts,
            "by_tier": dict(sorted(tiers.items(), key=lambda kv: -kv[1])),
            "by_region": dict(sorted(regions.items(), key=lambda kv: -kv[1])),
            "leaderboard": board,
            "token_leaderboards": dict(sorted(leaderboards.items())),
            "error": error,
        }


def rulings(events: list[ChainEvent]) -> list[dict[str, Any]]:
    """A job's ``Ruled`` events, each with the slash (``ProviderSlashed``) that followed it."""
    out: list[dict[str, Any]] = []
    for n, e in enumerate(events):
        if e.name != "Ruled":
            continue
        slash = next(
            (x for x in events[n + 1 :] if x.name == "ProviderSlashed" and x.tx_hash == e.tx_hash),
            None,
        )
        out.append(
            {
                "upheld": bool(e.args.get("upheld")),
                "mediator": str(e.args.get("mediator")),
                "provider": str(e.args.get("provider")),
                "attempt": e.args.get("attempt"),
                "tx_hash": e.tx_hash,
                "time": e.time,
                "slashed_wei": str(slash.args.get("amount")) if slash else None,
                "to_mediator_wei": str(slash.args.get("toMediator")) if slash else None,
            }
        )
    return out


def job_summary(state: JobState) -> dict[str, Any]:
    """One line of a job list, from the chain's fold."""
    job = state.job
    return {
        "job_id": hexstr(state.job_id),
        "status": state.status.name.lower(),
        "submitter": job.submitter,
        "provider": None if int(job.provider, 16) == 0 else job.provider,
        "token": job.token,
        "bounty_wei": str(job.bounty),
        "deadline": job.deadline,
        "mediator": job.mediator,
        "collateral_wei": str(job.collateral),
        "payment": "on_verify" if job.on_verify else "after_window",
        "replicas": job.replicas,
        "spot": bool(job.flags & FLAG_SPOT),
        "group_id": hexstr(state.salt) if job.replicas else None,
        "spec_cid": state.spec_cid,
        "output_cid": state.output_cid,
        "problem": state.problem,
    }


def dumps(value: Any) -> str:
    """Compact JSON of a view (bytes as hex)."""
    return json.dumps(jsonable(value), separators=(",", ":"), sort_keys=True)
