"""Request and response bodies of the REST API (``/v1``), pydantic v2 with OpenAPI examples.

These models are shared by the service (response validation, OpenAPI) and the Python client
(:mod:`service.client` returns them), so this module imports nothing beyond pydantic.
Field names are part of the public contract: extend, never rename.
"""

from __future__ import annotations

import datetime as dt
import warnings
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from atlas.samples import METADATA_DOC as _META_DOC
from atlas.samples import Metadata
from atlas.vocabulary import JobKind, JobStatus, Mode, TaskStatus

MAX_ID = 2**53 - 1
"""Largest accepted id in paths, queries and bodies (JSON-safe, fits every database's BIGINT)."""

RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before trying again.",
                               "schema": {"type": "integer", "minimum": 1}}}
"""OpenAPI ``headers`` of every 429 and 503 answer (``service.errors.error_response`` sends it)."""

SPACE_REF_MAX = 300
"""Longest space reference (an id, a model name or ``default``) a request may give."""

_TASK_EXAMPLE: dict[str, Any] = {
    "id": 3, "name": "smiles", "space_id": 1, "mode": "text", "status": "ready", "metadata": {"domain": "chemistry"},
    "n_samples": 40, "n_tokens": 1873, "version": 1, "created_at": "2025-01-01T12:00:00Z",
    "updated_at": "2025-01-01T12:00:09Z",
}
_JOB_EXAMPLE: dict[str, Any] = {
    "id": 7, "kind": "create", "task_id": 3, "status": "running",
    "progress": {"samples_done": 20, "samples_total": 40, "tokens": 911, "tokens_per_s": 412.5,
                 "tokens_streamed": 1540, "tokens_streamed_per_s": 697.3, "samples_per_s": 9.1, "eta_s": 2.2},
    "error": None, "created_at": "2025-01-01T12:00:00Z", "started_at": "2025-01-01T12:00:01Z", "finished_at": None,
}


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


# --------------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------------


class ErrorBody(BaseModel):
    """The body of every error response."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"code": "not_found", "message": "task 42 does not exist", "detail": None}]
        }
    )

    code: str = Field(description="Stable machine-readable error code, e.g. `invalid_input`, `queue_full`.")
    message: str = Field(description="Human-readable explanation.")
    detail: Any = Field(default=None, description="Optional structured detail.")


# --------------------------------------------------------------------------------------------------
# tasks and jobs
# --------------------------------------------------------------------------------------------------


class SampleIn(BaseModel):
    """One sample: ``{"text"}`` (mode text) or ``{"prompt", "completion"}`` (mode completion)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"text": "CCO"}, {"prompt": "2+2=", "completion": "4"}]},
    )

    text: str | None = None
    prompt: str | None = None
    completion: str | None = None


class TaskCreate(BaseModel):
    """JSON alternative to the multipart upload of ``POST /v1/tasks``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "smiles",
                    "mode": "text",
                    "metadata": {"domain": "chemistry"},
                    "samples": [{"text": "CCO"}, {"text": "c1ccccc1O"}],
                }
            ]
        },
    )

    name: str = Field(min_length=1, max_length=300, description="Task name, unique in its space.")
    mode: Mode = Field(default=Mode.TEXT,
                       description="`text`: every next token counts; `completion`: only completions.")
    space: str | None = Field(default=None, max_length=SPACE_REF_MAX,
                              description="Space id or name; default: the loaded model's space.")
    metadata: Metadata = Field(default_factory=dict, description=f"Free-form user metadata (JSON object, {_META_DOC}).")
    samples: list[SampleIn] = Field(min_length=1, description="The samples of the task.")


class SamplesAppend(BaseModel):
    """JSON alternative to the multipart upload of ``POST /v1/tasks/{id}/samples``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"samples": [{"text": "CC(=O)O"}]}]},
    )

    samples: list[SampleIn] = Field(min_length=1)


