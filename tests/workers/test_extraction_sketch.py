"""Extractor.extract end to end: sketch state, baselines, windows, resume, cancellation, progress."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from atlas.baselines import BaselineSums
from atlas.errors import IncompatibleSpace
from atlas.samples import Sample
from fishersketch import Sketcher, SketchSpec, SketchState
from workers.extraction import ExtractionResult, Extractor, Progress
from workers.model_loading import LoadedModel

M = 64


def _sketcher(lm: LoadedModel, granularity: str = "token") -> Sketcher:
    return Sketcher(lm.make_spec(m=M, seed=5, granularity=granularity), device="cpu")


def _samples(texts: list[str]) -> list[Sample]:
    extra = ["", "a", "Question: is the sky blue?"]  # one empty, one too short
    return [Sample(text=t) for t in texts + extra]


def _reference_losses(lm: LoadedModel, text: str) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([lm.tokenizer(text)["input_ids"]])
    with torch.no_grad():
        out = lm.model(input_ids=ids, output_hidden_states=True)
    loss = torch.nn.functional.cross_entropy(out.logits[0, :-1], ids[0, 1:], reduction="none")
    return loss, out.hidden_states[-1][0, :-1]


def test_extract_fills_state_and_baselines(tiny_lm: LoadedModel, texts: list[str]) -> None:
    samples = _samples(texts)
    sk = _sketcher(tiny_lm)
    res = Extractor(tiny_lm, sk, logits_chunk=5).extract(samples)
    used = [s for s in samples if s.text not in ("", "a")]
    assert res.samples_used == len(used) and res.samples_skipped == 2
    assert res.skipped_reasons == {"empty": 1, "too_short": 1}
    assert res.samples_done == res.samples_total == len(samples) and not res.cancelled
    n_tok = sum(len(tiny_lm.tokenizer(s.text)["input_ids"]) - 1 for s in used)
    assert res.tokens == res.state.n_tokens == res.baselines.n_tokens == n_tok
    assert res.state.n_samples == res.baselines.n_samples == len(used)  # long samples cut over chunks count once
    assert res.model_key == tiny_lm.fingerprint.key() and res.max_tokens_per_sample == 256
    # baselines against the model's own forward
    losses, hidden, last = [], [], []
    for s in used:
        loss, h = _reference_losses(tiny_lm, s.text or "")
        losses.append(loss)
        hidden.append(h)
        last.append(h[-1])
    np.testing.assert_allclose(res.baselines.mean_loss(), float(torch.cat(losses).mean()), rtol=1e-5)
    np.testing.assert_allclose(res.baselines.mean_hidden(), torch.cat(hidden).mean(0).numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(res.baselines.last_hidden(), torch.stack(last).mean(0).numpy(), rtol=1e-4, atol=1e-5)
    # the state equals feeding the (a, e) chunks to the sketcher directly
    direct = SketchState.empty(sk.spec)
    for hb in Extractor(tiny_lm, None, logits_chunk=5).iter_head_batches(samples):
        sk.update(direct, hb.a, hb.e, hb.sample_ids)
    np.testing.assert_allclose(res.state.sums, direct.sums, rtol=1e-10)
    assert np.array_equal(res.state.token_counts, direct.token_counts)
    summary = res.summary()
    assert summary["skipped_reasons"] == {"empty": 1, "too_short": 1} and "truncation_policy" in summary


def test_batching_and_chunking_do_not_change_the_state(gpt2_lm: LoadedModel, texts: list[str]) -> None:
    samples = _samples(texts)
    sk = _sketcher(gpt2_lm)
    ref = Extractor(gpt2_lm, sk, token_budget=1, logits_chunk=1).extract(samples).state
    for budget, chunk in ((10_000, 4096), (64, 7)):
        other = Extractor(gpt2_lm, sk, token_budget=budget, logits_chunk=chunk).extract(samples).state
        np.testing.assert_allclose(other.sums, ref.sums, rtol=1e-4, atol=1e-6 * np.abs(ref.sums).max())
        assert other.n_tokens == ref.n_tokens and other.n_samples == ref.n_samples


def _rel(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.max(np.abs(x - y)) / np.max(np.abs(y)))


def _assert_same(x: SketchState, y: SketchState, tol: float = 1e-10) -> None:
    assert _rel(x.sums, y.sums) <= tol and _rel(x.sq_norms, y.sq_norms) <= tol
    assert np.array_equal(x.token_counts, y.token_counts) and np.array_equal(x.sample_counts, y.sample_counts)


def _per_whole_sample(lm: LoadedModel, sk: Sketcher, samples: list[Sample], **kw: int) -> SketchState:
    """Reference: the extractor's (a, e) regrouped into whole samples, one plain ``update`` per sample."""
    hbs = list(Extractor(lm, None, **kw).iter_head_batches(samples))
    a, e = torch.cat([h.a for h in hbs]), torch.cat([h.e for h in hbs])
    ids, last = torch.cat([h.sample_ids for h in hbs]), torch.cat([h.last_token_mask for h in hbs])
    state = SketchState.empty(sk.spec)
    lo = 0
    for hi in (torch.nonzero(last).flatten() + 1).tolist():
        assert len(set(ids[lo:hi].tolist())) == 1
        sk.update(state, a[lo:hi], e[lo:hi], ids[lo:hi])
        lo = hi
    return state


