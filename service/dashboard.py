"""The web dashboard: static single-page app served at ``/dashboard``.

The page (``service/static/dashboard/``: ``index.html``, ``app.js``, ``style.css``) is plain
JavaScript and SVG with no build step and no third-party assets. It talks only to the public
REST API under ``/v1`` with the read key the user types into it (kept in ``localStorage``), so it
needs nothing from the server beyond these files.

Mount it with :func:`mount_dashboard` (or ``app.include_router(dashboard_router)``)::

    from service.dashboard import mount_dashboard
    mount_dashboard(app)

``GET /dashboard`` redirects (relative ``Location``, so it also works behind a path prefix) to
``/dashboard/``, which serves ``index.html``; ``GET /dashboard/{file}`` serves the assets with an
explicit content type. Only the files in the static folder can be served (no path traversal).
The static files are public: every data request the page makes carries the user's key.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, RedirectResponse, Response

STATIC_DIR = Path(__file__).resolve().parent / "static" / "dashboard"
"""Folder holding the dashboard's files (packaged as package data)."""

_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".json": "application/json",
}

_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Everything the page loads comes from this origin; it only calls the API with fetch().
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'self'; frame-ancestors 'none'"
    ),
}

dashboard_router = APIRouter(include_in_schema=False)


def _file_response(name: str) -> Response:
    path = (STATIC_DIR / name).resolve()
    content_type = _CONTENT_TYPES.get(path.suffix.lower())
    if content_type is None or path.parent != STATIC_DIR or not path.is_file():
        return Response(
            content='{"code":"not_found","message":"no such dashboard file","detail":null}',
            status_code=404,
            media_type="application/json",
        )
    return FileResponse(path, media_type=content_type, headers=_HEADERS)


@dashboard_router.api_route("/dashboard", methods=["GET", "HEAD"])
def dashboard_redirect() -> RedirectResponse:
    """Redirect to the trailing-slash URL so the page's relative asset URLs resolve."""
    return RedirectResponse(url="dashboard/", status_code=307)


@dashboard_router.api_route("/dashboard/", methods=["GET", "HEAD"])
def dashboard_index() -> Response:
    """Serve the single page (client-side hash routes: ``#/atlas``, ``#/matrix``, ...)."""
    return _file_response("index.html")


@dashboard_router.api_route("/dashboard/{name}", methods=["GET", "HEAD"])
def dashboard_asset(name: str) -> Response:
    """Serve one static asset of the dashboard (``app.js``, ``style.css``, ...)."""
    return _file_response(name)


def mount_dashboard(app: FastAPI) -> None:
    """Add the dashboard routes (``/dashboard``, ``/dashboard/``, ``/dashboard/{file}``) to ``app``."""
    app.include_router(dashboard_router)
