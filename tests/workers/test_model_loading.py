"""Loading tiny causal LMs from disk, offline errors and model fingerprints."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import workers.model_loading as ml
from atlas.errors import InvalidInput, ModelUnavailable
from tests.tiny_models import save_tiny_gpt2
from workers.model_loading import BUNDLED_MODEL_DIR, LoadedModel, load_causal_lm


def test_loads_local_dir_in_eval_mode_without_grad(tiny_lm: LoadedModel) -> None:
    assert not tiny_lm.model.training
    assert all(not p.requires_grad for p in tiny_lm.model.parameters())
    assert tiny_lm.tokenizer.pad_token_id is not None
    assert tiny_lm.device == torch.device("cpu") and tiny_lm.dtype == torch.float32
    assert tiny_lm.head.weight.shape[0] == tiny_lm.K and tiny_lm.d == tiny_lm.hidden_size == 32
    assert tiny_lm.max_positions == 256


def test_fingerprint_is_stable_and_content_sensitive(gpt2_dir: Path, gpt2_lm: LoadedModel, llama_lm: LoadedModel,
                                                     tmp_path: Path) -> None:
    again = load_causal_lm(str(gpt2_dir), device="cpu")
    assert again.fingerprint == gpt2_lm.fingerprint and again.fingerprint.key() == gpt2_lm.fingerprint.key()
    fp = gpt2_lm.fingerprint
    assert fp.name == str(gpt2_dir.resolve()) and fp.revision is None
    assert len(fp.config_sha256) == 64 and len(fp.head_sha256) == 64 and len(fp.key()) == 20
    assert llama_lm.fingerprint.key() != fp.key()
    # other weights, same architecture: same config hash, different head hash and key
    other = load_causal_lm(str(save_tiny_gpt2(tmp_path / "seed1", seed=1)), device="cpu")
    assert other.fingerprint.config_sha256 == fp.config_sha256
    assert other.fingerprint.head_sha256 != fp.head_sha256 and other.fingerprint.key() != fp.key()


def test_dtypes(gpt2_dir: Path, gpt2_lm: LoadedModel) -> None:
    bf16 = load_causal_lm(str(gpt2_dir), device="cpu", dtype="bf16")
    assert bf16.dtype == torch.bfloat16 and bf16.model.dtype == torch.bfloat16
    # the head hash is over float32 values: rounding to bf16 changes it
    assert bf16.fingerprint.head_sha256 != gpt2_lm.fingerprint.head_sha256
    with pytest.raises(InvalidInput, match="unsupported dtype"):
        load_causal_lm(str(gpt2_dir), dtype="int8")


def test_a_checkpoint_whose_values_a_dtype_holds_keeps_its_key_in_it(gpt2_dir: Path, tmp_path: Path) -> None:
    """The documented rule (docs/ARCHITECTURE.md, "Mixing is an error"): weights are hashed as loaded, so a
    bfloat16 checkpoint has one key in float32 and bfloat16, and a float32 one a key per dtype that rounds it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    saved = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(gpt2_dir, dtype=torch.bfloat16).save_pretrained(saved)
    AutoTokenizer.from_pretrained(gpt2_dir).save_pretrained(saved)
    keys = {dt: load_causal_lm(str(saved), device="cpu", dtype=dt).fingerprint.key() for dt in ("float32", "bfloat16")}
    assert keys["float32"] == keys["bfloat16"]
    rounded = {dt: load_causal_lm(str(gpt2_dir), device="cpu", dtype=dt).fingerprint.key()
               for dt in ("float32", "bfloat16")}
    assert rounded["float32"] != rounded["bfloat16"]


def test_device_resolution(gpt2_dir: Path) -> None:
    assert ml.resolve_device("cpu") == torch.device("cpu")
    assert ml.resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(InvalidInput):
        ml.resolve_device("tpu:0")
    if not torch.cuda.is_available():
        with pytest.raises(ModelUnavailable, match="CUDA is not available"):
            load_causal_lm(str(gpt2_dir), device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_loads_on_cuda(gpt2_dir: Path) -> None:
    lm = load_causal_lm(str(gpt2_dir), device="cuda", dtype="bfloat16")
    assert lm.device.type == "cuda"


def test_missing_local_path_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelUnavailable, match="does not exist") as info:
        load_causal_lm(str(missing))
    assert str(missing) in info.value.message


def test_dir_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelUnavailable, match=r"no config\.json"):
        load_causal_lm(str(tmp_path))


def test_dir_with_missing_tokenizer(gpt2_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "weights-only"
    target.mkdir()
    for f in gpt2_dir.iterdir():
        if f.name in ("config.json", "model.safetensors", "generation_config.json"):
            shutil.copy(f, target / f.name)
    with pytest.raises(ModelUnavailable, match="tokenizer"):
        load_causal_lm(str(target))


def test_unknown_hub_model_offline_explains_how_to_supply_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelUnavailable) as info:
        load_causal_lm("fisher-atlas-tests/definitely-not-cached", device="cpu")
    msg = info.value.message
    assert "fisher-atlas-tests/definitely-not-cached" in msg
    assert "local directory" in msg and "huggingface-cli download" in msg
    assert info.value.detail["model"] == "fisher-atlas-tests/definitely-not-cached"


def test_bundled_resolves_to_module_directory(monkeypatch: pytest.MonkeyPatch, gpt2_dir: Path, tmp_path: Path) -> None:
    assert Path(__file__).resolve().parents[2] / "workers" / "bundled_model" == BUNDLED_MODEL_DIR.resolve()
    monkeypatch.setattr(ml, "BUNDLED_MODEL_DIR", tmp_path / "absent")
    with pytest.raises(ModelUnavailable, match="bundled model is missing"):
        load_causal_lm("bundled")
    monkeypatch.setattr(ml, "BUNDLED_MODEL_DIR", gpt2_dir)
    lm = load_causal_lm("bundled", device="cpu")
    assert lm.fingerprint.name == "bundled" and lm.fingerprint.revision is None


