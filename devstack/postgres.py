"""Throwaway PostgreSQL databases on the machine's server, for tests, benches and replicas.

The server is the machine's own (127.0.0.1:5432, trust auth: docs/platform.md);
``GRIDMARKET_PG_ADMIN_URL`` points elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

from sqlalchemy import create_engine, text

from ._process import ServiceError

PG_ADMIN_URL = os.environ.get(
    "GRIDMARKET_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


@contextlib.contextmanager
def fresh_database(prefix: str = "gm", admin_url: str = PG_ADMIN_URL) -> Iterator[str]:
    """A new, empty database's URL; dropped (connections and all) when the block ends.

    Raises ServiceError naming the server when it cannot be used.
    """
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        admin.dispose()
        raise ServiceError(f"PostgreSQL at {admin_url} is not usable: {exc}") from exc
    try:
        yield f"{admin_url.rsplit('/', 1)[0]}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
