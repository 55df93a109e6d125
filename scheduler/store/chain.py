"""The chain, folded in: the watcher's block cursor, and escrow events applied to jobs.

The on-chain struct of each job (``chain_job``) is folded from escrow events in log order by
:meth:`ChainStore.apply_chain_events` (the watcher) and :meth:`ChainStore.apply_sent` (our own
receipts); ``chain_pos`` makes both idempotent. An event moves the job's scheduler state only
where :mod:`scheduler.lifecycle` has a row for it (``CHAIN_EVENTS``, :func:`lifecycle.chain_event`);
the others only update the struct. Events that concern a job or the market without changing a
struct (``ProviderSlashed``, ``Credited``, ``MediatorListed``) leave an audit row.

Reorgs (docs/scheduler-chain.md "Reorgs"): the watcher's sink also keeps the hash of each batch's
last block (``chain_blocks``, the newest :data:`KEEP_BLOCKS`) with the cursor, and
:meth:`ChainStore.rollback` undoes what a reorg removed: every job whose fold reached past the fork
block is folded again from its events up to that block (read from the chain again), a job whose
creation was reorged out is deleted (or, when the scheduler already leased it, kept with chain
status None until its ``JobCreated`` comes back). The scheduler's own state (lease, attempts,
outbox) is not rewound: see the docs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    String,
    Table,
    bindparam,
    delete,
    insert,
    select,
    update,
)

from gridmarket.escrow import JOB_EVENTS, JobState, Status, apply_event, seat_ids
from scheduler import lifecycle
from scheduler.lifecycle import Event, State
from scheduler.matching.reputation import Outcome

from .jobs import JOB_BY_ID, UPDATE_JOB, JobStore
from .rows import JobRow, job_to_json, pos_of
from .tables import attempts, cursors, jobs, metadata, outbox

__all__ = ["CHAIN_CURSOR", "KEEP_BLOCKS", "ChainStore", "chain_blocks"]

_CHAIN_POS = select(jobs.c.chain_pos).where(jobs.c.job_id == bindparam("job_id_"))
_INSERT_JOB = insert(jobs)  # executed with a row's values: compiled once, no per-call cache key

CHAIN_CURSOR = "escrow"
KEEP_BLOCKS = 128
"""How many checkpoints (the watcher's delivered batch ends) are kept: the deepest reorg that
can be rolled back is about this many batches (blocks, once caught up)."""

# migration 0004 (belongs in tables.py with the others)
chain_blocks = Table(
    "chain_blocks",
    metadata,
    Column("block", BigInteger, primary_key=True),
    Column("hash", String(66), nullable=False),
)


class ChainStore(JobStore):
    """The ``cursors`` table and the fold of escrow events into ``jobs``."""

    def chain_cursor(self) -> int | None:
        with self.reader.connect() as conn:
            value = conn.execute(
                select(cursors.c.block).where(cursors.c.name == CHAIN_CURSOR)
            ).scalar()
            return None if value is None else int(value)

    def apply_chain_events(
        self, events: Sequence[Any], through_block: int, block_hash: str | None = None
    ) -> int:
        """The watcher's sink: fold escrow events into jobs and move the cursor, atomically.

        ``events`` are :class:`gridmarket.chain.Event` in log order. Events at or before a job's
        ``chain_pos`` were applied already (by an earlier batch or by our own receipt) and are
        skipped, so a repeated batch changes nothing. ``block_hash`` (the hash of
        ``through_block``) is kept as a checkpoint with the cursor. Returns the number of new
        jobs.
        """
        created = 0
        with self._begin_jobs_first() as conn:
            for ev in events:
                created += self._apply_event(conn, ev)
            self._set_cursor(conn, through_block)
            if block_hash is not None:
                conn.execute(delete(chain_blocks).where(chain_blocks.c.block >= through_block))
                conn.execute(insert(chain_blocks).values(block=through_block, hash=block_hash))
                oldest = conn.execute(
                    select(chain_blocks.c.block)
                    .order_by(chain_blocks.c.block.desc())
                    .offset(KEEP_BLOCKS - 1)
                    .limit(1)
                ).scalar()
                if oldest is not None:
                    conn.execute(delete(chain_blocks).where(chain_blocks.c.block < oldest))
            queued = conn.info.pop("queued", 0)
            conn.info.pop("slashed", None)
        if queued:
            self.on_queued(queued)
        return created

    def _set_cursor(self, conn: Connection, block: int) -> None:
        n = conn.execute(
            update(cursors).where(cursors.c.name == CHAIN_CURSOR).values(block=block)
        ).rowcount
        if n == 0:
            conn.execute(insert(cursors).values(name=CHAIN_CURSOR, block=block))

    # ------------------------------------------------------------------ reorgs
    def checkpoints(self) -> list[tuple[int, str]]:
        """The kept ``(block, hash)`` of the watcher's delivered batch ends, oldest first."""
        with self.reader.connect() as conn:
            rows = conn.execute(
                select(chain_blocks.c.block, chain_blocks.c.hash).order_by(chain_blocks.c.block)
            ).all()
        return [(int(b), str(h)) for b, h in rows]

    def rollback(self, fork_block: int, read: Any) -> list[str]:
        """Undo what a reorg removed: everything after ``fork_block`` (which the chain still
        has). Each job whose fold reached past it is folded again from its events up to it
        (``read(first, last, topics)``: the watcher's reader); a job created after it is deleted,
        or kept with chain status None when the scheduler leased it already (its attempts and
        outbox rows stay; its ``JobCreated`` folds in again if it comes back). The checkpoints
        after ``fork_block`` go and the cursor moves to it, in one transaction. Returns the ids
        of the jobs changed.
        """
        first_gone = pos_of(fork_block + 1, 0)
        with self.reader.connect() as conn:
            hit = conn.execute(
                select(jobs.c.job_id, jobs.c.created_block).where(jobs.c.chain_pos >= first_gone)
            ).all()
        kept = {str(j): int(b) for j, b in hit if int(b) <= fork_block}
        folded: dict[str, JobState] = {}
        last_pos: dict[str, int] = {}
        if kept:
            ids = sorted(kept)
            for ev in read(min(kept.values()), fork_block, [None, ids]):
                if ev.name not in JOB_EVENTS:
                    continue
                job_id = "0x" + bytes(ev.args["jobId"]).hex()
                if job_id not in kept or (job_id not in folded and ev.name != "JobCreated"):
                    continue
                folded[job_id] = apply_event(folded.get(job_id), ev.name, ev.args)
                last_pos[job_id] = pos_of(ev.block, ev.log_index)
        now = self.clock()
        with self.engine.begin() as conn:
            for job_id, created_block in ((str(j), int(b)) for j, b in hit):
                state = folded.get(job_id)
                if state is not None:
                    values: dict[str, Any] = {
                        "chain_status": int(state.status),
                        "chain_job": job_to_json(state),
                        "token": state.job.token,
                        "chain_pos": last_pos[job_id],
                        "updated_at": now,
                    }
                    row = self._job(conn, job_id)
                    if (
                        row.acceptance is not None
                        and row.state in lifecycle.OPEN
                        and row.attempt > state.job.attempt
                    ):
                        # our assign of the current lease was reorged out; its outbox row stays
                        # done (never sent twice): the same transaction mined again folds back in
                        values["reason"] = (
                            f"its assign (attempt {row.attempt}) was reorged out at block "
                            f"{fork_block}: waiting for it to be mined again"
                        )
                    conn.execute(update(jobs).where(jobs.c.job_id == job_id).values(**values))
                    self._audit(
                        conn,
                        "job",
                        job_id,
                        "chain:reorg",
                        fork_block=fork_block,
                        chain_status=state.status.name,
                    )
                    continue
                leased = (
                    conn.execute(
                        select(attempts.c.id).where(attempts.c.job_id == job_id).limit(1)
                    ).first()
                    or conn.execute(
                        select(outbox.c.id).where(outbox.c.job_id == job_id).limit(1)
                    ).first()
                )
                if leased is None:  # never offered: the chain has no such job, nor do we
                    conn.execute(delete(jobs).where(jobs.c.job_id == job_id))
                    self._audit(conn, "job", job_id, "chain:reorged_out", fork_block=fork_block)
                    continue
                conn.execute(
                    update(jobs)
                    .where(jobs.c.job_id == job_id)
                    .values(chain_status=0, chain_pos=0, updated_at=now)
                )
                self._audit(
                    conn,
                    "job",
                    job_id,
                    "chain:reorged_out",
                    fork_block=fork_block,
                    created_block=created_block,
                )
            conn.execute(delete(chain_blocks).where(chain_blocks.c.block > fork_block))
            self._set_cursor(conn, fork_block)
        return [str(j) for j, _ in hit]

    def apply_sent(self, job_id: str, events: Sequence[Any]) -> None:
        """Fold the events of our own mined transaction (before the watcher sees them)."""
        self.apply_sent_many([events])

    def apply_sent_many(self, per_job: Sequence[Sequence[Any]]) -> None:
        """:meth:`apply_sent` for the rows of one outbox batch (each job's events, in order)
        in one transaction: one commit for a ``multicall`` of many jobs instead of one each
        (the outbox's per-row commits left anvil idle most of the time under load)."""
        with self._begin_jobs_first() as conn:
            for ev in (e for events in per_job for e in events):
                self._apply_event(conn, ev)
            queued = conn.info.pop("queued", 0)
            conn.info.pop("slashed", None)
        if queued:
            self.on_queued(queued)

    def _apply_event(self, conn: Connection, ev: Any) -> int:
        args = ev.args
        if ev.name not in JOB_EVENTS:
            self._note_event(conn, ev)
            return 0
        job_id = "0x" + bytes(args["jobId"]).hex()
        pos = pos_of(ev.block, ev.log_index)
        now = self.clock()
        if ev.name == "JobCreated":
            known = conn.execute(_CHAIN_POS, {"job_id_": job_id}).scalar()
            if known == 0:  # its creation was reorged out after the scheduler leased it
                state = apply_event(None, ev.name, args)
                conn.execute(
                    update(jobs)
                    .where(jobs.c.job_id == job_id)
                    .values(
                        chain_status=int(state.status),
                        chain_job=job_to_json(state),
                        token=state.job.token,  # the same id may come back in another token
                        chain_pos=pos,
                        updated_at=now,
                    )
                )
                self._audit(conn, "job", job_id, "chain:" + ev.name, tx=ev.tx_hash, block=ev.block)
                return 0
            if known is not None:
                return 0
            state = apply_event(None, ev.name, args)
            start = lifecycle.step(None, Event.CREATED).value
            conn.execute(
                _INSERT_JOB,
                {
                    "job_id": job_id,
                    "submitter": state.job.submitter,
                    "bounty_wei": str(state.job.bounty),
                    "deadline": state.job.deadline,
                    "fee_bps": state.job.fee_bps,
                    "salt": "0x" + state.salt.hex(),
                    "spec_cid": state.spec_cid,
                    "spec": None,
                    "state": start,
                    "reason": "fetching the job spec from IPFS",
                    "created_block": ev.block,
                    "created_at": now,
                    "updated_at": now,
                    "queued_at": None,
                    "chain_status": int(state.status),
                    "chain_job": job_to_json(state),
                    "token": state.job.token,
                    "chain_pos": pos,
                    "output_cid": None,
                    "node_id": None,
                    "attempt": 0,
                    "lease_expires": None,
                    "excluded": [],
                    "failures": 0,
                    "result": None,
                },
            )
            self._audit(conn, "job", job_id, "created", tx=ev.tx_hash, block=ev.block)
            return 1
        # most events the watcher sees were folded already from our own receipt (apply_sent):
        # their position alone says so, without reading and decoding the row
        known = conn.execute(_CHAIN_POS, {"job_id_": job_id}).scalar()
        if known is None:
            return 0  # a job created before this scheduler's start block
        if pos <= known:
            return 0
        row = conn.execute(JOB_BY_ID, {"job_id_": job_id}).first()
        if row is None:
            return 0
        job = JobRow.of(row)
        if pos <= job.chain_pos:
            return 0
        new = apply_event(job.chain, ev.name, args)
        values: dict[str, Any] = {
            "chain_status": int(new.status),
            "chain_job": job_to_json(new),
            "chain_pos": pos,
            "updated_at": now,
        }
        event = lifecycle.chain_event(ev.name, args)
        to = None if event is None else lifecycle.target(job.state, event)
        holds = job.state in lifecycle.HOLDS_SLOT
        if event is Event.RELEASED_ON_CHAIN:
            values["output_cid"] = new.output_cid  # the struct's output, whatever our state
        if ev.name == "JobAssigned" and new.job.replicas:
            # one wallet holds one seat of a group, ever (the escrow: JobEscrowSeatTaken),
            # whoever sent the assign: never offer it another
            self._keep_off_siblings(conn, job, new.job.provider)
        if to is None:
            pass  # a step we took ourselves (assign, unassign, relay): the struct only
        elif event is Event.REFUNDED_ON_CHAIN and job.chain.status is Status.SUBMITTED:
            # a seat of a replicated job that `resolve` did not pay
            slashed = job_id in conn.info.get("slashed", set())
            if job.node_id and job.state in lifecycle.OPEN:
                if holds:
                    self._free_slot(conn, job.node_id)
                    self._held_drop(job.node_id, [job_id])
                if slashed:
                    self._reputation(conn, job.node_id, Outcome.REJECTED)
                why = (
                    "outvoted: its result disagreed with the majority"
                    if slashed
                    else ("no majority of the seats agreed; refunded, nobody slashed")
                )
                outcome = "outvoted" if slashed else "refunded"
                self._end_attempt(conn, job_id, job.attempt, outcome, why)
            reason = (
                "refunded to the submitter: this seat's result disagreed with the majority and "
                f"its provider {job.chain.job.provider} lost its collateral"
                if slashed
                else "refunded to the submitter: the seats never reached a majority"
            )
            values.update(state=to.value, reason=reason, node_id=None)
        elif event is Event.REFUNDED_ON_CHAIN:
            if job.node_id and job.state in lifecycle.OPEN:
                if holds:
                    self._free_slot(conn, job.node_id)
                self._end_attempt(conn, job_id, job.attempt, "refunded", "submitter refunded")
            values.update(state=to.value, reason="refunded to the submitter", node_id=None)
        elif event is Event.RELEASED_ON_CHAIN:
            if job.node_id is not None:
                self._paid(
                    conn,
                    job_id,
                    job.node_id,
                    job.attempt,
                    f"paid in {ev.tx_hash}",
                    free_slot=holds,
                )
            values.update(state=to.value, reason="paid", node_id=None, lease_expires=None)
        elif event is Event.DISPUTED_ON_CHAIN:
            values.update(
                state=to.value,
                reason=f"the submitter disputed the result: the mediator {new.job.mediator} "
                "rules on it",
            )
        elif event is Event.RULED_AGAINST:
            self._ruled_against(conn, job, new, values, ev)
            return 0
        elif event is Event.SUBMITTED_ON_CHAIN:
            # the provider submitted on-chain itself: verify it like a relayed result
            values.update(state=to.value, reason="verifying the result submitted on-chain")
            values["output_cid"] = new.output_cid
        conn.execute(UPDATE_JOB, {"job_id_": job_id, **values})
        self._audit(conn, "job", job_id, "chain:" + ev.name, tx=ev.tx_hash, block=ev.block)
        return 0

    def _ruled_against(
        self, conn: Connection, job: JobRow, new: Any, values: dict[str, Any], ev: Any
    ) -> None:
        """The mediator ruled the result wrong: the provider was slashed and the job is Funded
        again. The node that ran it takes a node fault (unless its result already failed our
        own check), and the job is queued again, never for that wallet."""
        job_id = job.job_id
        provider = str(ev.args["provider"]).lower()
        wallets = list(job.excluded_wallets)
        if provider not in wallets:
            wallets.append(provider)
        values.update(excluded_wallets=wallets, output_cid=None)
        conn.execute(update(jobs).where(jobs.c.job_id == job_id).values(**values))
        self._audit(conn, "job", job_id, "chain:" + ev.name, tx=ev.tx_hash, block=ev.block)
        node_id = job.node_id
        if node_id is not None:
            judged = conn.execute(
                select(attempts.c.id).where(
                    attempts.c.job_id == job_id,
                    attempts.c.attempt == job.attempt,
                    attempts.c.outcome == "rejected",
                )
            ).first()
            if judged is None:
                self._reputation(conn, node_id, Outcome.REJECTED)
            self._end_attempt(conn, job_id, job.attempt, "ruled_against", f"in {ev.tx_hash}")
            if job.state in lifecycle.HOLDS_SLOT:
                self._free_slot(conn, node_id)
                self._held_drop(node_id, [job_id])
        # a finalize (or a seat's resolve) still waiting (for the window, the mediator, the
        # deadline) has nothing left to pay, and must not hold back the next provider's assign;
        # the next result of a seat queues its group's resolve again
        conn.execute(
            update(outbox)
            .where(
                outbox.c.job_id == job_id,
                outbox.c.status == "pending",
                outbox.c.kind.in_(("finalize", "resolve")),
            )
            .values(status="done", error="moot: the mediator ruled the result wrong")
        )
        fresh = self._job(conn, job_id)
        state = self._requeue(
            conn,
            fresh,
            Event.RULED_AGAINST,
            exclude=True,
            failed=True,
            reason=f"the mediator ruled the result of attempt {new.job.attempt} wrong (provider "
            f"{ev.args['provider']} slashed)",
        )
        if state == State.QUEUED:
            conn.info["queued"] = conn.info.get("queued", 0) + 1

    def _note_event(self, conn: Connection, ev: Any) -> None:
        """An escrow event that changes no job struct but concerns a job or the market
        (a slash, a credit, the mediator list): an audit row, so the job's history shows it."""
        args = ev.args
        if ev.name in ("ProviderSlashed", "Credited"):
            job_id = "0x" + bytes(args["jobId"]).hex()
            if not conn.execute(select(jobs.c.job_id).where(jobs.c.job_id == job_id)).first():
                return
            detail: dict[str, Any] = {"tx": ev.tx_hash, "block": ev.block}
            if ev.name == "ProviderSlashed":
                conn.info.setdefault("slashed", set()).add(job_id)
                detail.update(
                    provider=args["provider"],
                    amount=str(args["amount"]),
                    submitter=args["submitter"],
                    to_mediator=str(args["toMediator"]),
                )
            else:
                reason = args["reason"]
                raw = getattr(reason, "raw", None)
                detail.update(
                    account=args["account"],
                    amount=str(args["amount"]),
                    reason=raw.decode("utf-8", "replace") if raw is not None else str(reason),
                )
            self._audit(conn, "job", job_id, "chain:" + ev.name, **detail)
        elif ev.name == "Resolved":
            group = "0x" + bytes(args["groupId"]).hex()
            digest = bytes(args["resultDigest"])
            for job_id in [
                "0x" + i.hex() for i in seat_ids(bytes(args["groupId"]), int(args["replicas"]))
            ]:
                if conn.execute(select(jobs.c.job_id).where(jobs.c.job_id == job_id)).first():
                    self._audit(
                        conn,
                        "job",
                        job_id,
                        "chain:Resolved",
                        group=group,
                        result_digest="0x" + digest.hex(),
                        agreeing=int(args["agreeing"]),
                        replicas=int(args["replicas"]),
                        tx=ev.tx_hash,
                        block=ev.block,
                    )
        elif ev.name == "MediatorListed":
            self._audit(
                conn,
                "escrow",
                str(args["mediator"]),
                "chain:MediatorListed",
                listed=bool(args["listed"]),
                tx=ev.tx_hash,
                block=ev.block,
            )
