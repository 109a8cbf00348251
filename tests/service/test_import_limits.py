"""A space import has its own body limit (``max_import_bytes``), not the sample-upload limit.

Before it, an export of a few hundred tasks could not be imported over REST or the CLI: every body shared the
64 MiB upload limit while an export line holds a whole task (~309 KB at m = 4096). Here the upload limit is set
far below a two-task export so the same shape shows at test size.
"""

from __future__ import annotations

from typing import Any

import httpx

from service.body_limit import ENVELOPE_BYTES
from service.client import AtlasClient
from tests.service.conftest import wait_job

PROSE = ["The quick brown fox jumps over the lazy dog near the barn.",
         "A small red hen walks along the old road by the river."]
SMILES = ["CC(=O)OC1=CC=CC=C1C(=O)O", "C1=CC=C(C=C1)C=O"]
M = 4096
"""The product's signature length: an export line is ~309 KB, two tasks past the upload limit below."""
UPLOAD_LIMIT = 64 * 1024


def _export_of_two_tasks(serve: Any, tiny_lm: Any) -> bytes:
    src = serve(lm=tiny_lm, sketch_dim=M)
    with httpx.Client(base_url=src.url, timeout=60) as http:
        for name, texts in (("prose", PROSE), ("chem", SMILES)):
            r = http.post("/v1/tasks", json={"name": name, "samples": [{"text": t} for t in texts]})
            assert r.status_code == 202, r.text
            assert wait_job(http, r.json()["job"]["id"])["status"] == "succeeded"
        blob = http.get("/v1/spaces/default/export").content
    assert blob.count(b"\n") == 4  # header, two tasks, trailer
    assert len(blob) > UPLOAD_LIMIT + ENVELOPE_BYTES  # over the upload limit with its multipart allowance
    return blob


def test_an_export_larger_than_the_upload_limit_imports(serve: Any, tiny_lm: Any) -> None:
    blob = _export_of_two_tasks(serve, tiny_lm)
    dst = serve(lm=tiny_lm, sketch_dim=M, max_upload_bytes=UPLOAD_LIMIT)
    with httpx.Client(base_url=dst.url, timeout=60) as http:
        r = http.post("/v1/spaces/import", files={"file": ("space.jsonl", blob)})
        assert r.status_code == 200, r.text
        assert r.json()["imported"] == 2
        # the upload limit still holds for samples
        big = [{"text": "word " * 200} for _ in range(400)]  # 400 KB: past the limit and its multipart envelope
        r = http.post("/v1/tasks", json={"name": "big", "samples": big})
        assert r.status_code == 413 and r.json()["detail"]["max_upload_bytes"] > 0, r.text
    with AtlasClient(dst.url) as client:  # the client and CLI path: the same endpoint
        again = client.import_space(blob, on_conflict="skip")
        assert again.imported == 0 and sorted(again.skipped) == ["chem", "prose"]


def test_the_client_streams_an_import_from_a_path(serve: Any, tiny_lm: Any, tmp_path: Any) -> None:
    """A path is sent from disk (an export may be 1 GiB), through the sync and the async client alike."""
    import asyncio

    from service.client import AsyncAtlasClient

    path = tmp_path / "space.jsonl"
    path.write_bytes(_export_of_two_tasks(serve, tiny_lm))
    dst = serve(lm=tiny_lm, sketch_dim=M)
    with AtlasClient(dst.url) as client:
        assert client.import_space(path).imported == 2
        assert sorted(t.name for t in client.list_tasks().items) == ["chem", "prose"]

    async def again() -> Any:
        async with AsyncAtlasClient(dst.url) as client:
            return await client.import_space(str(path), on_conflict="skip")

    assert sorted(asyncio.run(again()).skipped) == ["chem", "prose"]


def test_an_export_over_the_import_limit_is_a_413_naming_its_setting(serve: Any, tiny_lm: Any) -> None:
    blob = _export_of_two_tasks(serve, tiny_lm)
    dst = serve(lm=tiny_lm, sketch_dim=M, max_import_bytes=len(blob) - 1)
    with httpx.Client(base_url=dst.url, timeout=60) as http:
        r = http.post("/v1/spaces/import", files={"file": ("space.jsonl", blob)})
        assert r.status_code == 413, r.text
        body = r.json()
        assert body["code"] == "payload_too_large" and "max_import_bytes" in body["message"]
        assert body["detail"]["max_import_bytes"] == len(blob) - 1
        assert http.get("/v1/tasks").json()["total"] == 0  # nothing stored
        # a body past the import limit and its envelope is refused before it is read (declared length)
        huge = b"x" * (len(blob) + 512 * 1024)
        r = http.post("/v1/spaces/import", files={"file": ("space.jsonl", huge)})
        assert r.status_code == 413 and "max_import_bytes" in r.json()["detail"], r.text
