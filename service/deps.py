"""FastAPI dependencies: the engine, database sessions and scope checks, as ``Annotated`` aliases."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from service.auth import ANONYMOUS, Principal, authenticate, presented_key
from service.engine import AtlasEngine


def get_engine(request: Request) -> AtlasEngine:
    """The app's :class:`AtlasEngine` (started in the lifespan)."""
    return request.app.state.engine


EngineDep = Annotated[AtlasEngine, Depends(get_engine)]


def get_read_session(engine: EngineDep) -> Iterator[Session]:
    """A read-only session (a snapshot on SQLite) for the request."""
    with engine.read() as session:
        yield session


ReadSessionDep = Annotated[Session, Depends(get_read_session)]


class Authorize:
    """Dependency checking that the caller holds ``scope`` (anonymous admin when keys are off)."""

    def __init__(self, scope: str) -> None:
        self.scope = scope

    def __call__(self, request: Request, engine: EngineDep) -> Principal:
        if not engine.keys_required:
            return ANONYMOUS
        principal = authenticate(engine.read, engine.write, presented_key(request), self.scope)
        request.state.principal = principal
        return principal


require_read = Depends(Authorize("read"))
require_write = Depends(Authorize("write"))
require_admin = Depends(Authorize("admin"))

ReadPrincipal = Annotated[Principal, require_read]
WritePrincipal = Annotated[Principal, require_write]
AdminPrincipal = Annotated[Principal, require_admin]
