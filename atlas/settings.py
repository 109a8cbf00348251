"""Service settings, validated at start (pydantic-settings).

Every setting has an environment twin ``FISHER_ATLAS_<NAME>``; a few also have a flag of ``serve``, ``worker`` and
``migrate`` (``--host``, ``--port``, ``--data-dir``, ``--database-url``, ``--model``, ``--queue``,
``--sketch-dim``): the others are set by their variable. Two variables are CLI options, not settings:
``FISHER_ATLAS_LOG_FORMAT`` (``serve``/``worker --log-format``) and ``FISHER_ATLAS_WORKER_CONCURRENCY`` (``worker
--concurrency``: Celery jobs at once; ``worker_threads`` is the in-process runner's). The
embedded defaults run everything in one process: SQLite and FAISS files under ``data_dir``, an
in-process worker and the bundled model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MODEL = "bundled"
"""Model name meaning the small GPT-2-architecture model shipped inside the package."""


class Settings(BaseSettings):
    """All runtime configuration of FisherAtlas."""

    model_config = SettingsConfigDict(env_prefix="FISHER_ATLAS_", extra="ignore")

    data_dir: Path = Field(default=Path("./fisher-atlas-data"), description="SQLite file, FAISS files, uploads.")
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default sqlite:///<data_dir>/atlas.sqlite."
    )
    host: str = "127.0.0.1"
    port: int = 8000

    model: str = Field(default=DEFAULT_MODEL, description="'bundled', a hub name or a local directory.")
    model_revision: str | None = Field(
        default=None, description="A hub model's revision (branch, tag or commit); ignored for a local directory.")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    torch_threads: int | None = Field(
        default=None, ge=1, le=256, description="Intra-op torch threads of this process (default: torch's choice)."
    )

    sketch_dim: int = Field(default=4096, ge=64, le=65536, description="m, signature length.")
    sketch_seed: int = Field(default=0, description="Seed of the sketch's random projections: part of a space's "
                             "spec, so signatures of different seeds are never compared.")
    error_projection: Literal["auto", "srht", "dense"] = "auto"

    queue: Literal["inprocess", "celery"] = "inprocess"
    redis_url: str = "redis://127.0.0.1:6379/0"
    worker_threads: int = Field(default=1, ge=1, le=64, description="Jobs the in-process runner (`serve` on the "
                                "embedded queue, library mode) runs at once.")
    max_queued_jobs: int = Field(default=64, ge=1, description="Queued jobs per model (the jobs waiting for "
                                 "the same workers); one more answers 429 queue_full.")
    checkpoint_every: int = Field(default=256, ge=1, description="Samples between job checkpoints.")
    job_stale_after_s: float = Field(
        default=15.0, gt=0, description="A running job whose heartbeat is older than this is dead (its worker died); "
        "workers heartbeat every quarter of it, sweeps run every half."
    )

    max_upload_bytes: int = 64 * 1024 * 1024
    max_import_bytes: int = Field(
        default=1024 * 1024 * 1024, ge=1024, description="Largest space export POST /v1/spaces/import reads "
        "(an export line holds a whole task: at m = 4096 0.3-0.5 MB for a text task, up to ~0.8 MB for a completion "
        "task with its prompt-side state; 1 GiB holds about 2,000 text tasks). The "
        "file is checked whole before one transaction stores it, read through a memory map of where the upload was "
        "spooled (not copied into memory) and stored one task at a time (bench/results/import_memory.md).",
    )
    max_concurrent_uploads: int = Field(
        default=4, ge=1, description="Uploads (task adds, appends, space imports) this API process reads, parses and "
        "stores at once, and other JSON bodies over 1 MiB (route, fit) it parses at once; each holds "
        "2-17 bytes of memory per upload "
        "byte while it does (bench/results/"
        "upload_memory.md). The next one waits for a slot, its body unread.")
    upload_slot_wait_s: float = Field(
        default=30.0, ge=0, le=600, description="Longest wait of an upload for a slot (max_concurrent_uploads) before "
        "it is refused with 503 and Retry-After, nothing stored.")
    max_samples: int = 200_000
    max_sample_chars: int = 100_000
    max_tokens_per_sample: int = 512
    max_prompt_chars: int = 20_000
    max_matrix_tasks: int = Field(default=256, description="Most tasks in one alignment matrix; the atlas map "
                                  "draws an even subset of a larger space.")

    require_keys: bool | None = Field(
        default=None, description="Require API keys; default: only when bound to a non-loopback host."
    )
    route_threshold: float = Field(
        default=0.05, description="Default open-set threshold on the route score (see atlas.analysis)."
    )
    route_lexical: bool = Field(
        default=True, description="Order route matches by the hybrid of the Fisher ranking and the tasks' "
        "lexical evidence (atlas.lexical); false: the Fisher ranking alone.",
    )
    route_template: bool = Field(
        default=True, description="Answer 'none' when a prompt lacks a term every sample of the answered task "
        "has, for tasks whose template is active (atlas.template); needs route_lexical.",
    )
    route_novelty: bool = Field(
        default=True,
        description="Answer none when the prompt's mean hidden state is farther from the answered task's samples than "
        "the task's novelty threshold (atlas.novelty; a task is tested when its stored sample vectors can bound its "
        "share of the false-reject rate: 39 at the default 5 %, 99 at 2 %; GET /v1/tasks/{id}/routing says).",
    )
    route_length_match: bool = Field(
        default=True,
        description="Hold a prompt under 3/4 of the length of three in four of the answered task's samples to the "
        "threshold of the task's held-out sample prefixes of about its length, without the template and novelty "
        "tests (docs/SCORES.md, 'Prompts shorter than the samples'); false: every prompt is judged as a whole sample.",
    )
    index_kind: Literal["auto", "flat", "ivf"] = Field(
        default="auto",
        description="'auto' (or 'ivf'): exact flat below index_ivf_min_size signatures, the two-stage index "
        "(projected IVF + exact re-rank) above; 'flat': always exact.",
    )
    index_nprobe: int = Field(default=32, ge=1, description="IVF lists probed per query (of sqrt(N) lists).")
    index_ivf_min_size: int = Field(default=4096, ge=1, description="Below this many signatures a space stays flat.")
    index_gpu: bool = Field(default=False, description="Search flat indexes on a GPU copy: needs the `gpu` extra "
                            "(faiss-gpu in place of faiss-cpu) and a CUDA device, else a warning and the CPU. For the "
                            "process that searches: `serve` (a Celery worker builds no index).")

    prompt_service: Literal["auto", "inprocess", "redis"] = Field(
        default="auto",
        description="Who sketches routing prompts: 'inprocess' (the model in this process), 'redis' (workers "
        "over Redis; this process loads no model), 'auto' (redis when queue='celery', else inprocess).",
    )
    prompt_max_batch: int = Field(default=64, ge=1, le=4096, description="Prompts per micro-batch.")
    prompt_max_wait_ms: float = Field(default=2.0, ge=0, le=1000, description="Wait for more prompts per batch.")
    prompt_max_pending: int = Field(default=1024, ge=1, description="Waiting prompts beyond which /v1/route is 429 "
                                    "(a request of more prompts than this on its own: 413).")
    prompt_timeout_s: float = Field(default=10.0, gt=0, le=600, description="Longest wait for a remote worker.")
    shutdown_grace_s: float = Field(
        default=20.0, ge=0, le=3600, description="At SIGTERM, how long `serve` lets open requests finish before it "
        "closes them (a running job is released at once); keep it under the orchestrator's grace period (30 s).")

    allowed_hosts: list[str] = Field(
        default_factory=list, description="Host names accepted besides localhost, loopback IPs and `host` "
        "('*': any). Checked on loopback binds (DNS rebinding) and wherever this list is set.")
    allowed_origins: list[str] = Field(
        default_factory=list, description="Origins (scheme://host[:port]) allowed to send state-changing requests "
        "besides the service's own origin ('*': any); browsers on them also get CORS answers (preflights included), "
        "so a web UI there can call the API with its key.")
    rate_limit_per_s: float = Field(
        default=100.0, ge=0, description="Requests per second per API key (per client address when anonymous); 0: off.")
    rate_limit_burst: int = Field(default=200, ge=1, description="Token-bucket size of the per-client rate limit.")
    max_event_streams_per_client: int = Field(
        default=16, ge=1, description="Progress streams (GET /v1/jobs/{id}/events) one API key (one client address "
        "when anonymous) may hold open at once; one more answers 429 with Retry-After.")
    max_event_streams: int = Field(
        default=256, ge=1, description="Progress streams open at once in this process, all clients together; one "
        "more answers 429 with Retry-After.")
    db_busy_timeout_s: float = Field(
        default=5.0, gt=0, le=600, description="Longest wait for the SQLite write lock before answering 503.")
    db_pool_timeout_s: float = Field(
        default=5.0, gt=0, le=600, description="Longest wait for a pooled connection before answering 503.")
    key_touch_every_s: float = Field(
        default=60.0, gt=0, description="A key's last-used time is written at most this often, off the request path.")
    bootstrap_admin_key: SecretStr | None = Field(
        default=None, description="An admin key (plaintext, or 'sha256:<hex>' of it) created at start if absent.")

    celery_queue: str = "fisher_atlas"
    celery_visibility_timeout_s: int = Field(default=6 * 3600, ge=60, description="Seconds before Redis "
                                             "re-delivers a job message not yet acknowledged (a job's message is "
                                             "acknowledged when the job ends; a copy delivered while the job runs "
                                             "finds it held and is skipped).")
    job_max_attempts: int = Field(default=5, ge=1)

    @field_validator("data_dir")
    @classmethod
    def _home_expanded(cls, value: Path) -> Path:
        """``~/atlases/x`` is under the home directory, as a shell reads it (a folder named ``~`` was made in the
        working directory: the store looked lost from anywhere else)."""
        return value.expanduser()

    @field_validator("bootstrap_admin_key", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    def resolved_prompt_service(self) -> str:
        """``prompt_service`` with ``auto`` resolved (``redis`` exactly when the job queue is Celery)."""
        if self.prompt_service != "auto":
            return self.prompt_service
        return "redis" if self.queue == "celery" else "inprocess"

    def resolved_database_url(self) -> str:
        """Return the database URL, defaulting to a SQLite file in ``data_dir``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'atlas.sqlite').resolve()}"


def get_settings(**overrides: object) -> Settings:
    """Build settings from the environment, with explicit overrides (CLI flags) on top."""
    clean: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
    return Settings(**clean)
