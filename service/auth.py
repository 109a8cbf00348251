"""API-key authentication with scopes ``read`` ⊂ ``write`` ⊂ ``admin``, decided per request.

Keys travel in the ``X-API-Key`` header (``Authorization: Bearer <key>`` is accepted too) and are
checked against their sha256 hashes in the store (:mod:`atlas.apikeys`).

Whether a request needs a key (:meth:`KeyGate.required`):

* ``settings.require_keys`` true → always; false → never (the explicit insecure setting);
* otherwise (the default) a key is required when **the socket that accepted the connection** is not a
  loopback socket — judged from the ASGI ``scope["server"]`` address of the connection *and* the
  listening sockets of this process on that port (:func:`listening_publicly`), so
  ``uvicorn --factory service.app:create_app --host 0.0.0.0`` needs keys whatever ``settings.host``
  says — or when any active key exists (keys are honoured on loopback as soon as one is created) — or when
  the request carries a header a reverse proxy adds (``Forwarded``, ``X-Forwarded-For``/``-Host``/``-Proto``,
  ``X-Real-IP``: :func:`is_proxied`): a proxy on the same host makes every outside client look local, so such
  a request is treated as coming from outside (fail closed).

Without a key a request acts with the ``admin`` scope. The key is checked by
:class:`service.security.SecurityMiddleware` before the body is read; the route's scope by
:func:`authorize`. A key's last-used time is written by :class:`UsageRecorder` off the request path, at
most once per ``settings.key_touch_every_s``. ``serve`` refuses to start on a non-loopback address while
no key exists (:func:`check_bind_allowed`), and the app refuses to be built with the wildcard origin ``*`` unless
keys are always required (:func:`check_origins_allowed`); ``FISHER_ATLAS_BOOTSTRAP_ADMIN_KEY`` creates the first
admin key at start (:func:`prepare_keys`).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from sqlalchemy.orm import Session, sessionmaker

from atlas import apikeys
from atlas.errors import Forbidden, Unauthorized
from atlas.models import utcnow
from atlas.settings import Settings

logger = logging.getLogger("fisher_atlas.service")

HEADER = "X-API-Key"
PRINCIPAL_STATE = "fisher_atlas_principal"
"""Key of the authenticated :class:`Principal` in the ASGI scope's ``state``."""


@dataclass(frozen=True)
class Principal:
    """Who is calling: a key (``key_id``) or anonymous (keys not required)."""

    key_id: int | None
    name: str
    scopes: tuple[str, ...]


