"""live job logs: the batches of stdout/stderr nodes post while a job runs

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-29 00:30:00.000000

``job_logs``: one row per batch (``POST /v1/nodes/{node_id}/jobs/{job_id}/logs``), unique on
``(job_id, attempt, seq)`` so a repost is a no-op; ``id`` is the readers' cursor. Bounded per
job by the store (the newest ``scheduler.api.logs.KEEP_CHARS`` characters and ``KEEP_BATCHES``
batches; older batches are deleted). Existing jobs have none.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_logs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=66), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.String(length=24), nullable=False),
        sa.Column("received_at", sa.Float(), nullable=False),
        sa.Column("chars", sa.Integer(), nullable=False),
        sa.Column("chunks", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_logs")),
    )
    op.create_index("ix_job_logs_job_id", "job_logs", ["job_id", "attempt", "seq"], unique=True)
    op.create_index("ix_job_logs_job_id_id", "job_logs", ["job_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_job_logs_job_id_id", table_name="job_logs")
    op.drop_index("ix_job_logs_job_id", table_name="job_logs")
    op.drop_table("job_logs")