def test_make_spec_matches_model(gpt2_lm: LoadedModel) -> None:
    spec = gpt2_lm.make_spec(m=256, seed=3)
    assert (spec.d, spec.K, spec.m, spec.seed) == (gpt2_lm.d, gpt2_lm.K, 256, 3)


def test_bad_names() -> None:
    with pytest.raises(InvalidInput):
        load_causal_lm("   ")


@pytest.mark.skipif(not (BUNDLED_MODEL_DIR / "config.json").is_file(), reason="bundled model not built")
def test_bundled_model_loads_and_extracts() -> None:
    from atlas.samples import Sample
    from workers.extraction import Extractor

    lm = load_causal_lm("bundled", device="cpu")
    assert lm.fingerprint.name == "bundled" and lm.d == lm.hidden_size and lm.head.weight.shape[0] == lm.K
    batches = list(Extractor(lm, None, logits_chunk=8).iter_head_batches([Sample(text="Hello there, world.")]))
    e = torch.cat([b.e for b in batches])
    torch.testing.assert_close(e.sum(dim=1), torch.zeros(e.shape[0]), atol=1e-5, rtol=0)


def test_sketch_gemm_dtype_is_bf16_only_for_a_bf16_model_on_a_gpu() -> None:
    """A float16 GEMM of the head inputs overflows (65504) where float32 and bf16 do not: float16 models are
    sketched in float32 (they were sketched in float16 on a GPU, and large activations gave a SketchError)."""
    import numpy as np

    from fishersketch import Sketcher, SketchError, SketchSpec

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert ml.sketch_dtype(torch.bfloat16, cuda) == torch.bfloat16
    assert ml.sketch_dtype(torch.float16, cuda) == torch.float32
    assert ml.sketch_dtype(torch.bfloat16, cpu) == ml.sketch_dtype(torch.float32, cuda) == torch.float32
    spec = SketchSpec(d=1024, K=300, m=256, seed=1)
    a = (torch.randn(4, 1024, generator=torch.Generator().manual_seed(0)) * 2500).to(torch.float16)  # fits fp16
    e = torch.softmax(torch.randn(4, 300, generator=torch.Generator().manual_seed(1)), -1)
    e[torch.arange(4), 0] -= 1
    with pytest.raises(SketchError):
        Sketcher(spec, dtype=torch.float16).sketch(a, e, np.arange(4))
    for dtype in (torch.float32, torch.bfloat16):
        assert np.isfinite(Sketcher(spec, dtype=dtype).sketch(a.to(dtype), e, np.arange(4)).signature()).all()


def test_a_checkpoint_without_its_head_or_a_layer_is_refused(tmp_path: Path) -> None:
    """transformers fills a checkpoint's missing tensors with random values and loads: a base model saved without
    its LM head was served with a random head, a new fingerprint at every start (every restart an empty space),
    and a checkpoint short of a layer sketched with random weights (a model review, 2026-12-07)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModel

    from tests.tiny_models import save_tiny_llama

    full = save_tiny_llama(tmp_path / "llama")
    base = tmp_path / "base"
    AutoModel.from_pretrained(full).save_pretrained(base)  # the decoder alone: no lm_head
    for f in full.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            shutil.copy(f, base / f.name)
    shutil.copy(full / "config.json", base / "config.json")  # a causal-LM config, as a hub base model has
    with pytest.raises(ModelUnavailable, match=r"lacks 1 of the model's tensors \(lm_head\.weight\)") as info:
        load_causal_lm(str(base), device="cpu")
    assert info.value.detail["missing_tensors"] == ["lm_head.weight"]
    short = tmp_path / "short"
    shutil.copytree(full, short)
    weights = load_file(short / "model.safetensors")
    save_file({k: v for k, v in weights.items() if ".layers.1." not in k}, short / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(ModelUnavailable, match=r"lacks \d+ of the model's tensors \(model\.layers\.1\."):
        load_causal_lm(str(short), device="cpu")
    assert load_causal_lm(str(full), device="cpu").K > 0  # the whole checkpoint loads


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused(tmp_path: Path) -> None:
    """Its highest ids index past the model: jobs dropped those samples ("token_out_of_range") or failed saying
    each sample needs two tokens, and prompts were refused, while the model said it was ready."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from tests.tiny_models import build_tokenizer

    tokenizer = build_tokenizer()
    small = tmp_path / "small-vocab"
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer) - 40, hidden_size=16, intermediate_size=32,
                                 num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                 max_position_embeddings=64)).save_pretrained(small)
    tokenizer.save_pretrained(small)
    with pytest.raises(ModelUnavailable, match=rf"tokenizer has text tokens up to id {len(tokenizer) - 1} but the "
                                               rf"model has {len(tokenizer) - 40} rows"):
        load_causal_lm(str(small), device="cpu")
    assert len(AutoTokenizer.from_pretrained(small)) == len(tokenizer)
    # a special token fed to the model (a BOS added without resizing it) counts; an added pad token does not
    fits = tmp_path / "fits"
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                 num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                 max_position_embeddings=64)).save_pretrained(fits)
    grown = AutoTokenizer.from_pretrained(small)
    grown.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})
    grown.save_pretrained(fits)
    with pytest.raises(ModelUnavailable, match=rf"text tokens up to id {len(tokenizer)} "):
        load_causal_lm(str(fits), device="cpu")
