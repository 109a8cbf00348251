"""Fixtures shared by every test package.

* The database fixtures (``db_url`` over SQLite and PostgreSQL, ``engine``, ``factory``, ``ro_factory``)
  live in :mod:`tests.atlas.fixtures` and are registered here, once, for the store and job tests.
* One torch intra-op thread per test: tiny GEMMs only contend on a shared 2-core box (20x slower).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

pytest_plugins = ["tests.atlas.fixtures"]


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Run each test with one intra-op thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
