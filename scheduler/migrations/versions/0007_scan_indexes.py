"""indexes for the scans that grew with a backlog (issue 12's 100,000-job soak)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28 13:00:00.000000

* ``ix_outbox_status_not_before``: the outbox's "does a pending row wait for a time?" read
  went through every pending row when none did (tens of thousands behind a slow chain).
* ``ix_jobs_state_updated_at``: the verifier takes the longest-waiting ``verifying`` jobs; it
  read and sorted every one (up to every node's every slot) for each pass.
* ``ix_jobs_state_deadline``: every replica's sweeper asks each second for the open jobs past
  their deadline; without it that read went through every queued job (92,000 rows a second
  per replica early in a 100,000-job soak: most of PostgreSQL's CPU).
* ``ix_jobs_node_id_state``: a poll reads the jobs leased to its node; by ``node_id`` alone that
  went through every job the node still held (its results' settles queued behind the chain:
  1,000 and more a node late in the soak).
* ``ix_jobs_node_id`` becomes ``(node_id, chain_status, chain_pos)``: an acceptance's collateral
  check reads the wallet's accepted jobs not yet assigned on-chain (and those held since a
  block), and went through every job its nodes held (the settles' backlog included).
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("outbox") as batch:
        batch.create_index("ix_outbox_status_not_before", ["status", "not_before"])
    with op.batch_alter_table("jobs") as batch:
        batch.create_index("ix_jobs_state_updated_at", ["state", "updated_at"])
        batch.create_index("ix_jobs_state_deadline", ["state", "deadline"])
        batch.create_index("ix_jobs_node_id_state", ["node_id", "state"])
        batch.drop_index("ix_jobs_node_id")
        batch.create_index("ix_jobs_node_id", ["node_id", "chain_status", "chain_pos"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_node_id")
        batch.create_index("ix_jobs_node_id", ["node_id"])
        batch.drop_index("ix_jobs_node_id_state")
        batch.drop_index("ix_jobs_state_deadline")
        batch.drop_index("ix_jobs_state_updated_at")
    with op.batch_alter_table("outbox") as batch:
        batch.drop_index("ix_outbox_status_not_before")
