"""``job_requests``: what a job's ``Idempotency-Key`` is bound to (``atlas.idempotency.request_digest``).

The digest covers the whole request — kind, space, task name, mode, metadata and the samples' content address for a
create; kind, task and samples for an append — so a key reused with other metadata is a 409, not an answer with
the first request's task. A table of its own, one row per keyed job (deleted with it): jobs stored before it have
none, and their replays are checked as before (kind, task fields and samples, without metadata), since the
request's metadata was never stored and the task's may have been patched.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_requests",
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("request_sha256", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_requests_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_requests")),
    )


def downgrade() -> None:
    """The table dropped (revision 0009's code checks a replay without the request's metadata)."""
    op.drop_table("job_requests")
