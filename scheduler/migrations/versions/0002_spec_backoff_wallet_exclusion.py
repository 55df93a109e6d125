"""spec fetch backoff, jobs excluded by wallet

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24 06:00:00.000000

``jobs.spec_tries`` / ``jobs.spec_retry_at``: failed fetches of a pending job's spec and when
the next one is due (the spec fetcher skips a job until then, also after a leader restart).
``jobs.excluded_wallets``: provider wallets a requeued job must not go to again (every node of
a wallet is one provider for the escrow). Existing rows get 0, NULL and NULL (none excluded).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("spec_tries", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("spec_retry_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("excluded_wallets", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("excluded_wallets")
        batch.drop_column("spec_retry_at")
        batch.drop_column("spec_tries")
