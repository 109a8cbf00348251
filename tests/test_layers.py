"""The architecture as tests: imports only point down, no import circle anywhere, small modules.

Floors (docs/CONTRACTS.md): fishersketch → atlas → workers → service → fisher_atlas. ``migrations`` sits
beside ``workers``: it reads ``atlas`` and only ``service`` (the composition root, the CLI) runs it. Every
module of the product and of ``bench`` is parsed (``ast``: function-local imports count; only
``if TYPE_CHECKING:`` blocks are left out of the circle check, since they never execute).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLOORS = ("fishersketch", "atlas", "workers", "service", "fisher_atlas")
"""Our packages, lowest floor first: a package may import only those before it."""
ALLOWED_EXTRA = {"migrations": {"atlas", "fishersketch"}, "service": {"migrations"}, "fisher_atlas": {"migrations"}}
"""Imports of ``migrations`` (and by it) beyond the floor rule."""
PRODUCT = (*FLOORS, "migrations")
MAX_LINES = 500
"""No module of these packages may be longer (one module per responsibility)."""
SIZED = ("fishersketch", "atlas", "workers", "service", "fisher_atlas")

FORBIDDEN_LIBRARIES = {
    "fishersketch": {"sqlalchemy", "fastapi", "starlette", "httpx", "transformers", "faiss", "celery", "redis"},
    "atlas": {"fastapi", "starlette", "httpx", "transformers", "celery", "uvicorn", "redis"},
    "workers": {"fastapi", "starlette", "httpx", "uvicorn"},
    "migrations": {"fastapi", "starlette", "httpx", "transformers", "celery", "redis", "torch"},
    "service": set(),
    "fisher_atlas": {"fastapi", "starlette", "uvicorn"},
}


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(sub) for sub in ast.walk(node))
    return skip


def _imports(path: Path, *, runtime_only: bool = False) -> set[str]:
    """Fully qualified names ``path`` imports (``from a import b`` gives ``a.b``; relative ones resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skip = _type_checking_nodes(tree) if runtime_only else set()
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package
                for _ in range(node.level - 1):
                    parent = parent.rpartition(".")[0]
                base = f"{parent}.{base}" if base else parent
            out.update(f"{base}.{alias.name}" for alias in node.names)  # resolves to ``base`` if not a module
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            out.add(node.args[0].value)
    return out


CASES = [(pkg, path) for pkg in PRODUCT for path in _modules(pkg)]


@pytest.mark.parametrize(("package", "path"), CASES, ids=[str(p.relative_to(ROOT)) for _, p in CASES])
def test_imports_point_down(package: str, path: Path) -> None:
    tops = {n.split(".")[0] for n in _imports(path)}
    allowed = set(FLOORS[: FLOORS.index(package)]) if package in FLOORS else set()
    allowed |= ALLOWED_EXTRA.get(package, set()) | {package}
    ours = tops & set(PRODUCT)
    assert ours <= allowed, f"{path.relative_to(ROOT)} imports a higher floor: {sorted(ours - allowed)}"
    banned = tops & FORBIDDEN_LIBRARIES[package]
    assert not banned, f"{path.relative_to(ROOT)} ({package}) must not import {sorted(banned)}"


def _graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    modules = {_module_name(p): p for pkg in packages for p in _modules(pkg)}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = {r for n in _imports(path, runtime_only=True) if (r := resolve(n)) is not None}
        graph[name] = deps - {name}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circle_in_product_or_bench() -> None:
    circles = strongly_connected(_graph((*PRODUCT, "bench")))
    assert not circles, f"import circles: {circles}"


def test_the_circle_detector_finds_circles() -> None:
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("package", SIZED)
def test_no_module_over_the_line_limit(package: str) -> None:
    long = {str(p.relative_to(ROOT)): n for p in _modules(package)
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_every_floor_has_modules() -> None:
    assert all(_modules(pkg) for pkg in PRODUCT)