class TaskPatch(BaseModel):
    """A task's update: a new name, and/or metadata merged into its own (top-level keys; a ``null`` value removes the
    key). Neither runs the model."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"metadata": {"owner": "chem-team", "old": None}},
                                                        {"name": "legal-contracts"}]}
    )

    name: str | None = Field(default=None, min_length=1, max_length=300,
                             description="A new name, unique in the task's space (the rules of a name at creation); "
                                         "routes, lists and exports answer with it at once.")
    metadata: Metadata | None = Field(
        default=None, description="Top-level merge into the task's metadata: each key replaces the stored one, a null "
                                  f"value removes it; nested objects are replaced whole ({_META_DOC}).")

    @model_validator(mode="after")
    def _something_to_change(self) -> TaskPatch:
        if self.name is None and self.metadata is None:
            raise ValueError("give a new name, metadata or both")
        return self


class TaskOut(_Out):
    """A task and its counts."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [_TASK_EXAMPLE]})

    id: int
    name: str
    space_id: int
    mode: Mode
    status: TaskStatus = Field(description="`pending` until its first job succeeds, then `ready`; `failed`.")
    metadata: dict[str, Any] = Field(default_factory=dict)
    n_samples: int = 0
    n_tokens: int = 0
    version: int = Field(default=0, description="Increases with every merged job.")
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None

    @property
    def meta(self) -> dict[str, Any]:
        """Deprecated: :attr:`metadata` (the library's ``Atlas.task()`` returned the stored row before 2026-12-07,
        whose user metadata was ``.meta``; kept one release with a warning)."""
        warnings.warn("TaskOut.meta is deprecated: read .metadata", DeprecationWarning, stacklevel=2)
        return self.metadata


class TaskList(_Out):
    """A page of tasks."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={"examples": [{"items": [_TASK_EXAMPLE], "total": 1, "offset": 0, "limit": 50}]},
    )

    items: list[TaskOut]
    total: int = Field(description="Number of tasks matching the filter (all pages).")
    offset: int = 0
    limit: int = 50


class JobProgress(_Out):
    """Progress counters of a job (rates over the current run of the job)."""

    samples_done: int = 0
    samples_total: int = 0
    tokens: int = Field(default=0, description="Counted tokens sketched (completion mode: completion tokens).")
    tokens_per_s: float = Field(default=0.0, description="Counted tokens per second.")
    tokens_streamed: int = Field(default=0, description="Every token forwarded through the model, prompts included.")
    tokens_streamed_per_s: float = Field(default=0.0, description="Tokens forwarded through the model per second.")
    samples_per_s: float = 0.0
    eta_s: float | None = Field(default=None, description="Estimated seconds left (of the current phase); null "
                                "before a rate is known.")
    phase: Literal["sketch", "routing"] = Field(
        default="sketch", description="`sketch`: streaming the samples through the model; `routing`: after them, "
        "sketching the prompts that route to the task (its calibration prompts; every prompt of a completion-mode "
        "task).")
    routing_done: int = Field(default=0, description="Prompts of the routing phase sketched.")
    routing_total: int = Field(default=0, description="Prompts of the routing phase.")


class JobResult(_Out):
    """What a succeeded job made of its samples: the ones it used, skipped (by reason) and cut."""

    samples_used: int = Field(default=0, description="Samples whose tokens were sketched.")
    samples_skipped: int = Field(default=0, description="Samples left out: see `skipped_reasons`.")
    skipped_reasons: dict[str, int] = Field(
        default_factory=dict, description="Skipped samples by reason: `too_short` (under 2 tokens), `empty`, "
        "`missing_field`, `invalid_text`, `no_completion_tokens`, `token_out_of_range`.")
    truncated: int = Field(default=0, description="Samples cut to `max_tokens_per_sample` tokens.")
    max_tokens_per_sample: int | None = Field(default=None, description="The worker's cap on a sample's tokens.")
    truncation_policy: str | None = Field(default=None, description="Which tokens a cut sample keeps.")
    notes: list[str] = Field(default_factory=list, description="The above in words, for people: e.g. `2 of 40 "
                             "samples skipped (too_short: 2)`, `1 cut to 512 tokens`; empty when nothing was.")


class JobOut(_Out):
    """A job (``create`` or ``append``) and its progress."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [_JOB_EXAMPLE]})

    id: int
    kind: JobKind = Field(description="`create` or `append`.")
    task_id: int | None = None
    status: JobStatus
    progress: JobProgress = Field(default_factory=JobProgress)
    result: JobResult | None = Field(default=None, description="Set when the job succeeded: samples used, skipped "
                                     "(by reason) and cut to the worker's token cap.")
    error: str | None = None
    created_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    attempts: int = Field(default=0, description="Times a worker claimed the job (a job whose worker died is claimed "
                          "again; it fails after the service's `job_max_attempts`).")
    cancel_requested: bool = Field(default=False, description="Whether a cancel was asked for; a running job stops at "
                                   "its next checkpoint window.")

    @property
    def done(self) -> bool:
        """Whether the job reached a terminal status."""
        return self.status in ("succeeded", "failed", "cancelled")