ANONYMOUS = Principal(key_id=None, name="anonymous", scopes=("read", "write", "admin"))


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or ``localhost`` (``0.0.0.0`` and ``::`` are not)."""
    h = host.strip().strip("[]").lower()
    if h in ("localhost", "localhost.localdomain") or h.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(h.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def keys_required(settings: Settings) -> bool:
    """Static view (OpenAPI, start checks): ``require_keys`` when set, else whether ``host`` is non-loopback."""
    if settings.require_keys is not None:
        return bool(settings.require_keys)
    return not is_loopback(settings.host)


def count_active_keys(session: Session) -> int:
    """Number of keys that are not revoked."""
    return apikeys.count_active_keys(session)


CREATE_KEY_HINT = (
    "create one on this machine with: fisher-atlas keys create --local --name admin --scopes admin, "
    "or set FISHER_ATLAS_BOOTSTRAP_ADMIN_KEY"
)


PROXY_HEADERS = ("forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-real-ip")
"""Headers a reverse proxy adds: a request carrying one came through a proxy, from anywhere."""


def is_proxied(headers: Any) -> bool:
    """Whether a request's ``headers`` (a mapping with ``get``: Starlette's ``Headers``) carry a proxy header."""
    return any(headers.get(name) is not None for name in PROXY_HEADERS)


def check_origins_allowed(settings: Settings) -> None:
    """Refuse the wildcard origin ``*`` unless API keys are always required.

    With ``*`` every web page may send state-changing requests (and read the CORS answers); without a key
    required that makes any page the visitor opens an anonymous admin of this service.

    Raises
    ------
    RuntimeError
        ``allowed_origins`` holds ``*`` while ``require_keys`` is not true.
    """
    if any(o.strip() == "*" for o in settings.allowed_origins) and settings.require_keys is not True:
        raise RuntimeError(
            "refusing to serve with FISHER_ATLAS_ALLOWED_ORIGINS containing '*' unless "
            "FISHER_ATLAS_REQUIRE_KEYS=true: any web page could act on this service without a key; "
            "list the origins of your web UI instead, or require API keys"
        )


def check_bind_allowed(settings: Settings, active_keys: int) -> None:
    """Refuse to serve on a non-loopback address without API keys.

    A configured ``bootstrap_admin_key`` counts as a key (it is created at start).

    Raises
    ------
    RuntimeError
        Bound to a non-loopback host while keys are disabled or none exists.
    """
    if settings.bootstrap_admin_key is not None:
        active_keys += 1
    if is_loopback(settings.host):
        if keys_required(settings) and active_keys == 0:
            logger.warning("API keys are required but none exists; %s", CREATE_KEY_HINT)
        return
    if settings.require_keys is False:
        raise RuntimeError(
            f"refusing to serve on non-loopback address {settings.host!r} with FISHER_ATLAS_REQUIRE_KEYS=false; "
            "bind to 127.0.0.1 or require API keys"
        )
    if active_keys == 0:
        raise RuntimeError(
            f"refusing to serve on non-loopback address {settings.host!r}: no API key exists; {CREATE_KEY_HINT} "
            "(same FISHER_ATLAS_DATABASE_URL / --data-dir), then start the service again"
        )


def prepare_keys(store: Any, settings: Settings) -> None:
    """At start: create the bootstrap admin key if configured, then :func:`check_bind_allowed`."""
    if settings.bootstrap_admin_key is not None:
        with store.session() as session:
            if apikeys.ensure_bootstrap_key(session, settings.bootstrap_admin_key.get_secret_value()) is not None:
                logger.info("created the bootstrap admin key (FISHER_ATLAS_BOOTSTRAP_ADMIN_KEY)")
    with store.read() as session:
        check_bind_allowed(settings, count_active_keys(session))


def presented_key(headers: Any) -> str | None:
    """The key in ``X-API-Key`` or ``Authorization: Bearer``, if any (``headers``: a request or its headers)."""
    headers = getattr(headers, "headers", headers)
    key = headers.get(HEADER) or headers.get(HEADER.lower())
    if key:
        return str(key).strip()
    auth = headers.get("Authorization") or headers.get("authorization") or ""
    scheme, _, token = str(auth).partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


# --------------------------------------------------------------------------------------------------
# the bound socket
# --------------------------------------------------------------------------------------------------

_listen_cache: dict[int, bool] = {}
_listen_lock = threading.Lock()


def _process_listens_publicly(port: int) -> bool | None:
    """Whether this process listens on ``port`` on a non-loopback address (``None``: unknown)."""
    try:
        import psutil

        conns = psutil.Process().net_connections(kind="inet")
    except Exception:  # psutil missing or not allowed: fall back to the connection's address
        return None
    mine = [c for c in conns if c.status == "LISTEN" and c.laddr and c.laddr.port == port]
    if not mine:
        return None
    return any(not is_loopback(str(c.laddr.ip)) for c in mine)


def forget_listening() -> None:
    """Forget what was found of this process's listening sockets: a new app may be served on a port an earlier one of
    this process used (a loopback server's "not public" was kept for the port, and a wildcard bind on the same port,
    later, asked no key: a test in CI, 2026-12-07). Called when an app's security middleware is built."""
    with _listen_lock:
        _listen_cache.clear()


