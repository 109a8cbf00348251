"""Fixtures shared by every test package.

* The database fixtures (``db_url`` over SQLite and PostgreSQL, ``engine``, ``factory``, ``ro_factory``)
  live in :mod:`tests.atlas.fixtures` and are registered here, once, for the store and job tests.
* One torch intra-op thread per test: tiny GEMMs only contend on a shared 2-core box (20x slower).
* ``redis_url``: the local Redis (``FISHER_ATLAS_TEST_REDIS_URL``); a test that needs it is skipped without it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

pytest_plugins = ["tests.atlas.fixtures"]

REDIS_URL = os.environ.get("FISHER_ATLAS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The local Redis; the test is skipped when it does not answer."""
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except Exception as exc:
        pytest.skip(f"Redis at {REDIS_URL} is unreachable: {exc}")
    return REDIS_URL


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Run each test with one intra-op thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
