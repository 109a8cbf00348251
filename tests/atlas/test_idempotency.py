"""``Idempotency-Key`` binding (``atlas.idempotency``) on SQLite and PostgreSQL.

A key is bound to the whole request, metadata included: the same key with other metadata was answered with the
first request's task (HTTP 202 instead of 409) before the request's digest was stored beside its job (revision 0010).
"""

from __future__ import annotations

import json
from itertools import count
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from atlas import repository
from atlas.errors import Conflict
from atlas.models import JobRequest
from atlas.samples import Sample
from tests.atlas.fixtures import make_space

SAMPLES = [Sample(text="alpha beta"), Sample(prompt="Q?", completion="A.")]

_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=4)
"""Metadata strings (NUL is refused in metadata: 422)."""
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-10, 10) | _TEXT,
                     lambda inner: st.lists(inner, max_size=2) | st.dictionaries(_TEXT, inner, max_size=2),
                     max_leaves=4)
_METADATA = st.dictionaries(st.sampled_from(["src", "lang", "n", "tags"]), _JSON, max_size=3)


def test_a_key_replayed_with_other_metadata_is_a_conflict(factory: sessionmaker[Session]) -> None:
    space = make_space(factory)
    with factory.begin() as s:
        first, job = repository.create_task_with_job(s, space.id, "qa", "text", {"src": "a", "n": 1}, SAMPLES,
                                                     idempotency_key="k")
    with factory.begin() as s:  # the same request, its metadata's keys in another order: a replay
        again, again_job = repository.create_task_with_job(s, space.id, "qa", "text", {"n": 1, "src": "a"}, SAMPLES,
                                                           idempotency_key="k")
    assert (again.id, again_job.id) == (first.id, job.id)
    with pytest.raises(Conflict) as err, factory.begin() as s:
        repository.create_task_with_job(s, space.id, "qa", "text", {"src": "b", "n": 1}, SAMPLES,
                                        idempotency_key="k")
    assert err.value.detail["job_id"] == job.id
    with pytest.raises(Conflict), factory.begin() as s:  # an append under a create's key
        repository.append_samples(s, first.id, SAMPLES, idempotency_key="k")


def test_a_replay_answers_the_request_not_the_tasks_current_metadata(factory: sessionmaker[Session]) -> None:
    """A PATCH after the create does not turn the create's own retry into a conflict."""
    space = make_space(factory)
    with factory.begin() as s:
        task, job = repository.create_task_with_job(s, space.id, "qa", "text", {"src": "a"}, SAMPLES,
                                                    idempotency_key="k")
    with factory.begin() as s:
        repository.update_task(s, task.id, metadata={"src": "patched"}, name="renamed")
    with factory.begin() as s:
        again, again_job = repository.create_task_with_job(s, space.id, "qa", "text", {"src": "a"}, SAMPLES,
                                                           idempotency_key="k")
    assert (again.id, again_job.id) == (task.id, job.id)


def test_a_job_stored_before_the_digest_is_checked_as_before(factory: sessionmaker[Session]) -> None:
    """A key stored before revision 0010 (no digest) replays on kind, name, mode and samples, as it did."""
    space = make_space(factory)
    with factory.begin() as s:
        task, job = repository.create_task_with_job(s, space.id, "qa", "text", {"src": "a"}, SAMPLES,
                                                    idempotency_key="old")
    with factory.begin() as s:
        s.execute(delete(JobRequest).where(JobRequest.job_id == job.id))
    with factory.begin() as s:
        again, _ = repository.create_task_with_job(s, space.id, "qa", "text", {"src": "other"}, SAMPLES,
                                                   idempotency_key="old")
    assert again.id == task.id
    with pytest.raises(Conflict), factory.begin() as s:
        repository.create_task_with_job(s, space.id, "qa", "text", {"src": "a"}, SAMPLES[:1], idempotency_key="old")


def test_keyless_jobs_store_no_digest(factory: sessionmaker[Session]) -> None:
    space = make_space(factory)
    with factory.begin() as s:
        _, job = repository.create_task_with_job(s, space.id, "qa", "text", {}, SAMPLES)
        assert s.get(JobRequest, job.id) is None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=_METADATA, second=_METADATA)
def test_a_replay_is_answered_exactly_when_its_metadata_is_the_same(
        factory: sessionmaker[Session], first: dict[str, Any], second: dict[str, Any]) -> None:
    space = make_space(factory)
    key = f"prop-{next(_KEYS)}"
    with factory.begin() as s:
        task, _ = repository.create_task_with_job(s, space.id, key, "text", first, SAMPLES, idempotency_key=key)
    try:
        with factory.begin() as s:
            again, _ = repository.create_task_with_job(s, space.id, key, "text", second, SAMPLES,
                                                       idempotency_key=key)
    except Conflict:
        assert _json(first) != _json(second)
    else:  # (``==`` alone is no oracle: ``{"n": True} == {"n": 1}`` in Python, two requests in JSON)
        assert _json(first) == _json(second) and again.id == task.id


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


_KEYS = count()


@pytest.mark.parametrize("db_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)
def test_one_keyed_append_through_two_replicas_at_once_is_one_job(factory: sessionmaker[Session]) -> None:
    """Two replicas take the same keyed append at once: the second waited for the task's lock, then refused the
    first one's upload as a repeat (409) instead of replaying its job (a multi-replica review, 2026-12-07)."""
    import threading

    space = make_space(factory)
    with factory.begin() as s:
        task, _ = repository.create_task_with_job(s, space.id, "t", "text", {}, [Sample(text="alpha beta gamma")])
        task_id = task.id
    more = [Sample(text="delta epsilon"), Sample(text="zeta eta theta")]
    first = factory()
    first.begin()
    job = repository.append_samples(first, task_id, more, idempotency_key="same-append")  # holds the task's lock
    answers: list[Any] = []

    def second() -> None:
        try:
            with factory.begin() as s:
                answers.append(repository.append_samples(s, task_id, more, idempotency_key="same-append").id)
        except Exception as exc:
            answers.append(exc)

    other = threading.Thread(target=second)
    other.start()
    other.join(1.0)
    assert other.is_alive()  # waiting for the lock
    job_id = job.id
    first.commit()
    first.close()
    other.join(30)
    assert answers == [job_id], answers  # the replay, not a 409
