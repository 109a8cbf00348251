"""Lexical records re-derived under the Unicode term rules, and task names stored in NFC.

The term rules of ``atlas.lexical`` changed on 2026-11-25: text is NFC-normalised, words keep their combining
marks, and scripts written without spaces give character bigrams. ASCII text gives the same terms as before,
but a record of non-ASCII samples holds terms no prompt produces any more — a Chinese task's template held
whole clauses, so its template test answered every prompt of the task ``none``. Every task whose uploads are
all stored is re-derived from them (``atlas.lexicon_repo.backfill``, as 0005); an imported task keeps the record
it came with.

Task names are stored in NFC since the same change (a decomposed ``café`` and a composed one were two tasks that
looked the same). A stored name not in NFC is rewritten, unless its NFC form is already taken in the space (then
it stays, and lookups by either spelling still find one of them).

No schema change; the downgrade leaves both (the previous code reads them).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from alembic import context, op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    from sqlalchemy import select, update
    from sqlalchemy.orm import Session

    from atlas import lexicon_repo
    from atlas.models import Task

    if context.is_offline_mode():  # `alembic upgrade --sql`: no rows to read
        op.execute("-- 0007: no records re-derived here: on a database that holds tasks, migrate online instead")
        return
    with Session(bind=op.get_bind()) as session:
        rows = session.execute(select(Task.id, Task.space_id, Task.name)).all()
        taken = {(space, name) for _, space, name in rows}
        for tid, space, name in rows:
            nfc = unicodedata.normalize("NFC", name)
            if nfc != name and (space, nfc) not in taken:
                session.execute(update(Task).where(Task.id == tid).values(name=nfc))
                taken.add((space, nfc))
        lexicon_repo.backfill(session, [tid for tid, _, _ in rows], complete_only=True)
        session.flush()


def downgrade() -> None:
    """Nothing to undo: the records have the format revision 0006's code reads, and NFC names are names."""
