"""Imports only point down: service → workers → atlas → fishersketch (docs/CONTRACTS.md).

Every module of the four packages is parsed (``ast``, so function-local and ``TYPE_CHECKING``
imports count too) and its imports are checked against the floors and the forbidden libraries.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLOORS = ("fishersketch", "atlas", "workers", "service")
"""Our packages, lowest floor first: a package may import only those before it."""

FORBIDDEN_LIBRARIES = {
    "fishersketch": {"sqlalchemy", "fastapi", "starlette", "httpx", "transformers", "faiss", "celery", "redis"},
    "atlas": {"fastapi", "starlette", "httpx", "transformers", "celery", "uvicorn"},
    "workers": {"fastapi", "starlette", "httpx", "uvicorn"},
    "service": set(),
}


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def _imported(path: Path, package: str) -> set[str]:
    """Top-level names of every module ``path`` imports (relative imports resolve to ``package``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add(package if node.level > 0 else (node.module or "").split(".")[0])
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value.split(".")[0])
    return names


CASES = [(pkg, path) for pkg in FLOORS for path in _modules(pkg)]


@pytest.mark.parametrize(("package", "path"), CASES, ids=[str(p.relative_to(ROOT)) for _, p in CASES])
def test_imports_point_down(package: str, path: Path) -> None:
    imported = _imported(path, package)
    above = set(FLOORS[FLOORS.index(package) + 1 :])
    assert not imported & above, f"{path.relative_to(ROOT)} imports a higher floor: {sorted(imported & above)}"
    banned = imported & FORBIDDEN_LIBRARIES[package]
    assert not banned, f"{path.relative_to(ROOT)} ({package}) must not import {sorted(banned)}"


def test_every_floor_has_modules() -> None:
    assert all(_modules(pkg) for pkg in FLOORS)
