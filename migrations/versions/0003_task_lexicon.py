"""Lexical side of routing: a task's hashed term counts (additive).

Tasks stored before this revision get theirs here, from the uploads of their succeeded jobs.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "task_lexicon",
        sa.Column("task_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("digest", sa.LargeBinary(), nullable=False),
        sa.Column("n_terms", sa.Integer(), nullable=False),
        sa.Column("terms", sa.LargeBinary(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_task_lexicon_task_id_tasks"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("task_id", name=op.f("pk_task_lexicon")),
    )
    _backfill()


def _backfill() -> None:
    """Term counts of the tasks stored before this revision, from their succeeded jobs' uploads."""
    from sqlalchemy.orm import Session

    if context.is_offline_mode():  # `alembic upgrade --sql`: no rows to read
        op.execute("-- 0003: no backfill here: on a database that holds tasks, migrate online (`fisher-atlas migrate`) instead")
        return

    from atlas import lexicon_repo

    with Session(bind=op.get_bind()) as session:
        lexicon_repo.backfill(session, lexicon_repo.tasks_without_terms(session))
        session.flush()


def downgrade() -> None:
    op.drop_table("task_lexicon")
