"""End to end over real HTTP with the bundled model, on SQLite and on PostgreSQL.

Three clearly different domains from ``shared/data`` (SMILES molecules, Shakespeare speeches, BoolQ
questions; 40 samples each, uploaded as a plain-text file, a JSONL file and a CSV file) are added
through the CLI and the Python client, then: held-out prompts are routed to the right task, sources
are recommended, pairs aligned, the atlas drawn, a task deleted, and the space exported and imported
into a fresh service, which gives identical answers.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from service.cli import main
from service.client import AtlasClient
from tests.shared_data import DATA, require_shared_data

MODEL = os.environ.get("FISHER_ATLAS_E2E_MODEL", "bundled")
N_TASK, N_HELDOUT = 40, 5
OFF_DOMAIN = ["import os\nfor f in os.listdir('.'):\n    print(f)", "SELECT name FROM users WHERE age > 30;",
              "1 2 3 4 5 6 7 8 9 10 11 12"]


def _bucket(key: str) -> int:
    """The bundled model's training split rule: rows with bucket < 4 were trained on; we use 4..9."""
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:8], 16) % 10


def _pick(rows: list[str]) -> tuple[list[str], list[str]]:
    rows = [r for r in rows if _bucket(r) >= 4]
    return rows[:N_TASK], rows[N_TASK : N_TASK + N_HELDOUT]


def _domains() -> dict[str, tuple[list[str], list[str]]]:
    require_shared_data()
    smiles, shakespeare, boolq = [], [], []
    with (DATA / "molecules_smiles" / "moleculenet_bbbp.jsonl").open() as f:
        for line, _ in zip(f, range(400), strict=False):
            s = json.loads(line)["smiles"]
            if 10 <= len(s) <= 80:
                smiles.append(s)
    with (DATA / "multidomain_text" / "multidomain_text.jsonl").open() as f:
        for line in f:
            rec = json.loads(line)
            if rec["domain"] == "literature_shakespeare" and 40 <= len(rec["text"]) <= 300:
                shakespeare.append(rec["text"])
            if len(shakespeare) >= 200:
                break
    with (DATA / "superglue" / "BoolQ_val.jsonl").open() as f:
        for line, _ in zip(f, range(400), strict=False):
            boolq.append(json.loads(line)["question"].strip() + "?")
    return {"smiles": _pick(smiles), "shakespeare": _pick(shakespeare), "boolq": _pick(boolq)}


@pytest.fixture(scope="module")
def model() -> Any:
    from workers.model_loading import load_causal_lm

    return load_causal_lm(MODEL, device="cpu")


@pytest.fixture(scope="module")
def domains() -> dict[str, tuple[list[str], list[str]]]:
    return _domains()


def _write_files(tmp: Path, domains: dict[str, tuple[list[str], list[str]]]) -> dict[str, Path]:
    files = {"smiles": tmp / "smiles.txt", "shakespeare": tmp / "shakespeare.jsonl", "boolq": tmp / "boolq.csv"}
    files["smiles"].write_text("\n".join(domains["smiles"][0]) + "\n")
    files["shakespeare"].write_text("".join(json.dumps({"text": t}) + "\n" for t in domains["shakespeare"][0]))
    with files["boolq"].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text"])
        for t in domains["boolq"][0]:
            w.writerow([t])
    return files


