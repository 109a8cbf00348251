"""``keys create|list|revoke|current``: over the API (``--url``, an admin key), or ``--local`` on the database
(the bootstrap of the first admin key, before any server runs)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from service.cli.common import ApiKey, DatabaseUrl, DataDir, Json, Timeout, Url, client, emit, fail

app = typer.Typer(help="Create, list and revoke API keys (admin); show the scopes of the key in use.",
                  no_args_is_help=True)
Local = Annotated[bool, typer.Option("--local", help="Act on the database directly (bootstrap), not over the API.")]


@contextmanager
def _db(data_dir: str | None, database_url: str | None, *, create: bool = False) -> Iterator[Any]:
    """A session of the store's database. Only ``create`` (``keys create``, the first admin key) makes a SQLite store
    that is not there or upgrades a schema; the others change nothing but keys (``keys list --local`` made an empty
    store under a mistyped ``--data-dir``, and upgraded an old one under a rolling upgrade's old replicas)."""
    from sqlalchemy.engine import make_url

    from atlas.db import make_engine, session_factory
    from migrations import require_current
    from service.cli.server import migrate_db, settings

    s = settings(data_dir=data_dir, database_url=database_url)
    url = make_url(s.resolved_database_url())
    if not create and url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:") \
            and not Path(url.database).is_file():
        raise fail(f"no store at {url.database}: is --data-dir (FISHER_ATLAS_DATA_DIR) the service's? "
                   "`keys create --local` makes a store there")
    if create:
        migrate_db(s)
    else:
        require_current(url)
    engine = make_engine(s.resolved_database_url(), pool_size=1)
    try:
        with session_factory(engine).begin() as session:
            yield session
    finally:
        engine.dispose()


@app.command()
def create(name: Annotated[str, typer.Option(help="A name for the key.")],
           scopes: Annotated[str, typer.Option(help="Comma-separated: read, write, admin.")] = "read",
           local: Local = False, data_dir: DataDir = None, database_url: DatabaseUrl = None,
           url: Url = None, api_key: ApiKey = None, timeout: Timeout = 120.0, json: Json = False) -> None:
    """Create a key and print it once."""
    wanted = [s.strip() for s in scopes.split(",") if s.strip()]
    if local:
        from atlas import apikeys
        from atlas.errors import AtlasError
        from service.views import key_out

        try:
            with _db(data_dir, database_url, create=True) as session:
                key, plaintext = apikeys.create_api_key(session, name, wanted)
                out: dict[str, Any] = {**key_out(key).model_dump(mode="json"), "key": plaintext}  # as the API's
        except AtlasError as exc:
            raise fail(exc.message) from None
    else:
        with client(url, api_key, timeout) as cl:
            out = cl.create_key(name, wanted).model_dump(mode="json")
    emit(json, out, f"created key {out['id']} ({out['name']}, scopes {','.join(out['scopes'])}):\n{out['key']}\n"
         "store it now: it is shown only once")


@app.command("list")
def list_keys(all_keys: Annotated[bool, typer.Option("--all", help="Include revoked keys.")] = False,
              local: Local = False, data_dir: DataDir = None, database_url: DatabaseUrl = None,
              url: Url = None, api_key: ApiKey = None, timeout: Timeout = 120.0, json: Json = False) -> None:
    """List keys (never their secrets)."""
    if local:
        from atlas import apikeys
        from service.views import key_out

        with _db(data_dir, database_url) as session:
            rows = apikeys.list_api_keys(session, include_revoked=all_keys)
            data = [key_out(k).model_dump(mode="json") for k in rows]
    else:
        with client(url, api_key, timeout) as cl:
            data = [k.model_dump(mode="json") for k in cl.list_keys(include_revoked=all_keys).items]
    lines = [f"{d['id']:>4}  {d['prefix']}…  {','.join(str(x) for x in d['scopes']):<18} {d['name']}"
             + ("  (revoked)" if d.get("revoked") else "") for d in data]
    emit(json, data, "\n".join(lines) if lines else "no API keys")


@app.command()
def revoke(key_id: int, local: Local = False, data_dir: DataDir = None, database_url: DatabaseUrl = None,
           url: Url = None, api_key: ApiKey = None, timeout: Timeout = 120.0, json: Json = False) -> None:
    """Revoke a key by id."""
    if local:
        from atlas import apikeys
        from atlas.errors import AtlasError

        try:
            with _db(data_dir, database_url) as session:
                apikeys.revoke_api_key(session, key_id)
        except AtlasError as exc:
            raise fail(exc.message) from None
    else:
        with client(url, api_key, timeout) as cl:
            cl.revoke_key(key_id)
    emit(json, {"id": key_id, "revoked": True}, f"revoked key {key_id}")


@app.command()
def current(url: Url = None, api_key: ApiKey = None, timeout: Timeout = 120.0, json: Json = False) -> None:
    """Show the key in use (--api-key or FISHER_ATLAS_API_KEY) and its scopes (any key may ask)."""
    with client(url, api_key, timeout) as cl:
        me = cl.current_key()
    who = "anonymous (the service asks no key)" if me.key_id is None else f"key {me.key_id} ({me.name})"
    emit(json, me, f"{who}: scopes {','.join(me.scopes)}")
