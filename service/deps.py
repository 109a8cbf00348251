"""FastAPI dependencies: the container, database sessions and scope checks, as ``Annotated`` aliases."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request

from service.auth import Principal, authorize
from service.container import Container


def get_container(request: Request) -> Container:
    """The app's :class:`Container` (started in the lifespan)."""
    return request.app.state.container


ContainerDep = Annotated[Container, Depends(get_container)]


class Authorize:
    """Dependency checking that the caller holds ``scope`` (anonymous admin when keys are off)."""

    def __init__(self, scope: str) -> None:
        self.scope = scope

    def __call__(self, request: Request, container: ContainerDep) -> Principal:
        return authorize(request, container, self.scope)


require_read = Depends(Authorize("read"))
require_write = Depends(Authorize("write"))
require_admin = Depends(Authorize("admin"))

ReadPrincipal = Annotated[Principal, require_read]
WritePrincipal = Annotated[Principal, require_write]
AdminPrincipal = Annotated[Principal, require_admin]


async def hold_upload_slot(container: ContainerDep) -> AsyncIterator[None]:
    """Hold one of the process's upload slots for the request (:class:`service.upload_slots.UploadSlots`):
    declared after the principal, so a refused caller never takes one."""
    async with container.upload_slots.hold():
        yield


UploadSlot = Annotated[None, Depends(hold_upload_slot)]
