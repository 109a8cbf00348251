"""``task_uploads``: the content addresses of the uploads a task was imported with (``atlas.models.TaskUpload``).

An export carries each task's uploads (those its jobs added and those it came with); an import stores them here, so
appending the task's original file again after an export and import is refused as a repeat (409), as it is in the
store it came from. Tasks stored before it have no rows: their jobs say what they hold, as before.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "task_uploads",
        sa.Column("task_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_task_uploads_task_id_tasks"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("task_id", "sha256", name=op.f("pk_task_uploads")),
    )


def downgrade() -> None:
    """The table dropped (revision 0011's code knows only the uploads its jobs added)."""
    op.drop_table("task_uploads")
