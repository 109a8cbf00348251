"""Choose the job queue of the service: the in-process runner (embedded) or Celery (scale-out)."""

from __future__ import annotations

from typing import Any


def make_queue(engine: Any) -> tuple[Any, Any]:
    """Return ``(queue, runner)`` for ``engine.settings.queue``.

    ``inprocess``: a :class:`workers.inprocess.InProcessRunner` sharing the engine's model, store and
    index (it is both the queue and the runner; started unless ``start_runner=False`` is overridden or
    no model is loaded). ``celery``: a :class:`workers.celery_app.CeleryJobQueue` sending job ids to
    workers through Redis (no runner here).
    """
    settings = engine.settings
    if settings.queue == "celery":
        from workers.celery_app import CeleryJobQueue
        from workers.celery_app import create_app as create_celery

        return CeleryJobQueue(create_celery(settings)), None
    from workers.inprocess import InProcessRunner
    from workers.jobs import WorkerContext

    ctx = WorkerContext(settings=settings, factory=engine.write, index=engine.index, lm=engine.lm)
    runner = InProcessRunner(ctx)
    if engine.overrides.get("start_runner", True) and engine.lm is not None:
        runner.start()
    return runner, runner
