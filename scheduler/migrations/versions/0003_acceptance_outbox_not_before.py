"""escrow v2: the node's acceptance of an offer, outbox rows that wait for a time

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24 09:00:00.000000

``jobs.acceptance``: the node's EIP-712 ``Acceptance`` signature (0x hex) for the current lease,
NULL while the lease is only an offer (escrow v2: ``assign`` needs it). ``outbox.not_before``:
the chain time (Unix seconds) before which a row is not sent (``finalize`` after the challenge
window, ``unassign``/``assign`` after ``reassignDelay``); NULL: at once. ``ix_outbox_job_id``:
a job's earlier rows hold its later ones back (the outbox sends each job's rows in order).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("acceptance", sa.String(length=132), nullable=True))
    with op.batch_alter_table("outbox") as batch:
        batch.add_column(sa.Column("not_before", sa.Float(), nullable=True))
    op.create_index("ix_outbox_job_id", "outbox", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_outbox_job_id", table_name="outbox")
    with op.batch_alter_table("outbox") as batch:
        batch.drop_column("not_before")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("acceptance")
