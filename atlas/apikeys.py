"""API keys: created once in plaintext, stored as sha256, with scopes ``read`` < ``write`` < ``admin``."""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import secrets
from collections.abc import Sequence

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from atlas.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthorized
from atlas.models import SCOPES, ApiKey, utcnow
from atlas.samples import is_storable_text, refuse_control_chars

KEY_PREFIX = "fa_"
_RANK: dict[str, int] = {str(scope): i for i, scope in enumerate(SCOPES)}
_TOUCH_EVERY = dt.timedelta(minutes=5)


def hash_key(plaintext: str) -> str:
    """sha256 hex digest of a key (keys are 256-bit random, so a fast hash is the right tool)."""
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


def has_scope(granted: Sequence[str], required: str) -> bool:
    """Whether scopes ``granted`` allow ``required`` (``admin`` implies ``write`` implies ``read``)."""
    if required not in _RANK:
        raise ValueError(f"unknown scope {required!r}")
    return any(_RANK.get(s, -1) >= _RANK[required] for s in granted)  # type: ignore[call-overload,index]


def create_api_key(session: Session, name: str, scopes: Sequence[str], *,
                   keep_an_admin: bool = False) -> tuple[ApiKey, str]:
    """Create a key; return the row and the plaintext (shown once, never stored).

    Parameters
    ----------
    name
        A label for humans.
    scopes
        Subset of ``("read", "write", "admin")``.
    keep_an_admin
        Refuse a key without ``admin`` while no active admin key exists (over HTTP: the first key switches key
        checks on, and a first ``read`` key left no caller able to write or manage keys).

    Raises
    ------
    InvalidInput
        Bad scopes or name.
    Conflict
        ``keep_an_admin``, the key lacks ``admin`` and no active admin key exists.
    """
    bad = [s for s in scopes if s not in SCOPES]
    if not scopes or bad:
        raise InvalidInput(f"scopes must be a non-empty subset of {', '.join(SCOPES)}", {"invalid": bad})
    if not 1 <= len(name) <= 200:  # as the API's body (it kept the first 200 of a longer local one, silently)
        raise InvalidInput(f"a key name must have 1 to 200 characters, not {len(name)}", {"name": name[:200]})
    if not is_storable_text(name):
        raise InvalidInput("a key name cannot hold NUL characters or lone surrogates")
    refuse_control_chars(name, "a key name")  # as a task name (it rewrote the terminal of `keys list`)
    if keep_an_admin and "admin" not in scopes:
        # locked as revoke_api_key locks them: two concurrent first keys cannot both see "an admin exists"
        active = session.execute(select(ApiKey).where(ApiKey.revoked_at.is_(None)).with_for_update()).scalars().all()
        if not any("admin" in k.scopes for k in active):
            raise Conflict("no admin key exists yet: the first key must have the admin scope (a first key switches "
                           "key checks on for every request, and without an admin key no caller could manage keys)",
                           {"scopes": list(scopes)})
    plaintext = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(name=name, prefix=plaintext[:10], key_hash=hash_key(plaintext),
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
    """Revoke a key (idempotent).

    Raises
    ------
    NotFound
        No such key.
    Conflict
        The key is the last active ``admin`` key: revoking it would lock every administrator out.
    """
    key = session.get(ApiKey, key_id)
    if key is None:
        raise NotFound(f"API key {key_id} does not exist", {"key_id": key_id})
    if key.revoked_at is None:
        if "admin" in key.scopes:
            # Lock the active keys (PostgreSQL; SQLite holds the write lock already) so that two
            # concurrent revocations cannot both see "another admin is left".
            active = session.execute(
                select(ApiKey).where(ApiKey.revoked_at.is_(None)).with_for_update()
            ).scalars().all()
            if not any(k.id != key.id and "admin" in k.scopes for k in active):
                raise Conflict(
                    "this is the last active admin key: create another admin key before revoking it",
                    {"key_id": key_id},
                )
        key.revoked_at = utcnow()
    session.flush()
    return key


def is_active(session: Session, key_id: int) -> bool:
    """Whether key ``key_id`` exists and is not revoked (a long-lived request re-checks its key with this)."""
    return session.execute(select(ApiKey.id).where(ApiKey.id == int(key_id), ApiKey.revoked_at.is_(None))
                           ).scalar_one_or_none() is not None


def count_active_keys(session: Session) -> int:
    """How many keys are not revoked (one ``COUNT``)."""
    return int(session.execute(select(func.count(ApiKey.id)).where(ApiKey.revoked_at.is_(None))).scalar_one())


def record_key_use(session: Session, last_used: dict[int, dt.datetime]) -> None:
    """Write the last-used times of keys (batched off the request path; never moves a time back)."""
    for key_id, when in last_used.items():
        session.execute(
            update(ApiKey)
            .where(ApiKey.id == key_id, (ApiKey.last_used_at.is_(None)) | (ApiKey.last_used_at < when))
            .values(last_used_at=when)
        )


BOOTSTRAP_NAME = "bootstrap-admin"
_SHA256 = re.compile(r"^sha256:([0-9a-fA-F]{64})$")
_GENERATED = re.compile(r"^fa_[A-Za-z0-9_-]{43}$")
"""A key as :func:`create_api_key` makes it (``fa_`` + ``secrets.token_urlsafe(32)``)."""
MIN_BOOTSTRAP_CHARS = 24


def bootstrap_key_hash(value: str) -> str:
    """The sha256 of a bootstrap admin key given as plaintext or as ``sha256:<64 hex digits>``.

    Raises
    ------
    InvalidInput
        A plaintext shorter than 24 characters (too easy to guess for an admin key).
    """
    value = value.strip()
    m = _SHA256.match(value)
    if m:
        return m.group(1).lower()
    if len(value) < MIN_BOOTSTRAP_CHARS:
        raise InvalidInput(
            f"the bootstrap admin key must be at least {MIN_BOOTSTRAP_CHARS} characters (or sha256:<hex> of one); "
            "generate one with: python -c \"import secrets; print('fa_' + secrets.token_urlsafe(32))\""
        )
    return hash_key(value)


def bootstrap_prefix(value: str) -> str:
    """The ``prefix`` stored (and listed) for a bootstrap admin key: nothing of its secret.

    A key in the format :func:`create_api_key` makes (``fa_`` + 43 URL-safe characters, as the README's command
    generates) keeps the first 10 characters, like every generated key (7 of its 43 random characters). Any other
    key — a passphrase, or ``sha256:<hex>`` of a key — is shown as ``boot:`` + the first 8 hex digits of its
    sha256 (the stored hash's own start): its plaintext may be short, and its first characters part of a secret.
    """
    shown = value.strip()
    if _GENERATED.match(shown):
        return shown[:10]
    return "boot:" + bootstrap_key_hash(shown)[:8]


def ensure_bootstrap_key(session: Session, value: str) -> ApiKey | None:
    """Create the admin key given by ``FISHER_ATLAS_BOOTSTRAP_ADMIN_KEY`` unless its hash is stored.

    Idempotent and safe to run from several replicas at once; a bootstrap key that was revoked stays
    revoked. An existing row whose ``prefix`` is not :func:`bootstrap_prefix`'s (a row written before: the
    first 10 characters of the plaintext) gets it. Returns the new row, or ``None`` when the key already existed.
    """
    digest = bootstrap_key_hash(value)
    prefix = bootstrap_prefix(value)
    existing = session.execute(select(ApiKey).where(ApiKey.key_hash == digest)).scalar_one_or_none()
    if existing is not None:
        if existing.prefix != prefix:
            existing.prefix = prefix
            session.flush()
        return None
    key = ApiKey(name=BOOTSTRAP_NAME, prefix=prefix, key_hash=digest, scopes=["admin"])
    try:
        with session.begin_nested():
            session.add(key)
            session.flush()
    except IntegrityError:  # another replica created it first
        return None
    return key
