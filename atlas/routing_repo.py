"""Repository of the routing side of tasks (``task_routing`` rows; all its SQL lives here).

Kept apart from :mod:`atlas.repository` (already large) so that routing can change without touching
the task store. See :class:`atlas.models.TaskRouting` and docs/SCORES.md.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from atlas import lexicon_repo
from atlas.errors import InvalidInput, NotFound
from atlas.lru import ContentLru
from atlas.models import TASK_READY, Task, TaskRouting, utcnow
from atlas.route_calibration import (
    MAX_CAL_VIEWS,
    MAX_FALSE_REJECT_RATE,
    LengthViews,
    is_false_reject_rate,
    split_rates,
    validate_views,
)
from atlas.routing import (
    FALSE_REJECT_RATE,
    Calibration,
    Candidate,
    TaskRoute,
    calibrate,
    resolve,
    state_view,
    typical_score,
)

_PROMPT_VIEWS: ContentLru[tuple[Any, Any]] = ContentLru(2048)
"""Deserialised prompt-side states and their views, by (spec fingerprint, state digest)."""


def get_routing(session: Session, task_id: int) -> TaskRouting | None:
    """The routing row of a task, or ``None``."""
    return session.get(TaskRouting, int(task_id), populate_existing=True)


_DIGEST_BYTES = 32
"""A state blob ends with its BLAKE2b-256 digest (``SketchState.to_bytes``)."""


_TYPICAL: ContentLru[tuple[float | None, float | None, LengthViews | None]] = ContentLru(65536)
"""Each row's :func:`~atlas.routing.typical_score`, its threshold at half its false-reject rate (what a task with
a novelty test is held to, :func:`split_threshold`) and its held-out views by length (``cal_views``), by (database,
task, row version, write time): the held-out scores and views they summarise (up to 256 floats and 1,024 records of
JSON per task) are read only when a row was written since (a rate PATCH bumps the version)."""


def split_threshold(scores: Sequence[float] | None, stored_rate: float | None) -> float | None:
    """The route threshold calibrated at half the task's false-reject rate (``None``: too few held-out scores): a
    task with a novelty test spends the other half on it (docs/SCORES.md, "Open set: novelty test")."""
    if not scores:
        return None
    return calibrate(scores, split_rates(calibration_rate(stored_rate))[0]).threshold


def get_task_routes(session: Session, task_ids: Sequence[int]) -> dict[int, TaskRoute]:
    """Resolved :class:`TaskRoute` (threshold, scale, prompt-side state's stored digest, version) of the tasks that
    have a row.

    Neither the prompt-side state blobs (~200 KiB each at m = 4096) nor the held-out scores are read per call:
    every route batch re-ranks every completion task of the space, whose views are cached by stored digest and
    row version (:func:`route_candidates`), and each row's typical score is cached by its version and write time
    (every writer bumps the version, older replicas' too, and stamps the time)."""
    if not task_ids:
        return {}
    ids = [int(i) for i in task_ids]
    cols = [c for c in TaskRouting.__table__.columns if c.name not in ("prompt_state", "cal_scores", "cal_views")]
    has_blob = TaskRouting.prompt_state.is_not(None).label("prompt_side")  # not detoasted / read
    rows = session.execute(select(*cols, has_blob).where(TaskRouting.task_id.in_(ids))).all()
    where = str(session.get_bind().engine.url)
    typical = {int(r.task_id): _TYPICAL.get((where, int(r.task_id), int(r.version or 0), r.updated_at)) for r in rows}
    missing = [t for t, v in typical.items() if v is None]
    if missing:  # keyed by the version read with the scores (a write may land between the two reads)
        for t, version, at, scores, views, rate in session.execute(
                select(TaskRouting.task_id, TaskRouting.version, TaskRouting.updated_at, TaskRouting.cal_scores,
                       TaskRouting.cal_views, TaskRouting.false_reject_rate)
                .where(TaskRouting.task_id.in_(missing))).all():
            value = (typical_score(scores) if scores else None, split_threshold(scores, rate),
                     LengthViews.from_records(views))
            _TYPICAL.put((where, int(t), int(version or 0), at), value)
            typical[int(t)] = value
    return {int(r.task_id): resolve(r, *(typical.get(int(r.task_id)) or (None, None, None))) for r in rows}


def prompt_digest(blob: bytes) -> bytes:
    """What ``task_routing.prompt_digest`` holds for a prompt-side state ``blob``: its trailing digest."""
    return bytes(blob[-_DIGEST_BYTES:])


def _prompt_blobs(session: Session, task_ids: Sequence[int]) -> dict[int, bytes]:
    """The prompt-side state blobs of ``task_ids`` (those that have one)."""
    if not task_ids:
        return {}
    rows = session.execute(select(TaskRouting.task_id, TaskRouting.prompt_state)
                           .where(TaskRouting.task_id.in_([int(i) for i in task_ids]),
                                  TaskRouting.prompt_state.is_not(None)))
    return {int(t): bytes(b) for t, b in rows if b is not None}


def get_held_out_scores(session: Session, task_ids: Sequence[int]) -> dict[int, list[float]]:
    """The stored held-out (leave-one-out) calibration scores of the tasks."""
    if not task_ids:
        return {}
    rows = session.execute(
        select(TaskRouting.task_id, TaskRouting.cal_scores).where(TaskRouting.task_id.in_([int(i) for i in task_ids]))
    ).all()
    return {int(t): [float(x) for x in (s or [])] for t, s in rows}


def false_reject_rates(session: Session, task_ids: Sequence[int]) -> dict[int, float]:
    """The false-reject rate each task's threshold is calibrated at (:func:`calibration_rate`), of the tasks that
    have a routing row."""
    if not task_ids:
        return {}
    rows = session.execute(select(TaskRouting.task_id, TaskRouting.false_reject_rate)
                           .where(TaskRouting.task_id.in_([int(i) for i in task_ids]))).all()
    return {int(t): calibration_rate(rate) for t, rate in rows}


def prompt_side_task_ids(session: Session, space_id: int, *, limit: int) -> list[int]:
    """Ready tasks of a space that route on a prompt-side state (completion mode), by id."""
    ids = session.execute(
        select(TaskRouting.task_id).join(Task, Task.id == TaskRouting.task_id)
        .where(Task.space_id == space_id, Task.status == TASK_READY, TaskRouting.prompt_state.is_not(None))
        .order_by(TaskRouting.task_id).limit(limit)
    ).scalars()
    return [int(i) for i in ids]


def store_routing(session: Session, task_id: int, *, prompt_state: bytes | None, calibration: Calibration,
                  views: Sequence[Sequence[object]] = ()) -> None:
    """Write a task's prompt-side state (``None`` keeps none), calibration and held-out views by length (``[tokens,
    score, whole]`` records, :func:`atlas.routing.leave_one_out_views`; the last ``MAX_CAL_VIEWS`` kept); the
    override is kept."""
    row = get_routing(session, task_id)
    now = utcnow()
    digest = None if prompt_state is None else prompt_digest(prompt_state)
    values = {"prompt_state": prompt_state, "prompt_digest": digest, "cal_scores": list(calibration.scores),
              "cal_views": [list(v) for v in views][-MAX_CAL_VIEWS:] or None,
              "threshold_auto": calibration.threshold, "score_scale": calibration.scale,
              "false_reject_rate": calibration.false_reject_rate}
    if row is None:
        session.add(TaskRouting(task_id=int(task_id), version=1, updated_at=now, **values))
    else:
        for key, value in values.items():
            setattr(row, key, value)
        row.version = (row.version or 0) + 1
        row.updated_at = now
    session.flush()


def route_threshold(value: object) -> float:
    """``value`` as a route threshold: a number (not a bool) in [−1, 1], the route score's range.

    Raises
    ------
    InvalidInput
        Anything else (NaN included).
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not -1.0 <= float(value) <= 1.0:
        raise InvalidInput("a route threshold is a cosine in [-1, 1]", {"threshold": str(value)})
    return float(value)


def set_threshold_override(session: Session, task_id: int, threshold: float | None) -> TaskRouting:
    """Set (or clear, with ``None``) a task's threshold override (:func:`route_threshold`); creates its row
    when missing."""
    value = None if threshold is None else route_threshold(threshold)
    row = _routing_row(session, task_id)
    row.threshold_override = value
    session.flush()
    return row


def _routing_row(session: Session, task_id: int) -> TaskRouting:
    """The task's routing row, its version bumped (created when missing)."""
    if session.get(Task, int(task_id)) is None:
        raise NotFound(f"task {task_id} does not exist", {"task_id": task_id})
    row = get_routing(session, task_id)
    now = utcnow()
    if row is None:
        row = TaskRouting(task_id=int(task_id), version=1, cal_scores=[], updated_at=now)
        session.add(row)
    else:
        row.version = (row.version or 0) + 1
        row.updated_at = now
    return row


def set_false_reject_rate(session: Session, task_id: int, rate: float) -> TaskRouting:
    """Re-calibrate a task's threshold at another false-reject rate from its stored held-out scores (no model
    needed); later jobs of the task calibrate at it too. Creates its row when missing.

    Raises
    ------
    InvalidInput
        ``rate`` outside ``(0, MAX_FALSE_REJECT_RATE]``.
    """
    if not is_false_reject_rate(rate):
        raise InvalidInput(f"a false-reject rate is in (0, {MAX_FALSE_REJECT_RATE}]", {"false_reject_rate": rate})
    row = _routing_row(session, task_id)
    calibration = calibrate(list(row.cal_scores or []), float(rate))
    row.threshold_auto, row.false_reject_rate = calibration.threshold, calibration.false_reject_rate
    if calibration.scale is not None:
        row.score_scale = calibration.scale
    session.flush()
    return row


def calibration_rate(stored: float | None) -> float:
    """The false-reject rate a task calibrates at: its stored one (``task_routing.false_reject_rate``, set by
    :func:`set_false_reject_rate`), else the documented default."""
    return FALSE_REJECT_RATE if stored is None else float(stored)


def set_template_test(session: Session, task_id: int, enabled: bool) -> TaskRouting:
    """Turn the template test (:mod:`atlas.template`) on or off for a task; creates its row when missing."""
    row = _routing_row(session, task_id)
    row.template_test = bool(enabled)
    session.flush()
    return row


def set_novelty_test(session: Session, task_id: int, enabled: bool) -> TaskRouting:
    """Turn the novelty test (:mod:`atlas.novelty`) on or off for a task; creates its row when missing. Off, the
    task is routed as one without a test: at its full-rate route threshold."""
    row = _routing_row(session, task_id)
    row.novelty_test = bool(enabled)
    session.flush()
    return row


def export_records(session: Session, task_ids: Sequence[int]) -> dict[int, dict[str, object]]:
    """JSON-able routing records of the tasks that have one (for space export)."""
    import base64

    if not task_ids:
        return {}
    rows = session.execute(select(TaskRouting).where(TaskRouting.task_id.in_([int(i) for i in task_ids]))).scalars()
    terms = lexicon_repo.get_blobs(session, task_ids)
    return {int(r.task_id): {
        "prompt_state": None if r.prompt_state is None else base64.b64encode(r.prompt_state).decode(),
        "cal_scores": list(r.cal_scores or []), "cal_views": list(r.cal_views or []),
        "threshold_override": r.threshold_override,
        "false_reject_rate": r.false_reject_rate, "template_test": r.template_test is not False,
        "novelty_test": r.novelty_test is not False,
        "terms": None if r.task_id not in terms else base64.b64encode(terms[r.task_id]).decode(),
    } for r in rows}


def import_record(session: Session, task_id: int, record: object, spec: object) -> None:
    """Restore an exported routing record (validated: the prompt-side state must fit ``spec``)."""
    import base64

    from fishersketch import SketchState

    if not isinstance(record, dict):
        return
    try:
        blob = base64.b64decode(record["prompt_state"], validate=True) if record.get("prompt_state") else None
        if blob is not None:
            SketchState.from_bytes(blob, spec=spec)  # type: ignore[arg-type]  # a SketchSpec
        raw_scores = record.get("cal_scores") or []
        if not isinstance(raw_scores, list) or not all(
                isinstance(x, int | float) and not isinstance(x, bool) and -1.0 <= float(x) <= 1.0 for x in raw_scores):
            # route scores are cosines (1e308 overflowed calibrate; a string was read a character at a time)
            raise ValueError("cal_scores must be a list of route scores in [-1, 1]")
        scores = [float(x) for x in raw_scores]
        for switch in ("template_test", "novelty_test"):  # a "false" or 0 was dropped: the test stayed on
            if record.get(switch) is not None and not isinstance(record.get(switch), bool):
                raise ValueError(f"{switch} must be true or false, not {record.get(switch)!r}")
        views = validate_views(record.get("cal_views"))  # absent from exports written before 2026-11-28
        override = record.get("threshold_override")
        if override is not None:
            route_threshold(override)
        frr = record.get("false_reject_rate")
        frr = FALSE_REJECT_RATE if frr is None else frr
        if not is_false_reject_rate(frr):
            raise ValueError(f"false_reject_rate {frr!r} is not in (0, {MAX_FALSE_REJECT_RATE}]")
        calibration = calibrate(scores, float(frr))
        terms = (lexicon_repo.LexicalRecord.from_bytes(base64.b64decode(record["terms"], validate=True))
                 if record.get("terms") else None)
    except Exception as exc:
        raise InvalidInput(f"invalid routing record ({exc})") from None
    store_routing(session, task_id, prompt_state=blob, calibration=calibration, views=views)
    if terms is not None:
        lexicon_repo.put_record(session, task_id, terms)
    if override is not None:
        set_threshold_override(session, task_id, float(override))
    if record.get("template_test") is False:
        set_template_test(session, task_id, False)
    if record.get("novelty_test") is False:
        set_novelty_test(session, task_id, False)


def _prompt_view(blob: bytes, spec: Any) -> tuple[Any, Any]:
    """A prompt-side state blob deserialised, with its :func:`state_view`."""
    from fishersketch import SketchState

    state = SketchState.from_bytes(blob, spec=spec)
    return state, state_view(state)


def route_candidates(session: Any, spec: Any, loaded: Sequence[Any], faiss_score: Mapping[int, float]) -> list[Any]:
    """Re-rank candidates for loaded tasks: prompt-side state where the task has one, thresholds, terms, template.

    Parameters
    ----------
    session
        Open session (the routing rows are read through :mod:`atlas.routing_repo`).
    spec
        The space's sketch spec (to deserialise prompt-side states).
    loaded
        Objects with ``task_id``, ``name``, ``state`` and ``view`` (``atlas.services.Loaded``).
    faiss_score
        ANN score per task id (0 for tasks added because they route on a prompt-side state).
    """

    routes = get_task_routes(session, [x.task_id for x in loaded])
    lexicon = lexicon_repo.get_task_lexicon(session, [x.task_id for x in loaded])
    # Content-addressed: a state blob ends with its own BLAKE2b digest, so two stores in one process (a server
    # and a library, or tests) never share an entry by task id. Blobs are read only for views not cached.
    fp = spec.fingerprint()
    # Keyed by the stored digest *and* the row's version. A replica older than migration 0006 (rolling upgrade)
    # writes a blob without a digest (a miss, always) or rewrites one and leaves the old digest; every writer bumps
    # the version, so that rewrite is a miss too, not the previous blob's view.
    views = {t: None if r.prompt_digest is None else _PROMPT_VIEWS.get((fp, r.prompt_digest, r.version))
             for t, r in routes.items() if r.prompt_side}
    for t, blob in _prompt_blobs(session, [t for t, v in views.items() if v is None]).items():
        r = routes[t]
        key = (fp, prompt_digest(blob) if r.prompt_digest is None else r.prompt_digest, r.version)
        views[t] = _PROMPT_VIEWS.get_or_make(key, functools.partial(_prompt_view, blob, spec))
    out = []
    for x in loaded:
        r = routes.get(x.task_id, TaskRoute())
        state, view = x.state, x.view
        cached = views.get(x.task_id)
        if cached is not None:
            state, view = cached
        lex = lexicon.get(x.task_id)
        out.append(Candidate(x.task_id, x.name, state, float(faiss_score.get(x.task_id, 0.0)), view,
                             threshold=r.threshold, scale=r.scale, typical=r.typical,
                             terms=None if lex is None else lex.terms,
                             template=lex.template if lex is not None and r.template_test else None,
                             false_reject_rate=r.false_reject_rate, overridden=r.overridden,
                             split_threshold=r.split_threshold, novelty_test=r.novelty_test,
                             length_views=r.length_views, calibrated=r.calibrated))
    return out


def with_prompt_side(session: Any, space_id: int, ids: Sequence[int], cap: int = 256) -> list[int]:
    """``ids`` plus up to ``cap`` tasks of the space that route on a prompt-side state.

    Completion-mode tasks are indexed by their completion signature, which a prompt does not resemble,
    so the ANN stage may miss them; they are always re-ranked.
    """

    have = set(ids)
    extra = [i for i in prompt_side_task_ids(session, space_id, limit=cap) if i not in have]
    return list(ids) + extra
