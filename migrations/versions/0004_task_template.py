"""Lexical records gain the task's template (the terms every sample has; atlas.template), and
``task_routing.template_test`` (true: the template test applies to the task).

Records stored before this revision are bare term counts: they are re-derived here, counts and
template, from the uploads of their tasks' succeeded jobs.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    from sqlalchemy.orm import Session

    from atlas import lexicon_repo

    with op.batch_alter_table("task_routing") as batch:
        batch.add_column(sa.Column("template_test", sa.Boolean(), nullable=False, server_default=sa.true()))
    with Session(bind=op.get_bind()) as session:
        lexicon_repo.backfill(session, lexicon_repo.tasks_without_template(session))
        session.flush()


def downgrade() -> None:
    """Records back to bare term counts (what revision 0003's code reads); the column dropped."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from atlas import lexicon_repo
    from atlas.models import TaskLexicon

    with Session(bind=op.get_bind()) as session:
        for tid, blob in session.execute(select(TaskLexicon.task_id, TaskLexicon.terms)).all():
            record = lexicon_repo.LexicalRecord.from_bytes(blob)
            if record.template is not None:
                lexicon_repo.put_record(session, int(tid), lexicon_repo.LexicalRecord(record.counts, None))
        session.flush()
    with op.batch_alter_table("task_routing") as batch:
        batch.drop_column("template_test")
