"""API-key authentication with scopes ``read`` ⊂ ``write`` ⊂ ``admin``.

Keys travel in the ``X-API-Key`` header (``Authorization: Bearer <key>`` is accepted too) and are
checked against their sha256 hashes in the store (:mod:`atlas.apikeys`). Keys are required when
``settings.require_keys`` is true or — by default — when the service is bound to a non-loopback
address; otherwise anonymous requests act with the ``admin`` scope. ``serve`` refuses to start on a
non-loopback address while no key exists (see :func:`check_bind_allowed`).
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass

from fastapi import Request
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from atlas import apikeys
from atlas.errors import Unauthorized
from atlas.models import ApiKey, utcnow
from atlas.settings import Settings

logger = logging.getLogger("fisher_atlas.service")

HEADER = "X-API-Key"


@dataclass(frozen=True)
class Principal:
    """Who is calling: a key (``key_id``) or anonymous (keys not required)."""

    key_id: int | None
    name: str
    scopes: tuple[str, ...]


ANONYMOUS = Principal(key_id=None, name="anonymous", scopes=("read", "write", "admin"))


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or ``localhost`` (``0.0.0.0`` and ``::`` are not)."""
    h = host.strip().strip("[]").lower()
    if h in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def keys_required(settings: Settings) -> bool:
    """``settings.require_keys`` when set, else true exactly when bound to a non-loopback address."""
    if settings.require_keys is not None:
        return bool(settings.require_keys)
    return not is_loopback(settings.host)


def count_active_keys(session: Session) -> int:
    """Number of keys that are not revoked."""
    return len(apikeys.list_api_keys(session))


CREATE_KEY_HINT = "create one with: fisher-atlas keys create --name admin --scopes admin"


def check_bind_allowed(settings: Settings, active_keys: int) -> None:
    """Refuse to serve on a non-loopback address without API keys.

    Raises
    ------
    RuntimeError
        Bound to a non-loopback host while keys are disabled or none exists.
    """
    if is_loopback(settings.host):
        if keys_required(settings) and active_keys == 0:
            logger.warning("API keys are required but none exists; %s", CREATE_KEY_HINT)
        return
    if settings.require_keys is False:
        raise RuntimeError(
            f"refusing to serve on non-loopback address {settings.host!r} with FISHER_ATLAS_REQUIRE_KEYS=false; "
            "bind to 127.0.0.1 or require API keys"
        )
    if active_keys == 0:
        raise RuntimeError(
            f"refusing to serve on non-loopback address {settings.host!r}: no API key exists; {CREATE_KEY_HINT} "
            "(same FISHER_ATLAS_DATABASE_URL / --data-dir), then start the service again"
        )


def presented_key(request: Request) -> str | None:
    """The key in ``X-API-Key`` or ``Authorization: Bearer``, if any."""
    key = request.headers.get(HEADER)
    if key:
        return key.strip()
    auth = request.headers.get("Authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


def authenticate(
    read_factory: sessionmaker[Session], write_factory: sessionmaker[Session], plaintext: str | None, scope: str
) -> Principal:
    """Check a presented key for ``scope``.

    The lookup runs in a read-only transaction; the occasional ``last_used_at`` touch is written in a
    separate short transaction whose failure is only logged (never fails the request).

    Raises
    ------
    Unauthorized
        Missing, unknown or revoked key.
    Forbidden
        The key lacks ``scope``.
    """
    if not plaintext:
        raise Unauthorized(f"an API key is required: send it in the {HEADER} header")
    with read_factory() as session:
        key = apikeys.verify_api_key(session, plaintext, scope)
        touched = key in session.dirty
        principal = Principal(key_id=key.id, name=key.name, scopes=tuple(key.scopes))
        session.rollback()
    if touched:
        try:
            with write_factory.begin() as session:
                session.execute(update(ApiKey).where(ApiKey.id == principal.key_id).values(last_used_at=utcnow()))
        except Exception:
            logger.warning("could not record API key use", exc_info=True)
    return principal
