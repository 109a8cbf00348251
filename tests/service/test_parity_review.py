"""The surfaces agree (a parity review of REST, CLI, client, library and dashboard, 2026-12-07; each case failed
before its fix):

* ``export x.jsonl.gz`` from the CLI was refused by the REST import and by library mode ("not a FisherAtlas space
  export header"), and library mode's ``export("x.jsonl.gz")`` wrote plain text under that name.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import httpx

from fisher_atlas import Atlas

TEXTS = ["The quick brown fox jumps over the lazy dog.", "A lazy dog sleeps while the fox runs.",
         "The brown fox and the dog are friends.", "The fox jumps over the fence by the road."]


def test_a_gzipped_export_moves_between_library_rest_and_back(tmp_path: Path, tiny_model_dir: Path, tiny_lm: Any,
                                                             serve: Any) -> None:
    packed = tmp_path / "space.jsonl.gz"
    with Atlas(tmp_path / "lib", model=str(tiny_model_dir), sketch_dim=128, device="cpu") as atlas:
        atlas.add("prose", TEXTS, progress=False)
        atlas.export(packed)
    assert packed.read_bytes()[:2] == b"\x1f\x8b"  # gzipped, as its name says
    lines = gzip.decompress(packed.read_bytes()).splitlines()
    assert len(lines) == 3  # header, the task, trailer
    served = serve(lm=tiny_lm, sketch_dim=128)
    with httpx.Client(base_url=served.url, timeout=60) as http:
        r = http.post("/v1/spaces/import", files={"file": ("space.jsonl.gz", packed.read_bytes())})
        assert r.status_code == 200 and r.json()["imported"] == 1, r.text
        bad = http.post("/v1/spaces/import?on_conflict=skip",
                        files={"file": ("cut.jsonl.gz", packed.read_bytes()[:-20])})
        assert bad.status_code == 422 and "gzipped but cannot be decompressed" in bad.json()["message"], bad.text
        again = http.get(f"/v1/spaces/{r.json()['space_id']}/export").content
    (tmp_path / "rest.jsonl.gz").write_bytes(gzip.compress(again))
    with Atlas(tmp_path / "lib2", model=str(tiny_model_dir), sketch_dim=128, device="cpu") as atlas:
        assert atlas.import_(tmp_path / "rest.jsonl.gz") == 1
        assert atlas.task("prose").status == "ready"


def test_a_gzipped_export_is_inflated_no_further_than_the_import_limit(serve: Any, tiny_lm: Any) -> None:
    served = serve(lm=tiny_lm, sketch_dim=128, max_import_bytes=1 << 20)
    bomb = gzip.compress(b"\n" * (8 << 20))  # 8 MiB of line breaks in a few KiB
    r = httpx.post(served.url + "/v1/spaces/import", files={"file": ("bomb.jsonl.gz", bomb)}, timeout=60)
    assert r.status_code == 413 and "gzipped export holds more than the import limit" in r.json()["message"], r.text


def test_keys_create_local_checks_and_answers_as_the_api(tmp_path: Path, capsys: Any) -> None:
    """``keys create --local`` kept the first 200 characters of a longer name (the API refuses it) and printed four of
    the API answer's fields: a script reading ``prefix`` broke on the bootstrap path."""
    import json

    from service.cli import main

    data = str(tmp_path / "data")
    assert main(["keys", "create", "--local", "--data-dir", data, "--name", "x" * 250, "--scopes", "admin"]) == 1
    assert "a key name must have 1 to 200 characters, not 250" in capsys.readouterr().err
    assert main(["keys", "create", "--local", "--data-dir", data, "--name", "root", "--scopes", "admin",
                 "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert set(created) == {"id", "name", "prefix", "scopes", "created_at", "last_used_at", "revoked", "key"}
    assert created["key"].startswith(created["prefix"]) and created["revoked"] is False


def test_jobs_wait_says_the_jobs_own_time_and_a_bad_idempotency_key_is_named(serve: Any, tiny_lm: Any,
                                                                            capsys: Any) -> None:
    import re

    from service.cli import main
    from service.client import AtlasClient, InvalidInput

    served = serve(lm=tiny_lm, sketch_dim=128)
    with AtlasClient(served.url) as client:
        job = client.add_task("prose", samples=TEXTS, wait=True).job
        try:
            client.add_task("other", samples=TEXTS, idempotency_key="a bé")
            raise AssertionError("sent")
        except InvalidInput as exc:
            assert "idempotency key must be printable ASCII" in exc.message
        ran = (job.finished_at - job.started_at).total_seconds()
    capsys.readouterr()
    assert main(["jobs", "wait", str(job.id), "--url", served.url]) == 0
    said = "".join(capsys.readouterr())  # (the CLI's progress lines are on stderr)
    took = float(re.search(r"succeeded in ([\d.]+) s", said)[1])  # type: ignore[index]
    assert abs(took - ran) < 0.06, (said, ran)


def test_the_cli_updates_metadata_lists_spaces_and_passes_candidates(serve: Any, tiny_lm: Any, capsys: Any) -> None:
    """Task metadata could be changed only over REST or the client; no command listed the spaces ``--space`` takes;
    ``route`` had no ``--candidates``."""
    import json

    from service.cli import main
    from service.client import AtlasClient

    served = serve(lm=tiny_lm, sketch_dim=128)
    with AtlasClient(served.url) as client:
        client.add_task("prose", samples=TEXTS, metadata={"owner": "me", "typo": 1}, wait=True)
    url = ["--url", served.url, "--json"]
    capsys.readouterr()
    assert main(["tasks", "update", "prose", "--metadata", '{"typo": null, "team": "nlp"}', *url]) == 0
    assert json.loads(capsys.readouterr().out)["metadata"] == {"owner": "me", "team": "nlp"}
    assert main(["tasks", "update", "prose", "--metadata", "", *url]) == 2  # no object given
    capsys.readouterr()
    assert main(["add", "other", "-", "--metadata", '{"a": "b\\u0000c"}', *url]) == 1  # named by its flag
    err = capsys.readouterr().err
    assert "--metadata: NUL characters are not allowed" in err and "form field" not in err, err
    capsys.readouterr()
    assert main(["spaces", "list", *url]) == 0
    (space,) = json.loads(capsys.readouterr().out)["items"]
    assert space["default"] and space["n_tasks"] == 1
    assert main(["spaces", "show", str(space["id"]), *url]) == 0
    assert json.loads(capsys.readouterr().out)["model_fingerprint"] == space["model_fingerprint"]
    assert main(["route", "a fox and a dog", "--candidates", "1", *url]) == 0
    assert len(json.loads(capsys.readouterr().out)["matches"]) == 1
    assert main(["route", "a fox and a dog", "--candidates", "0", *url]) == 2


def test_library_maps_and_compares_another_models_space(tmp_path: Path, tiny_model_dir: Path) -> None:
    """An imported space of another model could be aligned task by task in library mode, but not mapped
    (``atlas()`` took no space) nor given to ``matrix()``'s default (the loaded model's space only)."""
    import hashlib
    import json

    export = tmp_path / "space.jsonl"
    with Atlas(tmp_path / "a", model=str(tiny_model_dir), sketch_dim=128, device="cpu") as atlas:
        atlas.add("prose", TEXTS, progress=False)
        atlas.add("more prose", [t.upper() for t in TEXTS], progress=False)
        atlas.export(export)
    lines = export.read_bytes().splitlines(keepends=True)
    header = json.loads(lines[0])
    header["space"]["model_fingerprint"] = "another-model@1"
    body = [(json.dumps(header) + "\n").encode(), *lines[1:-1]]
    body.append((json.dumps({"trailer": True, "n_tasks": len(lines) - 2,
                             "sha256": hashlib.sha256(b"".join(body)).hexdigest()}) + "\n").encode())
    export.write_bytes(b"".join(body))
    with Atlas(tmp_path / "b", model=str(tiny_model_dir), sketch_dim=128, device="cpu") as atlas:
        atlas.add("here", TEXTS, progress=False)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # its prompts do not route here: said, and expected
            atlas.import_(export)
        other = atlas.task("prose").space_id
        mapped = atlas.atlas(space=other)
        assert mapped.extra["space_id"] == other and sorted(p.name for p in mapped.points) == ["more prose", "prose"]
        assert atlas.matrix(space=other).ids == [atlas.task("prose").id, atlas.task("more prose").id]
        assert [p.name for p in atlas.atlas().points] == ["here"]  # the default: the loaded model's space
