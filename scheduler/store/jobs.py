"""Jobs: reads, and the transitions that follow a job's spec, its results and its verdict.

Every transition asks :mod:`scheduler.lifecycle` where the job goes, then writes that state in
one transaction with its audit row (and the outbox row, attempt end, slot and reputation the
move needs). A method whose move the table refuses changes nothing and returns the state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, and_, bindparam, case, func, or_, select, update
from sqlalchemy.exc import IntegrityError

from gridmarket.cid import CidError, same_cid
from gridmarket.escrow import ZERO_ADDRESS, Job, Status, seat_ids
from gridmarket.holds import hold_for as offered_hold
from gridmarket.wire import JobSpec, ResultReport
from scheduler import lifecycle
from scheduler.lifecycle import Event, Fault, State
from scheduler.matching.reputation import Outcome

from .outbox import OutboxStore
from .reputation import ReputationStore
from .rows import (
    ConflictError,
    JobRow,
    NotFoundError,
    SeatTakenError,
    ShortOfCollateralError,
    block_of,
    pos_of,
)
from .tables import attempts, job_columns, jobs, nodes, outbox

__all__ = ["TIMED_OUT", "JobStore"]

TIMED_OUT = "timed_out"
"""An attempt that ran out of the job's time: counted against its node if the job is paid."""


# Statements the hot paths run built once, with bound parameters (building one per call, and
# its cache key, cost more than running it on SQLite: issue 12's claims profile)
JOB_BY_ID = select(*job_columns).where(jobs.c.job_id == bindparam("job_id_"))
JOB_BY_ID_FOR_UPDATE = JOB_BY_ID.with_for_update()
UPDATE_JOB = update(jobs).where(jobs.c.job_id == bindparam("job_id_"))
_UPDATE_JOB_IN_STATE = update(jobs).where(
    jobs.c.job_id == bindparam("job_id_"), jobs.c.state == bindparam("state_")
)
_WALLET = select(nodes.c.wallet).where(nodes.c.node_id == bindparam("node_id_"))
_WALLET_FOR_UPDATE = _WALLET.with_for_update()
_PENDING_COLUMNS = (
    select(
        # the two fields read as text by the database (json_extract, ->>): decoding each
        # row's whole chain struct in Python was 40% of an acceptance with 60 pending
        jobs.c.chain_job["collateral"].as_string().label("collateral"),
        jobs.c.chain_job["provider"].as_string().label("provider"),
        jobs.c.chain_status,
        jobs.c.chain_pos,
    )
    .select_from(jobs.join(nodes, jobs.c.node_id == nodes.c.node_id))
    .where(
        nodes.c.wallet == bindparam("wallet_"),
        jobs.c.acceptance.is_not(None),
        jobs.c.job_id != bindparam("but_"),
        jobs.c.token == bindparam("token_"),
    )
)
_HOLDING = (int(Status.ASSIGNED), int(Status.SUBMITTED), int(Status.DISPUTED))
_PENDING_UNASSIGNED = _PENDING_COLUMNS.where(jobs.c.chain_status == int(Status.FUNDED))
# ... and the held ones folded from a block after the free collateral was read
_PENDING_SINCE = _PENDING_COLUMNS.where(
    or_(
        jobs.c.chain_status == int(Status.FUNDED),
        and_(jobs.c.chain_status.in_(_HOLDING), jobs.c.chain_pos >= bindparam("later_")),
    )
)


def _terms(job: Job) -> tuple[object, ...]:
    """The fields of a job's struct that its EIP-712 ``Acceptance`` signs (besides its id and
    the attempt), addresses compared case-blind."""
    return (
        job.bounty,
        job.fee_bps,
        job.deadline,
        job.collateral,
        job.mediator.lower(),
        job.flags,
        job.token.lower(),
    )


def _same(a: str | None, b: str | None) -> bool:
    """Two optional CIDs name the same content (binary comparison, any text encoding)."""
    if a is None or b is None:
        return a is b
    try:
        return same_cid(a, b)
    except CidError:
        return False


