"""checkpoints of long jobs: the reports nodes post, and the checkpoint each attempt resumed from

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29 07:00:00.000000

``job_checkpoints``: one row per checkpoint a node reported
(``POST /v1/nodes/{node_id}/jobs/{job_id}/checkpoints``), unique on ``(job_id, attempt, seq)``
so a repost is a no-op; the keeper's state per row (``kept_at``, ``keep_error``,
``unpinned_at``). Bounded per job by the store (``scheduler.api.checkpoints.KEEP_ROWS``).
``attempts.resume_cid``: the checkpoint an attempt started from (NULL: none; every existing
attempt).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_checkpoints",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=66), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.String(length=24), nullable=False),
        sa.Column("wallet", sa.String(length=42), nullable=False),
        sa.Column("cid", sa.String(length=128), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=True),
        sa.Column("total", sa.BigInteger(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.Column("final", sa.Boolean(), nullable=False),
        sa.Column("taken_at", sa.Float(), nullable=False),
        sa.Column("received_at", sa.Float(), nullable=False),
        sa.Column("kept_at", sa.Float(), nullable=True),
        sa.Column("keep_error", sa.Text(), nullable=True),
        sa.Column("unpinned_at", sa.Float(), nullable=True),
        sa.Column("signature", sa.String(length=132), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_checkpoints")),
    )
    op.create_index(
        "ix_job_checkpoints_job_id", "job_checkpoints", ["job_id", "attempt", "seq"], unique=True
    )
    op.create_index("ix_job_checkpoints_kept_at", "job_checkpoints", ["kept_at", "keep_error"])
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("resume_cid", sa.String(length=128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("resume_cid")
    op.drop_index("ix_job_checkpoints_kept_at", table_name="job_checkpoints")
    op.drop_index("ix_job_checkpoints_job_id", table_name="job_checkpoints")
    op.drop_table("job_checkpoints")
