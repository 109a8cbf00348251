"""API keys: list, create, revoke (the HTTP routes' and the CLI's ``--local`` commands' one way to the key rows)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from atlas import apikeys
from atlas.models import ApiKey
from atlas.store import Store


class KeyService:
    """Key rows through one store; ``on_change`` runs after a key is created or revoked (the key gate's cache)."""

    def __init__(self, store: Store, on_change: Callable[[], None] | None = None) -> None:
        self.store = store
        self.on_change = on_change

    def list(self, *, include_revoked: bool = False) -> list[ApiKey]:
        """Active keys (and revoked ones with ``include_revoked``), oldest first, without secrets."""
        with self.store.read() as session:
            return apikeys.list_api_keys(session, include_revoked=include_revoked)

    def create(self, name: str, scopes: Sequence[str], *, keep_an_admin: bool = True) -> tuple[ApiKey, str]:
        """A new key and its plaintext (shown once, stored as a hash); ``keep_an_admin``: refuse a non-admin key
        while no admin key is active (:func:`atlas.apikeys.create_api_key`)."""
        with self.store.session() as session:
            key, plaintext = apikeys.create_api_key(session, name, list(scopes), keep_an_admin=keep_an_admin)
        self._changed()
        return key, plaintext

    def revoke(self, key_id: int) -> ApiKey:
        """Revoke a key (idempotent; the last active admin key cannot be: 409)."""
        with self.store.session() as session:
            key = apikeys.revoke_api_key(session, key_id)
        self._changed()
        return key

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()
