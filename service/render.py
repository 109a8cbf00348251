"""Draw the atlas map as PNG (numpy + zlib, no plotting library) or SVG.

``fisher-atlas atlas --out atlas.png`` needs no matplotlib: points are rasterised as discs coloured
by cluster with their task names in a built-in 3×5 pixel font (upper-cased; unknown characters become
``?``). An ``.svg`` output keeps the exact names as text.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from html import escape

import numpy as np

from service.schemas import AtlasPoint

PALETTE = [
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
]

# 3x5 glyphs, rows top to bottom, '#' = ink.
_FONT_ROWS = {
    "A": ".#.|#.#|###|#.#|#.#", "B": "##.|#.#|##.|#.#|##.", "C": ".##|#..|#..|#..|.##", "D": "##.|#.#|#.#|#.#|##.",
    "E": "###|#..|##.|#..|###", "F": "###|#..|##.|#..|#..", "G": ".##|#..|#.#|#.#|.##", "H": "#.#|#.#|###|#.#|#.#",
    "I": "###|.#.|.#.|.#.|###", "J": "..#|..#|..#|#.#|.#.", "K": "#.#|#.#|##.|#.#|#.#", "L": "#..|#..|#..|#..|###",
    "M": "#.#|###|###|#.#|#.#", "N": "##.|#.#|#.#|#.#|#.#", "O": ".#.|#.#|#.#|#.#|.#.", "P": "##.|#.#|##.|#..|#..",
    "Q": ".#.|#.#|#.#|##.|.##", "R": "##.|#.#|##.|#.#|#.#", "S": ".##|#..|.#.|..#|##.", "T": "###|.#.|.#.|.#.|.#.",
    "U": "#.#|#.#|#.#|#.#|###", "V": "#.#|#.#|#.#|#.#|.#.", "W": "#.#|#.#|###|###|#.#", "X": "#.#|#.#|.#.|#.#|#.#",
    "Y": "#.#|#.#|.#.|.#.|.#.", "Z": "###|..#|.#.|#..|###", "0": "###|#.#|#.#|#.#|###", "1": ".#.|##.|.#.|.#.|###",
    "2": "##.|..#|.#.|#..|###", "3": "##.|..#|.#.|..#|##.", "4": "#.#|#.#|###|..#|..#", "5": "###|#..|##.|..#|##.",
    "6": ".##|#..|###|#.#|###", "7": "###|..#|.#.|.#.|.#.", "8": "###|#.#|###|#.#|###", "9": "###|#.#|###|..#|##.",
    "-": "...|...|###|...|...", "_": "...|...|...|...|###", ".": "...|...|...|...|.#.", ":": "...|.#.|...|.#.|...",
    "/": "..#|..#|.#.|#..|#..", "(": ".#.|#..|#..|#..|.#.", ")": ".#.|..#|..#|..#|.#.", " ": "...|...|...|...|...",
    "?": "##.|..#|.#.|...|.#.", ",": "...|...|...|.#.|#..", "+": "...|.#.|###|.#.|...",
    "=": "...|###|...|###|...", "'": ".#.|.#.|...|...|...",
}
_FONT = {ch: np.array([[c == "#" for c in row] for row in rows.split("|")]) for ch, rows in _FONT_ROWS.items()}


def _png(rgb: np.ndarray) -> bytes:
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].astype(np.uint8).tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def _project(points: Sequence[AtlasPoint], size: int, margin: int) -> list[tuple[int, int]]:
    xs = np.array([p.x for p in points], dtype=float)
    ys = np.array([p.y for p in points], dtype=float)
    span = max(float(np.ptp(xs)) if len(xs) else 0.0, float(np.ptp(ys)) if len(ys) else 0.0, 1e-9)
    cx = (xs.max() + xs.min()) / 2 if len(xs) else 0.0
    cy = (ys.max() + ys.min()) / 2 if len(ys) else 0.0
    scale = (size - 2 * margin) / span
    return [(round(size / 2 + (x - cx) * scale), round(size / 2 - (y - cy) * scale))
            for x, y in zip(xs.tolist(), ys.tolist(), strict=True)]


def _text(img: np.ndarray, x: int, y: int, text: str, color: tuple[int, int, int], scale: int = 2) -> None:
    h, w, _ = img.shape
    for i, ch in enumerate(text.upper()):
        glyph = _FONT.get(ch, _FONT["?"])
        big = np.kron(glyph, np.ones((scale, scale), dtype=bool))
        gx = x + i * 4 * scale
        ys, xs = np.nonzero(big)
        ys, xs = ys + y, xs + gx
        ok = (ys >= 0) & (ys < h) & (xs >= 0) & (xs < w)
        img[ys[ok], xs[ok]] = color


def render_png(points: Sequence[AtlasPoint], *, size: int = 800, title: str | None = None) -> bytes:
    """Rasterise the map to PNG bytes (``size`` × ``size`` pixels)."""
    img = np.full((size, size, 3), 255, dtype=np.uint8)
    margin = 90
    yy, xx = np.mgrid[0:size, 0:size]
    for (px, py), p in zip(_project(points, size, margin), points, strict=True):
        color = PALETTE[p.cluster % len(PALETTE)]
        disc = (xx - px) ** 2 + (yy - py) ** 2 <= 36
        img[disc] = color
        label = p.name[:40]
        width = len(label) * 8
        lx = px + 9 if px + 9 + width < size else px - 9 - width
        _text(img, lx, py - 5, label, (40, 40, 40))
    if title:
        _text(img, 10, 10, title[:90], (0, 0, 0))
    return _png(img)


def render_svg(points: Sequence[AtlasPoint], *, size: int = 800, title: str | None = None) -> bytes:
    """Draw the map as an SVG document."""
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{size}" height="{size}" viewBox="0 0 {size} {size}">',
             f'<rect width="{size}" height="{size}" fill="white"/>']
    if title:
        parts.append(f'<text x="10" y="20" font-family="sans-serif" font-size="14">{escape(title)}</text>')
    for (px, py), p in zip(_project(points, size, 90), points, strict=True):
        r, g, b = PALETTE[p.cluster % len(PALETTE)]
        parts.append(f'<circle cx="{px}" cy="{py}" r="6" fill="rgb({r},{g},{b})"><title>{escape(p.name)} '
                     f'(cluster {p.cluster})</title></circle>')
        parts.append(f'<text x="{px + 9}" y="{py + 4}" font-family="sans-serif" font-size="12">{escape(p.name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts).encode("utf-8")