def listening_publicly(server: tuple[str, int | None] | list[Any] | None) -> bool:
    """Whether the connection came through a socket reachable from other machines.

    ``server`` is the ASGI ``scope["server"]`` (the connection's local address). Non-loopback → true.
    A loopback connection counts as public when this process listens on the same port on a wildcard or
    non-loopback address (``--host 0.0.0.0`` reached through 127.0.0.1): the bound socket decides, not
    the path one client took. Unix sockets (no port) are local; no address at all is public.
    """
    if not server:
        return True
    host, port = str(server[0]), server[1] if len(server) > 1 else None
    if port is None:
        return False  # a Unix domain socket: reachable through the file system only
    if not is_loopback(host):
        return True
    port = int(port)
    with _listen_lock:
        cached = _listen_cache.get(port)
    if cached is None:
        found = _process_listens_publicly(port)
        cached = bool(found)
        if found is not None:
            with _listen_lock:
                _listen_cache[port] = cached
    return cached


# --------------------------------------------------------------------------------------------------
# keys
# --------------------------------------------------------------------------------------------------


class UsageRecorder:
    """Records keys' last-used times and writes them in one short background transaction, at most once
    per ``every_s`` (never on the request path: a locked database only delays the record)."""

    def __init__(self, write_factory: sessionmaker[Session], every_s: float) -> None:
        self.write_factory = write_factory
        self.every_s = every_s
        self._pending: dict[int, dt.datetime] = {}
        self._lock = threading.Lock()
        self._last_flush = 0.0
        self._flushing = False

    def note(self, key_id: int) -> None:
        """Remember a use of ``key_id``; start a background flush when one is due."""
        now = time.monotonic()
        with self._lock:
            self._pending[key_id] = utcnow()
            due = not self._flushing and now - self._last_flush >= self.every_s
            if due:
                self._flushing = True
                self._last_flush = now
        if due:
            threading.Thread(target=self.flush, name="api-key-usage", daemon=True).start()

    def flush(self) -> None:
        """Write the pending times (on failure they are kept for the next flush)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        try:
            if pending:
                with self.write_factory.begin() as session:
                    apikeys.record_key_use(session, pending)
        except Exception as exc:
            logger.warning("could not record API key use: %s", type(exc).__name__)
            with self._lock:
                for k, v in pending.items():
                    self._pending.setdefault(k, v)
        finally:
            with self._lock:
                self._flushing = False


class KeyGate:
    """Decides whether a request needs a key and checks the key (see the module docstring).

    Parameters
    ----------
    settings : Settings
    read_factory, write_factory
        Session factories of the store (reads never take the write lock).
    ttl_s
        How long the "some active key exists" answer is cached (create and revoke through this
        process refresh it at once).
    """

    def __init__(self, settings: Settings, read_factory: sessionmaker[Session], write_factory: sessionmaker[Session],
                 ttl_s: float = 2.0) -> None:
        self.settings = settings
        self.read_factory = read_factory
        self.usage = UsageRecorder(write_factory, settings.key_touch_every_s)
        self.ttl_s = ttl_s
        self._any_key: tuple[float, bool] | None = None

    def invalidate(self) -> None:
        """Forget the cached key count (after a key was created or revoked)."""
        self._any_key = None

    def any_active_key(self) -> bool:
        """Whether an active key exists (cached ``ttl_s``)."""
        cached = self._any_key
        now = time.monotonic()
        if cached is not None and now - cached[0] < self.ttl_s:
            return cached[1]
        with self.read_factory() as session:
            value = count_active_keys(session) > 0
        self._any_key = (now, value)
        return value

    def required(self, server: Any, proxied: bool = False) -> bool:
        """Whether a request arriving at ``server`` (the ASGI ``scope["server"]``) needs a key; ``proxied``:
        it carries a proxy header (:func:`is_proxied`), so it may come from anywhere."""
        quick = self.required_without_io(server, proxied)
        return quick if quick is not None else self.any_active_key()

    def required_without_io(self, server: Any, proxied: bool = False) -> bool | None:
        """:meth:`required` when it can be told without a database read (else ``None``)."""
        if self.settings.require_keys is not None:
            return bool(self.settings.require_keys)
        if proxied or listening_publicly(server):
            return True
        cached = self._any_key
        if cached is not None and time.monotonic() - cached[0] < self.ttl_s:
            return cached[1]
        return None

    def still_active(self, principal: Principal) -> bool:
        """Whether ``principal``'s key is still active (anonymous: true); long-lived requests re-check with it."""
        if principal.key_id is None:
            return True
        with self.read_factory() as session:
            return apikeys.is_active(session, principal.key_id)

    def authenticate(self, plaintext: str | None, proxied: bool = False) -> Principal:
        """The principal of a presented key (any scope; routes check theirs with :func:`authorize`);
        ``proxied``: the request carries a proxy header (the message of a missing key says so).

        Raises
        ------
        Unauthorized
            Missing, unknown or revoked key.
        """
        if not plaintext:
            raise Unauthorized(missing_key_message(proxied))
        if len(plaintext) > 512:
            raise Unauthorized("invalid or revoked API key")
        with self.read_factory() as session:
            key = apikeys.verify_api_key(session, plaintext, "read", touch=False)
            principal = Principal(key_id=key.id, name=key.name, scopes=tuple(key.scopes))
        assert principal.key_id is not None
        self.usage.note(principal.key_id)
        return principal


