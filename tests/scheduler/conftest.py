"""Databases for the scheduler's tests: every store test runs on SQLite and on PostgreSQL.

PostgreSQL is the machine's own server (127.0.0.1:5432, trust auth; docs/platform.md): each
test gets a fresh database, dropped afterwards. If PostgreSQL is not reachable the PostgreSQL
half of the suite FAILS (it is never skipped): set GRIDMARKET_TEST_PG_URL to point elsewhere.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

PG_ADMIN_URL = os.environ.get(
    "GRIDMARKET_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def _pg_database() -> Iterator[str]:
    name = f"gm_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        admin.dispose()
        pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} is not usable: {exc}", pytrace=False)
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database URL of each kind."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'scheduler.db'}"
    else:
        yield from _pg_database()
