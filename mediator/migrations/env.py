"""Alembic environment of the mediator's state file: runs on the connection
:func:`mediator.state.migrate` hands it (or, on the command line, ``-x url=sqlite:///FILE``).

The state is read and written with plain ``sqlite3`` (:class:`mediator.state.MediatorState`);
Alembic only owns its schema, as it does the scheduler's (scheduler/migrations/)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

config = context.config


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is None:  # `alembic` on the command line: -x url=...
        url = context.get_x_argument(as_dictionary=True).get("url", "sqlite:///mediator.db")
        with create_engine(url).begin() as conn:
            context.configure(connection=conn, target_metadata=None)
            context.run_migrations()
        return
    context.configure(connection=connection, target_metadata=None)
    context.run_migrations()


run()