class JobList(_Out):
    """A page of jobs, newest first."""

    items: list[JobOut]
    total: int
    offset: int = 0
    limit: int = 50


class TaskCreated(_Out):
    """Answer of ``POST /v1/tasks`` (202): the new task and its job."""

    model_config = ConfigDict(
        extra="allow", json_schema_extra={"examples": [{"task": _TASK_EXAMPLE, "job": _JOB_EXAMPLE}]}
    )

    task: TaskOut
    job: JobOut


class JobAccepted(_Out):
    """Answer of ``POST /v1/tasks/{id}/samples`` (202)."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [{"job": _JOB_EXAMPLE}]})

    job: JobOut


# --------------------------------------------------------------------------------------------------
# queries
# --------------------------------------------------------------------------------------------------


class TaskRef(_Out):
    """A task's id and name."""

    task_id: int
    name: str


class PairFactors(_Out):
    """Fisher alignment of a pair and its factors."""

    fisher: float = Field(description="Â_F: sketched Fisher alignment (cosine of the head-gradient Fishers).")
    fisher_shrunk: float = Field(description="Empirical-Bayes shrunk Fisher alignment (the ranking score).")
    activation: float = Field(description="S_cov(M_a): activation-covariance similarity.")
    error: float = Field(description="S_cov(Γ_e): error-covariance similarity.")
    rho: float = Field(description="ρ: coupling ratio; low ρ warns that separable proxies are unreliable.")
    se: float | None = Field(default=None, description="Split-half standard error of log ρ (null if not estimable).")
    activation_dark: bool = Field(description="Activations alike (activation ≥ 0.8) but updates not (fisher ≤ 0.3).")
    flags: list[str] = Field(default_factory=list, description="The estimator's caveats for this pair "
                             "(docs/SCORES.md, 'Flags'): e.g. `rho_bounded` — ρ hit its bound [1/100, 100] because "
                             "the proxy is near 0, so ρ carries no information; `cosine_clipped`, `identical`, "
                             "`single_draw`, `split_half_unavailable`, `zero_norm_<feature>`, `clamped`, `empty`.")


class SourceOut(PairFactors):
    """One recommended source for a target task."""

    task_id: int
    name: str


class SourcesResponse(_Out):
    """Answer of ``GET /v1/tasks/{id}/sources``: sources sorted by ``fisher_shrunk``, best first."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "target": {"task_id": 3, "name": "boolq"},
                    "sources": [
                        {"task_id": 5, "name": "rte", "fisher": 0.52, "fisher_shrunk": 0.49, "activation": 0.95,
                         "error": 0.55, "rho": 0.97, "se": 0.04, "activation_dark": False}
                    ],
                    "compared": 12,
                }
            ]
        },
    )

    target: TaskRef
    sources: list[SourceOut]
    compared: int = Field(description="Number of candidate sources compared (EB shrinkage is over this set).")


class AlignResponse(PairFactors):
    """Answer of ``GET /v1/align``: one pair's alignment and factors."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {"a": {"task_id": 3, "name": "boolq"}, "b": {"task_id": 5, "name": "rte"}, "fisher": 0.52,
                 "fisher_shrunk": 0.5, "activation": 0.95, "error": 0.55, "rho": 0.97, "se": 0.04,
                 "activation_dark": False, "chi": 1.8}
            ]
        },
    )

    a: TaskRef
    b: TaskRef
    chi: float | None = None


