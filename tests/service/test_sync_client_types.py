"""The blocking client is typed like the async one: a script using ``AtlasClient`` under mypy gets each method's
answer type and has a wrong argument or a misspelt keyword reported (the generated methods typed everything ``Any``).

The types are written out in ``service/client/sync.py`` (an ``if TYPE_CHECKING`` block; the methods themselves are
generated from the async client at import time), so the first test holds them to the async client's signatures.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

from mypy import api

import service.client.aio as aio
import service.client.sync as sync

SKIPPED = {"aclose", "job_events"}  # the sync client's own close() and iterator


def _methods(module: object, class_name: str, kind: type[ast.AST]) -> dict[str, ast.AST]:
    """Public methods of ``class_name`` in ``module``'s source, nested ``if`` blocks included."""
    tree = ast.parse(inspect.getsource(module))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    return {n.name: n for n in ast.walk(cls)
            if isinstance(n, kind) and not n.name.startswith("_") and n.name not in SKIPPED}


def test_the_sync_clients_declared_types_are_the_async_clients_signatures() -> None:
    coroutines = _methods(aio, "AsyncAtlasClient", ast.AsyncFunctionDef)
    declared = _methods(sync, "AtlasClient", ast.FunctionDef)
    declared = {name: fn for name, fn in declared.items() if name not in ("close",)}
    assert sorted(declared) == sorted(coroutines), "declare every async method's blocking twin in sync.py"
    for name, coro in coroutines.items():
        mine = declared[name]
        assert ast.dump(mine.args) == ast.dump(coro.args), f"{name}: parameters differ from the async client's"
        assert ast.dump(mine.returns) == ast.dump(coro.returns), f"{name}: return type differs"


def test_a_script_using_the_sync_client_is_type_checked(tmp_path: Path) -> None:
    script = tmp_path / "user_script.py"
    script.write_text(
        "from service.client import AtlasClient\n"
        "with AtlasClient('http://127.0.0.1:8000') as client:\n"
        "    reveal_type(client.route('a prompt'))\n"
        "    reveal_type(client.add_task('t', samples=[{'text': 'a'}]).job)\n"
        "    client.route(3)\n"
        "    client.wait_job(1, timeot=5)\n"
        "    client.no_such_method()\n"
    )
    out, err, status = api.run(["--cache-dir", str(tmp_path / "cache"), "--ignore-missing-imports",
                                "--no-error-summary", "--show-error-codes", str(script)])
    assert status == 1, (out, err)
    lines = out.splitlines()
    assert any(':3: note: Revealed type is "service.schemas_routing.RouteResponse"' in line for line in lines), out
    assert any(":4: note: Revealed type is \"service.schemas.JobOut" in line for line in lines), out
    assert any(":5: error:" in line and "[arg-type]" in line for line in lines), out
    assert any(":6: error:" in line and "timeot" in line for line in lines), out
    assert any(":7: error:" in line and "no_such_method" in line for line in lines), out


def test_the_key_methods_return_models_and_read_as_dicts_with_a_warning(serve: Any, tiny_lm: Any) -> None:
    """``current_key``, ``create_key`` and ``list_keys`` returned dicts although every method is documented to
    return a response model (a client review, 2026-12-07); the old subscript still reads a field, deprecated."""
    import warnings

    from service.client import AtlasClient
    from service.schemas_keys import CurrentKey, KeyCreated, KeyList

    svc = serve(lm=tiny_lm)
    with AtlasClient(svc.url) as c:
        created = c.create_key("root", ["admin"])
        assert isinstance(created, KeyCreated) and created.key.startswith("fa_") and created.scopes == ["admin"]
    with AtlasClient(svc.url, api_key=created.key) as c:
        me = c.current_key()
        keys = c.list_keys()
        assert isinstance(me, CurrentKey) and me.key_id == created.id and me.name == "root"
        assert isinstance(keys, KeyList) and [k.id for k in keys.items] == [created.id]
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            assert me["scopes"] == ["admin"] and me.get("key_id") == created.id and me.get("absent", 7) == 7
        assert len(said) == 3 and all(issubclass(w.category, DeprecationWarning) for w in said)
