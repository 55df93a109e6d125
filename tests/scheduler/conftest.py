"""Databases for the scheduler's tests: every store test runs on SQLite and on PostgreSQL.

PostgreSQL is the machine's own server (127.0.0.1:5432, trust auth; docs/platform.md): each
test gets a fresh database, dropped afterwards. If PostgreSQL is not reachable the PostgreSQL
half of the suite FAILS (it is never skipped): set GRIDMARKET_PG_ADMIN_URL to point elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack._process import ServiceError
from devstack.postgres import fresh_database
from scheduler.store import Store


def _pg_database() -> Iterator[str]:
    try:
        with fresh_database("gm_test") as url:
            yield url
    except ServiceError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database URL of each kind."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'scheduler.db'}"
    else:
        yield from _pg_database()


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """A migrated store on a fresh database of each kind (``db_url``)."""
    s = Store(db_url)
    s.migrate()
    yield s
    s.close()