class AlignMatrixRequest(BaseModel):
    """Tasks of one space for ``POST /v1/align/matrix`` (at most the service's ``max_matrix_tasks``)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"task_ids": [1, 2, 3]}]})

    task_ids: list[Annotated[StrictInt, Field(ge=1, le=MAX_ID)]] = Field(
        min_length=1, json_schema_extra={"uniqueItems": True},
        description="Distinct task ids (JSON integers), all ready, all in one space.")


class PairFlags(_Out):
    """The estimator's flags of one pair of an alignment matrix: rows/columns ``i`` and ``j`` (``i < j``)."""

    i: int
    j: int
    flags: list[str]


class AlignMatrixResponse(_Out):
    """Alignment matrices; row/column ``i`` is ``ids[i]``."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {"ids": [1, 2], "names": ["a", "b"], "fisher": [[1.0, 0.3], [0.3, 1.0]],
                 "fisher_shrunk": [[1.0, 0.28], [0.28, 1.0]], "activation": [[1.0, 0.9], [0.9, 1.0]],
                 "error": [[1.0, 0.4], [0.4, 1.0]], "rho": [[1.0, 0.8], [0.8, 1.0]]}
            ]
        },
    )

    ids: list[int]
    names: list[str]
    fisher: list[list[float]]
    fisher_shrunk: list[list[float]]
    activation: list[list[float]]
    error: list[list[float]]
    rho: list[list[float]]
    pair_flags: list[PairFlags] = Field(default_factory=list, description="The pairs the estimator flagged "
                                        "(docs/SCORES.md, 'Flags'), each once (`i < j`).")


class AtlasPoint(_Out):
    """One task on the 2-D map."""

    task_id: int
    name: str
    x: float
    y: float
    cluster: int


class AtlasResponse(_Out):
    """Answer of ``GET /v1/atlas``: a deterministic 2-D map of a space's ready tasks."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {"space_id": 1, "method": "mds-fisher", "total": 2, "sampled": False, "n_clusters": 1,
                 "points": [{"task_id": 1, "name": "a", "x": -0.4, "y": 0.0, "cluster": 0},
                            {"task_id": 2, "name": "b", "x": 0.4, "y": 0.0, "cluster": 0}]}
            ]
        },
    )

    space_id: int
    method: str = Field(description="Layout method: classical MDS of 1 − Â_F.")
    total: int = Field(description="Ready tasks in the space.")
    sampled: bool = Field(description="True when the space exceeds max_matrix_tasks and a subset is drawn.")
    n_clusters: int
    points: list[AtlasPoint]


# --------------------------------------------------------------------------------------------------
# spaces, health
# --------------------------------------------------------------------------------------------------


class SpaceOut(_Out):
    """A (model fingerprint, sketch spec) space."""

    id: int
    model_name: str
    model_fingerprint: str
    spec_fingerprint: str
    d: int
    K: int
    m: int
    seed: int
    spec: dict[str, Any] = Field(default_factory=dict)
    n_tasks: int | None = None
    default: bool = Field(default=False, description="Whether this is the loaded model's space.")


class SpaceList(_Out):
    """All spaces."""

    items: list[SpaceOut]


class ImportResult(_Out):
    """Answer of ``POST /v1/spaces/import``."""

    space_id: int
    imported: int
    skipped: list[str] = Field(default_factory=list)
    served: bool = Field(default=True, description="Whether this service can sketch in the space (its model and "
                         "sketch spec): routing to its tasks and appending to them need it; alignment, recommendation "
                         "and export do not.")
    note: str | None = Field(default=None, description="Why the space is not served, and what would serve it.")


class Health(_Out):
    """Liveness."""

    status: Literal["ok"] = "ok"
    version: str | None = None


class Readiness(_Out):
    """Readiness: the database is reachable, the model is loaded and the index is caught up."""

    ready: bool
    checks: dict[str, bool]
    detail: dict[str, Any] = Field(default_factory=dict)
