"""Routing side of a task: prompt-side state, calibrated threshold and its override (additive).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "task_routing",
        sa.Column("task_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("prompt_state", sa.LargeBinary(), nullable=True),
        sa.Column("cal_scores", sa.JSON(), nullable=False),
        sa.Column("threshold_auto", sa.Float(), nullable=True),
        sa.Column("score_scale", sa.Float(), nullable=True),
        sa.Column("false_reject_rate", sa.Float(), nullable=True),
        sa.Column("threshold_override", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_task_routing_task_id_tasks"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("task_id", name=op.f("pk_task_routing")),
    )


def downgrade() -> None:
    op.drop_table("task_routing")
