"""``task_routing.cal_views``: held-out views of the calibration samples by length (``atlas.route_calibration``).

Each record is ``[tokens, route score, whole]``, for a calibration sample scored held out whole and for its first
half, quarter and eighth of tokens: what a prompt shorter than the task's samples has its threshold calibrated on
(docs/SCORES.md, "Prompts shorter than the samples"). Existing rows get NULL: the prefixes were never sketched, so
there is nothing to derive; such a task judges every prompt as before (on whole samples) until its next job.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    column = sa.Column("cal_views", sa.JSON(), nullable=True)
    if context.is_offline_mode():  # SQLite's batch mode reflects the table, which --sql cannot: a plain ADD COLUMN
        op.add_column("task_routing", column)
    else:
        with op.batch_alter_table("task_routing") as batch:
            batch.add_column(column)


def downgrade() -> None:
    """The column dropped (revision 0008's code judges every prompt on whole samples)."""
    if context.is_offline_mode():  # `alembic downgrade --sql`: no table to reflect
        op.drop_column("task_routing", "cal_views")
        return
    with op.batch_alter_table("task_routing") as batch:
        batch.drop_column("cal_views")
