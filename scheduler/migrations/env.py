"""Alembic environment: runs on the connection the store hands it (scheduler.store.db.migrate)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from scheduler.store.tables import metadata

config = context.config
target_metadata = metadata


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is None:  # `alembic` on the command line: -x url=...
        url = context.get_x_argument(as_dictionary=True).get("url", "sqlite:///.run/scheduler.db")
        with create_engine(url).begin() as conn:
            context.configure(connection=conn, target_metadata=target_metadata)
            context.run_migrations()
        return
    context.configure(connection=connection, target_metadata=target_metadata)
    context.run_migrations()


run()
