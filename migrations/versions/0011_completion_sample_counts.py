"""Completion-mode tasks' lexical records gain their per-term sample counts (``atlas.lexical``, "Completion-mode
tasks"): how many of the task's samples hold each term, which their profile weighs (a term of one passage counts
half). Every completion task whose uploads are all stored is re-derived from them (``atlas.lexicon_repo.backfill``,
as 0005 and 0007); an imported one keeps the record it came with and is routed on its counts alone, as before.

No schema change (the counts travel in the record blob, format ``FALR2``). The downgrade writes such records back in
the format revision 0010's code reads (``FALR1``, without the sample counts).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import context, op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from atlas import lexicon_repo
    from atlas.models import Task

    if context.is_offline_mode():  # `alembic upgrade --sql`: no rows to read
        op.execute("-- 0011: no records re-derived here: on a database that holds tasks, migrate online instead")
        return
    with Session(bind=op.get_bind()) as session:
        ids = session.execute(select(Task.id).where(Task.mode == "completion").order_by(Task.id)).scalars().all()
        lexicon_repo.backfill(session, [int(i) for i in ids], complete_only=True)
        session.flush()


def downgrade() -> None:
    """Records with sample counts written back without them (revision 0010's code reads the rest unchanged)."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from atlas import lexicon_repo
    from atlas.lexical_record import LexicalRecord
    from atlas.models import TaskLexicon

    if context.is_offline_mode():
        op.execute("-- 0011: no records rewritten here: on a database that holds tasks, migrate online instead")
        return
    with Session(bind=op.get_bind()) as session:
        for tid, blob in session.execute(select(TaskLexicon.task_id, TaskLexicon.terms)).all():
            record = LexicalRecord.from_bytes(blob)
            if record.sample_counts is not None:
                lexicon_repo.put_record(session, int(tid), LexicalRecord(record.counts, record.template))
        session.flush()
