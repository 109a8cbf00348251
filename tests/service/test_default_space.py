"""``matrix`` without task names draws the default space's ready tasks (CLI and library), as documented: a
store that also holds another space (another model's tasks, e.g. imported) must not mix them in.

Real parts: a uvicorn server over SQLite with the tiny GPT-2, the ``fisher-atlas`` entry point, ``Atlas(path)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from atlas import repository
from atlas.samples import Sample
from fisher_atlas import Atlas
from service.cli import main
from service.client import AtlasClient
from tests.atlas.fixtures import unit_vectors

TEXTS = {"fox": ["the quick brown fox jumps over the lazy dog", "a brown fox runs past the dog"],
         "sums": ["one plus one is two", "two times three is six"]}


def _other_space_task(store: Any) -> int:
    """A ready task in a space of another model (older than the default space's tasks: listed first)."""
    with store.session() as s:
        other = repository.get_or_create_space(
            s, model_fingerprint="another-model@1", spec_fingerprint="spec", model_name="another/model", d=8,
            K=16, m=256, seed=0, spec={"d": 8, "K": 16, "m": 256, "seed": 0})
        task, _ = repository.create_task_with_job(s, other.id, "elsewhere", "text", {}, [Sample(text="hi there")])
        repository.store_task_result(s, task, state=b"x", signature=unit_vectors(1, 256)[0], baselines=None,
                                     n_samples=1, n_tokens=2)
        return int(task.id)


def test_cli_matrix_without_names_keeps_to_the_default_space(serve: Any, tiny_lm: Any, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """It listed the ready tasks of every space and sent them to ``/v1/align/matrix``: 409
    ``incompatible_space``, exit 1."""
    svc = serve(lm=tiny_lm)
    elsewhere = _other_space_task(svc.container.store)
    with AtlasClient(svc.url) as cl:
        ids = [cl.add_task(name, samples=[{"text": t} for t in texts], wait=True).task.id
               for name, texts in TEXTS.items()]
    out = tmp_path / "matrix.json"
    assert main(["matrix", "--out", str(out), "--url", svc.url, "--json"]) == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["ids"] == ids
    assert elsewhere not in ids


def test_library_matrix_without_names_keeps_to_the_default_space(tmp_path: Path, tiny_model_dir: Path) -> None:
    with Atlas(tmp_path / "atlas", model=str(tiny_model_dir), sketch_dim=256, device="cpu") as atlas:
        _other_space_task(atlas._c.store)
        for name, texts in TEXTS.items():
            atlas.add(name, texts, progress=False)
        assert atlas.matrix().fisher.shape == (2, 2)


def test_an_api_without_a_model_defaults_to_the_space_of_its_sketch_settings(tmp_path: Path) -> None:
    """One model sketched in two specs (workers restarted with another ``FISHER_ATLAS_SKETCH_DIM``): an API
    without a model took the newest space whatever its own ``sketch_dim`` said."""
    import migrations
    from atlas.settings import Settings
    from atlas.store import Store

    settings = Settings(data_dir=tmp_path / "d", model="some/model", sketch_dim=256)
    migrations.upgrade(settings.resolved_database_url())
    store = Store(settings)
    try:
        with store.session() as s:
            ids = [repository.get_or_create_space(
                s, model_fingerprint="some-model@1", spec_fingerprint=f"spec-{m}", model_name="some/model", d=8,
                K=16, m=m, seed=0, spec={"d": 8, "K": 16, "m": m, "seed": 0}).id for m in (256, 512)]
        with store.read() as s:
            assert store.default_space(s).id == ids[0]  # its own m, though the m = 512 space is newer
        # the space list says which is the default as requests resolve it (a model-free replica, which has no
        # default_space_id of its own, listed "default": false for every space; a multi-replica review, 2026-12-07)
        assert store.default_space_id is None
        assert [(sp["id"], sp["default"]) for sp in store.list_spaces()] == [(ids[0], True), (ids[1], False)]
        other = Store(settings.model_copy(update={"sketch_dim": 1024}))
        try:
            with other.read() as s:
                assert other.default_space(s).id == ids[1]  # no space of its m: the newest, as before
        finally:
            other.close()
    finally:
        store.close()


def test_a_model_free_api_whose_model_has_no_space_says_which_it_answers_from(tmp_path: Path,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    """An API configured with a mistyped model answered from the only space's model without a word (an operator
    review, 2026-12-07): the fallback stays — a replica whose model name differs still serves — but it is logged."""
    import logging

    from atlas.settings import Settings
    from atlas.store import Store
    from migrations import upgrade

    settings = Settings(data_dir=tmp_path, model="nosuch-org/no-such-model", device="cpu")
    upgrade(settings.resolved_database_url())
    store = Store(settings)
    try:
        _other_space_task(store)
        with caplog.at_level(logging.WARNING, logger="atlas.store"):
            for _ in range(3):
                with store.read() as s:
                    assert store.default_space(s).model_name == "another/model"
        said = [r.getMessage() for r in caplog.records if r.name == "atlas.store"]
        assert len(said) == 1, said  # once, not per request
        assert "'nosuch-org/no-such-model'" in said[0] and "'another/model'" in said[0], said
    finally:
        store.close()
    # left at the default (an API replica serving its workers' model, as README's scale-out runs it): no warning
    caplog.clear()
    quiet = Store(Settings(data_dir=tmp_path, device="cpu"))
    try:
        with caplog.at_level(logging.WARNING, logger="atlas.store"), quiet.read() as s:
            assert quiet.default_space(s).model_name == "another/model"
        assert not [r for r in caplog.records if r.name == "atlas.store"]
    finally:
        quiet.close()
