"""reorgs: the watcher's checkpoints (block, hash) of delivered batch ends

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24 09:45:00.000000

``chain_blocks``: the last delivered blocks' hashes (scheduler.store.chain keeps the newest
128), written with the cursor; the watcher checks the chain still has them and rolls the store
back to the newest one it has after a reorg (docs/scheduler-chain.md "Reorgs"). Existing stores
start with none: the first batch after the upgrade writes the first.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "chain_blocks",
        sa.Column("block", sa.BigInteger(), nullable=False),
        sa.Column("hash", sa.String(length=66), nullable=False),
        sa.PrimaryKeyConstraint("block", name=op.f("pk_chain_blocks")),
    )


def downgrade() -> None:
    op.drop_table("chain_blocks")
