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
from alembic import context, op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    from sqlalchemy.orm import Session

    from atlas import lexicon_repo

    column = sa.Column("template_test", sa.Boolean(), nullable=False, server_default=sa.true())
    if context.is_offline_mode():  # SQLite's batch mode reflects the table, which --sql cannot: a plain ADD COLUMN
        op.add_column("task_routing", column)
    else:
        with op.batch_alter_table("task_routing") as batch:
            batch.add_column(column)
    if context.is_offline_mode():  # `alembic upgrade --sql`: no rows to read
        op.execute("-- 0004: no templates derived here: on a database that holds tasks, migrate online (`fisher-atlas migrate`)")
        return
    with Session(bind=op.get_bind()) as session:
        lexicon_repo.backfill(session, lexicon_repo.tasks_without_template(session))
        session.flush()


def downgrade() -> None:
    """Records back to bare term counts (what revision 0003's code reads); the column dropped."""
    if context.is_offline_mode():  # `alembic downgrade --sql`: no rows to read, no table to reflect
        op.execute("-- 0004: run the downgrade online to strip the templates from the lexical records")
        op.drop_column("task_routing", "template_test")
        return
    _strip_templates()
    with op.batch_alter_table("task_routing") as batch:
        batch.drop_column("template_test")


def _strip_templates() -> None:
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
