"""FisherAtlas as a library: the same store, index and model in your process, no server.

>>> from fisher_atlas import Atlas
>>> with Atlas("./fisher-atlas-data") as atlas:                                    # doctest: +SKIP
...     atlas.add("smiles", ["CC(=O)Oc1ccccc1C(=O)O", "CN1C=NC2=C1C(=O)N(C(=O)N2C)C"])
...     print(atlas.route("CC(=O)Nc1ccc(O)cc1").matches[0].name)

:class:`Atlas` builds the service's composition root (:class:`service.container.Container`) over a data
directory and calls the same services the HTTP routes call, so a server started later on the same
directory gives the same answers. Its answers are the types below (tasks, jobs and routing settings as the REST API
and the client give them; routes, sources, factors, matrices and the map as the algorithm computes them), and its
errors are :class:`AtlasError` subclasses carrying the HTTP status the service would answer.
"""

from atlas.analysis import AtlasMap, AtlasPoint, Factors, Matrices, Source
from atlas.errors import (
    AtlasError,
    Conflict,
    IncompatibleSpace,
    InvalidInput,
    ModelUnavailable,
    NotFound,
    NotReady,
    PayloadTooLarge,
)
from atlas.route_answer import Rejection, RouteAnswer, RouteMatch
from atlas.services.thresholds import FitResult
from fisher_atlas.library import Atlas, AtlasClosed
from service.schemas import JobOut, TaskOut
from service.schemas_routing import RoutingInfo

__all__ = [
    "Atlas",
    "AtlasClosed",
    "AtlasError",
    "AtlasMap",
    "AtlasPoint",
    "Conflict",
    "Factors",
    "FitResult",
    "IncompatibleSpace",
    "InvalidInput",
    "JobOut",
    "Matrices",
    "ModelUnavailable",
    "NotFound",
    "NotReady",
    "PayloadTooLarge",
    "Rejection",
    "RouteAnswer",
    "RouteMatch",
    "RoutingInfo",
    "Source",
    "TaskOut",
]