class JobStore(ReputationStore, OutboxStore):
    """The ``jobs`` table, apart from leases (``leases.py``, ``claims.py``) and the chain fold
    (``chain.py``)."""

    def _job(self, conn: Connection, job_id: str, *, lock: bool = False) -> JobRow:
        q = JOB_BY_ID_FOR_UPDATE if lock and self.postgres else JOB_BY_ID
        row = conn.execute(q, {"job_id_": job_id}).first()
        if row is None:
            raise NotFoundError(f"no job {job_id}")
        return JobRow.of(row)

    def _requeue(
        self,
        conn: Connection,
        job: JobRow,
        event: Event,
        *,
        exclude: bool,
        reason: str,
        failed: bool = False,
    ) -> str:
        """Put a job back in the queue after ``event`` (lease lost, failed run, result failed
        the check, ruled against, ...), or on to where the queue sends it (failed when its
        attempts are used up, expired when its deadline has passed). ``exclude``: the job never
        goes back to that node's wallet (any of its nodes: the escrow sees one provider).

        A lease the node had accepted may be assigned on-chain (or about to be): the outbox
        takes it back (``unassign``; the escrow lets the operator do that only once the hold
        the node signed for is over, ``max(since + reassignDelay, holdUntil)``, and the row
        waits until then, while the job moves on here at once). The offer's
        acceptance is forgotten."""
        now = self.clock()
        excluded = list(job.excluded)
        wallets = list(job.excluded_wallets)
        wallet = self._node(conn, job.node_id).wallet if job.node_id else None
        if exclude and job.node_id and wallet:
            if job.node_id not in excluded:
                excluded.append(job.node_id)
            if wallet.lower() not in wallets:
                wallets.append(wallet.lower())
        failures = job.failures + (1 if failed else 0)
        max_attempts = job.spec.max_attempts if job.spec else 1
        queued = lifecycle.step(job.state, event)
        then = lifecycle.on_requeue(
            failures=failures, max_attempts=max_attempts, deadline_passed=now > job.deadline
        )
        state = queued.value if then is None else lifecycle.step(queued, then).value
        why = reason
        if then is Event.ATTEMPTS_USED_UP:
            why = f"{reason}; {failures} failed attempts, no more tries"
            self._outbox(conn, job.job_id, "unassign", {})
        elif job.acceptance is not None and event is not Event.RULED_AGAINST and wallet:
            self._outbox(conn, job.job_id, "unassign", {"provider": wallet, "attempt": job.attempt})
        if then is Event.DEADLINE_PASSED:
            why = f"{reason}; deadline passed"
        conn.execute(
            update(jobs)
            .where(jobs.c.job_id == job.job_id)
            .values(
                state=state,
                reason=why,
                node_id=None,
                lease_expires=None,
                acceptance=None,
                excluded=excluded,
                excluded_wallets=wallets,
                failures=failures,
                queued_at=now if state == State.QUEUED else job.queued_at,
                updated_at=now,
            )
        )
        self._audit(conn, "job", job.job_id, state, reason=why, node_id=job.node_id)
        return state

    def pending_specs(self, limit: int = 32, *, skip: Sequence[str] = ()) -> list[JobRow]:
        """``pending_spec`` jobs whose next fetch is due, but not those in ``skip`` (being
        fetched): jobs never tried first, then the oldest due."""
        now = self.clock()
        due = func.coalesce(jobs.c.spec_retry_at, jobs.c.created_at)
        with self.reader.connect() as conn:
            q = select(*job_columns).where(
                jobs.c.state == State.PENDING_SPEC.value,
                (jobs.c.spec_retry_at.is_(None)) | (jobs.c.spec_retry_at <= now),
            )
            if skip:
                q = q.where(jobs.c.job_id.not_in(list(skip)))
            q = q.order_by(case((jobs.c.spec_tries == 0, 0), else_=1), due, jobs.c.job_id).limit(
                limit
            )
            return [JobRow.of(r) for r in conn.execute(q)]

    def spec_retry(self, job_id: str, retry_at: float, reason: str) -> bool:
        """A fetch of the job's spec failed but may pass later: count the try, skip the job
        until ``retry_at``, say why it waits. False when the job is no longer pending."""
        with self.engine.begin() as conn:
            n = conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id, jobs.c.state == State.PENDING_SPEC.value)
                .values(
                    spec_tries=jobs.c.spec_tries + 1,
                    spec_retry_at=retry_at,
                    reason=reason,
                    updated_at=self.clock(),
                )
            ).rowcount
        return bool(n)

    def set_spec(
        self, job_id: str, spec: JobSpec | None, reason: str = "", *, refusal: str = ""
    ) -> str:
        """The job's spec was fetched: queue it, or mark it invalid with ``reason`` (no spec) or
        ``refusal`` (a valid spec the job's on-chain terms do not fit: kept, not offered). A
        spot job whose commitment another job of the same submitter already holds is refused
        (``(submitter, spot_commit)`` is unique: a seed revealed for one would open the other's
        draws). Another submitter's job never holds it: the commitment hashes its submitter in
        (:func:`gridmarket.spot.commit_of`), so a copy in another wallet's job is not the
        victim's seed and must not block the victim's job."""
        try:
            return self._set_spec(job_id, spec, reason, refusal)
        except IntegrityError:  # another job took the commitment meanwhile: refused now
            return self._set_spec(job_id, spec, reason, refusal)

    def _set_spec(self, job_id: str, spec: JobSpec | None, reason: str, refusal: str) -> str:
        now = self.clock()
        with self.engine.begin() as conn:
            commit = spec.spot.commit.lower() if spec is not None and spec.spot else None
            if commit is not None and not refusal:
                refusal = self._claim_commit(conn, job_id, commit, now)
            queued = spec is not None and not refusal
            event = Event.SPEC_FETCHED if queued else Event.SPEC_INVALID
            to = lifecycle.step(State.PENDING_SPEC, event).value
            values: dict[str, Any] = {"state": to, "reason": refusal or reason}
            if spec is not None:
                values["spec"] = spec.model_dump(mode="json")
            if queued:
                values.update(reason="waiting for a node", queued_at=now, spot_commit=commit)
            n = conn.execute(
                _UPDATE_JOB_IN_STATE,
                {
                    "job_id_": job_id,
                    "state_": State.PENDING_SPEC.value,
                    "updated_at": now,
                    **values,
                },
            ).rowcount
            if n:
                self._audit(conn, "job", job_id, str(values["state"]), reason=refusal or reason)
        if n and queued:
            self.on_queued(1)
        return str(values["state"]) if n else "unchanged"

    def _claim_commit(self, conn: Connection, job_id: str, commit: str, now: float) -> str:
        """Give the spot commitment ``commit`` to ``job_id`` if no job of the same submitter
        created before it on chain holds it (chain order, not the order the specs were read);
        the refusal otherwise. A later holder that was never offered loses it (``queued`` ->
        ``invalid``); one already offered keeps it. Other submitters' jobs are not looked at: a
        copy of a victim's commitment in an attacker's job (even funded first) opens nothing
        (the seed is sealed for the victim's address) and blocks nothing."""
        me = conn.execute(
            select(jobs.c.created_block, jobs.c.submitter).where(jobs.c.job_id == job_id)
        ).first()
        mine = (int(me[0] or 0) if me else 0, job_id)
        holders = conn.execute(
            select(jobs.c.job_id, jobs.c.created_block, jobs.c.state, jobs.c.attempt).where(
                jobs.c.spot_commit == commit,
                jobs.c.submitter == (me[1] if me else ""),
                jobs.c.job_id != job_id,
            )
        ).all()
        for other, block, state, attempt in holders:
            if (int(block), str(other)) < mine or state != State.QUEUED.value or attempt:
                return (
                    f"spot: the spec's commitment {commit} is already job {other}'s: a seed is "
                    "never used twice (its reveal would open the other job's draws); not "
                    "offered, the submitter can cancel"
                )
        for other, *_ in holders:  # later on chain, never offered: the commitment is ours
            why = (
                f"spot: the spec's commitment {commit} is job {job_id}'s, created before this "
                "one: a seed is never used twice (its reveal would open the other job's "
                "draws); not offered, the submitter can cancel"
            )
            to = lifecycle.step(State.QUEUED, Event.SPEC_INVALID).value
            n = conn.execute(
                update(jobs)
                .where(jobs.c.job_id == other, jobs.c.state == State.QUEUED.value)
                .values(state=to, reason=why, spot_commit=None, queued_at=None, updated_at=now)
            ).rowcount
            if n:
                self._audit(conn, "job", str(other), to, reason=why)
        return ""

    def spot_sharing(self, job_id: str, commit: str) -> list[tuple[str, int]]:
        """Other jobs of ``job_id``'s submitter holding the spot commitment ``commit``: ``(job
        id, chain status)`` (another submitter's copy is no reuse of this seed)."""
        submitter = select(jobs.c.submitter).where(jobs.c.job_id == job_id).scalar_subquery()
        with self.reader.connect() as conn:
            rows = conn.execute(
                select(jobs.c.job_id, jobs.c.chain_status).where(
                    jobs.c.spot_commit == commit.lower(),
                    jobs.c.submitter == submitter,
                    jobs.c.job_id != job_id,
                )
            ).all()
        return [(str(r[0]), int(r[1])) for r in rows]

    def set_spot_seed(self, job_id: str, seed: str) -> bool:
        """Keep a settled spot job's revealed seed (checked by the caller); the first one
        stays. False when the job is unknown."""
        with self.engine.begin() as conn:
            n = conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id, jobs.c.spot_seed.is_(None))
                .values(spot_seed=seed.lower(), spot_revealed_at=self.clock())
            ).rowcount
            if n:
                self._audit(conn, "job", job_id, "spot_revealed", seed=seed.lower())
        return bool(n)

    def set_reason(self, job_id: str, reason: str) -> None:
        """Why a queued job waits (the matching engine's explanation); no audit row."""
        with self.engine.begin() as conn:
            conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id, jobs.c.state == "queued")
                .values(reason=reason)
            )

    def set_reasons(self, reasons: Sequence[tuple[str, str]]) -> None:
        """:meth:`set_reason` for many queued jobs in one transaction (a dispatch round's
        explanations: one write, not one per job waiting)."""
        if not reasons:
            return
        with self.engine.begin() as conn:
            conn.execute(
                update(jobs)
                .where(jobs.c.job_id == bindparam("jid"), jobs.c.state == "queued")
                .values(reason=bindparam("why")),
                [{"jid": j, "why": why} for j, why in reasons],
            )

    def job(self, job_id: str) -> JobRow:
        with self.reader.connect() as conn:
            return self._job(conn, job_id)

    def jobs(
        self,
        *,
        state: str | None = None,
        submitter: str | None = None,
        node_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[JobRow]:
        q = select(*job_columns).order_by(jobs.c.created_at.desc()).limit(limit).offset(offset)
        if state is not None:
            q = q.where(jobs.c.state == state)
        if submitter is not None:
            q = q.where(func.lower(jobs.c.submitter) == submitter.lower())
        if node_id is not None:
            q = q.where(jobs.c.node_id == node_id)
        with self.reader.connect() as conn:
            return [JobRow.of(r) for r in conn.execute(q)]

    def job_counts(self) -> dict[str, int]:
        return self._counts(jobs.c.state)

    def record_result(self, job_id: str, node_id: str, report: ResultReport) -> str:
        """A node reports the end of its run. Success -> ``verifying``; a failed run is
        requeued elsewhere (or fails the job when its attempts are used up)."""
        self._held_drop(node_id, [job_id])  # the run ended: no longer busy with it
        with self.engine.begin() as conn:
            job = self._job(conn, job_id, lock=True)
            if (
                job.state == "verifying"
                and job.node_id == node_id
                and job.attempt == report.attempt
                and job.result is None
                and _same(report.output_cid, job.output_cid)
            ):
                # the node submitted this result on-chain itself and the watcher saw it first:
                # keep the report (logs, exit code) for the submitter
                conn.execute(
                    update(jobs)
                    .where(jobs.c.job_id == job_id)
                    .values(result=report.model_dump(mode="json"))
                )
                return job.state
            if job.node_id != node_id or job.state != State.LEASED:
                raise ConflictError(
                    f"job {job_id} is not leased to node {node_id} (it is {job.state})"
                )
            if report.attempt != job.attempt:
                raise ConflictError(
                    f"attempt {report.attempt} is stale: the lease is attempt {job.attempt}"
                )
            if job.acceptance is None:
                raise ConflictError(
                    f"job {job_id} attempt {job.attempt} was offered but never accepted: "
                    "post the signed acceptance first"
                )
            result = report.model_dump(mode="json")
            if report.output_cid is not None and report.reason.value == "succeeded":
                to = lifecycle.step(job.state, Event.RESULT_REPORTED).value
                conn.execute(
                    UPDATE_JOB,
                    {
                        "job_id_": job_id,
                        "state": to,
                        "reason": "verifying the output",
                        "result": result,
                        "output_cid": report.output_cid,
                        "lease_expires": None,
                        "updated_at": self.clock(),
                    },
                )
                self._audit(conn, "job", job_id, to, output_cid=report.output_cid)
                return to
            fault = lifecycle.fault_of(report.reason, report.message)
            if fault is Fault.JOB:
                return self._job_failed(conn, job, node_id, report, result)
            if fault is Fault.NODE:
                self._end_attempt(conn, job_id, job.attempt, "failure", report.message)
                self._reputation(conn, node_id, Outcome.FAILURE)
            else:  # counted against the node if another node does the job in time
                self._end_attempt(conn, job_id, job.attempt, TIMED_OUT, report.message)
            self._free_slot(conn, node_id)
            conn.execute(update(jobs).where(jobs.c.job_id == job_id).values(result=result))
            state = self._requeue(
                conn,
                job,
                Event.RUN_FAILED,
                exclude=True,
                failed=True,
                reason=f"attempt {job.attempt} failed on {node_id}: {report.reason.value}",
            )
        if state == "queued":
            self.on_queued(1)
        return state

    def _job_failed(
        self,
        conn: Connection,
        job: JobRow,
        node_id: str,
        report: ResultReport,
        result: dict[str, Any],
    ) -> str:
        """The run failed because of the job itself (:func:`scheduler.lifecycle.fault_of`): it
        fails at once, the node keeps its reputation, and the outbox unassigns it on-chain so
        the submitter can cancel and get the bounty back."""
        to = lifecycle.step(job.state, Event.JOB_FAILED).value
        detail = report.message or report.reason.value
        why = (
            f"the job failed on its own ({report.reason.value}: {detail}); not retried on "
            "another node: cancel it on-chain to get the bounty back"
        )
        self._end_attempt(conn, job.job_id, job.attempt, "job_failed", detail)
        self._free_slot(conn, node_id)
        self._outbox(conn, job.job_id, "unassign", {})
        conn.execute(
            update(jobs)
            .where(jobs.c.job_id == job.job_id)
            .values(
                state=to,
                reason=why,
                result=result,
                node_id=None,
                lease_expires=None,
                updated_at=self.clock(),
            )
        )
        self._audit(
            conn, "job", job.job_id, to, reason=why, node_id=node_id, run=report.reason.value
        )
        return to

    def verifying(self, limit: int = 16, *, skip: Sequence[str] = ()) -> list[JobRow]:
        """``verifying`` jobs, the longest waiting first, but not those in ``skip`` (being
        checked, or backing off)."""
        with self.reader.connect() as conn:
            q = select(*job_columns).where(jobs.c.state == "verifying")
            if skip:
                q = q.where(jobs.c.job_id.not_in(list(skip)))
            q = q.order_by(jobs.c.updated_at).limit(limit)
            return [JobRow.of(r) for r in conn.execute(q)]

    def verify_retry(self, job_id: str, attempt: int, reason: str) -> bool:
        """The output of the job's ``attempt`` could not be fetched yet: it stays ``verifying``
        and says why; its ``updated_at`` moves (it goes behind the other jobs waiting for the
        verifier). False when the job is no longer verifying that attempt."""
        with self.engine.begin() as conn:
            n = conn.execute(
                update(jobs)
                .where(
                    jobs.c.job_id == job_id,
                    jobs.c.state == State.VERIFYING.value,
                    jobs.c.attempt == attempt,
                )
                .values(reason=reason, updated_at=self.clock())
            ).rowcount
        return bool(n)

    def verified(
        self,
        job_id: str,
        ok: bool,
        detail: str,
        *,
        attempt: int | None = None,
        output_cid: str | None = None,
    ) -> str:
        """Verification done (of ``attempt`` and its ``output_cid`` when given: a verdict on
        an attempt or an output the job no longer holds changes nothing).

        Good: an on-verify job is paid at once (``settle`` a relayed result, ``release`` one the
        provider posted); any other is relayed (``relay``: ``submitResultFor``) and finalized
        after the challenge window (``finalize``: the relay rule writes it once the result is
        on-chain, with its time). Bad: the result is not relayed; it is the node's fault, the
        job is taken back (``unassign``) and queued for another wallet. A bad result the
        provider posted on-chain itself cannot be taken back: the job waits (``disputed``) for
        the submitter to dispute it and the mediator to rule; the scheduler never finalizes it.
        The node's slot is free from the verdict on (its work is done)."""
        with self.engine.begin() as conn:
            job = self._job(conn, job_id, lock=True)
            if attempt is not None and job.attempt != attempt:
                return job.state
            if output_cid is not None and (job.output_cid or job.chain.output_cid) != output_cid:
                return job.state
            posted = job.chain.status is Status.SUBMITTED
            if ok:
                event = Event.VERDICT_OK
            else:
                event = Event.VERDICT_BAD_POSTED if posted else Event.VERDICT_BAD
            to = lifecycle.target(job.state, event)
            if to is None:
                return job.state
            node_id = job.node_id
            holds = job.state in lifecycle.HOLDS_SLOT
            if ok:
                result = job.result
                signed = {
                    "output_cid": job.output_cid,
                    "signature": None if result is None else result.signature,
                }
                if job.chain.job.on_verify:
                    kind, payload = ("release", {}) if posted else ("settle", signed)
                    reason = f"verified ({detail}); paying the provider"
                elif posted and job.chain.job.replicas:
                    kind, payload = "resolve", {"group": job.salt}
                    reason = f"verified ({detail}); paid when the seats' results agree"
                elif posted:
                    kind, payload = "finalize", {}
                    reason = (
                        f"verified ({detail}); the result is on-chain: finalized once the "
                        "challenge window has passed"
                    )
                elif job.chain.job.replicas:
                    kind, payload = "relay", signed
                    reason = f"verified ({detail}); relaying the result: paid when the seats agree"
                else:
                    kind, payload = "relay", signed
                    reason = (
                        f"verified ({detail}); relaying the result: finalized once the "
                        "challenge window has passed"
                    )
                if payload.get("signature", "") is None:
                    raise ConflictError(f"job {job_id}: a verified result without a signature")
                self._outbox(conn, job_id, kind, payload)
                if holds and node_id is not None:
                    self._free_slot(conn, node_id)
                conn.execute(
                    update(jobs)
                    .where(jobs.c.job_id == job_id)
                    .values(state=to.value, reason=reason, updated_at=self.clock())
                )
                self._audit(conn, "job", job_id, "verified", detail=detail)
                return to.value
            if node_id is not None:
                self._end_attempt(conn, job_id, job.attempt, "rejected", detail)
                if holds:
                    self._free_slot(conn, node_id)
                self._reputation(conn, node_id, Outcome.REJECTED)
            self._audit(conn, "job", job_id, "rejected", detail=detail)
            if posted:
                reason = (
                    f"the result the provider posted on-chain failed verification ({detail}): "
                    "not finalized by the scheduler; dispute it before the challenge window "
                    "closes, the mediator rules"
                )
                conn.execute(
                    update(jobs)
                    .where(jobs.c.job_id == job_id)
                    .values(state=to.value, reason=reason, updated_at=self.clock())
                )
                self._audit(conn, "job", job_id, to.value, reason=reason)
                return to.value
            state = self._requeue(
                conn,
                job,
                event,
                exclude=True,
                failed=True,
                reason=f"result failed verification ({detail}); not relayed",
            )
        if state == "queued":
            self.on_queued(1)
        return state

    def relayed(self, job_id: str, finalize_at: float) -> None:
        """The outbox relayed the result (``submitResultFor`` mined): ``finalize`` it at chain
        time ``finalize_at`` (the end of the challenge window)."""
        with self.engine.begin() as conn:
            self._outbox(conn, job_id, "finalize", {}, not_before=finalize_at)
            conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id, jobs.c.state == State.SETTLING.value)
                .values(
                    reason=f"result relayed on-chain; finalized after the challenge window "
                    f"(chain time {int(finalize_at)})",
                    updated_at=self.clock(),
                )
            )

    def settled(self, job_id: str, *, detail: str = "") -> str:
        """The outbox paid the job (settle/release/finalize; usually the receipt's
        ``JobReleased`` already moved it)."""
        with self.engine.begin() as conn:
            job = self._job(conn, job_id, lock=True)
            node_id = job.node_id
            to = lifecycle.target(job.state, Event.PAID)
            if node_id is None or to is None:
                return job.state
            self._paid(conn, job_id, node_id, job.attempt, detail, free_slot=False)
            conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id)
                .values(state=to.value, reason="paid", node_id=None, updated_at=self.clock())
            )
            self._audit(conn, "job", job_id, to.value, node_id=node_id)
            return to.value

    def _collateral_pending(
        self,
        conn: Connection,
        wallet: str,
        but: str,
        as_of_block: int | None = None,
        token: str = ZERO_ADDRESS,
    ) -> int:
        """Collateral in ``token`` of ``wallet``'s accepted jobs paid in it (other than ``but``;
        a stake in one token never covers a job in another) that the chain's
        ``freeCollateralIn(wallet, token)`` read at ``as_of_block`` does not count: those whose
        on-chain ``assign`` is not folded yet, and (when the block is known) those it holds whose
        latest event was folded from a later block (an assign mined between the read and this
        transaction: counted nowhere else, so a fast node could promise the same stake twice).
        The second rule may count a job twice (it was locked at the block and moved on since):
        that refuses an offer too many, never lets one through that the chain would refuse."""
        # only rows that can count are read (each one's chain struct is JSON to decode): the
        # unassigned ones, and the held ones folded from a block after the read. A node's
        # running jobs are the rest, and reading them made each acceptance cost O(running).
        params: dict[str, object] = {"wallet_": wallet, "but_": but, "token_": token}
        q = _PENDING_UNASSIGNED
        if as_of_block is not None:
            q, params["later_"] = _PENDING_SINCE, pos_of(as_of_block + 1, 0)
        total = 0
        for row in conn.execute(q, params):
            if row.chain_status != int(Status.FUNDED):
                later = as_of_block is not None and block_of(row.chain_pos) > as_of_block
                mine = str(row.provider or "").lower() == wallet.lower()
                if not (later and mine):
                    continue
            total += int(row.collateral or 0)
        return total

    def _paid(
        self,
        conn: Connection,
        job_id: str,
        node_id: str,
        attempt: int,
        detail: str,
        *,
        free_slot: bool,
    ) -> None:
        """The job was paid to ``node_id`` (our settle, or seen on-chain): its attempt ends, the
        node gains reputation; the nodes that ran out of time on it lose some (it fitted).
        ``free_slot``: the job still held the node's slot (:data:`lifecycle.HOLDS_SLOT`)."""
        self._end_attempt(conn, job_id, attempt, "success", detail)
        if free_slot:
            self._free_slot(conn, node_id)
        self._reputation(conn, node_id, Outcome.SUCCESS)
        q = select(attempts.c.node_id).where(
            attempts.c.job_id == job_id, attempts.c.outcome == TIMED_OUT
        )
        for (slow,) in conn.execute(q).all():
            self._reputation(conn, slow, Outcome.FAILURE)

    def accept(
        self,
        job_id: str,
        node_id: str,
        attempt: int,
        signature: str,
        free_collateral: int | None = None,
        as_of_block: int | None = None,
        *,
        signed: Job | None = None,
        hold_for: int | None = None,
    ) -> str:
        """The node accepted its offer: ``signature`` (checked by the caller against the job's
        on-chain struct and ``hold_for``, for attempt ``chain attempt + 1``) is stored and the
        outbox assigns the job on-chain with it, with that ``holdFor`` (default: the one
        :func:`scheduler.dispatch.hold_of` offers for the job's spec; a signature covers the
        hold, so the outbox must pass the very value the node signed). Accepting twice with the
        same signature is a no-op. Raises :class:`ConflictError` when the lease is not this
        node's, or not that attempt, or the chain moved on (another assignment: the offer no
        longer fits the chain).

        ``free_collateral``: the wallet's ``freeCollateralIn(wallet, job's token)`` as the chain
        said at block ``as_of_block`` (assigns folded from later blocks are counted as pending
        too). The collateral of the wallet's other accepted jobs in the same token whose
        ``assign`` is not mined yet is not in it: it is taken off here, in the same transaction
        as the acceptance, and :class:`ShortOfCollateralError` is raised when what is left does
        not cover this job (so a fast node cannot accept more than its stake covers and have
        the chain refuse the surplus assigns).

        ``signed``: the job's on-chain struct the caller checked the signature against (it may
        come from a remembered offer): :class:`ConflictError` when the row's terms differ."""
        with self.engine.begin() as conn:
            job = self._job(conn, job_id, lock=True)
            if signed is not None and _terms(signed) != _terms(job.chain.job):
                raise ConflictError(
                    f"job {job_id}: the terms signed are not the job's on-chain terms: ask for "
                    "work again"
                )
            if job.node_id != node_id or job.state not in lifecycle.sources(Event.ACCEPTED):
                raise ConflictError(
                    f"job {job_id} is not offered to node {node_id} (it is {job.state})"
                )
            if attempt != job.attempt:
                raise ConflictError(
                    f"attempt {attempt} is stale: the offer is attempt {job.attempt}"
                )
            if job.acceptance is not None:
                if job.acceptance.lower() == signature.lower():
                    return job.state
                raise ConflictError(f"job {job_id} attempt {attempt} is already accepted")
            if job.chain.job.attempt + 1 != attempt:
                raise ConflictError(
                    f"job {job_id}: the chain is at attempt {job.chain.job.attempt}, the offer "
                    f"was attempt {attempt}: ask for work again"
                )
            to = lifecycle.step(job.state, Event.ACCEPTED).value
            wallet = self._wallet_of(conn, node_id, lock=free_collateral is not None)
            if job.chain.job.replicas:
                self._claim_seat(conn, job, wallet)
            if free_collateral is not None:
                token = job.chain.job.token
                pending = self._collateral_pending(conn, wallet, job_id, as_of_block, token)
                needed = job.chain.job.collateral
                if free_collateral - pending < needed:
                    unit = "wei" if token == ZERO_ADDRESS else f"units of token {token}"
                    how = "stake more" if token == ZERO_ADDRESS else "stakeToken more of it"
                    raise ShortOfCollateralError(
                        f"{wallet} has {free_collateral} {unit} of free collateral on-chain, "
                        f"{pending} of it promised to accepted jobs not yet assigned; the job "
                        f"locks {needed}: offer withdrawn ({how}, or finish other jobs)"
                    )
            if hold_for is None:
                if job.spec is None:
                    raise ConflictError(f"job {job_id} has no spec: no hold was offered")
                hold_for = offered_hold(job.spec.limits.timeout_s)
            self._outbox(
                conn,
                job_id,
                "assign",
                {
                    "provider": wallet,
                    "attempt": attempt,
                    "node_id": node_id,
                    "acceptance": signature,
                    "hold_for": hold_for,
                },
            )
            conn.execute(
                UPDATE_JOB,
                {
                    "job_id_": job_id,
                    "state": to,
                    "acceptance": signature,
                    "reason": f"accepted by {node_id}; assigning on-chain",
                    "updated_at": self.clock(),
                },
            )
            self._audit(conn, "job", job_id, "accepted", node_id=node_id, attempt=attempt)
            return to

    def _wallet_of(self, conn: Connection, node_id: str, *, lock: bool) -> str:
        """The wallet of node ``node_id`` (its row locked on PostgreSQL when ``lock``: two
        acceptances of one wallet take its collateral in turn), without decoding the row."""
        q = _WALLET_FOR_UPDATE if lock and self.postgres else _WALLET
        wallet = conn.execute(q, {"node_id_": node_id}).scalar()
        if wallet is None:
            raise NotFoundError(f"no node {node_id}")
        return str(wallet)

    def _siblings(self, conn: Connection, job: JobRow) -> list[JobRow]:
        """The other seats of the replicated job ``job`` is a seat of (its ``salt`` is the
        group id; only seats carry replica flags, and a group id hashes in its submitter)."""
        q = select(*job_columns).where(jobs.c.salt == job.salt, jobs.c.job_id != job.job_id)
        return [
            row
            for row in map(JobRow.of, conn.execute(q))
            if row.chain.job.replicas == job.chain.job.replicas
            and row.chain.job.submitter == job.chain.job.submitter
        ]

    def _claim_seat(self, conn: Connection, job: JobRow, wallet: str) -> None:
        """Refuse ``wallet`` a seat when it holds another seat of the same replicated job (on
        chain, or accepted and not yet mined); otherwise keep it off the other seats from now
        on (``excluded_wallets``), so its result is counted once."""
        me = wallet.lower()
        if me in job.excluded_wallets:  # e.g. seen holding another seat on-chain since the offer
            raise SeatTakenError(
                f"{wallet} may not take seat {job.job_id} of this replicated job: it holds or "
                "held another seat of it (the escrow lets a wallet hold one seat of a group)"
            )
        for sib in self._siblings(conn, job):
            holder = sib.chain.job.provider.lower()
            if holder != me and sib.acceptance is not None and sib.node_id is not None:
                holder = self._node(conn, sib.node_id).wallet.lower()
            if holder == me:
                raise SeatTakenError(
                    f"{wallet} already holds seat {sib.job_id} of this replicated job: each "
                    "seat goes to a distinct provider"
                )
        self._keep_off_siblings(conn, job, me)

    def _keep_off_siblings(self, conn: Connection, job: JobRow, wallet: str) -> None:
        """Keep ``wallet`` off the other seats of ``job``'s replicated job for good
        (``excluded_wallets``): the escrow lets one wallet hold one seat of a group, ever
        (``JobEscrowSeatTaken``)."""
        me = wallet.lower()
        for sib in self._siblings(conn, job):
            if me not in sib.excluded_wallets:
                conn.execute(
                    update(jobs)
                    .where(jobs.c.job_id == sib.job_id)
                    .values(excluded_wallets=[*sib.excluded_wallets, me])
                )

    def seats(self, group: str) -> list[JobRow]:
        """The seats of replicated job ``group`` (0x hex) this scheduler knows, in seat order
        (``keccak256(abi.encode(groupId, i))``); a seat it never saw is left out."""
        with self.reader.connect() as conn:
            rows = {
                r.job_id: r
                for r in map(
                    JobRow.of, conn.execute(select(*job_columns).where(jobs.c.salt == group))
                )
                if r.chain.job.replicas
            }
        if not rows:
            return []
        k = next(iter(rows.values())).chain.job.replicas
        ids = ["0x" + i.hex() for i in seat_ids(bytes.fromhex(group[2:]), k)]
        return [rows[i] for i in ids if i in rows]

    def seat_relayed(self, job_id: str) -> None:
        """A seat's result is on-chain: ``resolve`` the replicated job once every seat has one
        (now, if this was the last), else at its deadline (a seat that never delivers cannot
        hold the others' pay back longer)."""
        with self.engine.begin() as conn:
            job = self._job(conn, job_id, lock=True)
            siblings = self._siblings(conn, job)
            waiting = [
                s.job_id for s in siblings if s.chain.status in (Status.FUNDED, Status.ASSIGNED)
            ]
            k = job.chain.job.replicas
            if waiting:
                at: float | None = float(job.chain.job.deadline + 1)
                reason = (
                    f"result on-chain; {len(waiting)} of {k} seats still running: resolved when "
                    f"every seat has a result, or after the deadline (chain time {int(at or 0)})"
                )
            else:
                at = None
                reason = f"result on-chain; every seat of {k} has one: resolving"
                # the other seats' resolves waiting for the deadline are superseded by this one
                conn.execute(
                    update(outbox)
                    .where(
                        outbox.c.job_id.in_([s.job_id for s in siblings]),
                        outbox.c.status == "pending",
                        outbox.c.kind == "resolve",
                    )
                    .values(status="done", error=f"superseded by the resolve of {job_id}")
                )
            self._outbox(conn, job_id, "resolve", {"group": job.salt}, not_before=at)
            conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id, jobs.c.state == State.SETTLING.value)
                .values(reason=reason, updated_at=self.clock())
            )

    def offer_refused(self, job_id: str, node_id: str, attempt: int, reason: str) -> str:
        """The offer of ``attempt`` cannot go on-chain for a reason of the provider's that is no
        fault of the node (its free collateral is below the job's): the lease ends, the job is
        queued for another wallet, the node keeps its reputation."""
        with self.engine.begin() as conn:
            job = self._job(conn, job_id, lock=True)
            event = Event.ASSIGN_REFUSED
            if (
                job.node_id != node_id
                or job.attempt != attempt
                or lifecycle.target(job.state, event) is None
            ):
                return job.state
            self._held_drop(node_id, [job_id])
            self._end_attempt(conn, job_id, attempt, "not_taken", reason)
            self._free_slot(conn, node_id)
            state = self._requeue(conn, job, event, exclude=True, reason=reason)
        if state == "queued":
            self.on_queued(1)
        return state

    def assign_failed(self, job_id: str, attempt: int, error: str) -> str:
        """The on-chain assign of ``attempt`` reverted: end that lease (no fault of the node)."""
        with self.engine.begin() as conn:
            job = self._job(conn, job_id, lock=True)
            event = lifecycle.assign_refusal(error)
            if (
                job.attempt != attempt
                or lifecycle.target(job.state, event) is None
                or job.node_id is None
            ):
                return job.state
            self._held_drop(job.node_id, [job_id])
            self._end_attempt(conn, job_id, attempt, "assign_failed", error)
            if job.state in lifecycle.HOLDS_SLOT:
                self._free_slot(conn, job.node_id)
            conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id)
                .values(attempt=job.chain.job.attempt, acceptance=None)
            )
            job = self._job(conn, job_id)
            if event is Event.ASSIGN_REFUSED_FOR_GOOD:
                to = lifecycle.step(job.state, event).value
                conn.execute(
                    update(jobs)
                    .where(jobs.c.job_id == job_id)
                    .values(
                        state=to,
                        reason=f"on-chain assign refused: {error}",
                        node_id=None,
                        lease_expires=None,
                        updated_at=self.clock(),
                    )
                )
                self._audit(conn, "job", job_id, to, error=error)
                return to
            state = self._requeue(
                conn, job, event, exclude=True, reason=f"on-chain assign refused: {error}"
            )
        if state == "queued":
            self.on_queued(1)
        return state

    def fail_job(self, job_id: str, reason: str) -> None:
        """Give up on an open job (an on-chain step was refused for good)."""
        with self.engine.begin() as conn:
            job = self._job(conn, job_id, lock=True)
            to = lifecycle.target(job.state, Event.GIVEN_UP)
            if to is None:
                return
            if job.node_id is not None:
                self._end_attempt(conn, job_id, job.attempt, "failed", reason)
                if job.state in lifecycle.HOLDS_SLOT:
                    self._free_slot(conn, job.node_id)
            conn.execute(
                update(jobs)
                .where(jobs.c.job_id == job_id)
                .values(
                    state=to.value,
                    reason=reason,
                    node_id=None,
                    lease_expires=None,
                    updated_at=self.clock(),
                )
            )
            self._audit(conn, "job", job_id, to.value, reason=reason)
