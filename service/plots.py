"""Figures of the answers people read with their eyes, drawn with matplotlib (the ``[plots]`` extra).

* :func:`save_atlas` — the 2-D map of a space (``GET /v1/atlas``): labelled points coloured by cluster.
* :func:`save_matrix` — the Fisher alignment heatmap of a set of tasks (``POST /v1/align/matrix``).
* :func:`save_factors` — a target's recommended sources with their three factors (``GET /v1/tasks/{id}/sources``).
* :func:`save_bars` — grouped bars for the benchmark figures of ``bench/RESULTS.md``.

The format comes from the file suffix (``.png``, ``.svg``, ``.pdf``); anything else raises
:class:`PlotError`. matplotlib is imported lazily (Agg backend) and :class:`PlotsUnavailable` says how to
install it when it is missing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PLOT_SUFFIXES = (".png", ".svg", ".pdf")
MAX_ANNOTATED = 15
"""Heatmaps of at most this many tasks print their values in the cells."""


class PlotError(ValueError):
    """An unknown output format."""


class PlotsUnavailable(ImportError):
    """matplotlib is not installed."""


def _check(path: str | Path) -> Path:
    out = Path(path)
    if out.suffix.lower() not in PLOT_SUFFIXES:
        raise PlotError(f"cannot draw {out.name!r}: use one of {', '.join(PLOT_SUFFIXES)}")
    return out


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise PlotsUnavailable("plots need matplotlib: pip install 'fisher-atlas[plots]'") from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"  # keep text as text in SVG (searchable task names)
    return plt


def _save(fig: Any, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format=out.suffix.lower().lstrip("."), dpi=150, bbox_inches="tight")
    _pyplot().close(fig)
    return out


def _get(obj: Any, key: str) -> Any:
    return obj[key] if isinstance(obj, Mapping) else getattr(obj, key)


def save_atlas(atlas: Any, path: str | Path, *, title: str) -> Path:
    """Draw the atlas map (an ``AtlasResponse`` or its JSON) with task names and a cluster legend."""
    out = _check(path)
    plt = _pyplot()
    points = list(_get(atlas, "points"))
    fig, ax = plt.subplots(figsize=(8, 6.5))
    cmap = plt.get_cmap("tab10")
    clusters = sorted({int(_get(p, "cluster")) for p in points})
    for c in clusters:
        members = [p for p in points if int(_get(p, "cluster")) == c]
        ax.scatter([_get(p, "x") for p in members], [_get(p, "y") for p in members], s=60, color=cmap(c % 10),
                   edgecolor="black", linewidth=0.5, label=f"cluster {c + 1} ({len(members)})", zorder=3)
    for p in points:
        ax.annotate(str(_get(p, "name")), (_get(p, "x"), _get(p, "y")), textcoords="offset points", xytext=(5, 4),
                    fontsize=8)
    ax.set_title(title)
    ax.set_xlabel("MDS 1 (1 − Fisher alignment)")
    ax.set_ylabel("MDS 2")
    ax.grid(alpha=0.3)
    if clusters:
        ax.legend(loc="best", fontsize=8, frameon=True)
    return _save(fig, out)


def save_matrix(matrix: Any, path: str | Path, *, title: str) -> Path:
    """Heatmap of the Fisher alignment matrix (an ``AlignMatrixResponse`` or its JSON)."""
    out = _check(path)
    plt = _pyplot()
    names = [str(n) for n in _get(matrix, "names")]
    values = [list(row) for row in _get(matrix, "fisher")]
    n = len(names)
    size = max(4.0, min(0.45 * n + 2.5, 20.0))
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    im = ax.imshow(values, cmap="viridis", vmin=min(0.0, min((min(r) for r in values), default=0.0)), vmax=1.0)
    ax.set_xticks(range(n), labels=names, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(n), labels=names, fontsize=8)
    if n <= MAX_ANNOTATED:
        for i in range(n):
            for j in range(n):
                v = values[i][j]
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if v < 0.6 else "black")
    fig.colorbar(im, ax=ax, label="Fisher alignment")
    ax.set_title(title)
    return _save(fig, out)


def save_factors(sources: Any, path: str | Path, *, title: str) -> Path:
    """Grouped bars of each recommended source's activation, error and coupling-adjusted Fisher factors
    (a ``SourcesResponse`` or its JSON)."""
    out = _check(path)
    rows = list(_get(sources, "sources"))
    labels = [str(_get(s, "name")) for s in rows]
    series = {"activation S(Mₐ)": [float(_get(s, "activation")) for s in rows],
              "error S(Γₑ)": [float(_get(s, "error")) for s in rows],
              "Fisher (shrunk)": [float(_get(s, "fisher_shrunk")) for s in rows]}
    return save_bars(labels, series, out, title=title, ylabel="score")


def save_bars(labels: Sequence[str], series: Mapping[str, Sequence[float]], path: str | Path, *, title: str,
              ylabel: str) -> Path:
    """Grouped bars: one group per label, one bar per series."""
    out = _check(path)
    plt = _pyplot()
    n, k = len(labels), max(len(series), 1)
    width = 0.8 / k
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * n + 2.0), 4.5))
    for i, (name, vals) in enumerate(series.items()):
        xs = [x + (i - (k - 1) / 2) * width for x in range(n)]
        ax.bar(xs, list(vals), width, label=name)
    ax.set_xticks(range(n), labels=list(labels), rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out)
