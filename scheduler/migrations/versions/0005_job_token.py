"""escrow v4: the token a job is paid in

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 18:50:00.000000

``jobs.token``: the job struct's ``token`` (JobEscrow version 4, ERC-20 bounties), folded from
``JobCreated``; the zero address for a job paid in ETH, which every job stored before this
revision is. Every amount of a job (``bounty_wei``, the collateral in ``chain_job``) is in its
token's smallest units. The acceptance check sums pending collateral per token by it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

ZERO_ADDRESS = "0x0000000000000000000000000000000000000000"


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column("token", sa.String(length=42), nullable=False, server_default=ZERO_ADDRESS)
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("token")
