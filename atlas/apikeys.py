"""API keys: created once in plaintext, stored as sha256, with scopes ``read`` < ``write`` < ``admin``."""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from atlas.errors import Forbidden, InvalidInput, NotFound, Unauthorized
from atlas.models import SCOPES, ApiKey, utcnow

KEY_PREFIX = "fa_"
_RANK = {scope: i for i, scope in enumerate(SCOPES)}
_TOUCH_EVERY = dt.timedelta(minutes=5)


def hash_key(plaintext: str) -> str:
    """sha256 hex digest of a key (keys are 256-bit random, so a fast hash is the right tool)."""
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


def has_scope(granted: Sequence[str], required: str) -> bool:
    """Whether scopes ``granted`` allow ``required`` (``admin`` implies ``write`` implies ``read``)."""
    if required not in _RANK:
        raise ValueError(f"unknown scope {required!r}")
    return any(_RANK.get(s, -1) >= _RANK[required] for s in granted)


def create_api_key(session: Session, name: str, scopes: Sequence[str]) -> tuple[ApiKey, str]:
    """Create a key; return the row and the plaintext (shown once, never stored).

    Parameters
    ----------
    name
        A label for humans.
    scopes
        Subset of ``("read", "write", "admin")``.
    """
    bad = [s for s in scopes if s not in SCOPES]
    if not scopes or bad:
        raise InvalidInput(f"scopes must be a non-empty subset of {SCOPES}", {"invalid": bad})
    plaintext = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(name=name[:200], prefix=plaintext[:10], key_hash=hash_key(plaintext),
                 scopes=sorted(set(scopes), key=_RANK.__getitem__))
    session.add(key)
    session.flush()
    return key, plaintext


def verify_api_key(
    session: Session, plaintext: str | None, required: str = "read", *, touch: bool = True
) -> ApiKey:
    """Return the key row for ``plaintext`` if it is valid and allows ``required``.

    With ``touch``, ``last_used_at`` is refreshed (at most every 5 minutes; a write, so call it in a
    writable session).

    Raises
    ------
    Unauthorized
        Missing, unknown or revoked key.
    Forbidden
        Valid key without the required scope.
    """
    if not plaintext:
        raise Unauthorized("an API key is required")
    key = session.execute(select(ApiKey).where(ApiKey.key_hash == hash_key(plaintext))).scalar_one_or_none()
    if key is None or key.revoked_at is not None:
        raise Unauthorized("invalid or revoked API key")
    if not has_scope(key.scopes, required):
        raise Forbidden(f"this API key lacks the {required!r} scope", {"scopes": key.scopes})
    now = utcnow()
    if touch and (key.last_used_at is None or now - key.last_used_at > _TOUCH_EVERY):
        key.last_used_at = now
    return key


def list_api_keys(session: Session, *, include_revoked: bool = False) -> list[ApiKey]:
    """All keys (without secrets), oldest first."""
    stmt = select(ApiKey).order_by(ApiKey.id)
    if not include_revoked:
        stmt = stmt.where(ApiKey.revoked_at.is_(None))
    return list(session.execute(stmt).scalars())


def revoke_api_key(session: Session, key_id: int) -> ApiKey:
    """Revoke a key (idempotent)."""
    key = session.get(ApiKey, key_id)
    if key is None:
        raise NotFound(f"API key {key_id} does not exist", {"key_id": key_id})
    if key.revoked_at is None:
        key.revoked_at = utcnow()
    session.flush()
    return key
