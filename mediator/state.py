"""The mediator's own state, in one small SQLite file: the event cursor, the jobs that name it,
the checks it still owes, every ruling it decided, the re-run it funded for each dispute, and the
seed of each spot job it opened (kept until the job is settled and it is revealed)
(docs/mediator.md).

The fold of a batch of events and the cursor move together in one transaction, so a crash
between batches re-delivers only what was not committed. With the cursor it keeps the hash of each
batch's last block (the newest :data:`KEEP_BLOCKS`), so the chain watcher can tell a reorg and
:meth:`MediatorState.rollback` can undo what the reorg removed (docs/mediator.md "Reorgs").

The ``rulings`` row of a job attempt is written before the transaction is sent: it is how the
mediator never rules twice. The ``reruns`` rows of a disputed job attempt (run 1, and run 2: the
tie-break funded when run 1's output differed) are written before their ``createJob`` is sent,
with the re-run's job id (fixed in advance by a salt derived from the disputed job, attempt and
run): it is how a restarted mediator never funds a re-run twice for the same dispute.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, create_engine, event
from sqlalchemy.pool import NullPool

from gridmarket.escrow import (
    JOB_EVENTS,
    ZERO_ADDRESS,
    InvalidText,
    Job,
    JobState,
    Status,
    apply_event,
)
from mediator.tasks import Kind

__all__ = [
    "KEEP_BLOCKS",
    "MIGRATIONS",
    "MediatorState",
    "Rerun",
    "Ruling",
    "SpotSeed",
    "StateError",
    "Task",
    "migrate",
    "state_from_json",
    "state_to_json",
]

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
"""The state file's schema, on Alembic as the scheduler's is (``mediator/migrations/versions/``:
what each table and column holds); :func:`migrate` brings a file to the newest revision."""


def migrate(path: Path) -> None:
    """Bring the state file at ``path`` (created if missing) to the newest Alembic revision
    (idempotent; run on every start). A file from before Alembic is upgraded in place. The
    whole upgrade is one ``BEGIN IMMEDIATE`` transaction (SQLite's DDL is transactional; the
    driver's own implicit transactions are off), so a crash leaves the file as it was."""
    engine = create_engine(
        "sqlite://",
        creator=lambda: sqlite3.connect(str(path), isolation_level=None),
        poolclass=NullPool,
    )

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    try:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    finally:
        engine.dispose()


KEEP_BLOCKS = 128
"""How many checkpoints (the watcher's delivered batch ends) are kept: the deepest reorg that can
be rolled back is about this many batches (blocks, once caught up)."""


def pos_of(block: int, log_index: int) -> int:
    """Total order of a log in the chain (the scheduler's ``scheduler.store.rows.pos_of``)."""
    return block * 100_000 + log_index


@dataclass(frozen=True)
class Rerun:
    """The re-run the mediator funded (or is funding) to judge one disputed job attempt."""

    job_id: bytes
    attempt: int
    rerun_id: bytes
    spec_cid: str
    salt: bytes
    bounty: int
    deadline: int
    status: str
    note: str
    at: float
    run: int = 1
    """1: the re-run of the dispute; 2: the tie-break funded when run 1's output differed."""


@dataclass(frozen=True)
class SpotSeed:
    """What the mediator read of a spot job's hidden draw: the spec's commitment and ``p``,
    and the seed it opened with its key (None, with ``note`` saying why, when it did not: the
    submitter's mistake, never charged to the provider)."""

    job_id: bytes
    commit: bytes
    p_bps: int
    seed: bytes | None
    note: str
    revealed: str | None
    at: float


class StateError(RuntimeError):
    """The state file belongs to another escrow, or cannot be used."""


@dataclass(frozen=True)
class Task:
    """A check the mediator owes a job attempt."""

    job_id: bytes
    attempt: int
    kind: Kind
    tries: int
    due: float
    note: str


@dataclass(frozen=True)
class Ruling:
    """A ruling the mediator decided (and sent, once ``outcome`` is ``sent``)."""

    job_id: bytes
    attempt: int
    upheld: bool
    reason: str
    outcome: str
    tx_hash: str | None
    at: float


def _text(value: str | None) -> Any:
    if isinstance(value, InvalidText):
        return {"invalid": value.field, "raw": value.raw.hex(), "problem": value.problem}
    return value


def _untext(value: Any) -> str | None:
    if isinstance(value, dict):
        return InvalidText(str(value["invalid"]), bytes.fromhex(value["raw"]), value["problem"])
    return None if value is None else str(value)


def state_to_json(state: JobState) -> str:
    """A :class:`JobState` as JSON (invalid strings keep their raw bytes)."""
    job = state.job
    return json.dumps(
        {
            "job_id": state.job_id.hex(),
            "status": int(state.status),
            "spec_cid": _text(state.spec_cid),
            "salt": state.salt.hex(),
            "output_cid": _text(state.output_cid),
            "spec_problem": state.spec_problem,
            "output_problem": state.output_problem,
            "job": {
                "submitter": job.submitter,
                "bounty": job.bounty,
                "provider": job.provider,
                "deadline": job.deadline,
                "since": job.since,
                "fee_bps": job.fee_bps,
                "attempt": job.attempt,
                "result_digest": job.result_digest.hex(),
                "operator": job.operator,
                "mediator": job.mediator,
                "collateral": job.collateral,
                "disputed_at": job.disputed_at,
                "flags": job.flags,
                "token": job.token,
                "hold_until": job.hold_until,
            },
        },
        sort_keys=True,
    )


def state_from_json(text: str) -> JobState:
    """The inverse of :func:`state_to_json`."""
    body = json.loads(text)
    job = dict(body["job"])
    job["result_digest"] = bytes.fromhex(job["result_digest"])
    job.setdefault("token", ZERO_ADDRESS)  # a state file written before JobEscrow version 4
    # before version 5 (no holdUntil): zero, what the struct holds in every status the mediator
    # sends a job's struct in (a result pending or ruled, a re-run Funded)
    job.setdefault("hold_until", 0)
    spec = _untext(body["spec_cid"])
    return JobState(
        job_id=bytes.fromhex(body["job_id"]),
        job=Job(**job),
        status=Status(body["status"]),
        spec_cid=spec if spec is not None else "",
        salt=bytes.fromhex(body["salt"]),
        output_cid=_untext(body["output_cid"]),
        spec_problem=body["spec_problem"],
        output_problem=body["output_problem"],
    )


class MediatorState:
    """The SQLite file; every method is thread-safe. Use :meth:`batch` to group writes."""

    def __init__(self, path: Path, *, escrow: str, chain_id: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.RLock()
        migrate(path)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._depth = 0
        owner = f"{chain_id}:{escrow.lower()}"
        with self.batch():
            found = self._meta("escrow")
            if found is None:
                self._set_meta("escrow", owner)
            elif found != owner:
                raise StateError(
                    f"state file {path} belongs to escrow {found}, not {owner}: "
                    "give each escrow its own state file"
                )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def batch(self) -> Iterator[None]:
        """One transaction (nested calls join the outer one); rolled back if the block raises."""
        with self._lock:
            if self._depth == 0:
                self._db.execute("BEGIN IMMEDIATE")
            self._depth += 1
            try:
                yield
            except BaseException:
                self._depth -= 1
                if self._depth == 0:
                    self._db.execute("ROLLBACK")
                raise
            self._depth -= 1
            if self._depth == 0:
                self._db.execute("COMMIT")

    # ------------------------------------------------------------------ meta and cursor
    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _set_meta(self, key: str, value: str) -> None:
        self._db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def load(self) -> int | None:
        """The last block whose events were folded (the chain watcher's cursor)."""
        with self._lock:
            value = self._meta("cursor")
        return None if value is None else int(value)

    def set_cursor(self, block: int) -> None:
        with self.batch():
            self._set_meta("cursor", str(block))

    # ------------------------------------------------------------------ jobs
    def job(self, job_id: bytes) -> JobState | None:
        with self._lock:
            row = self._db.execute(
                "SELECT state FROM jobs WHERE job_id = ?", (job_id.hex(),)
            ).fetchone()
        return None if row is None else state_from_json(row[0])

    def put_job(self, state: JobState, pos: int = 0, created_block: int | None = None) -> None:
        """Store a job's fold; ``pos`` is the position of the event folded last
        (:func:`pos_of`), ``created_block`` the block of its ``JobCreated`` (kept when None)."""
        with self.batch():
            self._db.execute(
                "INSERT INTO jobs (job_id, state, pos, created_block) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (job_id) DO UPDATE SET state = excluded.state, pos = excluded.pos, "
                "created_block = CASE WHEN ? IS NULL THEN jobs.created_block "
                "ELSE excluded.created_block END",
                (
                    state.job_id.hex(),
                    state_to_json(state),
                    pos,
                    created_block or 0,
                    created_block,
                ),
            )

    def job_count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM jobs").fetchone()[0])

    # ------------------------------------------------------------------ reorgs
    def set_checkpoint(self, block: int, block_hash: str) -> None:
        """Keep ``(block, hash)`` of a delivered batch's end (with the cursor, in its batch)."""
        with self.batch():
            self._db.execute("DELETE FROM blocks WHERE block >= ?", (block,))
            self._db.execute("INSERT INTO blocks (block, hash) VALUES (?, ?)", (block, block_hash))
            self._db.execute(
                "DELETE FROM blocks WHERE block NOT IN "
                "(SELECT block FROM blocks ORDER BY block DESC LIMIT ?)",
                (KEEP_BLOCKS,),
            )

    def checkpoints(self) -> list[tuple[int, str]]:
        """The kept ``(block, hash)`` of the watcher's delivered batch ends, oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT block, hash FROM blocks ORDER BY block").fetchall()
        return [(int(b), str(h)) for b, h in rows]

    def rollback(self, fork_block: int, read: Any) -> list[str]:
        """Undo what a reorg removed: everything after ``fork_block`` (which the chain still has).

        Each job whose fold reached past it is folded again from its events up to it
        (``read(first, last, topics)``: the watcher's reader); a job created after it is
        forgotten with its checks and rulings. For the others (:meth:`_reopen`), the checks and
        rulings that came from removed events are forgotten (handled again if those events are
        mined again) and the check the refolded state owes is open again; a ruling of this
        mediator whose ``Ruled`` the reorg removed is decided again (the escrow refuses a second
        ruling if the first is mined again). A re-run whose ``JobCreated`` the reorg removed goes
        back to ``funding`` (sent again only if the chain has no such job). Checkpoints after
        ``fork_block`` go and the cursor moves to it, all in one transaction. Returns the ids
        (hex) of the jobs changed.
        """
        first_gone = pos_of(fork_block + 1, 0)
        with self._lock:
            hit = self._db.execute(
                "SELECT job_id, created_block FROM jobs WHERE pos >= ?", (first_gone,)
            ).fetchall()
        kept = {str(j): int(b) for j, b in hit if int(b) <= fork_block}
        folded: dict[str, JobState] = {}
        last_pos: dict[str, int] = {}
        if kept:
            ids = ["0x" + j for j in sorted(kept)]
            for ev in read(min(kept.values()), fork_block, [None, ids]):
                if ev.name not in JOB_EVENTS:
                    continue
                job_id = bytes(ev.args["jobId"]).hex()
                if job_id not in kept or (job_id not in folded and ev.name != "JobCreated"):
                    continue
                folded[job_id] = apply_event(folded.get(job_id), ev.name, ev.args)
                last_pos[job_id] = pos_of(ev.block, ev.log_index)
        now = time.time()
        with self.batch():
            for job_id in (str(j) for j, _ in hit):
                state = folded.get(job_id)
                if state is None:  # created after the fork: the chain has no such job now
                    for table in ("jobs", "tasks", "rulings", "spot"):
                        self._db.execute(
                            f"DELETE FROM {table} WHERE job_id = ?",  # noqa: S608
                            (job_id,),
                        )
                    self._db.execute(  # sent again, unless the chain has such a job
                        "UPDATE reruns SET status = 'funding', note = ? "
                        "WHERE rerun_id = ? AND status IN ('funded', 'held', 'compared')",
                        (f"its createJob was reorged out at block {fork_block}", job_id),
                    )
                    continue
                self._db.execute(
                    "UPDATE jobs SET state = ?, pos = ? WHERE job_id = ?",
                    (state_to_json(state), last_pos[job_id], job_id),
                )
                self._reopen(job_id, state, fork_block, now)
            self._db.execute("DELETE FROM blocks WHERE block > ?", (fork_block,))
            self._set_meta("cursor", str(fork_block))
        return [str(j) for j, _ in hit]

    def _reopen(self, job_id: str, state: JobState, fork_block: int, now: float) -> None:
        """The checks, rulings and re-runs of a job refolded to ``state`` by a rollback: what
        came from events after the fork is forgotten, so the same events, mined again, are
        handled again; the check the refolded state owes is open again (a check that finds
        nothing to do, or a ruling the escrow refuses because the first one came back, ends it).
        """
        attempt = state.job.attempt
        want = {Status.SUBMITTED: Kind.CHECK, Status.DISPUTED: Kind.DISPUTE}.get(state.status, "")
        open_result = state.status in (Status.ASSIGNED, Status.SUBMITTED, Status.DISPUTED)
        # no ruling of the current attempt is on the chain while it is open
        self._db.execute(
            "DELETE FROM rulings WHERE job_id = ? AND (attempt > ? OR (attempt = ? AND ?))",
            (job_id, attempt, attempt, int(open_result)),
        )
        self._db.execute(
            "DELETE FROM tasks WHERE job_id = ? AND kind != ? "
            "AND (attempt > ? OR (attempt = ? AND kind != ? AND ?))",
            (job_id, Kind.TIE, attempt, attempt, want, int(open_result)),
        )
        if want == Kind.DISPUTE:  # compare again with the re-run (its job is still on chain)
            self._db.execute(
                "UPDATE reruns SET status = 'funded', note = ? WHERE job_id = ? AND attempt = ? "
                "AND status = 'compared'",
                (f"compared again: reorg at block {fork_block}", job_id, attempt),
            )
        if want:
            self._db.execute(
                "INSERT INTO tasks (job_id, attempt, kind, due, note) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (job_id, attempt, kind) DO UPDATE SET done = 0, due = excluded.due, "
                "note = excluded.note",
                (job_id, attempt, want, now, f"reopened: reorg at block {fork_block}"),
            )

    # ------------------------------------------------------------------ tasks
    def add_task(self, job_id: bytes, attempt: int, kind: Kind, due: float) -> None:
        """Owe a check (once per job, attempt and kind: a repeated add changes nothing)."""
        with self.batch():
            self._db.execute(
                "INSERT OR IGNORE INTO tasks (job_id, attempt, kind, due) VALUES (?, ?, ?, ?)",
                (job_id.hex(), attempt, kind, due),
            )

    def due_tasks(self, now: float, limit: int = 100) -> list[Task]:
        with self._lock:
            rows = self._db.execute(
                "SELECT job_id, attempt, kind, tries, due, note FROM tasks "
                "WHERE done = 0 AND due <= ? ORDER BY due, job_id LIMIT ?",
                (now, limit),
            ).fetchall()
        return [Task(bytes.fromhex(r[0]), r[1], Kind(r[2]), r[3], r[4], r[5]) for r in rows]

    def pending_tasks(self) -> list[Task]:
        with self._lock:
            rows = self._db.execute(
                "SELECT job_id, attempt, kind, tries, due, note FROM tasks WHERE done = 0 "
                "ORDER BY due"
            ).fetchall()
        return [Task(bytes.fromhex(r[0]), r[1], Kind(r[2]), r[3], r[4], r[5]) for r in rows]

    def retry_task(self, task: Task, due: float, note: str, *, tried: bool) -> None:
        with self.batch():
            self._db.execute(
                "UPDATE tasks SET due = ?, note = ?, tries = tries + ? "
                "WHERE job_id = ? AND attempt = ? AND kind = ?",
                (due, note, 1 if tried else 0, task.job_id.hex(), task.attempt, task.kind),
            )

    def finish_task(self, task: Task, note: str) -> None:
        with self.batch():
            self._db.execute(
                "UPDATE tasks SET done = 1, note = ? WHERE job_id = ? AND attempt = ? AND kind = ?",
                (note, task.job_id.hex(), task.attempt, task.kind),
            )

    # ------------------------------------------------------------------ rulings
    def ruling(self, job_id: bytes, attempt: int) -> Ruling | None:
        with self._lock:
            row = self._db.execute(
                "SELECT job_id, attempt, upheld, reason, outcome, tx_hash, at FROM rulings "
                "WHERE job_id = ? AND attempt = ?",
                (job_id.hex(), attempt),
            ).fetchone()
        return None if row is None else _ruling(row)

    def rulings(self) -> list[Ruling]:
        with self._lock:
            rows = self._db.execute(
                "SELECT job_id, attempt, upheld, reason, outcome, tx_hash, at FROM rulings "
                "ORDER BY at"
            ).fetchall()
        return [_ruling(r) for r in rows]

    def record_ruling(
        self,
        job_id: bytes,
        attempt: int,
        upheld: bool,
        reason: str,
        outcome: str,
        tx_hash: str | None = None,
    ) -> None:
        with self.batch():
            self._db.execute(
                "INSERT INTO rulings (job_id, attempt, upheld, reason, outcome, tx_hash, at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job_id, attempt) DO UPDATE SET "
                "upheld = excluded.upheld, reason = excluded.reason, "
                "outcome = excluded.outcome, tx_hash = excluded.tx_hash",
                (job_id.hex(), attempt, int(upheld), reason, outcome, tx_hash, time.time()),
            )

    def sent_rulings(self, limit: int = 50) -> list[Ruling]:
        """Rulings sent whose ``Ruled`` event has not folded in yet, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT job_id, attempt, upheld, reason, outcome, tx_hash, at FROM rulings "
                "WHERE outcome = 'sent' ORDER BY at LIMIT ?",
                (limit,),
            ).fetchall()
        return [_ruling(r) for r in rows]

    def decide_again(self, job_id: bytes, attempt: int, kind: Kind, note: str) -> None:
        """Forget the ruling of a job attempt (its transaction is not on the chain) and open its
        check again, at once."""
        with self.batch():
            self._db.execute(
                "DELETE FROM rulings WHERE job_id = ? AND attempt = ?", (job_id.hex(), attempt)
            )
            self._db.execute(
                "INSERT INTO tasks (job_id, attempt, kind, due, note) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (job_id, attempt, kind) DO UPDATE SET done = 0, due = excluded.due, "
                "note = excluded.note",
                (job_id.hex(), attempt, kind, time.time(), note),
            )

    # ------------------------------------------------------------------ re-runs
    def rerun(self, job_id: bytes, attempt: int, run: int = 1) -> Rerun | None:
        """The re-run of a disputed job attempt (``run`` 2: its tie-break), if one was ever
        started."""
        with self._lock:
            row = self._db.execute(
                f"SELECT {_RERUN_COLUMNS} FROM reruns "  # noqa: S608
                "WHERE job_id = ? AND attempt = ? AND run = ?",
                (job_id.hex(), attempt, run),
            ).fetchone()
        return None if row is None else _rerun(row)

    def rerun_by_id(self, rerun_id: bytes) -> Rerun | None:
        """The re-run whose own job id is ``rerun_id`` (a job this mediator funded)."""
        with self._lock:
            row = self._db.execute(
                f"SELECT {_RERUN_COLUMNS} FROM reruns WHERE rerun_id = ?",  # noqa: S608
                (rerun_id.hex(),),
            ).fetchone()
        return None if row is None else _rerun(row)

    def reruns(self) -> list[Rerun]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_RERUN_COLUMNS} FROM reruns ORDER BY at, run"  # noqa: S608
            ).fetchall()
        return [_rerun(r) for r in rows]

    def start_rerun(self, rerun: Rerun) -> None:
        """Record a re-run before its ``createJob`` is sent (once per job attempt and run: a
        second start for the same ones raises :class:`sqlite3.IntegrityError`)."""
        with self.batch():
            self._db.execute(
                f"INSERT INTO reruns ({_RERUN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
                (
                    rerun.job_id.hex(),
                    rerun.attempt,
                    rerun.rerun_id.hex(),
                    rerun.spec_cid,
                    rerun.salt.hex(),
                    str(rerun.bounty),
                    rerun.deadline,
                    rerun.status,
                    rerun.note,
                    rerun.at,
                    rerun.run,
                ),
            )

    def set_rerun(self, job_id: bytes, attempt: int, status: str, note: str, run: int = 1) -> None:
        with self.batch():
            self._db.execute(
                "UPDATE reruns SET status = ?, note = ? "
                "WHERE job_id = ? AND attempt = ? AND run = ?",
                (status, note[:2000], job_id.hex(), attempt, run),
            )

    # ------------------------------------------------------------------ spot checks
    def spot(self, job_id: bytes) -> SpotSeed | None:
        """The spot draw read for a job (once per job: the spec does not change)."""
        with self._lock:
            row = self._db.execute(
                f"SELECT {_SPOT_COLUMNS} FROM spot WHERE job_id = ?",  # noqa: S608
                (job_id.hex(),),
            ).fetchone()
        return None if row is None else _spot(row)

    def put_spot(self, spot: SpotSeed) -> SpotSeed:
        """Keep a job's spot draw; the first one kept for a job stays (returned)."""
        with self.batch():
            self._db.execute(
                f"INSERT OR IGNORE INTO spot ({_SPOT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
                (
                    spot.job_id.hex(),
                    spot.commit.hex(),
                    spot.p_bps,
                    None if spot.seed is None else spot.seed.hex(),
                    spot.note,
                    spot.revealed,
                    spot.at,
                ),
            )
            kept = self.spot(spot.job_id)
        assert kept is not None
        return kept

    def spot_sharing(self, job_id: bytes, commit: bytes) -> list[bytes]:
        """Other jobs whose seed opened under the same commitment (a reused seed). Only opened
        seeds count: one opens only for its submitter and matches a commitment that hashes that
        submitter in, so these are the same submitter's jobs. A copy of the commitment in
        another wallet's spec never opens, and neither leaves the original unchecked nor holds
        back its reveal."""
        if not commit:
            return []
        with self._lock:
            rows = self._db.execute(
                "SELECT job_id FROM spot WHERE spot_commit = ? AND job_id != ? "
                "AND seed IS NOT NULL ORDER BY at",
                (commit.hex(), job_id.hex()),
            ).fetchall()
        return [bytes.fromhex(r[0]) for r in rows]

    def set_revealed(self, job_id: bytes, outcome: str) -> None:
        with self.batch():
            self._db.execute(
                "UPDATE spot SET revealed = ? WHERE job_id = ?", (outcome[:500], job_id.hex())
            )


_SPOT_COLUMNS = "job_id, spot_commit, p_bps, seed, note, revealed, at"


def _spot(row: Any) -> SpotSeed:
    return SpotSeed(
        bytes.fromhex(row[0]),
        bytes.fromhex(row[1]),
        int(row[2]),
        None if row[3] is None else bytes.fromhex(row[3]),
        row[4],
        row[5],
        row[6],
    )


_RERUN_COLUMNS = (
    "job_id, attempt, rerun_id, spec_cid, salt, bounty, deadline, status, note, at, run"
)


def _rerun(row: Any) -> Rerun:
    return Rerun(
        bytes.fromhex(row[0]),
        row[1],
        bytes.fromhex(row[2]),
        row[3],
        bytes.fromhex(row[4]),
        int(row[5]),
        row[6],
        row[7],
        row[8],
        row[9],
        int(row[10]),
    )


def _ruling(row: Any) -> Ruling:
    return Ruling(bytes.fromhex(row[0]), row[1], bool(row[2]), row[3], row[4], row[5], row[6])
