"""Bootstrap admin keys stored before 2026-12-07 show no part of their secret: ``api_keys.prefix`` becomes ``boot:``
and the first 8 hex digits of the stored hash (:func:`atlas.apikeys.bootstrap_prefix`), unless the key has the format
of a generated one (``fa_`` and 43 URL-safe characters), whose first 10 characters every generated key shows.

Before, such a row was rewritten only at a start with ``FISHER_ATLAS_BOOTSTRAP_ADMIN_KEY`` still set, and an operator
who set it for the first start alone kept a passphrase's first 10 characters listed (an upgrade review, 2026-12-07).
The stored hash is the plaintext's sha256, the one the prefix is made from: no secret is needed here.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BOOTSTRAP_NAME = "bootstrap-admin"

_KEYS = sa.table("api_keys", sa.column("name", sa.String), sa.column("prefix", sa.String),
                 sa.column("key_hash", sa.String))
"""The columns this revision reads and writes, as they are at 0012 (not the live model: a later column would break
an upgrade through here)."""


def upgrade() -> None:
    """One statement (offline SQL scripts render it too); a generated key's prefix is ``fa_`` and 7 more characters
    (its first 10)."""
    op.execute(
        sa.update(_KEYS)
        .where(_KEYS.c.name == _BOOTSTRAP_NAME, sa.func.substr(_KEYS.c.prefix, 1, 5) != "boot:",
               sa.or_(sa.func.substr(_KEYS.c.prefix, 1, 3) != "fa_", sa.func.length(_KEYS.c.prefix) != 10))
        .values(prefix=sa.literal("boot:") + sa.func.substr(_KEYS.c.key_hash, 1, 8))
    )


def downgrade() -> None:
    """Nothing to undo: revision 0012's code lists whatever prefix is stored, and writes ``boot:`` ones itself."""
