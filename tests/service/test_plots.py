"""matplotlib figures (service.plots) of real API answers from a running service with three tasks."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service import plots

pytest.importorskip("matplotlib")
from PIL import Image  # PIL comes with matplotlib

TASKS = {
    "prose-fox": ["The quick brown fox jumps over the lazy dog.", "A lazy dog sleeps while the fox runs away.",
                  "The brown fox and the dog are friends in the garden.", "The fox jumps over the fence."],
    "python-code": ["def add(a, b):\n    return a + b\n", "def sub(a, b):\n    return a - b\n",
                    "for i in range(3):\n    print(i)\n", "class A:\n    x = 1\n"],
    "sums-math": ["12 + 7 = 19", "40 + 2 = 42", "3 + 99 = 102", "18 + 18 = 36", "5 + 6 = 11"],
}




@pytest.fixture(scope="module")
def bodies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The atlas, matrix and sources bodies of a live service holding three ready tasks."""
    from atlas.settings import Settings
    from service.app import create_app
    from tests.service.conftest import LiveServer
    from tests.service.conftest import wait_job as _wait
    from tests.tiny_models import save_tiny_gpt2

    tmp = tmp_path_factory.mktemp("plots")
    settings = Settings(data_dir=tmp / "data", model=str(save_tiny_gpt2(tmp / "model")), device="cpu",
                        sketch_dim=256)
    server = LiveServer(create_app(settings)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            ids = []
            for name, texts in TASKS.items():
                r = http.post("/v1/tasks", json={"name": name, "samples": [{"text": t} for t in texts]})
                assert r.status_code == 202, r.text
                assert _wait(http, r.json()["job"]["id"])["status"] == "succeeded"
                ids.append(r.json()["task"]["id"])
            atlas = http.get("/v1/atlas").json()
            matrix = http.post("/v1/align/matrix", json={"task_ids": ids}).json()
            sources = http.get(f"/v1/tasks/{ids[0]}/sources").json()
        assert len(atlas["points"]) == 3 and len(matrix["names"]) == 3 and sources["sources"]
        return {"atlas": atlas, "matrix": matrix, "sources": sources}
    finally:
        server.stop()


def _drawn_pixels(path: Path) -> tuple[tuple[int, int], int, int]:
    img = np.asarray(Image.open(path).convert("RGB")).astype(int)
    non_white = int((img.sum(axis=2) < 740).sum())
    colours = len({tuple(p) for p in img.reshape(-1, 3)[:: max(1, img.shape[0] * img.shape[1] // 20000)]})
    return (img.shape[1], img.shape[0]), non_white, colours


def _svg_texts(path: Path) -> str:
    text = path.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    return " ".join(re.findall(r"<text[^>]*>([^<]*)</text>", text))


@pytest.mark.parametrize("kind", ["atlas", "matrix", "factors"])
def test_png_svg_pdf_of_real_answers(bodies: dict[str, Any], kind: str, tmp_path: Path) -> None:
    draw = {"atlas": (plots.save_atlas, bodies["atlas"]), "matrix": (plots.save_matrix, bodies["matrix"]),
            "factors": (plots.save_factors, bodies["sources"])}[kind]
    fn, body = draw
    png = fn(body, tmp_path / f"{kind}.png", title=f"{kind} of space {bodies['atlas']['space_id']}")
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    (w, h), non_white, colours = _drawn_pixels(png)
    assert w >= 400 and h >= 300
    assert non_white > 0.01 * w * h  # real marks, not a blank canvas
    assert colours >= 8  # coloured marks, antialiased text

    svg = fn(body, str(tmp_path / f"{kind}.svg"), title=f"{kind} figure")
    texts = _svg_texts(svg)
    if kind == "factors":
        names = [s["name"] for s in bodies["sources"]["sources"]] + [bodies["sources"]["target"]["name"]]
    else:
        names = list(TASKS)
    for name in names:
        assert name in texts, (name, texts[:500])
    assert f"{kind} figure" in texts

    pdf = fn(body, tmp_path / f"{kind}.pdf", title=kind)
    assert pdf.read_bytes().startswith(b"%PDF-")


def test_matrix_values_annotated_for_small_sets(bodies: dict[str, Any], tmp_path: Path) -> None:
    texts = _svg_texts(plots.save_matrix(bodies["matrix"], tmp_path / "m.svg", title="m"))
    for row in bodies["matrix"]["fisher"]:
        for v in row:
            assert f"{v:.2f}" in texts
    # the diagonal is the self-alignment
    assert texts.count(f"{bodies['matrix']['fisher'][0][0]:.2f}") >= 1


def test_atlas_legend_lists_the_clusters(bodies: dict[str, Any], tmp_path: Path) -> None:
    texts = _svg_texts(plots.save_atlas(bodies["atlas"], tmp_path / "a.svg", title="Atlas"))
    for c in {p["cluster"] for p in bodies["atlas"]["points"]}:
        assert f"cluster {c}" in texts


@pytest.mark.parametrize("name", ["atlas.gif", "atlas.jpg", "atlas", "atlas.png.txt"])
def test_unknown_suffix_refused_before_drawing(bodies: dict[str, Any], tmp_path: Path, name: str) -> None:
    for fn, body in ((plots.save_atlas, bodies["atlas"]), (plots.save_matrix, bodies["matrix"]),
                     (plots.save_factors, bodies["sources"])):
        with pytest.raises(plots.PlotError) as info:
            fn(body, tmp_path / name, title="x")
        assert all(s in str(info.value) for s in plots.PLOT_SUFFIXES)
        assert isinstance(info.value, ValueError)
    assert not any(tmp_path.iterdir())


def test_malformed_matrix_refused(bodies: dict[str, Any], tmp_path: Path) -> None:
    bad = dict(bodies["matrix"], fisher=[[1.0, 0.5]])
    with pytest.raises(plots.PlotError):
        plots.save_matrix(bad, tmp_path / "m.png", title="m")


def test_missing_matplotlib_gives_the_install_hint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    with pytest.raises(plots.PlotsUnavailable) as info:
        plots.save_atlas({"points": []}, tmp_path / "a.png", title="a")
    assert "pip install 'fisher-atlas[plots]'" in str(info.value)
    assert isinstance(info.value, ImportError)


def test_bench_figures_drawn_from_the_results_tables(tmp_path: Path) -> None:
    from bench.figures import draw

    rows = next(t for t in draw.read_tables((draw.RESULTS / "quality.md").read_text()) if t and "Router" in t[0])
    assert rows and all(0 <= draw._number(r["Top-1"]) <= 100 for r in rows)
    for name, fn in draw.FIGURE_FUNCS.items():
        png = fn(tmp_path / name)
        (w, h), non_white, colours = _drawn_pixels(png)
        assert w >= 600 and h >= 400 and non_white > 0.01 * w * h and colours >= 8, name
        texts = _svg_texts(fn(tmp_path / (Path(name).stem + ".svg")))
        assert ("MiniLM" in texts) if name.startswith("routing") else ("flat p50" in texts)
    # the results pages link the committed figures, and RESULTS.md links them relative to bench/
    results = (draw.BENCH / "RESULTS.md").read_text()
    for name in draw.FIGURE_FUNCS:
        assert (draw.FIGURES / name).is_file() and f"](figures/{name})" in results


@settings(max_examples=60, deadline=None)
@given(stem=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"), min_size=1, max_size=20),
       suffix=st.text(st.characters(whitelist_categories=("Ll", "Lu", "Nd")), min_size=0, max_size=5))
def test_only_png_svg_pdf_suffixes_pass(stem: str, suffix: str) -> None:
    path = Path(f"{stem}.{suffix}" if suffix else stem)
    if path.suffix.lower() in plots.PLOT_SUFFIXES:
        assert plots.check_suffix(path) == path
    else:
        with pytest.raises(plots.PlotError, match=r"\.png, \.svg, \.pdf"):
            plots.check_suffix(path)


@settings(max_examples=8, deadline=None)
@given(names=st.lists(st.text(st.characters(whitelist_categories=("L", "N"), max_codepoint=0x2FFF),
                              min_size=1, max_size=12), min_size=1, max_size=4, unique=True))
def test_any_task_names_drawn_into_the_svg(names: list[str], tmp_path_factory: pytest.TempPathFactory) -> None:
    body = {"space_id": 1, "method": "mds", "total": len(names), "sampled": False, "n_clusters": 1,
            "points": [{"task_id": i + 1, "name": n, "x": float(i), "y": float(i % 2), "cluster": i % 2}
                       for i, n in enumerate(names)]}
    texts = _svg_texts(plots.save_atlas(body, tmp_path_factory.mktemp("h") / "a.svg", title="t"))
    for n in names:
        assert n in texts


DOLLAR_NAMES = ["cost $x$ and $y$", "a$^$b", "$\\frac$ budget"]
"""Task names with dollar signs: matplotlib read an even number of them as mathtext (the first was drawn as
math, the others raised ``ValueError`` from the mathtext parser)."""


@pytest.mark.parametrize("kind", ["atlas", "matrix", "factors"])
def test_names_with_dollar_signs_drawn_as_written(bodies: dict[str, Any], kind: str, tmp_path: Path) -> None:
    if kind == "atlas":
        points = bodies["atlas"]["points"]
        body = dict(bodies["atlas"], points=[dict(p, name=n) for p, n in zip(points, DOLLAR_NAMES, strict=False)])
        fn, title, shown = plots.save_atlas, "Atlas of $pace", DOLLAR_NAMES[: len(points)]
    elif kind == "matrix":
        shown = DOLLAR_NAMES[: len(bodies["matrix"]["names"])]
        body = dict(bodies["matrix"], names=shown)
        fn, title = plots.save_matrix, "Fisher alignment of $3$ tasks"
    else:
        found = bodies["sources"]["sources"]
        body = dict(bodies["sources"], target={**bodies["sources"]["target"], "name": "t$rg$t"},
                    sources=[dict(s, name=n) for s, n in zip(found, DOLLAR_NAMES, strict=False)])
        fn, title, shown = plots.save_factors, "Sources for $t$", [*DOLLAR_NAMES[: len(found)], "t$rg$t"]
    assert fn(body, tmp_path / f"{kind}.png", title=title).read_bytes().startswith(b"\x89PNG")
    texts = _svg_texts(fn(body, tmp_path / f"{kind}.svg", title=title)).replace("&amp;", "&")
    for name in [*shown, title]:
        assert name in texts, (name, texts[:400])


@settings(max_examples=60, deadline=None)
@given(pts=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=0, max_size=30))
def test_labels_of_points_at_nearly_one_place_never_share_a_height(pts: list[tuple[int, int]]) -> None:
    """Tasks of identical signatures sit at one place of the atlas: their names were printed over each other."""
    xs, ys = [x / 6.0 for x, _ in pts], [y / 6.0 for _, y in pts]
    lifts = plots.label_lifts(xs, ys, near=0.1)
    assert len(lifts) == len(pts) and all(v >= 0 for v in lifts)
    span = max(max(xs, default=0) - min(xs, default=0), max(ys, default=0) - min(ys, default=0), 1e-12)
    for i in range(len(pts)):
        near = [j for j in range(len(pts)) if j != i and math.hypot(xs[i] - xs[j], ys[i] - ys[j]) < 0.1 * span]
        assert all(lifts[j] != lifts[i] for j in near), (i, near, lifts)
        assert lifts[i] <= len(near)  # raised no higher than its crowd needs


def test_names_of_one_place_are_stacked_in_the_svg(tmp_path: Path) -> None:
    body = {"space_id": 1, "method": "mds", "total": 4, "sampled": False, "n_clusters": 1,
            "points": [{"task_id": 1, "name": "bbbp", "x": 0.5, "y": 0.5, "cluster": 0},
                       {"task_id": 2, "name": "bbbpcopy", "x": 0.5, "y": 0.5, "cluster": 0},
                       {"task_id": 3, "name": "bbbp2", "x": 0.501, "y": 0.5, "cluster": 0},
                       {"task_id": 4, "name": "esol", "x": 1.0, "y": 0.0, "cluster": 0}]}
    svg = plots.save_atlas(body, tmp_path / "a.svg", title="t").read_text()
    heights = {name: float(y) for y, name in re.findall(r'<text[^>]*\by="([-\d.]+)"[^>]*>(bbbp\w*|esol)</text>', svg)}
    assert set(heights) == {"bbbp", "bbbpcopy", "bbbp2", "esol"}, heights
    assert len({heights[n] for n in ("bbbp", "bbbpcopy", "bbbp2")}) == 3  # three names, three lines


def test_factor_bars_show_what_orders_the_sources_and_their_caveats(bodies: dict[str, Any], tmp_path: Path) -> None:
    """The bars left out fisher_shrunk, the value that orders the sources, and the estimator's flags: a source of a
    few samples (split_half_unavailable) or a near-copy (cosine_clipped) looked as sure as the rest."""
    body = json.loads(json.dumps(bodies["sources"]))
    body["sources"][0]["flags"] = ["cosine_clipped", "split_half_unavailable", "a_new_flag"]
    texts = _svg_texts(plots.save_factors(body, tmp_path / "f.svg", title="f"))
    assert "Fisher, shrunk (ranks the sources)" in texts
    assert "clipped to 1, no SE, a_new_flag" in texts
    assert f"ρ = {float(body['sources'][0]['rho']):.2f}" in texts
