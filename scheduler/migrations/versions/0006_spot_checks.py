"""spot checks: a spot job's commitment and its revealed seed

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 10:00:00.000000

``jobs.spot_commit``: the commitment of a spot job's spec (``JobSpec.spot.commit``, lower-case
0x hex), set when the job is queued; unique, so a second job carrying a commitment already seen
is refused at intake (a seed revealed for one job would open the other's draws).
``jobs.spot_seed`` and ``jobs.spot_revealed_at``: the seed posted once the job is settled
(``POST /v1/jobs/{job_id}/spot``), checked against the commitment. Existing jobs have none.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("spot_commit", sa.String(length=66), nullable=True))
        batch.add_column(sa.Column("spot_seed", sa.String(length=66), nullable=True))
        batch.add_column(sa.Column("spot_revealed_at", sa.Float(), nullable=True))
        batch.create_index("ix_jobs_spot_commit", ["spot_commit"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_spot_commit")
        batch.drop_column("spot_revealed_at")
        batch.drop_column("spot_seed")
        batch.drop_column("spot_commit")
