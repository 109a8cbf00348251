"""A model's identity is its content (config, weights, head, tokenizer), not its path; non-causal models are
refused; a hub model in the local cache loads without a network and without HF_HUB_OFFLINE."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from transformers import AutoModelForCausalLM, BertConfig, BertForMaskedLM

from atlas import repository
from atlas.errors import ModelUnavailable
from atlas.models import Space, Task
from atlas.samples import Sample
from atlas.settings import Settings
from tests.tiny_models import build_tokenizer
from workers.model_identity import weights_sha256
from workers.model_loading import LoadedModel, load_causal_lm
from workers.worker_context import ensure_space

REPO = Path(__file__).resolve().parents[2]


def test_a_moved_or_copied_model_keeps_its_key(gpt2_dir: Path, gpt2_lm: LoadedModel, tmp_path: Path) -> None:
    moved = shutil.copytree(gpt2_dir, tmp_path / "elsewhere" / "model")
    lm = load_causal_lm(str(moved), device="cpu")
    assert lm.fingerprint.key() == gpt2_lm.fingerprint.key()
    assert lm.fingerprint.name == str(moved.resolve()) != gpt2_lm.fingerprint.name
    # the path-based key of before differs: that is what left a moved model's tasks behind
    assert lm.fingerprint.previous_keys[-1] != gpt2_lm.fingerprint.previous_keys[-1]


def test_retrained_body_weights_give_another_key(gpt2_dir: Path, gpt2_lm: LoadedModel, tmp_path: Path) -> None:
    """Weights the head hash does not see (a transformer block) retrained in place, same directory name."""
    target = shutil.copytree(gpt2_dir, tmp_path / "model")
    before = load_causal_lm(str(target), device="cpu").fingerprint
    model = AutoModelForCausalLM.from_pretrained(target)
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight.add_(0.01 * torch.randn_like(model.transformer.h[0].mlp.c_fc.weight))
    model.save_pretrained(target)
    after = load_causal_lm(str(target), device="cpu").fingerprint
    assert (after.config_sha256, after.head_sha256, after.name) == (before.config_sha256, before.head_sha256,
                                                                    before.name)
    assert after.weights_sha256 != before.weights_sha256 and after.key() != before.key()
    assert before.key() == gpt2_lm.fingerprint.key()


def test_weights_digest_ignores_parameter_order_and_samples_large_tensors() -> None:
    a = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.Linear(200, 3))
    b = copy.deepcopy(torch.nn.ModuleDict({"head": a[1], "body": a[0]}))  # same values, other order and names
    assert weights_sha256(a) == weights_sha256(b)
    with torch.no_grad():
        b["body"].weight[0, 0] += 1.0  # element 0 is always sampled
    assert weights_sha256(a) != weights_sha256(b)


def test_another_tokenizer_gives_another_key(gpt2_dir: Path, gpt2_lm: LoadedModel, tmp_path: Path) -> None:
    target = shutil.copytree(gpt2_dir, tmp_path / "model")
    for f in target.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            f.unlink()
    build_tokenizer(vocab_size=300).save_pretrained(target)  # fits the model's 320 rows, other merges
    lm = load_causal_lm(str(target), device="cpu")
    assert lm.fingerprint.weights_sha256 == gpt2_lm.fingerprint.weights_sha256
    assert lm.fingerprint.tokenizer_sha256 != gpt2_lm.fingerprint.tokenizer_sha256
    assert lm.fingerprint.key() != gpt2_lm.fingerprint.key()


def test_a_masked_lm_is_refused_as_not_causal(tmp_path: Path) -> None:
    """AutoModelForCausalLM builds a BertLMHeadModel from a BertForMaskedLM folder; its attention is
    bidirectional, so every position would see the token it is to predict."""
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    BertForMaskedLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelUnavailable, match="not a causal LM") as info:
        load_causal_lm(str(tmp_path), device="cpu")
    assert info.value.detail["early_change"] > 0


@pytest.mark.parametrize("scheme", [0, 1], ids=["library-config-key", "path-key"])
def test_a_space_under_a_previous_key_is_re_keyed_with_its_tasks(
        factory: sessionmaker[Session], db_url: str, gpt2_dir: Path, gpt2_lm: LoadedModel, tmp_path: Path,
        scheme: int) -> None:
    settings = Settings(data_dir=tmp_path, database_url=db_url, model=str(gpt2_dir), device="cpu", sketch_dim=256)
    fp = gpt2_lm.fingerprint
    assert len(set(fp.previous_keys)) == 2 and fp.key() not in fp.previous_keys
    spec = gpt2_lm.make_spec(m=256, seed=settings.sketch_seed, error_projection=settings.error_projection)
    with factory.begin() as s:  # what a version before stored
        old = repository.get_or_create_space(
            s, model_fingerprint=fp.previous_keys[scheme], spec_fingerprint=spec.fingerprint(), model_name=fp.name,
            d=spec.d, K=spec.K, m=spec.m, seed=spec.seed, spec=spec.to_dict())
        task, _ = repository.create_task_with_job(s, old.id, "kept", "text", None, [Sample(text="a b c d")])
        old_id, task_id = old.id, task.id
    with factory.begin() as s:
        space = ensure_space(s, gpt2_lm, settings)
        assert (space.id, space.model_fingerprint) == (old_id, fp.key())
    with factory() as s:
        assert s.execute(select(Space.model_fingerprint).where(Space.id == old_id)).scalar_one() == fp.key()
        assert s.execute(select(Task.space_id).where(Task.id == task_id)).scalar_one() == old_id
        again = ensure_space(s, gpt2_lm, settings)
        assert again.id == old_id and len(s.execute(select(Space)).scalars().all()) == 1


def _hub_cache(root: Path, repo_id: str, model_dir: Path, commit: str) -> Path:
    """A Hugging Face hub cache holding ``model_dir``'s files as ``repo_id`` at ``commit`` (refs/main)."""
    repo = root / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    shutil.copytree(model_dir, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return root


def test_a_cached_hub_model_loads_when_the_hub_is_unreachable(gpt2_dir: Path, gpt2_lm: LoadedModel,
                                                              tmp_path: Path) -> None:
    """No HF_HUB_OFFLINE, no network (the endpoint refuses connections): one probe, then the cache only; the
    resolved commit is reported, and the key is the same as from the directory."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    home = _hub_cache(tmp_path / "hf", "acme/tiny-gpt2", gpt2_dir, commit)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_HOME=str(home), HF_ENDPOINT="http://127.0.0.1:9", PYTHONPATH=str(REPO))
    code = ("from workers.model_loading import load_causal_lm; lm = load_causal_lm('acme/tiny-gpt2', device='cpu'); "
            "print(lm.fingerprint.revision, lm.fingerprint.key())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [commit, gpt2_lm.fingerprint.key()]
    assert "is not reachable" in out.stderr and "local cache only" in out.stderr


def _export_under_key(gpt2_dir: Path, gpt2_lm: LoadedModel, tmp_path: Path, key: str) -> tuple[list[str], Path]:
    """A one-task export of the model's space rewritten as a version of before wrote it: its space under ``key``
    (checksum made again). Returns the task's texts and the file."""
    from fisher_atlas import Atlas

    texts = [f"the {w} fox jumps over the lazy dog number {i}" for i, w in enumerate(["red", "blue"] * 8)]
    with Atlas(tmp_path / "old", model=str(gpt2_dir), sketch_dim=256, device="cpu") as atlas:
        atlas.add("foxes", texts, progress=False)
        export = atlas.export(tmp_path / "space.jsonl")
    header, *lines, trailer = export.read_text().splitlines()
    head = json.loads(header)
    assert head["space"]["model_fingerprint"] == gpt2_lm.fingerprint.key()
    head["space"]["model_fingerprint"] = key
    body = "\n".join([json.dumps(head), *lines]) + "\n"
    end = json.loads(trailer) | {"sha256": hashlib.sha256(body.encode()).hexdigest()}
    export.write_text(body + json.dumps(end) + "\n")
    return texts, export


def test_an_export_written_under_the_previous_key_imports_into_the_models_space(
        gpt2_dir: Path, gpt2_lm: LoadedModel, tmp_path: Path) -> None:
    """A library (or service) upgraded to content fingerprints imports an older export into its own space."""
    from fisher_atlas import Atlas

    texts, export = _export_under_key(gpt2_dir, gpt2_lm, tmp_path, gpt2_lm.fingerprint.previous_keys[0])
    with Atlas(tmp_path / "new", model=str(gpt2_dir), sketch_dim=256, device="cpu") as atlas:
        assert atlas.import_(export) == 1
        assert [t.name for t in atlas.tasks()] == ["foxes"]  # in the served space, not a stranded one
        assert atlas.route(texts[0], threshold=-1.0).matches[0].name == "foxes"


def test_the_key_is_the_model_files_not_the_installed_transformers_defaults(
        gpt2_dir: Path, gpt2_lm: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A packaging review (2026-12-07): the same model directory under transformers 4.56 had another key than under
    5.25 (``config.to_dict()`` held 38 more library defaults), so a store's tasks were in "another space" and a
    worker of another version served an empty one. The digest is over the model's ``config.json``."""
    from transformers import PretrainedConfig

    to_dict, to_diff_dict = PretrainedConfig.to_dict, PretrainedConfig.to_diff_dict
    # another library version: more defaults filled in, and another idea of what differs from them
    monkeypatch.setattr(PretrainedConfig, "to_dict", lambda self: {**to_dict(self), "top_k": 50, "num_beams": 1})
    monkeypatch.setattr(PretrainedConfig, "to_diff_dict",
                        lambda self: {**to_diff_dict(self), "add_cross_attention": False})
    other = load_causal_lm(str(gpt2_dir), device="cpu").fingerprint
    assert other.key() == gpt2_lm.fingerprint.key()
    assert other.previous_keys[0] != gpt2_lm.fingerprint.previous_keys[0]  # the library-config key of before moved
    monkeypatch.undo()
    # what the config states still counts: another layer-norm epsilon is another model
    changed = shutil.copytree(gpt2_dir, tmp_path / "model")
    config = json.loads((changed / "config.json").read_text())
    config["layer_norm_epsilon"] = 1e-3
    (changed / "config.json").write_text(json.dumps(config))
    assert load_causal_lm(str(changed), device="cpu").fingerprint.key() != gpt2_lm.fingerprint.key()
    # a model built in memory (no file) is keyed by what save_pretrained would write: the same key
    built = LoadedModel.from_model(AutoModelForCausalLM.from_pretrained(gpt2_dir), gpt2_lm.tokenizer, name="mem")
    assert built.fingerprint.key() == gpt2_lm.fingerprint.key()


@pytest.mark.parametrize("scheme", [0, 1], ids=["library-config-key", "path-key"])
def test_an_export_under_an_earlier_key_imports_into_the_served_space_where_no_model_is_loaded(
        gpt2_dir: Path, gpt2_lm: LoadedModel, tmp_path: Path, scheme: int) -> None:
    """A diff review (2026-12-07): an API replica without the model (a scaled-out deployment) knew no earlier key, so
    an export written before the key changed made a second space that no worker served. A process that loads the
    model stores its earlier keys (``model_key_aliases``); the import reads them."""
    from fisher_atlas import Atlas

    texts, export = _export_under_key(gpt2_dir, gpt2_lm, tmp_path, gpt2_lm.fingerprint.previous_keys[scheme])
    served = tmp_path / "served"
    with Atlas(served, model=str(gpt2_dir), sketch_dim=256, device="cpu"):
        pass  # a worker's start: the model's space, and its earlier keys stored
    with Atlas(served, require_model=False, model=str(tmp_path / "no-model-here"), sketch_dim=256,  # no model here
               device="cpu") as api, pytest.warns(UserWarning, match="space 1 is not served by this service"):
        assert api.import_(export) == 1  # into space 1: the served one
    with Atlas(served, model=str(gpt2_dir), sketch_dim=256, device="cpu") as atlas:
        assert [t.name for t in atlas.tasks()] == ["foxes"]
        assert atlas.task("foxes").space_id == 1  # the served space, not a second one
        assert atlas.route(texts[0], threshold=-1.0).matches[0].name == "foxes"
