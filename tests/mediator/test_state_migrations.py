"""The mediator's state file on Alembic (mediator/migrations/, docs/mediator.md "Events and
state"): a new file, files from before Alembic (before reorg handling, before the tie-break),
and a second start that changes nothing. Plain SQLite: no chain, no IPFS."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

from gridmarket.escrow import JOB_ABI_TYPES, Job, JobState, Status
from mediator.state import MediatorState, migrate, state_to_json

ESCROW = "0x" + "ab" * 20
CHAIN_ID = 31337
OLD_RERUNS = (
    "CREATE TABLE reruns (job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rerun_id TEXT NOT NULL,"
    " spec_cid TEXT NOT NULL, salt TEXT NOT NULL, bounty TEXT NOT NULL, deadline INTEGER NOT NULL,"
    " status TEXT NOT NULL, note TEXT NOT NULL DEFAULT '', at REAL NOT NULL,"
    " PRIMARY KEY (job_id, attempt))"
)


def columns(path: Path, table: str) -> list[str]:
    with sqlite3.connect(path) as db:
        return [row[1] for row in db.execute(f"PRAGMA table_info({table})")]


def revision(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return [row[0] for row in db.execute("SELECT version_num FROM alembic_version")]


def test_a_new_state_file_is_created_at_the_newest_revision(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "m.db"
    MediatorState(path, escrow=ESCROW, chain_id=CHAIN_ID).close()
    assert revision(path) == ["0001"]
    assert "run" in columns(path, "reruns")
    assert {"pos", "created_block"} <= set(columns(path, "jobs"))
    for table in ("meta", "blocks", "tasks", "rulings", "spot"):
        assert columns(path, table), table


def test_a_state_file_from_before_alembic_and_the_tie_break_is_upgraded_in_place(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as old:
        old.executescript(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
            "CREATE TABLE jobs (job_id TEXT PRIMARY KEY, state TEXT NOT NULL);" + OLD_RERUNS + ";"
        )
        old.execute("INSERT INTO meta VALUES ('escrow', ?)", (f"{CHAIN_ID}:{ESCROW}",))
        old.execute(
            "INSERT INTO reruns VALUES ('aa', 1, 'bb', 'cid', 'cc', '10', 99, 'funded', '', 1.0)"
        )
    state = MediatorState(path, escrow=ESCROW, chain_id=CHAIN_ID)
    try:
        rerun = state.rerun(bytes.fromhex("aa"), 1)
        assert rerun is not None and rerun.status == "funded" and rerun.bounty == 10
    finally:
        state.close()
    assert revision(path) == ["0001"]
    assert "run" in columns(path, "reruns")
    assert {"pos", "created_block"} <= set(columns(path, "jobs"))
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT run FROM reruns").fetchall() == [(1,)]
        names = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    assert "reruns_v1" not in names


def test_migrating_again_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    migrate(path)
    with sqlite3.connect(path) as db:
        before = db.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
    migrate(path)
    with sqlite3.connect(path) as db:
        after = db.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
    assert before == after
    assert revision(path) == ["0001"]


def test_a_job_stored_before_escrow_version_5_loads_and_is_stored_with_its_hold(
    tmp_path: Path,
) -> None:
    """A job folded by a mediator from before JobEscrow version 5 has no ``hold_until`` (the
    struct's 15th field) in its stored JSON: it loads as zero (what a pending result's struct
    holds on chain) and is written back with the field."""
    path = tmp_path / "m.db"
    job = Job(
        submitter="0x" + "11" * 20,
        bounty=10**16,
        provider="0x" + "22" * 20,
        deadline=2_000_000_000,
        since=1_900_000_000,
        attempt=1,
        result_digest=b"\x33" * 32,
        mediator="0x" + "44" * 20,
    )
    state = JobState(
        job_id=b"\xaa" * 32,
        job=job,
        status=Status.SUBMITTED,
        spec_cid="bafyspec",
        salt=b"\x01" * 32,
    )
    body = json.loads(state_to_json(state))
    del body["job"]["hold_until"]
    assert len(body["job"]) == 14  # the version-4 struct
    MediatorState(path, escrow=ESCROW, chain_id=CHAIN_ID).close()
    with sqlite3.connect(path) as db:
        db.execute(
            "INSERT INTO jobs (job_id, state) VALUES (?, ?)", (state.job_id.hex(), json.dumps(body))
        )
    stored = MediatorState(path, escrow=ESCROW, chain_id=CHAIN_ID)
    try:
        loaded = stored.job(state.job_id)
        assert loaded is not None and loaded == state and loaded.job.hold_until == 0
        assert len(loaded.job.as_tuple()) == len(JOB_ABI_TYPES) == 15
        stored.put_job(replace(loaded, job=replace(loaded.job, hold_until=1_900_000_600)))
        again = stored.job(state.job_id)
        assert again is not None and again.job.hold_until == 1_900_000_600
    finally:
        stored.close()
