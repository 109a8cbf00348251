"""``/v1/keys``: API key management over HTTP (admin scope); the CLI acts on the database directly."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from atlas.vocabulary import Scope
from service.deps import AdminPrincipal, ContainerDep, ReadPrincipal
from service.routes import MAX_ID, error_responses
from service.schemas_keys import CurrentKey, KeyCreated, KeyList
from service.uploads import BoundedJSONRoute
from service.views import key_out

router = APIRouter(prefix="/v1/keys", tags=["keys"], route_class=BoundedJSONRoute)


class KeyCreate(BaseModel):
    """A new key's label and scopes."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"name": "ci", "scopes": ["read"]}]})

    name: str = Field(min_length=1, max_length=200)
    scopes: list[Scope] = Field(min_length=1, max_length=3)


@router.get("", response_model=KeyList, summary="List API keys", responses=error_responses(401, 403))
def list_keys(c: ContainerDep, _: AdminPrincipal,
              include_revoked: Annotated[bool, Query(description="Also list revoked keys.")] = False) -> KeyList:
    """Active keys, and revoked ones with ``include_revoked`` (no secrets)."""
    return KeyList(items=[key_out(k) for k in c.keys.list(include_revoked=include_revoked)])


@router.get("/current", response_model=CurrentKey, summary="The calling key and its scopes",
            responses=error_responses(401))
def current_key(principal: ReadPrincipal) -> CurrentKey:
    """Who the caller is and what its key may do (any valid key: ``read`` is the least scope), so that a client
    can offer only the actions the key allows (the dashboard disables write controls for a read key)."""
    return CurrentKey(key_id=principal.key_id, name=principal.name, scopes=list(principal.scopes))  # type: ignore[arg-type]


@router.post("", status_code=201, response_model=KeyCreated, summary="Create an API key",
             responses=error_responses(401, 403, 409, 422))
async def create_key(body: KeyCreate, c: ContainerDep, _: AdminPrincipal) -> KeyCreated:
    """Create a key; its plaintext is returned once and stored only as a sha256 hash. While no admin key exists
    (the first key, which switches key checks on) only an admin key can be created (409)."""
    key, plaintext = await run_in_threadpool(c.keys.create, body.name, list(body.scopes), keep_an_admin=True)
    return KeyCreated(**key_out(key).model_dump(), key=plaintext)


@router.delete("/{key_id}", status_code=204, response_class=Response, summary="Revoke an API key",
               responses=error_responses(401, 403, 404, 409, 422))
def revoke_key(key_id: Annotated[int, Path(ge=1, le=MAX_ID)], c: ContainerDep, _: AdminPrincipal) -> Response:
    """Revoke a key (idempotent); the last active admin key cannot be revoked (409)."""
    c.keys.revoke(key_id)
    return Response(status_code=204)
