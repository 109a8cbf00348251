"""The (a, e) extraction layer against real tiny models loaded from disk (no sketch involved)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import CohereConfig, CohereForCausalLM, Gemma2Config, Gemma2ForCausalLM, GPT2LMHeadModel

from atlas.samples import Sample, sample_id
from tests.tiny_models import build_tokenizer
from workers.batching import collate, make_batches
from workers.extraction import Extractor
from workers.head import HeadBatch, LogitTransform, capture_head_input, head_errors, head_logits, iter_head_batches
from workers.model_loading import LoadedModel


def _cat(batches: list[HeadBatch]) -> dict[str, torch.Tensor]:
    return {k: torch.cat([getattr(b, k) for b in batches]) for k in
            ("a", "e", "sample_ids", "token_loss", "last_token_mask", "targets")}


def _reference(lm: LoadedModel, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Model logits (T-1, K), autograd dL/dlogits of the summed token loss, and per-token losses."""
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = lm.model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, :-1].float()
    z = logits.clone().requires_grad_(True)
    losses = torch.nn.functional.cross_entropy(z, x[0, 1:], reduction="none")
    losses.sum().backward()
    return logits, z.grad, losses.detach()  # type: ignore[return-value]


def _ids(lm: LoadedModel, text: str) -> list[int]:
    return list(lm.tokenizer(text)["input_ids"])


