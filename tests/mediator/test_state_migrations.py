"""The mediator's state file on Alembic (mediator/migrations/, docs/mediator.md "Events and
state"): a new file, files from before Alembic (before reorg handling, before the tie-break),
and a second start that changes nothing. Plain SQLite: no chain, no IPFS."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from mediator.state import MediatorState, migrate

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
