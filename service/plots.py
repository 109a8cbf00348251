"""Figures of API answers drawn with matplotlib: the atlas map, the alignment heatmap, the factor bars.

Every function takes one answer — the JSON body of an API response (a ``dict``), the Python client's answer, or
library mode's (:func:`as_body`) — writes one figure to ``path`` and returns the path. The format follows the
suffix (:data:`PLOT_SUFFIXES`); any other suffix raises
:class:`PlotError` before anything is drawn. matplotlib is an optional extra (``fisher-atlas[plots]``)
imported lazily with the Agg backend; when it is missing, :class:`PlotsUnavailable` says how to
install it. The CLI (``atlas --out``, ``matrix --out``, ``recommend --plot``) and the benchmark
figures (``bench/figures``) use the same functions.

Example
-------
>>> from service.plots import save_atlas
>>> save_atlas(client.atlas(), "atlas.svg", title="Atlas of space 1 (fisher-atlas-mini)")  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

PLOT_SUFFIXES = (".png", ".svg", ".pdf")
"""File suffixes a figure can be written as (the format follows the suffix)."""

INSTALL_HINT = "pip install 'fisher-atlas[plots]'"
ANNOTATE_MAX = 15
"""Heatmaps of at most this many tasks show their values in the cells."""

# Okabe–Ito (colour-blind safe) first, then further distinct hues (the dashboard uses the same).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#7A5CC4",
           "#8C8C3C", "#1B9E9E", "#B24A6B", "#5A7D2B", "#C28A2C")
FACTOR_COLOURS = {"activation": "#0072B2", "error": "#E69F00", "fisher": "#009E73", "fisher_shrunk": "#7A5CC4"}
FLAG_NOTES = {"rho_bounded": "ρ at bound", "cosine_clipped": "clipped to 1", "split_half_unavailable": "no SE",
              "identical": "identical", "single_draw": "one draw", "clamped": "clamped"}
"""How a source's estimator flags (docs/SCORES.md) are named under its bars; other flags by their own name."""


class PlotError(ValueError):
    """A figure cannot be drawn as asked (unknown suffix, empty or malformed body)."""


class PlotsUnavailable(ImportError):
    """matplotlib is not installed; the message carries the install command."""


def _pyplot() -> Any:
    """Import matplotlib lazily on the non-interactive Agg backend and return ``pyplot``."""
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - exercised in a venv without the extra
        raise PlotsUnavailable(f"drawing figures needs matplotlib: {INSTALL_HINT}") from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


_Draw = TypeVar("_Draw", bound=Callable[..., Path])


def _literal_text(draw: _Draw) -> _Draw:
    """Run ``draw`` with matplotlib's mathtext off, so task names and titles are drawn as written.

    With it on, a label holding an even number of ``$`` was read as math: ``cost $x$`` was drawn as an
    italic formula, and ``a$^$b`` made the figure raise the mathtext parser's ``ValueError``.
    """

    @functools.wraps(draw)
    def wrapper(*args: Any, **kwargs: Any) -> Path:
        try:
            import matplotlib
        except ImportError:  # draw raises PlotsUnavailable (or PlotError for a wrong suffix) itself
            return draw(*args, **kwargs)
        with matplotlib.rc_context({"text.parse_math": False}):
            return draw(*args, **kwargs)

    return cast(_Draw, wrapper)


def check_suffix(path: str | Path, also: Sequence[str] = ()) -> Path:
    """Return ``path`` as a :class:`~pathlib.Path` if its suffix is one of :data:`PLOT_SUFFIXES`.

    Parameters
    ----------
    path : str or Path
        Where the figure goes.
    also : sequence of str
        Suffixes the caller writes itself besides the figures (the CLI's ``.json``), accepted and listed too.

    Raises
    ------
    PlotError
        The suffix is not ``.png``, ``.svg`` or ``.pdf`` (the message lists the allowed ones).
    """
    p = Path(path)
    allowed = (*PLOT_SUFFIXES, *also)
    if p.suffix.lower() not in allowed:
        shown = p.suffix or "(none)"
        raise PlotError(f"unknown figure format {shown!r} for {p.name!r}: use one of {', '.join(allowed)}")
    return p


