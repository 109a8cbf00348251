"""Typed Python client of the FisherAtlas REST API: :class:`AsyncAtlasClient` (asyncio) defines every
method once; :class:`AtlasClient` runs the same coroutines on a private event loop (blocking).

>>> from service.client import AtlasClient
>>> with AtlasClient("http://127.0.0.1:8000") as c:               # doctest: +SKIP
...     c.add_task("weather", samples=[{"text": "rain again tomorrow"}], wait=True)
...     c.route("will it rain tomorrow", k=3).matches[0].name
'weather'

Every method returns a response model of :mod:`service.schemas`; every error answer raises a typed
subclass of :class:`AtlasClientError` chosen by the body's ``code`` (:mod:`service.client.errors`).
"""

from service.client.aio import AsyncAtlasClient
from service.client.calls import DEFAULT_URL
from service.client.errors import (
    AtlasClientError,
    BadGateway,
    ClientClosed,
    Conflict,
    CreatedButNotDone,
    Forbidden,
    IncompatibleSpace,
    InvalidInput,
    NotFound,
    NotReady,
    PayloadTooLarge,
    RateLimited,
    Unauthorized,
    Unavailable,
    Unreachable,
    UnsupportedMediaType,
)
from service.client.sync import AtlasClient

__all__ = [
    "DEFAULT_URL",
    "AsyncAtlasClient",
    "AtlasClient",
    "AtlasClientError",
    "BadGateway",
    "ClientClosed",
    "Conflict",
    "CreatedButNotDone",
    "Forbidden",
    "IncompatibleSpace",
    "InvalidInput",
    "NotFound",
    "NotReady",
    "PayloadTooLarge",
    "RateLimited",
    "Unauthorized",
    "Unavailable",
    "Unreachable",
    "UnsupportedMediaType",
]
