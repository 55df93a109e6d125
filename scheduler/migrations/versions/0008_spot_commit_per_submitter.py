"""a spot commitment is unique per submitter, not across submitters

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 10:00:00.000000

``ix_jobs_spot_commit`` (unique on ``spot_commit``) becomes ``ix_jobs_submitter_spot_commit``
(unique on ``(submitter, spot_commit)``). A commitment hashes its submitter's address in
(``keccak256("gridmarket.spot.v1" || submitter || seed)``), so the same commitment in another
wallet's job is a copy, not a reuse of the seed: an attacker who copied a victim's commitment
from the mempool into an earlier job of its own made the victim's job ``invalid`` (issue 32,
item 7). A submitter reusing its own commitment is still refused. Existing rows already satisfy
the new index (the old one was stricter).
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_spot_commit")
        batch.create_index(
            "ix_jobs_submitter_spot_commit", ["submitter", "spot_commit"], unique=True
        )


def downgrade() -> None:
    """Back to one holder per commitment: fails if two submitters' jobs hold the same one
    (clear ``spot_commit`` on the later job first)."""
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_submitter_spot_commit")
        batch.create_index("ix_jobs_spot_commit", ["spot_commit"], unique=True)