def _save(fig: Any, path: Path) -> Path:
    plt = _pyplot()
    path.parent.mkdir(parents=True, exist_ok=True)
    # svg.fonttype none keeps labels as <text> so the SVG stays searchable and small
    with plt.rc_context({"svg.fonttype": "none", "pdf.fonttype": 42}), warnings.catch_warnings():
        # a task name in a script the default font lacks still draws (as boxes in PNG, as text in SVG)
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)
        fig.savefig(path, format=path.suffix.lower().lstrip("."), dpi=150, bbox_inches="tight")
    plt.close(fig)
    return path


LABEL_STEP = 10
"""Points (1/72 in) between the stacked labels of points drawn at nearly one place."""
LABEL_NEAR = 0.03
"""Points closer than this share of the map's larger side are "at nearly one place": their labels are stacked."""


def label_lifts(xs: Sequence[float], ys: Sequence[float], near: float = LABEL_NEAR) -> list[int]:
    """How many label steps each point's label is raised, so that points at nearly one place (tasks of identical or
    near-identical signatures) do not print their names over each other: in ``(x, y)`` order, each point takes the
    lowest lift that no earlier point within ``near`` times the map's larger side of it holds (a point alone: 0).

    Parameters
    ----------
    xs, ys : sequence of float, length n
        The points' map coordinates.
    near : float

    Returns
    -------
    list of int, length n
    """
    import numpy as np

    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    if x.size == 0:
        return []
    span = max(float(np.ptp(x)), float(np.ptp(y)), 1e-12)
    lifts = [0] * x.size
    placed: list[int] = []
    for i in np.lexsort((y, x)):
        taken = {lifts[j] for j in placed if math.hypot(x[i] - x[j], y[i] - y[j]) < near * span}
        lifts[i] = next(k for k in range(len(taken) + 1) if k not in taken)
        placed.append(int(i))
    return lifts


def as_body(answer: Any) -> Mapping[str, Any]:
    """An answer as the JSON body the figures read: a ``dict`` as it is; the client's answer (a pydantic model) as its
    JSON; a library answer (``fisher_atlas.Atlas``'s :class:`~atlas.analysis.AtlasMap`,
    :class:`~atlas.analysis.Matrices`, or ``recommend``'s list of :class:`~atlas.analysis.Source`) as the REST body it
    stands for."""
    if isinstance(answer, Mapping):
        return answer
    dump = getattr(answer, "model_dump", None)
    if callable(dump):
        return cast(Mapping[str, Any], dump(mode="json"))
    if dataclasses.is_dataclass(answer) and not isinstance(answer, type):
        body = {f.name: getattr(answer, f.name) for f in dataclasses.fields(answer)}
        if "points" in body:  # AtlasMap: its points as dicts; the space, total and sampled the library put in extra
            body["points"] = [dataclasses.asdict(pt) for pt in body["points"]]
            extra = body.get("extra") or {}
            body.update(space_id=extra.get("space_id", "?"), total=extra.get("total", len(body["points"])),
                        sampled=bool(extra.get("sampled", False)))
        return body
    if isinstance(answer, Sequence) and all(dataclasses.is_dataclass(s) and hasattr(s, "factors") for s in answer):
        return {"sources": [{"task_id": s.task_id, "name": s.name, **dataclasses.asdict(s.factors)} for s in answer]}
    raise PlotError(f"cannot draw a {type(answer).__name__}: give an API answer (dict), the client's answer or the "
                    "library's (atlas(), matrix(), recommend())")