def _exact_head_logits(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """float64 head GEMM rounded to float32: the logits of a row no longer depend on the chunk's row count."""
    b = None if bias is None else bias.double()
    return torch.nn.functional.linear(a.double(), weight.double(), b).float()


@pytest.mark.parametrize("granularity", ["sequence", "token"])
def test_state_does_not_depend_on_logits_chunk(gpt2_lm: LoadedModel, texts: list[str], granularity: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    sk = _sketcher(gpt2_lm, granularity)
    samples = [*_samples(texts), Sample(text=texts[1])]  # a duplicate upload is a second sample
    used = len(samples) - 2
    chunked = Extractor(gpt2_lm, sk, logits_chunk=3).extract(samples)  # cuts every sample over chunks
    whole = Extractor(gpt2_lm, sk, logits_chunk=4096).extract(samples)
    assert chunked.samples_used == used and chunked.state.n_samples == whole.state.n_samples == used
    assert chunked.state.n_tokens == whole.state.n_tokens == chunked.tokens
    # exact against one update per whole sample on the same (a, e) ...
    _assert_same(chunked.state, _per_whole_sample(gpt2_lm, sk, samples, logits_chunk=3))
    _assert_same(whole.state, _per_whole_sample(gpt2_lm, sk, samples, logits_chunk=4096))
    # ... and across chunk sizes up to the float32 rounding of the head GEMM (its result depends on the
    # number of rows per call) ...
    np.testing.assert_allclose(chunked.state.sums, whole.state.sums, rtol=1e-4,
                               atol=1e-6 * np.abs(whole.state.sums).max())
    # ... which, with a head whose rows do not depend on the chunk, leaves float64 rounding only
    monkeypatch.setattr("workers.head.head_logits", _exact_head_logits)
    exact = [Extractor(gpt2_lm, sk, logits_chunk=c).extract(samples).state for c in (1, 3, 4096)]
    _assert_same(exact[0], exact[2])
    _assert_same(exact[1], exact[2])
    _assert_same(exact[1], _per_whole_sample(gpt2_lm, sk, samples, logits_chunk=4096))


def test_sequence_granularity_is_independent_of_batching(gpt2_lm: LoadedModel, texts: list[str]) -> None:
    sk = _sketcher(gpt2_lm, "sequence")
    samples = _samples(texts)
    ref = Extractor(gpt2_lm, sk, token_budget=1, logits_chunk=1).extract(samples).state
    for budget, chunk in ((10_000, 4096), (64, 7), (48, 5)):
        other = Extractor(gpt2_lm, sk, token_budget=budget, logits_chunk=chunk).extract(samples).state
        np.testing.assert_allclose(other.sums, ref.sums, rtol=1e-4, atol=1e-6 * np.abs(ref.sums).max())
        assert np.array_equal(other.sample_counts, ref.sample_counts) and other.n_samples == len(samples) - 2
        assert np.array_equal(other.token_counts, ref.token_counts)


@pytest.mark.parametrize("granularity", ["sequence", "token"])
def test_long_text_over_many_chunks_counts_as_one_sample(gpt2_lm: LoadedModel, texts: list[str],
                                                         granularity: str) -> None:
    sk = _sketcher(gpt2_lm, granularity)
    text = " ".join(texts)
    ex = Extractor(gpt2_lm, sk, logits_chunk=2)
    n_pos = len(gpt2_lm.tokenizer(text)["input_ids"]) - 1
    assert n_pos > 20  # more than ten chunks
    res = ex.prompt(text)
    assert res.state.n_samples == res.samples_used == res.baselines.n_samples == 1
    assert res.state.n_tokens == res.tokens == n_pos
    _assert_same(res.state, _per_whole_sample(gpt2_lm, sk, [Sample(text=text)], logits_chunk=2))
    res = ex.extract([Sample(text=t) for t in (text, texts[0], text)], checkpoint_every=2)
    assert res.state.n_samples == res.samples_used == 3


def test_resume_from_checkpoint_is_bit_identical(gpt2_lm: LoadedModel, texts: list[str]) -> None:
    samples = _samples(texts)  # 10 samples: windows [0,3) [3,6) [6,9) [9,10)
    ex = Extractor(gpt2_lm, _sketcher(gpt2_lm), token_budget=48, logits_chunk=6)
    checkpoints: list[tuple[int, bytes, bytes, int]] = []

    def keep(r: ExtractionResult) -> None:
        checkpoints.append((r.samples_done, r.state.to_bytes(), r.baselines.to_bytes(), r.tokens))

    full = ex.extract(samples, checkpoint_every=3, on_checkpoint=keep)
    assert [c[0] for c in checkpoints] == [3, 6, 9, 10]
    assert checkpoints[-1][1] == full.state.to_bytes()
    done, state_blob, base_blob, tokens_before = checkpoints[1]
    resumed = ex.extract(samples, state=SketchState.from_bytes(state_blob), start=done, checkpoint_every=3,
                         baselines=BaselineSums.from_bytes(base_blob))
    assert resumed.state.to_bytes() == full.state.to_bytes()
    assert resumed.baselines.to_bytes() == full.baselines.to_bytes()
    assert resumed.samples_done == len(samples) and resumed.tokens + tokens_before == full.tokens


def test_cancel_keeps_whole_windows_only(gpt2_lm: LoadedModel, texts: list[str]) -> None:
    samples = _samples(texts)
    ex = Extractor(gpt2_lm, _sketcher(gpt2_lm), token_budget=48, logits_chunk=6)
    states: dict[int, bytes] = {}
    ex.extract(samples, checkpoint_every=3, on_checkpoint=lambda r: states.setdefault(r.samples_done,
                                                                                     r.state.to_bytes()))
    calls = {"n": 0}

    def cancel_in_second_window() -> bool:
        calls["n"] += 1
        return calls["n"] > 2  # window 1 has at most 2 batches at budget 48 -> stop inside window 2

    given = SketchState.empty(ex.sketcher.spec)  # type: ignore[union-attr]
    res = ex.extract(samples, state=given, checkpoint_every=3, should_cancel=cancel_in_second_window)
    assert res.cancelled and res.samples_done == 3
    assert res.state.to_bytes() == states[3]
    assert given.n_tokens == 0  # the caller's state is never written to


def test_progress_is_reported_per_batch(gpt2_lm: LoadedModel, texts: list[str]) -> None:
    seen: list[Progress] = []
    samples = _samples(texts)
    res = Extractor(gpt2_lm, _sketcher(gpt2_lm), token_budget=40).extract(samples, progress=seen.append)
    assert len(seen) >= 3
    done = [p.samples_done for p in seen]
    assert done == sorted(done) and done[-1] == len(samples) and seen[-1].tokens == res.tokens
    assert all(p.samples_total == len(samples) and p.tokens_per_s >= 0 for p in seen)
    assert seen[-1].eta_s == 0.0


def test_prompt_mode_matches_text_mode(gpt2_lm: LoadedModel) -> None:
    ex = Extractor(gpt2_lm, _sketcher(gpt2_lm))
    text = "Question: is the sky blue? Answer: yes."
    res = ex.prompt(text)
    ref = ex.extract([Sample(text=text)])
    assert res.state.to_bytes() == ref.state.to_bytes()
    assert res.tokens == len(gpt2_lm.tokenizer(text)["input_ids"]) - 1 and res.state.has_signature


def test_errors_leave_given_state_untouched(gpt2_lm: LoadedModel, llama_lm: LoadedModel, texts: list[str]) -> None:
    ex = Extractor(gpt2_lm, _sketcher(gpt2_lm))
    state = SketchState.empty(ex.sketcher.spec)  # type: ignore[union-attr]
    blob = state.to_bytes()
    bad = [Sample(text=t) for t in texts] + [object()]  # not a Sample: fails inside the tokeniser thread
    with pytest.raises(AttributeError):
        ex.extract(bad, state=state)  # type: ignore[arg-type]
    assert state.to_bytes() == blob
    other = Sketcher(gpt2_lm.make_spec(m=M, seed=6), device="cpu")
    with pytest.raises(IncompatibleSpace):
        ex.extract([Sample(text=texts[0])], state=SketchState.empty(other.spec))
    with pytest.raises(IncompatibleSpace):
        Extractor(llama_lm, Sketcher(SketchSpec(d=7, K=9, m=M), device="cpu"))