def _answers(c: AtlasClient, ids: dict[str, int], prompts: list[str]) -> dict[str, Any]:
    route = [[(m.name, round(m.score, 9), round(m.activation, 9)) for m in r.matches]
             for r in c.route(prompts, k=3).results]
    pair = c.align(ids["smiles"], ids["boolq"])
    src = [(s.name, round(s.fisher_shrunk, 9), s.activation_dark) for s in c.sources(ids["boolq"], k=2).sources]
    atlas = [(p.name, p.x, p.y, p.cluster) for p in c.atlas().points]
    return {"route": route, "align": (pair.fisher, pair.activation, pair.error, pair.rho, pair.fisher_shrunk),
            "sources": src, "atlas": atlas}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_end_to_end(backend: str, serve, model, domains, request: pytest.FixtureRequest, tmp_path: Path,
                    capsys: pytest.CaptureFixture[str]) -> None:
    db: dict[str, str] = {}
    if backend == "postgres":
        make_db = request.getfixturevalue("pg_database")
        db = {"database_url": make_db()}
    svc = serve(lm=model, sketch_dim=4096, **db)  # the product default m
    files = _write_files(tmp_path, domains)

    # add: one task through the CLI (progress bar until the job ends), two through the client
    assert main(["add", "smiles", str(files["smiles"]), "--wait", "--url", svc.url,
                 "--metadata", '{"source": "moleculenet_bbbp"}']) == 0
    assert "succeeded" in capsys.readouterr().err
    with AtlasClient(svc.url) as c:
        for name in ("shakespeare", "boolq"):
            created = c.add_task(name, files[name], metadata={"source": name}, wait=True)
            assert created.job.status == "succeeded", created.job.error
            assert created.task.status == "ready" and created.task.n_samples == N_TASK
        ids = {t.name: t.id for t in c.list_tasks().items}
        assert set(ids) == {"smiles", "shakespeare", "boolq"}

        # routing: held-out prompts go to their own task
        for name, (_, heldout) in domains.items():
            res = c.route(heldout, k=3)
            top = [r.matches[0].name for r in res.results]
            assert top == [name] * len(heldout), (name, top)
            # per-task calibrated thresholds reject ~5 % of in-task prompts by design (docs/SCORES.md)
            assert sum(r.none for r in res.results) <= 1, [(r.best_score, r.threshold) for r in res.results]

        # open set: prompts of no stored domain answer none at the default threshold
        off = c.route(OFF_DOMAIN, k=1)
        assert [r.none for r in off.results] == [True] * len(OFF_DOMAIN), [r.best_score for r in off.results]
        assert c.route(domains["boolq"][1][0], k=1, threshold=0.999).none is True

        # recommendation with the factors, alignment, matrix, atlas
        src = c.sources(ids["boolq"], k=2)
        assert {s.name for s in src.sources} == {"smiles", "shakespeare"} and src.compared == 2
        for s in src.sources:
            assert -1.5 <= s.fisher <= 1.5 and s.se is not None and isinstance(s.activation_dark, bool)
        pair = c.align(ids["shakespeare"], ids["boolq"])
        far = c.align(ids["smiles"], ids["boolq"])
        assert pair.fisher > far.fisher  # two English tasks are closer than English and SMILES
        mat = c.align_matrix(list(ids.values()))
        assert len(mat.fisher) == 3 and all(abs(mat.fisher[i][i] - 1) < 1e-9 for i in range(3))
        flagged = {(p.i, p.j): p.flags for p in mat.pair_flags}
        assert all(p.i < p.j and p.flags for p in mat.pair_flags)
        for i in range(3):  # a pair's flags are its own: the matrix lists what /v1/align says of each pair
            for j in range(i + 1, 3):
                assert flagged.get((i, j), []) == c.align(mat.ids[i], mat.ids[j]).flags
        atlas = c.atlas()
        assert {p.name for p in atlas.points} == set(ids)
        out = tmp_path / "atlas.png"
        assert main(["atlas", "--out", str(out), "--url", svc.url]) == 0 and out.stat().st_size > 1000

        # append (open set grows without retraining) and the answers stay right
        job = c.append(ids["shakespeare"], samples=[{"text": t} for t in domains["shakespeare"][1][:2]], wait=True)
        assert job.status == "succeeded"
        assert c.route(domains["shakespeare"][1][3], k=1).matches[0].name == "shakespeare"

        # export -> import into a fresh service on the same backend: identical answers
        probe = [domains[n][1][-1] for n in ("smiles", "shakespeare", "boolq")]
        before = _answers(c, ids, probe)
        blob = c.export_space()
    db2 = {"database_url": request.getfixturevalue("pg_database")()} if backend == "postgres" else {}
    other = serve(lm=model, sketch_dim=4096, **db2)
    with AtlasClient(other.url) as c2:
        assert c2.import_space(blob).imported == 3
        ids2 = {t.name: t.id for t in c2.list_tasks().items}
        assert _answers(c2, ids2, probe) == before
        assert c2.get_task(ids2["smiles"]).metadata == {"source": "moleculenet_bbbp"}

    # delete: gone from the store and from the index
    with AtlasClient(svc.url) as c:
        c.delete_task(ids["smiles"])
        assert {t.name for t in c.list_tasks().items} == {"shakespeare", "boolq"}
        res = c.route(domains["smiles"][1][0], k=3)
        assert all(m.name != "smiles" for m in res.matches)
        assert svc.container.index.stats(svc.container.store.default_space_id)["count"] == 2