@_literal_text
def save_atlas(atlas_body: Mapping[str, Any] | Any, path: str | Path, *, title: str) -> Path:
    """Draw the 2-D atlas of a space (body of ``GET /v1/atlas``): labelled points coloured by cluster.

    Parameters
    ----------
    atlas_body : dict
        ``{"space_id", "method", "total", "sampled", "n_clusters", "points": [{"task_id", "name", "x",
        "y", "cluster"}, ...]}``.
    path : str or Path
        Output file; ``.png``, ``.svg`` or ``.pdf``.
    title : str
        Figure title (name the space and the model here).

    Returns
    -------
    Path
        The written file.
    """
    p = check_suffix(path)
    atlas_body = as_body(atlas_body)
    points = list(atlas_body.get("points") or [])
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 6.5))
    clusters = sorted({int(pt.get("cluster", 0)) for pt in points})
    for i, c in enumerate(clusters):
        members = [pt for pt in points if int(pt.get("cluster", 0)) == c]
        ax.scatter([pt["x"] for pt in members], [pt["y"] for pt in members], s=70,
                   color=PALETTE[i % len(PALETTE)], edgecolor="white", linewidth=0.8, zorder=3,
                   label=f"cluster {c} ({len(members)})" if c >= 0 else f"no cluster ({len(members)})")
    for pt, lift in zip(points, label_lifts([float(pt["x"]) for pt in points], [float(pt["y"]) for pt in points]),
                        strict=True):
        ax.annotate(str(pt["name"]), (pt["x"], pt["y"]), xytext=(5, 4 + LABEL_STEP * lift), textcoords="offset points",
                    fontsize=8, color="#1f2933", zorder=4)
    if not points:
        ax.text(0.5, 0.5, "no ready tasks in this space", ha="center", va="center", transform=ax.transAxes,
                color="#6b7280")
    sub = f"space {atlas_body.get('space_id', '?')} · {len(points)} of {atlas_body.get('total', len(points))} tasks"
    if atlas_body.get("sampled"):
        sub += " (sampled)"
    method = atlas_body.get("method")
    ax.set_title(f"{title}\n{sub}", fontsize=11)
    ax.set_xlabel(f"{method or 'MDS'} axis 1")
    ax.set_ylabel(f"{method or 'MDS'} axis 2")
    ax.grid(True, color="#e5e7eb", linewidth=0.6, zorder=0)
    ax.set_axisbelow(True)
    if clusters:  # beside the map, so it never hides a point
        ax.legend(title="cluster", fontsize=8, title_fontsize=9, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                  frameon=False)
    ax.set_aspect("equal", adjustable="datalim")  # distances on the map are honest
    ax.margins(0.12)
    return _save(fig, p)


@_literal_text
def save_matrix(matrix_body: Mapping[str, Any] | Any, path: str | Path, *, title: str, kind: str = "fisher") -> Path:
    """Draw the Fisher alignment heatmap of a set of tasks (body of ``POST /v1/align/matrix``).

    Parameters
    ----------
    matrix_body : dict
        ``{"ids", "names", "fisher", "fisher_shrunk", "activation", "error", "rho"}``, square matrices with
        row/column ``i`` = ``names[i]``.
    path : str or Path
        Output file; ``.png``, ``.svg`` or ``.pdf``.
    title : str
        Figure title.
    kind : str, optional
        Which matrix to draw (default ``"fisher"``).

    Returns
    -------
    Path
        The written file. Values are written in the cells when at most :data:`ANNOTATE_MAX` tasks.
    """
    p = check_suffix(path)
    import numpy as np

    matrix_body = as_body(matrix_body)
    names = [str(n) for n in matrix_body.get("names") or []]
    values = matrix_body.get(kind)
    if values is None:
        raise PlotError(f"the matrix body has no {kind!r} matrix")
    mat = np.asarray(values, dtype=float)
    if mat.ndim != 2 or mat.shape != (len(names), len(names)):
        raise PlotError(f"the {kind!r} matrix is {mat.shape}, expected {len(names)}×{len(names)}")
    plt = _pyplot()
    n = len(names)
    side = min(16.0, 3.0 + 0.45 * n)
    fig, ax = plt.subplots(figsize=(side + 1.2, side))
    lo = min(0.0, float(np.nanmin(mat))) if n else 0.0
    im = ax.imshow(mat, cmap="Blues", vmin=lo, vmax=1.0, interpolation="nearest")
    ax.set_xticks(range(n), names, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(n), names, fontsize=8)
    if n <= ANNOTATE_MAX:
        for i in range(n):
            for j in range(n):
                v = mat[i, j]
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if v > lo + 0.6 * (1.0 - lo) else "#1f2933")
    bar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    bar.set_label("Fisher alignment Â_F" if kind == "fisher" else kind)
    ax.set_title(title, fontsize=11)
    return _save(fig, p)