def missing_key_message(proxied: bool) -> str:
    """The 401 message of a request without a key (a proxied one is told why it needs one)."""
    if proxied:
        return (f"an API key is required: a proxied request (Forwarded, X-Forwarded-*, X-Real-IP) needs one; "
                f"send it in the {HEADER} header (behind a reverse proxy, set FISHER_ATLAS_REQUIRE_KEYS=true)")
    return f"an API key is required: send it in the {HEADER} header"


def authenticate(
    read_factory: sessionmaker[Session], write_factory: sessionmaker[Session], plaintext: str | None, scope: str,
    proxied: bool = False,
) -> Principal:
    """Check a presented key for ``scope`` (no middleware: read-only lookup, no write).

    Raises
    ------
    Unauthorized
        Missing, unknown or revoked key.
    Forbidden
        The key lacks ``scope``.
    """
    if not plaintext:
        raise Unauthorized(missing_key_message(proxied))
    with read_factory() as session:
        key = apikeys.verify_api_key(session, plaintext, scope, touch=False)
        return Principal(key_id=key.id, name=key.name, scopes=tuple(key.scopes))


_GATE_LOCK = threading.Lock()


def key_gate(container: Any) -> KeyGate | None:
    """The container's :class:`KeyGate`, made on first use (``None`` before its store exists).

    One gate per container, shared by :class:`service.security.SecurityMiddleware` and :func:`authorize`, so
    that a key created or revoked here invalidates the one cached answer.
    """
    gate: KeyGate | None = getattr(container, "key_gate", None)
    if gate is not None or getattr(container, "store", None) is None:
        return gate
    with _GATE_LOCK:  # two first uses at once must not make two gates (a key change would refresh only one)
        gate = getattr(container, "key_gate", None)
        if gate is None:
            gate = KeyGate(container.settings, container.store.read, container.store.write)
            container.key_gate = gate
    return gate


def authorize(request: Request, container: Any, scope: str) -> Principal:
    """The route dependency's check: the principal the middleware authenticated, holding ``scope``.

    The middleware leaves ``ANONYMOUS`` when it asked for no key. Where it did not run for the request, the key
    is checked here by the gate's rule (:func:`key_gate`: keys required on a public socket, for a proxied request
    or once any exists;
    fail closed), or, without a store (an app assembled by hand), by the static rule of :func:`keys_required`.

    Raises
    ------
    Unauthorized, Forbidden
    """
    state = request.scope.get("state") or {}
    principal = state.get(PRINCIPAL_STATE) if isinstance(state, dict) else None
    if principal is None:
        gate = key_gate(container)
        proxied = is_proxied(request.headers)
        required = (gate.required(request.scope.get("server"), proxied) if gate is not None
                    else container.keys_required or (proxied and container.settings.require_keys is None))
        if not required:
            return ANONYMOUS
        store = container.store
        principal = authenticate(store.read, store.write, presented_key(request), scope, proxied)
    if principal.key_id is not None and not apikeys.has_scope(principal.scopes, scope):
        raise Forbidden(f"this API key lacks the {scope!r} scope", {"scopes": list(principal.scopes)})
    request.state.principal = principal
    return principal
