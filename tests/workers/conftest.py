"""Fixtures for the workers tests: tiny real models saved to disk once per session and loaded back, and the job
tests' worker context (``settings``, ``ctx``, ``space_id``) over the real store (``db_url``: SQLite and PostgreSQL)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers / huggingface_hub are imported
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path

import pytest
import torch
from sqlalchemy.orm import Session, sessionmaker

from atlas.settings import Settings
from tests.tiny_models import save_tiny_gpt2, save_tiny_llama
from tests.workers.job_helpers import EVERY, M
from workers.model_loading import LoadedModel, load_causal_lm
from workers.worker_context import WorkerContext, ensure_space

torch.set_num_threads(1)  # tiny models: intra-op threads only add contention on a shared 2-core box


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_gpt2(tmp_path_factory.mktemp("models") / "tiny-gpt2")


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def gpt2_lm(gpt2_dir: Path) -> LoadedModel:
    return load_causal_lm(str(gpt2_dir), device="cpu")


@pytest.fixture(scope="session")
def llama_lm(llama_dir: Path) -> LoadedModel:
    return load_causal_lm(str(llama_dir), device="cpu")


@pytest.fixture(scope="session", params=["gpt2", "llama"])
def tiny_lm(request: pytest.FixtureRequest) -> LoadedModel:
    """Each tiny architecture in turn."""
    return request.getfixturevalue(f"{request.param}_lm")


TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Question: is the sky blue? Answer: yes.",
    "CC(=O)OC1=CC=CC=C1C(=O)O",
    "Fisher alignment compares the geometry of tasks through their head gradients.",
    "A vector database stores signatures.",
    "Hi there",
)


@pytest.fixture
def texts() -> list[str]:
    """A few short texts of different lengths that the tiny tokenizer knows."""
    return list(TEXTS)


@pytest.fixture
def settings(db_url: str, gpt2_dir: Path, tmp_path: Path) -> Settings:
    """The job tests' settings: the store at ``db_url``, the tiny GPT-2, a checkpoint every ``EVERY`` samples."""
    return Settings(
        data_dir=tmp_path, database_url=db_url, model=str(gpt2_dir), device="cpu", sketch_dim=M,
        checkpoint_every=EVERY, job_stale_after_s=1.0, max_tokens_per_sample=64,
    )


@pytest.fixture
def ctx(settings: Settings, factory: sessionmaker[Session], gpt2_lm: LoadedModel) -> WorkerContext:
    """A worker's context on the store with the tiny GPT-2 loaded."""
    return WorkerContext(settings=settings, factory=factory, lm=gpt2_lm)


@pytest.fixture
def space_id(ctx: WorkerContext) -> int:
    """The id of the model's space in the store (created)."""
    with ctx.factory.begin() as s:
        return ensure_space(s, ctx.lm, ctx.settings).id