def save_factors(sources_body: Mapping[str, Any] | Any, path: str | Path, *, title: str) -> Path:
    """Draw the three factors per source (body of ``GET /v1/tasks/{id}/sources``) as grouped bars.

    Parameters
    ----------
    sources_body : dict
        ``{"target": {"task_id", "name"}, "sources": [{"name", "activation", "error", "fisher", "fisher_shrunk",
        "rho", "flags", ...}],
        "compared"}``.
    path : str or Path
        Output file; ``.png``, ``.svg`` or ``.pdf``.
    title : str
        Figure title.

    Returns
    -------
    Path
        The written file: per source, bars for activation S_cov(M_a), error S_cov(Γ_e), the Fisher
        alignment (their coupling) and its shrunk value (what orders the sources), with ρ and the estimator's flags
        under the source's name.
    """
    p = check_suffix(path)
    sources_body = as_body(sources_body)
    sources = list(sources_body.get("sources") or [])
    factors = [("activation", "activation S_cov(M_a)"), ("error", "error S_cov(Γ_e)"), ("fisher", "Fisher Â_F"),
               ("fisher_shrunk", "Fisher, shrunk (ranks the sources)")]
    groups = []
    for s in sources:  # name; ρ; the estimator's caveats (a source of a few samples looked as sure as the rest)
        lines = [str(s["name"])] + ([f"ρ = {float(s['rho']):.2f}"] if s.get("rho") is not None else [])
        flags = [FLAG_NOTES.get(str(f), str(f)) for f in s.get("flags") or []]
        groups.append("\n".join(lines + ([", ".join(flags)] if flags else [])))
    series = {label: [float(s.get(key, 0.0)) for s in sources] for key, label in factors}
    colours = [FACTOR_COLOURS[key] for key, _ in factors]
    target = (sources_body.get("target") or {}).get("name")
    sub = f"sources for {target!r}" if target else "sources"
    return save_grouped_bars(groups, series, p, title=f"{title}\n{sub}", ylabel="similarity", colours=colours)


@_literal_text
def save_grouped_bars(groups: Sequence[str], series: Mapping[str, Sequence[float]], path: str | Path, *,
                      title: str, ylabel: str, colours: Sequence[str] | None = None,
                      ylim: tuple[float, float] | None = None, value_labels: bool = True,
                      value_fmt: str = "{:.2f}") -> Path:
    """Grouped bar chart: one group per entry of ``groups``, one bar per series.

    Parameters
    ----------
    groups : sequence of str
        Group labels along x.
    series : mapping of str to sequence of float
        Series name → one value per group (``nan`` leaves a gap).
    path : str or Path
        Output file; ``.png``, ``.svg`` or ``.pdf``.
    title, ylabel : str
        Figure title and y-axis label.
    colours : sequence of str, optional
        One colour per series (default: the palette).
    ylim : tuple of float, optional
        y-axis limits.
    value_labels : bool, optional
        Write each bar's value above it (default True).
    value_fmt : str, optional
        Format of those values (default ``"{:.2f}"``).

    Returns
    -------
    Path
        The written file.
    """
    p = check_suffix(path)
    import numpy as np

    plt = _pyplot()
    names = list(series)
    k = max(1, len(names))
    x = np.arange(len(groups))
    width = 0.8 / k
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(groups) * k * 0.45 + 3), 4.8))
    for i, name in enumerate(names):
        vals = np.asarray(series[name], dtype=float)
        colour = (colours[i] if colours and i < len(colours) else PALETTE[i % len(PALETTE)])
        bars = ax.bar(x + (i - (k - 1) / 2) * width, vals, width, label=name, color=colour, zorder=3)
        if value_labels and len(groups) * k <= 40:
            shown = [value_fmt.format(v) if np.isfinite(v) else "" for v in vals]
            ax.bar_label(bars, labels=shown, fontsize=7, padding=2)
    ax.set_xticks(x, list(groups), rotation=30 if len(groups) > 4 else 0, ha="right" if len(groups) > 4 else "center")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.axhline(0, color="#9ca3af", linewidth=0.8)
    ax.grid(True, axis="y", color="#e5e7eb", linewidth=0.6, zorder=0)
    ax.legend(fontsize=8, frameon=False)
    return _save(fig, p)


@_literal_text
def save_lines(x: Sequence[float], series: Mapping[str, Sequence[float]], path: str | Path, *, title: str,
               xlabel: str, ylabel: str, logx: bool = False, logy: bool = False) -> Path:
    """Line chart with markers: one line per series over the same ``x`` (used by the bench figures).

    Parameters
    ----------
    x : sequence of float
        x values.
    series : mapping of str to sequence of float
        Series name → one y per x (``nan`` leaves a gap).
    path : str or Path
        Output file; ``.png``, ``.svg`` or ``.pdf``.
    title, xlabel, ylabel : str
        Labels.
    logx, logy : bool, optional
        Logarithmic axes.

    Returns
    -------
    Path
        The written file.
    """
    p = check_suffix(path)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for i, (name, ys) in enumerate(series.items()):
        ax.plot(list(x), list(ys), marker="o", color=PALETTE[i % len(PALETTE)], label=name, zorder=3)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    ax.grid(True, which="both", color="#e5e7eb", linewidth=0.6, zorder=0)
    ax.legend(fontsize=8, frameon=False)
    return _save(fig, p)