def test_logits_and_errors_match_model_and_autograd(tiny_lm: LoadedModel, texts: list[str]) -> None:
    ex = Extractor(tiny_lm, None, logits_chunk=7)
    samples = [Sample(text=t) for t in texts]
    got = _cat(list(ex.iter_head_batches(samples)))
    head = tiny_lm.head
    # rows come length-sorted (longest first); gather each sample's rows by its id
    for s in samples:
        ids = _ids(tiny_lm, s.text or "")
        rows = got["sample_ids"] == sample_id(s)
        a, e = got["a"][rows], got["e"][rows]
        logits, grad, losses = _reference(tiny_lm, ids)
        assert a.shape == (len(ids) - 1, tiny_lm.d) and e.shape == (len(ids) - 1, tiny_lm.K)
        z = head_logits(a[:, : tiny_lm.hidden_size], head.weight, getattr(head, "bias", None))
        torch.testing.assert_close(z, logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(e, grad, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got["token_loss"][rows], losses, rtol=1e-5, atol=1e-5)
        assert got["targets"][rows].tolist() == ids[1:]
        assert got["last_token_mask"][rows].tolist() == [False] * (len(ids) - 2) + [True]
        assert e.dtype == torch.float32 and a.dtype == torch.float32


def test_head_with_bias_appends_one(llama_dir: object, texts: list[str]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(llama_dir)
    H, K = model.config.hidden_size, model.config.vocab_size
    torch.manual_seed(1)
    biased = torch.nn.Linear(H, K, bias=True)
    with torch.no_grad():
        biased.weight.copy_(model.lm_head.weight)
        biased.bias.normal_()
    model.lm_head = biased
    lm = LoadedModel.from_model(model, AutoTokenizer.from_pretrained(llama_dir), name="llama-bias")
    assert lm.d == H + 1 and lm.has_bias
    got = _cat(list(Extractor(lm, None, logits_chunk=5).iter_head_batches([Sample(text=texts[0])])))
    assert torch.all(got["a"][:, -1] == 1.0)
    logits, grad, _ = _reference(lm, _ids(lm, texts[0]))
    torch.testing.assert_close(head_logits(got["a"][:, :H], biased.weight, biased.bias), logits)
    torch.testing.assert_close(got["e"], grad, rtol=1e-5, atol=1e-6)


def _tiny_softcap_and_scale_models() -> list[tuple[str, torch.nn.Module]]:
    tok = build_tokenizer()
    common = dict(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=64)
    torch.manual_seed(0)
    gemma = Gemma2ForCausalLM(Gemma2Config(**common, final_logit_softcapping=0.5)).eval()
    cohere = CohereForCausalLM(CohereConfig(**common, logit_scale=0.3)).eval()
    with torch.no_grad():  # make raw logits large enough that tanh is far from linear
        gemma.lm_head.weight.mul_(40.0)
    return [("gemma2-softcap", gemma), ("cohere-scale", cohere)]


@pytest.mark.parametrize("case", [0, 1], ids=["softcap", "logit_scale"])
def test_post_head_transforms_use_chain_rule(case: int) -> None:
    name, model = _tiny_softcap_and_scale_models()[case]
    tok = build_tokenizer()
    lm = LoadedModel.from_model(model, tok, name=name)  # verify_head passes: the transform is known
    assert lm.logit_transform.kind == ("softcap" if case == 0 else "scale")
    text = "The quick brown fox jumps over the lazy dog."
    got = _cat(list(Extractor(lm, None, logits_chunk=4).iter_head_batches([Sample(text=text)])))
    ids = torch.tensor([_ids(lm, text)])
    with torch.no_grad():
        model_logits = model(input_ids=ids).logits[0, :-1]
    z_raw = head_logits(got["a"], lm.head.weight, None).requires_grad_(True)
    z = lm.logit_transform.apply(z_raw)
    torch.testing.assert_close(z, model_logits, rtol=1e-5, atol=1e-5)
    if case == 0:
        assert float(model_logits.abs().max()) > 0.4  # the cap (0.5) is active
    torch.nn.functional.cross_entropy(z, ids[0, 1:], reduction="sum").backward()
    torch.testing.assert_close(got["e"], z_raw.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("transform", [LogitTransform("softcap", 1.5, "x"), LogitTransform("scale", 0.25, "y"),
                                       LogitTransform()])
def test_head_errors_equal_autograd(transform: LogitTransform) -> None:
    g = torch.Generator().manual_seed(0)
    z_raw = (3 * torch.randn(6, 11, generator=g)).requires_grad_(True)
    y = torch.randint(0, 11, (6,), generator=g)
    e, loss = head_errors(z_raw.detach().clone(), y, transform)
    ref = torch.nn.functional.cross_entropy(transform.apply(z_raw), y, reduction="none")
    ref.sum().backward()
    torch.testing.assert_close(e, z_raw.grad)
    torch.testing.assert_close(loss, ref.detach())


class _DoubledLogitsGPT2(GPT2LMHeadModel):
    """A GPT-2 that scales its logits after the head without declaring it in the config."""

    def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = super().forward(*args, **kwargs)
        out.logits = out.logits * 2.0
        return out


def test_undeclared_post_head_transform_is_refused(gpt2_dir: object) -> None:
    from transformers import AutoTokenizer

    from atlas.errors import ModelUnavailable

    model = _DoubledLogitsGPT2.from_pretrained(gpt2_dir)
    with pytest.raises(ModelUnavailable, match="transforms its logits after the output head"):
        LoadedModel.from_model(model, AutoTokenizer.from_pretrained(gpt2_dir), name="doubled")


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_batched_equals_one_at_a_time(tiny_lm: LoadedModel, texts: list[str], padding_side: str) -> None:
    samples = [Sample(text=t) for t in texts]
    one = Extractor(tiny_lm, None, token_budget=1, padding_side=padding_side)  # each sample alone
    many = Extractor(tiny_lm, None, token_budget=10_000, padding_side=padding_side)  # all in one batch
    a = _cat(list(one.iter_head_batches(samples)))
    b = _cat(list(many.iter_head_batches(samples)))
    assert torch.equal(a["sample_ids"], b["sample_ids"]) and torch.equal(a["targets"], b["targets"])
    torch.testing.assert_close(a["a"], b["a"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(a["e"], b["e"], rtol=1e-4, atol=1e-6)


def test_chunk_size_does_not_change_results(tiny_lm: LoadedModel, texts: list[str]) -> None:
    samples = [Sample(text=t) for t in texts]
    runs = [_cat(list(Extractor(tiny_lm, None, logits_chunk=c).iter_head_batches(samples))) for c in (1, 7, 4096)]
    for other in runs[1:]:
        for key in runs[0]:
            torch.testing.assert_close(runs[0][key], other[key], rtol=1e-6, atol=1e-7)


def test_completion_mode_counts_only_completion_tokens(tiny_lm: LoadedModel) -> None:
    pairs = [("Question: is the sky blue? Answer:", " yes."), ("def add(a, b):", "\n    return a + b\n"),
             ("", "The quick brown fox")]
    samples = [Sample(prompt=p, completion=c) for p, c in pairs]
    got = _cat(list(Extractor(tiny_lm, None, logits_chunk=3).iter_head_batches(samples, mode="completion")))
    tok = tiny_lm.tokenizer
    for s, (p, c) in zip(samples, pairs, strict=True):
        p_ids = list(tok(p)["input_ids"])
        c_ids = list(tok(c, add_special_tokens=False)["input_ids"])
        ids = p_ids + c_ids
        rows = got["sample_ids"] == sample_id(s)
        expected_targets = c_ids if p_ids else c_ids[1:]  # with no prompt token the first is unpredictable
        assert got["targets"][rows].tolist() == expected_targets
        _, grad, _ = _reference(tiny_lm, ids)
        first = max(len(p_ids) - 1, 0)
        torch.testing.assert_close(got["e"][rows], grad[first:], rtol=1e-5, atol=1e-6)


class _LargestVocabTensor(TorchDispatchMode):
    """Records the largest tensor (elements) produced by any op that has a dimension of size K.

    Views of the model's parameters (e.g. the transposed head weight) are not allocations and are ignored.
    """

    def __init__(self, K: int, model: torch.nn.Module) -> None:
        super().__init__()
        self.K = K
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if (isinstance(t, torch.Tensor) and self.K in t.shape
                    and t.untyped_storage().data_ptr() not in self.params):
                self.largest = max(self.largest, t.numel())
        return out


def _largest_vocab_tensor(lm: LoadedModel, n_tokens: int, chunk: int) -> int:
    ids = [(7 * i) % (lm.K - 1) + 1 for i in range(n_tokens)]
    batch = collate(make_batches([_prepared(ids)], 10_000)[0], pad_id=0)
    with _LargestVocabTensor(lm.K, lm.model) as probe:
        for _ in iter_head_batches(lm, batch, chunk):
            pass
    return probe.largest


def _prepared(ids: list[int]):  # type: ignore[no-untyped-def]
    from workers.batching import PreparedSample

    return PreparedSample(0, 1, tuple(ids), 0, False)


def test_peak_logits_memory_is_independent_of_sequence_length(gpt2_lm: LoadedModel) -> None:
    K, chunk = gpt2_lm.K, 16
    short, long = (_largest_vocab_tensor(gpt2_lm, n, chunk) for n in (40, 250))
    assert short <= chunk * K and long <= chunk * K  # measured: never more than one chunk of logits
    assert long == short
    unchunked = _largest_vocab_tensor(gpt2_lm, 250, 10_000)
    assert unchunked >= 249 * K  # the probe does see full logits when they exist


def test_capture_does_not_disturb_normal_forward(gpt2_lm: LoadedModel) -> None:
    x = torch.tensor([[5, 6, 7, 8]])
    hidden = capture_head_input(gpt2_lm.model, x, torch.ones_like(x))
    with torch.no_grad():
        logits = gpt2_lm.model(input_ids=x).logits  # the hook is inert outside capture
    assert hidden.shape == (1, 4, gpt2_lm.hidden_size) and logits.shape == (1, 4, gpt2_lm.K)


def test_concurrent_extraction_from_two_threads(gpt2_lm: LoadedModel, texts: list[str]) -> None:
    import threading

    samples = [Sample(text=t) for t in texts]
    ref = _cat(list(Extractor(gpt2_lm, None).iter_head_batches(samples)))
    results: list[dict[str, torch.Tensor]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in range(3):
                results.append(_cat(list(Extractor(gpt2_lm, None, logits_chunk=5).iter_head_batches(samples))))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 6
    for r in results:
        torch.testing.assert_close(r["e"], ref["e"], rtol=1e-5, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_extraction_matches_cpu(gpt2_dir: object, gpt2_lm: LoadedModel, texts: list[str]) -> None:
    from workers.model_loading import load_causal_lm

    cuda_lm = load_causal_lm(str(gpt2_dir), device="cuda")
    samples = [Sample(text=t) for t in texts]
    got = _cat(list(Extractor(cuda_lm, None, logits_chunk=5).iter_head_batches(samples)))
    ref = _cat(list(Extractor(gpt2_lm, None, logits_chunk=5).iter_head_batches(samples)))
    assert got["a"].device.type == "cuda"
    torch.testing.assert_close(got["e"].cpu(), ref["e"], rtol=1e-3, atol=1e-5)
