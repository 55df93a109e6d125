"""the state file: meta, jobs, blocks, tasks, rulings, spot, reruns

Revision ID: 0001
Revises:
Create Date: 2026-11-29 00:00:00.000000

The mediator's state file as it was before Alembic, with the hand-written migrations it used to
run on every start folded in: every table is created only if missing, so a state file from
before this revision opens as it is and is stamped ``0001``; one from before reorg handling gets
``jobs.pos`` and ``jobs.created_block`` (0: refolded from the chain when a reorg reaches them);
one from before the tie-break (one re-run per dispute) gets ``reruns.run`` (each row is run 1)
and the key ``(job_id, attempt, run)``.

The tables are plain SQLite (``sqlite3`` reads and writes them: :mod:`mediator.state`).
"""

from __future__ import annotations

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TABLES = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    state TEXT NOT NULL,              -- gridmarket.escrow.JobState as JSON (mediator.state)
    pos INTEGER NOT NULL DEFAULT 0,   -- the last folded event: block * 100000 + log index
    created_block INTEGER NOT NULL DEFAULT 0  -- the block of its JobCreated
)""",
    """CREATE TABLE IF NOT EXISTS blocks (  -- the watcher's checkpoints (reorgs)
    block INTEGER PRIMARY KEY,
    hash TEXT NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS tasks (
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    kind TEXT NOT NULL,               -- a mediator.tasks.Kind: 'check', 'dispute', 'reveal', 'tie'
    done INTEGER NOT NULL DEFAULT 0,
    tries INTEGER NOT NULL DEFAULT 0, -- integrity checks that found the output unreachable
    due REAL NOT NULL,                -- time.time() when it may run next
    note TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (job_id, attempt, kind)
)""",
    """CREATE TABLE IF NOT EXISTS rulings (
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    upheld INTEGER NOT NULL,
    reason TEXT NOT NULL,
    outcome TEXT NOT NULL,            -- 'sending', 'sent', 'confirmed' or 'refused: <revert>'
    tx_hash TEXT,
    at REAL NOT NULL,
    PRIMARY KEY (job_id, attempt)
)""",
    """CREATE TABLE IF NOT EXISTS spot (  -- spot jobs (FLAG_SPOT): the opened seed
    job_id TEXT PRIMARY KEY,
    spot_commit TEXT NOT NULL,        -- the spec's commitment (hex; '' when the spec has none)
    p_bps INTEGER NOT NULL,           -- the spec's p (0 when none)
    seed TEXT,                        -- the opened seed (hex); NULL when it did not open
    note TEXT NOT NULL DEFAULT '',    -- why no seed (the submitter's mistake), or ''
    revealed TEXT,                    -- how the reveal to the scheduler ended; NULL: not yet
    at REAL NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS ix_spot_commit ON spot (spot_commit)",
)

RERUNS = """CREATE TABLE IF NOT EXISTS reruns (
    job_id TEXT NOT NULL,             -- the disputed job
    attempt INTEGER NOT NULL,         -- its disputed attempt
    run INTEGER NOT NULL DEFAULT 1,   -- 1: the re-run; 2: the tie-break when run 1 differed
    rerun_id TEXT NOT NULL,           -- the re-run's job id (known before createJob is sent)
    spec_cid TEXT NOT NULL,           -- the re-run's spec (the job's, with exclude_providers)
    salt TEXT NOT NULL,
    bounty TEXT NOT NULL,             -- in the job's currency, as text (past SQLite's ints)
    deadline INTEGER NOT NULL,
    status TEXT NOT NULL,             -- 'funding', 'funded', 'held', 'compared' or 'abandoned'
    note TEXT NOT NULL DEFAULT '',
    at REAL NOT NULL,
    PRIMARY KEY (job_id, attempt, run)
)"""

RERUN_COLUMNS = "job_id, attempt, rerun_id, spec_cid, salt, bounty, deadline, status, note, at"


def _columns(table: str) -> set[str]:
    return {row[1] for row in op.get_bind().exec_driver_sql(f"PRAGMA table_info({table})")}


def upgrade() -> None:
    bind = op.get_bind()
    for ddl in TABLES:
        bind.exec_driver_sql(ddl)
    jobs = _columns("jobs")
    for column in ("pos", "created_block"):  # a state file from before reorg handling
        if column not in jobs:
            bind.exec_driver_sql(f"ALTER TABLE jobs ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")
    reruns = _columns("reruns")
    if reruns and "run" not in reruns:  # from before the tie-break: each row is run 1
        bind.exec_driver_sql("ALTER TABLE reruns RENAME TO reruns_v1")
        bind.exec_driver_sql(RERUNS)
        bind.exec_driver_sql(
            f"INSERT INTO reruns ({RERUN_COLUMNS}, run) "  # noqa: S608
            f"SELECT {RERUN_COLUMNS}, 1 FROM reruns_v1"
        )
        bind.exec_driver_sql("DROP TABLE reruns_v1")
    else:
        bind.exec_driver_sql(RERUNS)


def downgrade() -> None:
    for table in ("reruns", "spot", "rulings", "tasks", "blocks", "jobs", "meta"):
        op.drop_table(table)
