"""The web dashboard: static single-page app served at ``/dashboard``.

The page (``service/static/dashboard/``: ``index.html``, ``app.js``, ``style.css``) is plain
JavaScript and SVG with no build step and no third-party assets. It talks only to the public
REST API under ``/v1`` with the key the user types into it (kept in ``sessionStorage``), so it
needs nothing from the server beyond these files. It can add a task (upload), append a file to a
task and delete one, with live job progress read from ``GET /v1/jobs/{id}/events``.

Mount it with :func:`mount_dashboard`::

    from service.dashboard import mount_dashboard
    mount_dashboard(app)

``GET /dashboard`` redirects (relative ``Location``, so it also works behind a path prefix) to
``/dashboard/``, which serves ``index.html``; the files are served by Starlette's ``StaticFiles``
(no path traversal, conditional requests) with explicit content types, a strict same-origin
Content-Security-Policy, and the API's JSON 404 body for anything else. Only the file types listed in
``_CONTENT_TYPES`` are served. The static files are public: every data request the page makes
carries the user's key.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from fastapi import APIRouter, FastAPI
from fastapi.responses import RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

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

_NOT_FOUND = '{"code":"not_found","message":"no such dashboard file","detail":null}'


class DashboardFiles(StaticFiles):
    """``StaticFiles`` over :data:`STATIC_DIR` with the dashboard's headers and the API's 404 body."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        """Serve ``path`` (``index.html`` for the folder) or answer the JSON 404."""
        suffix = PurePosixPath(path).suffix.lower() if path not in ("", ".") else ".html"
        content_type = _CONTENT_TYPES.get(suffix)
        try:
            response = await super().get_response(path, scope) if content_type else None
        except StarletteHTTPException:
            response = None
        if response is None or response.status_code == 404:
            return Response(content=_NOT_FOUND, status_code=404, media_type="application/json")
        response.headers.update(_HEADERS)
        if response.status_code == 200:
            response.headers["content-type"] = content_type or "application/octet-stream"
        return response


dashboard_router = APIRouter(include_in_schema=False)


@dashboard_router.api_route("/dashboard", methods=["GET", "HEAD"])
def dashboard_redirect() -> RedirectResponse:
    """Redirect to the trailing-slash URL so the page's relative asset URLs resolve."""
    return RedirectResponse(url="dashboard/", status_code=307)


@dashboard_router.api_route("/", methods=["GET", "HEAD"])
def root_redirect() -> RedirectResponse:
    """The service's root (what a person types in a browser first) opens the dashboard; it answered a JSON 404."""
    return RedirectResponse(url="dashboard/", status_code=307)


def mount_dashboard(app: FastAPI) -> None:
    """Add ``/dashboard`` (redirect) and mount the static files at ``/dashboard/`` on ``app``."""
    app.include_router(dashboard_router)
    app.mount("/dashboard", DashboardFiles(directory=STATIC_DIR, html=True), name="dashboard")
