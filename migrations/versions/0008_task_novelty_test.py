"""``task_routing.novelty_test`` (true: the novelty test applies to the task; ``atlas.novelty``).

The per-task switch of the open set's novelty test, as ``template_test`` (0004) is the template test's: PATCH
``{"novelty": false}`` or ``fit`` turns it off for a task whose real prompts are another kind of text than its
samples. Every existing row gets true (the test stays as it was); no data to derive.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    column = sa.Column("novelty_test", sa.Boolean(), nullable=False, server_default=sa.true())
    if context.is_offline_mode():  # SQLite's batch mode reflects the table, which --sql cannot: a plain ADD COLUMN
        op.add_column("task_routing", column)
    else:
        with op.batch_alter_table("task_routing") as batch:
            batch.add_column(column)


def downgrade() -> None:
    """The column dropped (revision 0007's code tests every task with enough sample vectors)."""
    if context.is_offline_mode():  # `alembic downgrade --sql`: no table to reflect
        op.drop_column("task_routing", "novelty_test")
        return
    with op.batch_alter_table("task_routing") as batch:
        batch.drop_column("novelty_test")
