"""Templates re-derived: a sample whose text has no term (``"a + b = c"``, ``"?"``) now counts, and empties its
task's template (atlas.template; before, such samples were skipped, so the task's own term-less prompts were
answered ``none``).

Only a template with terms can differ, and only one the fix can shrink: those tasks' records are re-derived from
the uploads of their succeeded jobs (term counts unchanged). A task whose uploads are not all stored (an
imported one) keeps its record. No schema change; the downgrade leaves the records (the previous code reads them).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import context, op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    from sqlalchemy.orm import Session

    from atlas import lexicon_repo

    if context.is_offline_mode():  # `alembic upgrade --sql`: no rows to read
        op.execute("-- 0005: no templates re-derived here: on a database that holds tasks, migrate online instead")
        return
    with Session(bind=op.get_bind()) as session:
        lexicon_repo.backfill(session, lexicon_repo.tasks_with_template_terms(session), complete_only=True)
        session.flush()


def downgrade() -> None:
    """Nothing to undo: the re-derived records have the format revision 0004's code reads."""
