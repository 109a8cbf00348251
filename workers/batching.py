"""Tokenisation, truncation, skipping and token-budget batching of samples.

Policy (documented here once, reported in every :class:`workers.extraction.ExtractionResult`):

* **Special tokens.** Texts (and prompts) are tokenised with the tokenizer's own default special
  tokens (``add_special_tokens=True``): a Llama-style tokenizer that prepends BOS keeps doing so, a
  GPT-2 tokenizer that adds nothing adds nothing. Nothing else is prepended.
* **text mode.** Tokens ``x_0..x_{T-1}`` of ``sample.text``; the ``T − 1`` positions ``t = 0..T−2``
  predicting ``x_{t+1}`` all count.
* **completion mode.** Prompt and completion are tokenised separately (the completion without special
  tokens) and their ids concatenated, so the boundary is exact. Special tokens the tokenizer appends
  *after* a text (an EOS of ``add_eos_token=True`` tokenizers) are dropped from the prompt, so the
  completion follows the prompt directly. Only positions predicting completion tokens count. With an
  empty prompt (and no BOS) the first completion token has no predecessor and is not counted.
* **Truncation** to ``max_tokens_per_sample`` tokens: text mode keeps the *first* tokens; completion
  mode first drops prompt tokens from the *left* (keeping at least one prompt token when there was
  one, so the first completion token stays predictable), then completion tokens from the *right*.
  Truncated samples are counted. Very long strings are cut to a generous character prefix (a suffix
  for completion-mode prompts, whose *last* tokens are kept) before tokenising, and re-tokenised whole
  if that cut yields too few tokens, so an absurdly long sample costs no more than a normal one.
* **Skips** (counted by reason, never an exception): ``empty`` (empty or whitespace-only text or
  completion), ``missing_field`` (no ``text`` in text mode / no ``completion`` in completion mode),
  ``invalid_text`` (a ``str`` that is not valid Unicode, i.e. holds lone surrogates — invalid UTF-8
  bytes are rejected earlier by the upload parser), ``too_short`` (fewer than 2 tokens in text mode),
  ``no_completion_tokens`` (no counted completion position), ``token_out_of_range`` (the tokenizer
  produced an id ≥ K, a model/tokenizer mismatch).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from atlas.samples import Sample, is_blank, is_valid_unicode, sample_id
from atlas.vocabulary import ModeName

ExtractMode = ModeName
PaddingSide = Literal["right", "left"]

SKIP_REASONS = ("empty", "missing_field", "invalid_text", "too_short", "no_completion_tokens",
                "token_out_of_range")

_TOKENIZER_LOCK = threading.Lock()
"""Serialises tokenizer calls: Hugging Face fast tokenizers may fail ("Already borrowed") when one instance
is called from several threads at once (concurrent jobs, prompt queries). The Rust encoder releases the
GIL, so the lock does not stop tokenisation from overlapping the model forward."""

CHARS_PER_TOKEN_CAP = 64
"""A string longer than ``CHARS_PER_TOKEN_CAP × max_tokens + 1024`` characters is cut before tokenising."""


@dataclass(frozen=True)
class PreparedSample:
    """One tokenised sample, ready to batch.

    Attributes
    ----------
    index : int
        Position in the input sequence.
    sample_id : int
        ``atlas.samples.sample_id(sample)``; every token of the sample carries it.
    input_ids : tuple of int, length T
        Token ids after truncation.
    first_target : int
        First position ``t`` that counts (predicting ``x_{t+1}``); positions ``first_target..T−2`` count.
    truncated : bool
        Whether tokens were dropped.
    """

    index: int
    sample_id: int
    input_ids: tuple[int, ...]
    first_target: int
    truncated: bool

    @property
    def length(self) -> int:
        """Number of tokens T."""
        return len(self.input_ids)

    @property
    def n_counted(self) -> int:
        """Number of counted positions ``T − 1 − first_target``."""
        return self.length - 1 - self.first_target


@dataclass(frozen=True)
class Skipped:
    """A sample that was not used, with its reason (one of :data:`SKIP_REASONS`)."""

    index: int
    reason: str


@dataclass
class TokenBatch:
    """A padded batch of samples and the flat list of counted positions.

    Attributes
    ----------
    input_ids : Tensor, shape (B, T), int64
    attention_mask : Tensor, shape (B, T), int64
        1 on real tokens, 0 on padding.
    position_ids : Tensor, shape (B, T), int64, or None
        Given for left padding (0 at each row's first real token); None for right padding, where the
        model's default positions are already right.
    flat_positions : Tensor, shape (n,), int64
        Index into the flattened (B·T) positions of every counted position, in sample order.
    targets : Tensor, shape (n,), int64
        The next-token id each counted position predicts.
    sample_ids : Tensor, shape (n,), int64
        Sample id of each counted position.
    last_token_mask : Tensor, shape (n,), bool
        True at each sample's last counted position.
    samples : list of PreparedSample
        The B samples, in row order.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor | None
    flat_positions: torch.Tensor
    targets: torch.Tensor
    sample_ids: torch.Tensor
    last_token_mask: torch.Tensor
    samples: list[PreparedSample] = field(default_factory=list)

    @property
    def n_positions(self) -> int:
        """Number of counted positions n."""
        return int(self.targets.shape[0])

    def to(self, device: torch.device) -> TokenBatch:
        """Copy the tensors to ``device``."""
        def mv(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        return TokenBatch(mv(self.input_ids), mv(self.attention_mask), mv(self.position_ids),  # type: ignore[arg-type]
                          mv(self.flat_positions), mv(self.targets), mv(self.sample_ids),  # type: ignore[arg-type]
                          mv(self.last_token_mask), self.samples)  # type: ignore[arg-type]


class SampleTokenizer:
    """Applies the tokenisation, truncation and skip policy of this module.

    Parameters
    ----------
    tokenizer : transformers tokenizer
    max_tokens : int
        ``max_tokens_per_sample`` (≥ 2).
    vocab_rows : int
        K; token ids ≥ K make the sample skipped (``token_out_of_range``).
    """

    def __init__(self, tokenizer: Any, max_tokens: int, vocab_rows: int) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.vocab_rows = vocab_rows
        self.max_chars = CHARS_PER_TOKEN_CAP * max_tokens + 1024
        self._appended: tuple[int, ...] | None = None

    def _encode(self, texts: list[str], special: bool, keep_tail: bool = False) -> list[list[int]]:
        """Token ids of ``texts``; over-long texts are cut to a character prefix (suffix if ``keep_tail``) first."""
        if not texts:
            return []
        cut = [t[-self.max_chars:] if keep_tail else t[: self.max_chars] for t in texts]
        with _TOKENIZER_LOCK:
            ids: list[list[int]] = list(self.tokenizer(cut, add_special_tokens=special, verbose=False)["input_ids"])
            for i, text in enumerate(texts):
                # a cut string must still yield comfortably more tokens than we keep, else tokenise it whole
                if len(text) > self.max_chars and len(ids[i]) < self.max_tokens + 16:
                    ids[i] = list(self.tokenizer(text, add_special_tokens=special, verbose=False)["input_ids"])
        return ids

    def appended_special_ids(self) -> tuple[int, ...]:
        """Ids the tokenizer appends after a text with ``add_special_tokens=True`` (e.g. an EOS); usually ()."""
        if self._appended is None:
            with _TOKENIZER_LOCK:
                full = list(self.tokenizer("a", add_special_tokens=True, verbose=False)["input_ids"])
                plain = list(self.tokenizer("a", add_special_tokens=False, verbose=False)["input_ids"])
            n = len(plain)
            starts = [i for i in range(len(full) - n + 1) if n and full[i:i + n] == plain]
            self._appended = tuple(full[starts[0] + n:]) if starts else ()
        return self._appended

    def prepare(self, samples: Sequence[Sample], mode: ExtractMode, offset: int = 0
                ) -> tuple[list[PreparedSample], list[Skipped]]:
        """Tokenise a window of samples.

        Parameters
        ----------
        samples : sequence of Sample
        mode : {"text", "completion"}
        offset : int
            Index of ``samples[0]`` in the whole input (for ``PreparedSample.index``).

        Returns
        -------
        prepared : list of PreparedSample
            In input order.
        skipped : list of Skipped
        """
        if mode not in ("text", "completion"):
            raise ValueError(f"unknown mode {mode!r}")
        skipped: list[Skipped] = []
        todo: list[tuple[int, Sample]] = []
        for j, s in enumerate(samples):
            idx = offset + j
            fields = [s.text] if mode == "text" else [s.prompt, s.completion]
            main = s.text if mode == "text" else s.completion
            if main is None:
                skipped.append(Skipped(idx, "missing_field"))
            elif not all(f is None or is_valid_unicode(f) for f in fields):
                skipped.append(Skipped(idx, "invalid_text"))
            elif is_blank(main):
                skipped.append(Skipped(idx, "empty"))
            else:
                todo.append((idx, s))
        prepared: list[PreparedSample] = []
        if mode == "text":
            all_ids = self._encode([s.text or "" for _, s in todo], special=True)
            for (idx, s), ids in zip(todo, all_ids, strict=True):
                truncated = len(ids) > self.max_tokens
                ids = ids[: self.max_tokens]
                prepared.append(PreparedSample(idx, sample_id(s), tuple(ids), 0, truncated))
        else:
            prompt_ids = self._encode([s.prompt or "" for _, s in todo], special=True, keep_tail=True)
            compl_ids = self._encode([s.completion or "" for _, s in todo], special=False)
            tail = self.appended_special_ids() if todo else ()
            for (idx, s), p, c in zip(todo, prompt_ids, compl_ids, strict=True):
                if tail and tuple(p[len(p) - len(tail):]) == tail:
                    p = p[: len(p) - len(tail)]  # no EOS between prompt and completion
                truncated = len(p) + len(c) > self.max_tokens
                if truncated:
                    keep_p = max(self.max_tokens - len(c), min(len(p), 1))
                    p = p[len(p) - keep_p:]
                    c = c[: self.max_tokens - len(p)]
                ids = list(p) + list(c)
                first = max(len(p) - 1, 0)
                prepared.append(PreparedSample(idx, sample_id(s), tuple(ids), first, truncated))
        kept: list[PreparedSample] = []
        for ps in prepared:
            if ps.length < 2 or ps.n_counted < 1:
                skipped.append(Skipped(ps.index, "too_short" if mode == "text" else "no_completion_tokens"))
            elif max(ps.input_ids) >= self.vocab_rows or min(ps.input_ids) < 0:
                skipped.append(Skipped(ps.index, "token_out_of_range"))
            else:
                kept.append(ps)
        skipped.sort(key=lambda s: s.index)
        return kept, skipped


def make_batches(prepared: Sequence[PreparedSample], token_budget: int) -> list[list[PreparedSample]]:
    """Length-sorted token-budget batches.

    Samples are sorted by length, longest first (ties by input index, so the order is deterministic),
    and cut greedily so that ``batch_size × longest_length ≤ token_budget`` (padded tokens). A sample
    longer than the budget forms a batch of its own.

    Parameters
    ----------
    prepared : sequence of PreparedSample
    token_budget : int
        Maximum padded tokens per batch.

    Returns
    -------
    list of list of PreparedSample
    """
    order = sorted(prepared, key=lambda p: (-p.length, p.index))
    batches: list[list[PreparedSample]] = []
    current: list[PreparedSample] = []
    for ps in order:
        width = current[0].length if current else ps.length
        if current and (len(current) + 1) * width > token_budget:
            batches.append(current)
            current = []
        current.append(ps)
    if current:
        batches.append(current)
    return batches


def collate(samples: Sequence[PreparedSample], pad_id: int, padding_side: PaddingSide = "right") -> TokenBatch:
    """Pad a batch and list its counted positions.

    Parameters
    ----------
    samples : sequence of PreparedSample, length B
    pad_id : int
        Id written into padding (masked out by ``attention_mask``).
    padding_side : {"right", "left"}

    Returns
    -------
    TokenBatch
    """
    B = len(samples)
    T = max(ps.length for ps in samples)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.long)
    flat: list[int] = []
    targets: list[int] = []
    sids: list[int] = []
    last: list[bool] = []
    for b, ps in enumerate(samples):
        L = ps.length
        off = 0 if padding_side == "right" else T - L
        input_ids[b, off:off + L] = torch.tensor(ps.input_ids, dtype=torch.long)
        mask[b, off:off + L] = 1
        n = ps.n_counted
        flat.extend(b * T + off + t for t in range(ps.first_target, L - 1))
        targets.extend(ps.input_ids[ps.first_target + 1:])
        sids.extend([ps.sample_id] * n)
        last.extend([False] * (n - 1) + [True])
    position_ids = None
    if padding_side == "left":
        position_ids = (mask.cumsum(dim=1) - 1).clamp_min(0)
    return TokenBatch(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=position_ids,
        flat_positions=torch.tensor(flat, dtype=torch.long),
        targets=torch.tensor(targets, dtype=torch.long),
        sample_ids=torch.tensor(sids, dtype=torch.long),
        last_token_mask=torch.tensor(last, dtype=torch.bool),
        samples=list(samples),
    )


# ----------------------------------------------------------------------------------------------------
# Windowed producer (runs in a background thread, bounded queue)


@dataclass(frozen=True)
class WindowStart:
    """Marks the start of window ``[start, stop)``; carries the window's skipped samples."""

    start: int
    stop: int
    skipped: list[Skipped]
    n_batches: int
    n_truncated: int


@dataclass(frozen=True)
class WindowEnd:
    """Marks the end of window ``[start, stop)``."""

    start: int
    stop: int


Item = WindowStart | TokenBatch | WindowEnd


def iter_windows(samples: Sequence[Sample], mode: ExtractMode, sample_tokenizer: SampleTokenizer, *,
                 start: int, window: int, token_budget: int, pad_id: int,
                 padding_side: PaddingSide = "right") -> Iterator[Item]:
    """Yield ``WindowStart, TokenBatch…, WindowEnd`` for each window of ``window`` samples from ``start``.

    Windows are ``[start + k·window, start + (k+1)·window)`` in input order; inside a window the
    samples are length-sorted into token-budget batches (:func:`make_batches`).
    """
    n = len(samples)
    for w0 in range(start, n, window):
        w1 = min(w0 + window, n)
        prepared, skipped = sample_tokenizer.prepare(samples[w0:w1], mode, offset=w0)
        batches = make_batches(prepared, token_budget)
        yield WindowStart(w0, w1, skipped, len(batches), sum(p.truncated for p in prepared))
        for b in batches:
            yield collate(b, pad_id, padding_side)
        yield WindowEnd(w0, w1)


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_DONE = object()


class Prefetcher:
    """Run an iterator in a background thread, ``maxsize`` items ahead, through a bounded queue.

    Exceptions raised by the producer are re-raised in the consumer; :meth:`close` stops the producer
    (it checks a stop flag whenever the queue is full) and joins it. Use as a context manager.

    Parameters
    ----------
    make_iter : callable returning an iterator
        Called inside the thread (so tokenisation happens there).
    maxsize : int
        Queue bound (items produced ahead of the consumer).
    """

    def __init__(self, make_iter: Callable[[], Iterator[Any]], maxsize: int = 2) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=maxsize)
        self._stop = threading.Event()
        self._make_iter = make_iter
        self._thread = threading.Thread(target=self._run, name="fisher-atlas-tokenize", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self._make_iter():
                if not self._put(item):
                    return
        except BaseException as exc:  # propagate anything to the consumer
            self._put(_Failure(exc))
            return
        self._put(_DONE)

    def __iter__(self) -> Iterator[Any]:
        while True:
            item = self._queue.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item

    def close(self) -> None:
        """Stop the producer and wait for it."""
        self._stop.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        """Whether the producer thread is still running."""
        return self._thread.is_alive()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
