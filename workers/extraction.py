"""Stream samples through a causal LM and collect per-token head activations and errors.

The (a, e) of each token come from :mod:`workers.head` (:func:`~workers.head.iter_head_batches`: one
forward stopped before the output head, then chunked ``z``, ``e = dL/dz`` and losses; peak memory does not
grow with T × K). :class:`Extractor` tokenises samples in a background thread (bounded queue, see
:mod:`workers.batching`), feeds every :class:`~workers.head.HeadBatch` to a ``sketcher.stream(state)``
(:class:`fishersketch.sketcher.SampleStream`: a sample cut over chunks is counted once) and accumulates the
baselines (:class:`atlas.baselines.BaselineSums`) from the same pass. Samples never straddle token batches.

Windows, checkpoints, resume and cancellation: samples are processed in windows of ``checkpoint_every``
samples in input order (each window length-sorted into token-budget batches). A window is sketched into
a fresh state which is merged into the running state only when the window is complete; then
``on_checkpoint(result_so_far)`` is called. ``start`` skips the first ``start`` samples (already in the
given state). Hence a job resumed from the checkpoint after a window produces bit-identical sums to an
uninterrupted run, and a cancelled run (``should_cancel()`` is checked before every batch) returns a
state holding whole windows only — nothing half-written.

Supported architectures: any ``AutoModelForCausalLM`` whose output embedding module is ``nn.Linear``-like
and whose logits are that module's output, possibly followed by ``final_logit_softcapping`` (Gemma-2/3),
``logit_scale`` (Cohere), ``logits_scaling`` (Granite) or ``lm_head_multiplier`` (Falcon-H1). Anything
else is refused at load time by :func:`workers.model_checks.verify_head`.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from atlas.baselines import BaselineSums
from atlas.errors import IncompatibleSpace, InvalidInput
from atlas.novelty import project
from atlas.samples import Sample
from workers.batching import (
    ExtractMode,
    Item,
    PaddingSide,
    Prefetcher,
    SampleTokenizer,
    TokenBatch,
    WindowEnd,
    WindowStart,
    iter_windows,
)
from workers.extraction_results import Counts, ExtractionResult, Progress
from workers.head import HeadBatch, iter_head_batches
from workers.model_loading import LoadedModel

if TYPE_CHECKING:
    from fishersketch import Sketcher, SketchState

DEFAULT_WINDOW = 1024
"""Window size (samples) when ``checkpoint_every`` is None."""

PROMPT_CHUNK_ROWS = 32
"""Fixed chunk size of the sketcher used for single routing prompts (see ``Extractor.prompt``)."""

class Extractor:
    """Streams samples through a model into a FisherSketch state and baseline sums.

    Parameters
    ----------
    lm : LoadedModel
    sketcher : fishersketch.Sketcher
        Its spec must have ``d == lm.d`` and ``K == lm.K``.
    max_tokens_per_sample : int
        Truncation length (≥ 2); lowered to the model's maximum sequence length when that is smaller
        (the effective value is ``self.max_tokens_per_sample`` and is reported in every result).
    token_budget : int
        Maximum padded tokens per forward batch.
    logits_chunk : int
        Positions whose logits are materialised at a time.
    padding_side : {"right", "left"}
        Padding of batches; both give the one-at-a-time result (left padding passes position ids).
    prefetch : int
        Tokenised batches kept ready by the background thread (0: tokenise inline).

    Raises
    ------
    InvalidInput
        Out-of-range sizes.
    IncompatibleSpace
        The sketch spec does not match the model's (d, K).
    """

    def __init__(self, lm: LoadedModel, sketcher: Sketcher | None, max_tokens_per_sample: int = 512,
                 token_budget: int = 4096, logits_chunk: int = 256, *, padding_side: PaddingSide = "right",
                 prefetch: int = 2) -> None:
        if not isinstance(max_tokens_per_sample, int) or max_tokens_per_sample < 2:
            raise InvalidInput(f"max_tokens_per_sample must be an integer ≥ 2, got {max_tokens_per_sample!r}")
        if lm.max_positions is not None:
            max_tokens_per_sample = min(max_tokens_per_sample, lm.max_positions)
        if not isinstance(token_budget, int) or token_budget < 1:
            raise InvalidInput(f"token_budget must be a positive integer, got {token_budget!r}")
        if not isinstance(logits_chunk, int) or logits_chunk < 1:
            raise InvalidInput(f"logits_chunk must be a positive integer, got {logits_chunk!r}")
        if padding_side not in ("right", "left"):
            raise InvalidInput(f"padding_side must be 'right' or 'left', got {padding_side!r}")
        spec = getattr(sketcher, "spec", None)
        if spec is not None and (spec.d != lm.d or spec.K != lm.K):
            raise IncompatibleSpace(
                f"sketch spec (d={spec.d}, K={spec.K}) does not match model {lm.name!r} (d={lm.d}, K={lm.K})"
            )
        self.lm = lm
        self.sketcher = sketcher
        self._prompt_sk: Sketcher | None = None
        self.max_tokens_per_sample = max_tokens_per_sample
        self.token_budget = token_budget
        self.logits_chunk = logits_chunk
        self.padding_side: PaddingSide = padding_side
        self.prefetch = prefetch
        self.sample_tokenizer = SampleTokenizer(lm.tokenizer, max_tokens_per_sample, lm.K)
        self.pad_id = _pad_id(lm)

    # -- extraction layer ------------------------------------------------------------------------

    def _items(self, samples: Sequence[Sample], mode: ExtractMode, start: int, window: int,
               prefetch: int) -> contextlib.AbstractContextManager[Any]:
        def make() -> Iterator[Item]:
            return iter_windows(samples, mode, self.sample_tokenizer, start=start, window=window,
                                token_budget=self.token_budget, pad_id=self.pad_id,
                                padding_side=self.padding_side)

        if prefetch > 0:
            return Prefetcher(make, maxsize=prefetch)
        return contextlib.nullcontext(make())

    def iter_head_batches(self, samples: Sequence[Sample], mode: ExtractMode = "text") -> Iterator[HeadBatch]:
        """All (a, e) chunks of ``samples``, without sketching (one window, length-sorted batches).

        A sample may be cut over consecutive chunks; to sketch the chunks yourself feed them to one
        ``stream = sketcher.stream(state)`` as ``stream.add(hb.a, hb.e, hb.sample_ids, hb.last_token_mask)``
        (plain ``sketcher.update`` would count such a sample once per chunk and, for
        ``granularity="sequence"``, needs whole samples).

        Parameters
        ----------
        samples : sequence of Sample
        mode : {"text", "completion"}

        Yields
        ------
        HeadBatch
        """
        _check_mode(mode)
        samples = list(samples)
        with self._items(samples, mode, 0, max(len(samples), 1), self.prefetch) as items:
            for item in items:
                if isinstance(item, TokenBatch):
                    yield from iter_head_batches(self.lm, item, self.logits_chunk)

    # -- sketching ---------------------------------------------------------------------------------

    def _empty_state(self) -> SketchState:
        from fishersketch import SketchState

        if self.sketcher is None:
            raise ValueError("this Extractor has no sketcher")
        return SketchState.empty(self.sketcher.spec)

    def extract(self, samples: Sequence[Sample], mode: ExtractMode = "text", state: SketchState | None = None,
                baselines: BaselineSums | None = None, start: int = 0, checkpoint_every: int | None = None,
                on_checkpoint: Callable[[ExtractionResult], None] | None = None,
                progress: Callable[[Progress], None] | None = None,
                should_cancel: Callable[[], bool] | None = None, counts: Counts | None = None) -> ExtractionResult:
        """Sketch ``samples[start:]`` window by window.

        Parameters
        ----------
        samples : sequence of Sample
        mode : {"text", "completion"}
        state : SketchState, optional
            State holding ``samples[:start]`` (not modified; the result holds a new merged state).
        baselines : BaselineSums, optional
            Baseline sums holding ``samples[:start]`` (not modified).
        start : int
            Samples to skip (already in ``state``).
        checkpoint_every : int, optional
            Window size in samples (default :data:`DEFAULT_WINDOW`). Resume is bit-identical only with
            the same value.
        on_checkpoint : callable, optional
            Called with the result so far after every window.
        progress : callable, optional
            Called with a :class:`Progress` after every batch and at the end.
        should_cancel : callable, optional
            Checked before every batch; when it returns True the current window is discarded and the
            result (``cancelled=True``) holds the whole windows done so far.
        counts : Counts, optional
            The counters of ``samples[:start]`` (a checkpoint's): the result's counts go on from them.

        Returns
        -------
        ExtractionResult

        Raises
        ------
        InvalidInput
            Unknown mode, bad ``start`` or ``checkpoint_every``.
        IncompatibleSpace
            ``state`` or ``baselines`` of another space.
        """
        return self._extract(samples, mode, state, baselines, start, checkpoint_every, on_checkpoint, progress,
                             should_cancel, prefetch=self.prefetch, counts=counts)

    def _extract(self, samples: Sequence[Sample], mode: ExtractMode, state: SketchState | None,
                 baselines: BaselineSums | None, start: int, checkpoint_every: int | None,
                 on_checkpoint: Callable[[ExtractionResult], None] | None,
                 progress: Callable[[Progress], None] | None, should_cancel: Callable[[], bool] | None,
                 *, prefetch: int, sketcher: Sketcher | None = None,
                 counts: Counts | None = None) -> ExtractionResult:
        _check_mode(mode)
        sketcher = sketcher or self.sketcher
        if sketcher is None:
            raise ValueError("this Extractor has no sketcher; use iter_head_batches()")
        if not isinstance(samples, Sequence):
            samples = list(samples)
        n_total = len(samples)
        if not isinstance(start, int) or not 0 <= start <= n_total:
            raise InvalidInput(f"start must be in [0, {n_total}], got {start!r}")
        window = DEFAULT_WINDOW if checkpoint_every is None else checkpoint_every
        if not isinstance(window, int) or window < 1:
            raise InvalidInput(f"checkpoint_every must be a positive integer, got {checkpoint_every!r}")
        if state is None:
            state = self._empty_state()
        else:
            state_spec = getattr(state, "spec", None)
            if state_spec is not None and state_spec.fingerprint() != sketcher.spec.fingerprint():
                raise IncompatibleSpace("the given state was built with another sketch spec",
                                        detail={"state_spec": state_spec.fingerprint(),
                                                "sketcher_spec": sketcher.spec.fingerprint()})
        H = self.lm.hidden_size
        if baselines is None:
            baselines = BaselineSums(d=H)
        elif baselines.d != H:
            raise IncompatibleSpace(f"baselines have width {baselines.d}, the model's hidden size is {H}")

        start_counts = counts or Counts()
        res = ExtractionResult(state=state, baselines=baselines, samples_total=n_total, samples_done=start,
                               mode=mode, max_tokens_per_sample=self.max_tokens_per_sample,
                               model_key=self.lm.fingerprint.key(), samples_start=start,
                               tokens_start=start_counts.tokens, tokens_streamed_start=start_counts.tokens_streamed,
                               **start_counts.to_dict())
        timings: dict[str, float] = {"tokenize_wait_s": 0.0, "forward_s": 0.0, "head_s": 0.0, "sketch_s": 0.0,
                                     "baselines_s": 0.0}
        res.timings = timings
        t_start = time.perf_counter()
        reasons: Counter[str] = Counter(start_counts.skipped_reasons)
        w_state: Any = None
        w_base = _BaselineAccumulator(H, self.lm.device, per_sample=mode == "text")
        w_tokens = w_used = w_done = w_streamed = 0
        w_skipped: list[Any] = []
        w_truncated = 0
        w_start = start

        def report() -> None:
            if progress is None:
                return
            elapsed = time.perf_counter() - t_start
            done = w_start + w_done if w_state is not None else res.samples_done
            tokens = res.tokens + (w_tokens if w_state is not None else 0)
            streamed = res.tokens_streamed + (w_streamed if w_state is not None else 0)
            rate = (done - start) / elapsed if elapsed > 0 else 0.0
            eta = (n_total - done) / rate if rate > 0 else None
            per_s = (lambda x: x / elapsed) if elapsed > 0 else (lambda x: 0.0)
            progress(Progress(done, n_total, tokens, per_s(tokens - start_counts.tokens), eta, streamed,
                              per_s(streamed - start_counts.tokens_streamed), rate))

        with self._items(samples, mode, start, window, prefetch) as items:
            it = iter(items)
            while True:
                t0 = time.perf_counter()
                item = next(it, None)
                timings["tokenize_wait_s"] += time.perf_counter() - t0
                if item is None:
                    break
                if isinstance(item, WindowStart):
                    w_state = self._empty_state()
                    w_base = _BaselineAccumulator(H, self.lm.device, per_sample=mode == "text")
                    w_tokens = w_used = w_streamed = 0
                    w_skipped = list(item.skipped)
                    w_done = len(w_skipped)
                    w_truncated = item.n_truncated
                    w_start = item.start
                elif isinstance(item, TokenBatch):
                    if should_cancel is not None and should_cancel():
                        res.cancelled = True
                        break
                    # Chunks may cut a sample; the stream counts it once and (sequence granularity)
                    # sketches it when its last chunk arrives. A batch holds whole samples only.
                    stream = sketcher.stream(w_state)
                    for hb in iter_head_batches(self.lm, item, self.logits_chunk, timings):
                        t1 = time.perf_counter()
                        stream.add(hb.a, hb.e, hb.sample_ids, hb.last_token_mask)
                        t2 = time.perf_counter()
                        w_base.add(hb)
                        timings["sketch_s"] += t2 - t1
                        timings["baselines_s"] += time.perf_counter() - t2
                        w_tokens += len(hb)
                    stream.close()
                    w_streamed += sum(sample.length for sample in item.samples)  # real tokens forwarded
                    w_used += len(item.samples)
                    w_done += len(item.samples)
                    report()
                elif isinstance(item, WindowEnd):
                    res.state = res.state.merge(w_state)
                    res.baselines = res.baselines.merge(w_base.to_sums())
                    res.samples_done = item.stop
                    res.samples_used += w_used
                    res.samples_skipped += len(w_skipped)
                    reasons.update(s.reason for s in w_skipped)
                    res.skipped_reasons = dict(sorted(reasons.items()))
                    res.tokens += w_tokens
                    res.tokens_streamed += w_streamed
                    res.truncated += w_truncated
                    w_state = None
                    res.elapsed_s = time.perf_counter() - t_start
                    if on_checkpoint is not None:
                        on_checkpoint(res)
        res.elapsed_s = time.perf_counter() - t_start
        w_state = None
        report()
        return res

    def prompt(self, prompt_text: str) -> ExtractionResult:
        """Sketch one query text (text mode: all T−1 next-token positions), for routing.

        Parameters
        ----------
        prompt_text : str

        Returns
        -------
        ExtractionResult
            With a fresh state of this one text.

        Raises
        ------
        InvalidInput
            Empty or whitespace-only text, invalid Unicode (lone surrogates), or fewer than 2 tokens.
        """
        if not isinstance(prompt_text, str):
            raise InvalidInput("prompt must be a string")
        _, skipped = self.sample_tokenizer.prepare([Sample(text=prompt_text)], "text")
        if skipped:
            reason = skipped[0].reason
            messages = {
                "empty": "prompt is empty",
                "invalid_text": "prompt is not valid Unicode (it contains lone surrogates)",
                "too_short": "prompt has fewer than 2 tokens; at least one next-token position is needed",
                "token_out_of_range": "prompt tokenises to ids outside the model's vocabulary",
            }
            raise InvalidInput(messages.get(reason, f"prompt cannot be used ({reason})"), detail={"reason": reason})
        return self._extract([Sample(text=prompt_text)], "text", None, None, 0, None, None, None, None, prefetch=0,
                             sketcher=self._prompt_sketcher())

    def _prompt_sketcher(self) -> Sketcher | None:
        """The sketcher for single prompts: same projections, chunks of ``PROMPT_CHUNK_ROWS`` rows.

        A prompt of a few tokens padded to the default 256-row chunk costs ~3x its real work; prompt
        states are never merged or resumed, so the smaller chunk's float32 rounding does not matter.
        """
        if self.sketcher is None:
            return None
        if self._prompt_sk is None:
            self._prompt_sk = self.sketcher.with_chunk_rows(min(PROMPT_CHUNK_ROWS, self.sketcher.chunk_rows))
        return self._prompt_sk


def _pad_id(lm: LoadedModel) -> int:
    """Id written into padding: the tokenizer's pad (else EOS) token when the model can embed it, else 0.

    Padding is masked, so any id the embedding accepts will do; a pad token added to the tokenizer without
    resizing the model (id ≥ the embedding rows) would make every padded batch fail with an IndexError.
    """
    rows = lm.K
    with contextlib.suppress(AttributeError, NotImplementedError, TypeError, IndexError):
        rows = min(rows, int(lm.model.get_input_embeddings().weight.shape[0]))  # else: the head's rows bound it
    for cand in (lm.tokenizer.pad_token_id, getattr(lm.tokenizer, "eos_token_id", None)):
        if isinstance(cand, int) and 0 <= cand < rows:
            return cand
    return 0


def _check_mode(mode: str) -> None:
    if mode not in ("text", "completion"):
        raise InvalidInput(f"unknown extraction mode {mode!r}; use 'text' or 'completion'")


class _BaselineAccumulator:
    """Baseline sums of one window, kept on the model's device (float64) until the window ends; in text mode
    also each sample's sum of head inputs (its novelty vector, :mod:`atlas.novelty`)."""

    def __init__(self, H: int, device: torch.device, per_sample: bool = False) -> None:
        self.per_sample = per_sample
        self.sample_sums: dict[int, torch.Tensor] = {}
        self.sample_counts: dict[int, int] = {}
        self.sum_hidden = torch.zeros(H, dtype=torch.float64, device=device)
        self.sum_last = torch.zeros(H, dtype=torch.float64, device=device)
        self.sum_loss = torch.zeros((), dtype=torch.float64, device=device)
        self.n_tokens = 0
        self.n_samples = 0

    def add(self, hb: HeadBatch) -> None:
        """Add a chunk's hidden states (without the bias column) and token losses."""
        with torch.no_grad():
            hidden = hb.hidden.double()
            self.sum_hidden += hidden.sum(dim=0)
            last = torch.nonzero(hb.last_token_mask).flatten()
            if last.numel():
                self.sum_last += hidden.index_select(0, last.to(hidden.device)).sum(dim=0)
            self.sum_loss += hb.token_loss.double().sum()
            self.n_tokens += len(hb)
            self.n_samples += int(last.numel())
            if self.per_sample and len(hb):
                ids, inverse, counts = torch.unique_consecutive(hb.sample_ids, return_inverse=True,
                                                                return_counts=True)
                sums = torch.zeros((len(ids), hidden.shape[1]), dtype=torch.float64, device=hidden.device)
                sums.index_add_(0, inverse.to(hidden.device), hidden)
                for sid, row, cnt in zip(ids.tolist(), sums, counts.tolist(), strict=True):
                    if sid in self.sample_sums:  # a sample cut across chunks of one batch
                        self.sample_sums[sid] += row
                        self.sample_counts[sid] += cnt
                    else:
                        self.sample_sums[sid], self.sample_counts[sid] = row, cnt

    def to_sums(self) -> BaselineSums:
        """The window's :class:`BaselineSums`."""
        sums = BaselineSums(d=int(self.sum_hidden.shape[0]), sum_hidden=self.sum_hidden.cpu().numpy(),
                            sum_last_hidden=self.sum_last.cpu().numpy(), sum_loss=float(self.sum_loss),
                            n_tokens=self.n_tokens, n_samples=self.n_samples)
        if not self.sample_sums:
            return sums
        keys = np.array(list(self.sample_sums), dtype=np.int64)
        means = torch.stack([self.sample_sums[k] / self.sample_counts[k] for k in self.sample_sums]).cpu().numpy()
        return sums.with_sample_vectors(keys, project(means))

