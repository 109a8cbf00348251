"""``model_key_aliases``: a model's earlier keys and its current one (``atlas.models.ModelKeyAlias``).

On 2026-12-07 a model's key came to hash its ``config.json`` instead of the installed transformers' view of it; a
process loading the model re-keys a space stored under the earlier key, and now writes the pair here, so that an API
replica without the model (a scaled-out deployment) imports an export written under the earlier key into the model's
space (a diff review: it made a second space no worker served).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "model_key_aliases",
        sa.Column("previous_key", sa.String(length=200), nullable=False),
        sa.Column("model_fingerprint", sa.String(length=200), nullable=False),
        sa.PrimaryKeyConstraint("previous_key", name=op.f("pk_model_key_aliases")),
    )


def downgrade() -> None:
    """The table dropped (revision 0013's code maps earlier keys only in a process that loads the model)."""
    op.drop_table("model_key_aliases")
