"""The service layer: one small service per resource, HTTP-agnostic and model-free.

Each service takes its collaborators (store, index, state loader, job queue, prompt sketcher) in its
constructor; :mod:`service.container` builds them once (the composition root) and both the HTTP routes
and library mode (:class:`fisher_atlas.Atlas`) call the same methods.

==============================  =======================================================================
:class:`TaskService`            create / append (validated, all or nothing, queued), list, get, patch,
                                delete
:class:`JobService`             get, list, cancel, store statistics
:class:`QueryService`           route (prompts through the :class:`~atlas.ports.PromptSketcher`), sources,
                                align, matrix, atlas
:class:`SpaceService`           list, get, export, import
:class:`KeyService`             API keys: list, create, revoke
==============================  =======================================================================
"""

from atlas.services.jobs import JobService
from atlas.services.keys import KeyService
from atlas.services.queries import QueryService, Timings
from atlas.services.spaces import SpaceService
from atlas.services.states import Loaded, StateLoader
from atlas.services.tasks import TaskService

__all__ = ["JobService", "KeyService", "Loaded", "QueryService", "SpaceService", "StateLoader", "TaskService",
           "Timings"]
