"""``/v1/spaces``: list spaces, export a space, import an export."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from atlas.errors import InvalidInput, PayloadTooLarge
from service.deps import ContainerDep, ReadPrincipal, UploadSlot, WritePrincipal
from service.routes import error_responses
from service.schemas import ImportResult, SpaceList, SpaceOut
from service.uploads import IMPORT_FORM_SCHEMA, BoundedJSONRoute, _content_type

router = APIRouter(prefix="/v1/spaces", tags=["spaces"], route_class=BoundedJSONRoute)

SpaceRef = Annotated[str, Path(min_length=1, max_length=300, description="Space id, model name or `default`; a model "
                                                                        "name may hold slashes (`org/model`).")]
# ``{space:path}``: a model name is a hub id or a directory (``org/model``, ``/models/x``); the export route is
# declared first, so ``…/org/model/export`` exports ``org/model``.


@router.get("", response_model=SpaceList, summary="List spaces", responses=error_responses(401, 403))
def list_spaces(c: ContainerDep, _: ReadPrincipal) -> SpaceList:
    """Every (model fingerprint, sketch spec) space with its task count; ``default`` marks the loaded
    model's space."""
    return SpaceList(items=[SpaceOut(**s) for s in c.spaces.all()])


@router.get(
    "/{space:path}/export", summary="Export a space", response_class=StreamingResponse,
    responses={
        200: {"content": {"application/x-ndjson": {"schema": {"type": "string"}}},
              "description": "JSON lines: a header (format, space spec and fingerprints), then one line per "
                             "ready task with name, mode, metadata, counts and base64 state, signature and "
                             "baselines."},
        **error_responses(401, 403, 404, 409, 422, 503),
    },
)
def export_space(space: SpaceRef, c: ContainerDep, _: ReadPrincipal) -> StreamingResponse:
    """Everything needed to restore the space's answers elsewhere (``POST /v1/spaces/import``)."""
    sp, lines = c.spaces.export_lines(space)
    return StreamingResponse(
        lines, media_type="application/x-ndjson",
        headers={"Content-Disposition": f'attachment; filename="fisher-atlas-space-{sp.id}.jsonl"'},
    )


@router.get("/{space:path}", response_model=SpaceOut, summary="Get a space",
            responses=error_responses(401, 403, 404, 409, 422, 503))
def get_space(space: SpaceRef, c: ContainerDep, _: ReadPrincipal) -> SpaceOut:
    """One space by id, model name or ``default``."""
    return SpaceOut(**c.spaces.get(space))


@router.post(
    "/import", response_model=ImportResult, summary="Import an exported space",
    openapi_extra={"requestBody": {"required": True,
                                   "content": {"multipart/form-data": {"schema": IMPORT_FORM_SCHEMA}}}},
    responses=error_responses(401, 403, 409, 413, 415, 422, 503),
)
async def import_space(
    request: Request,
    c: ContainerDep,
    _: WritePrincipal,
    _slot: UploadSlot,
    on_conflict: Annotated[Literal["fail", "skip"], Query(description="Existing task names: fail or skip.")] = "fail",
) -> ImportResult:
    """Restore the tasks of an export (new ids; same states, signatures, metadata), all or nothing,
    into the space with the export's model and spec fingerprints (created if needed); the index is
    updated before the answer, so queries give the same answers as on the exporting service. The body may be
    up to ``max_import_bytes`` (default 1 GiB), not the sample-upload limit: an export line is a whole task."""
    from starlette.datastructures import UploadFile

    from service.uploads import UnsupportedMediaType

    if _content_type(request) != "multipart/form-data":
        raise UnsupportedMediaType("send the export as multipart/form-data with a 'file' part")
    try:
        form = await request.form(max_files=1, max_fields=8)
    except (ValueError, KeyError, AssertionError) as exc:
        raise InvalidInput(f"malformed multipart body: {exc}") from None
    try:
        file = form.get("file")
        if not isinstance(file, UploadFile):
            raise InvalidInput("the multipart body needs a 'file' part")
        limit = c.settings.max_import_bytes
        if file.size is not None and file.size > limit:
            raise PayloadTooLarge(f"the export exceeds the import limit of {limit} bytes (setting max_import_bytes)",
                                  {"max_import_bytes": limit})
        # read where it was spooled (a memory map of the temporary file), not copied into memory
        space_id, imported, skipped = await run_in_threadpool(c.spaces.import_file, file.file,
                                                              on_conflict=on_conflict, max_bytes=limit)
    finally:
        await form.close()
    note = await run_in_threadpool(c.unserved_reason, space_id)
    return ImportResult(space_id=space_id, imported=imported, skipped=skipped, served=note is None, note=note)
