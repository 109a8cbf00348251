"""Dynamic micro-batching of routing prompts over one loaded model.

Callers tokenise their prompts once (:meth:`PromptBatcher.prepare`, in their own thread: invalid prompts
are refused before they queue) and wait on a future; one loop thread gathers requests until
``max_batch`` prompts or ``max_wait_ms`` after the first (it waits only while requests arrive
concurrently), sorts the prompts into length buckets (bounded padding, at most ``token_budget`` padded
tokens each), runs one forward per bucket and one batched sketch over all their tokens
(:func:`fishersketch.groups.sketch_groups`) that gives every prompt its own state, and resolves the
futures. The sketch chunk follows the batch size (32 to 256 rows), so a small batch does not pay for
padding to 256 rows. The queue is bounded: past ``max_pending`` prompts a request is refused with
``QueueFull`` whose ``retry_after_s`` is the time the queue ahead takes at the measured rate; a request
that alone holds more than ``max_pending`` prompts is refused with ``PayloadTooLarge`` (413: no retry helps).

:class:`InProcessPromptSketcher` is the embedded implementation of :class:`atlas.ports.PromptSketcher`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from atlas.errors import IncompatibleSpace, InvalidInput, ModelUnavailable, PayloadTooLarge, QueueFull
from atlas.novelty import project
from atlas.ports import PromptStates, SpaceKey, serving_key
from atlas.samples import Sample
from fishersketch import Sketcher, SketchState
from fishersketch.groups import sketch_groups
from workers.batching import PreparedSample, collate
from workers.extraction import Extractor
from workers.head import iter_head_batches

log = logging.getLogger(__name__)

PAD_RATIO = 0.5
"""A prompt joins a length bucket only if it is at least this fraction of the bucket's longest prompt."""
SKETCH_ROWS = 4096
"""Token rows gathered across buckets before one batched sketch (bounds the (rows, K) errors held)."""

_SKIP_MESSAGES = {
    "empty": "prompt is empty",
    "invalid_text": "prompt is not valid Unicode (it contains lone surrogates)",
    "too_short": "prompt has fewer than 2 tokens; at least one next-token position is needed",
    "token_out_of_range": "prompt tokenises to ids outside the model's vocabulary",
}


@dataclass
class _Request:
    prepared: list[PreparedSample]
    future: Future[list[SketchState]] = field(default_factory=Future)


class PromptBatcher:
    """One model's micro-batching loop (see the module docstring).

    Parameters
    ----------
    extractor : Extractor
        Model, tokenizer and sketcher of the space served.
    max_batch : int
        Prompts per gathered batch.
    max_wait_ms : float
        How long the loop waits for more prompts after the first of a batch.
    max_pending : int
        Prompts queued or running beyond which :meth:`submit` raises ``QueueFull``.
    token_budget : int
        Padded tokens per forward (longer batches are split by length buckets).
    """

    def __init__(self, extractor: Extractor, *, max_batch: int = 64, max_wait_ms: float = 2.0,
                 max_pending: int = 1024, token_budget: int = 8192) -> None:
        self.extractor = extractor
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1e3
        self.max_pending = max_pending
        self.token_budget = token_budget
        self._queue: deque[_Request] = deque()
        self._cond = threading.Condition()
        self._pending = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._sketchers: dict[int, Sketcher] = {}
        self._rate = 0.0  # EWMA prompts per second of busy time
        self._last_requests = 0
        self.batches = 0
        self.prompts_done = 0

    # -- callers' side ---------------------------------------------------------------------------

    def prepare(self, prompts: Sequence[str]) -> list[PreparedSample]:
        """Tokenise prompts once (text mode); ``PreparedSample.index`` is the prompt's position.

        Raises
        ------
        InvalidInput
            A prompt that is not a string, empty, invalid Unicode or under 2 tokens (``detail.prompt``).
        """
        for i, p in enumerate(prompts):
            if not isinstance(p, str):
                raise InvalidInput(f"prompt {i} must be a string", {"prompt": i})
        prepared, skipped = self.extractor.sample_tokenizer.prepare([Sample(text=p) for p in prompts], "text")
        if skipped:
            bad = skipped[0]
            message = _SKIP_MESSAGES.get(bad.reason, f"prompt cannot be used ({bad.reason})")
            raise InvalidInput(f"prompt {bad.index}: {message}", {"prompt": bad.index, "reason": bad.reason})
        return prepared

    def submit(self, prepared: list[PreparedSample]) -> Future[list[SketchState]]:
        """Queue tokenised prompts; the future gives their states in order.

        Raises
        ------
        QueueFull
            ``max_pending`` prompts are already waiting (``retry_after_s``: the queue's drain time).
        PayloadTooLarge
            The request alone holds more than ``max_pending`` prompts: no retry can admit it.
        """
        if len(prepared) > self.max_pending:
            raise PayloadTooLarge(
                f"{len(prepared)} prompts in one request; at most {self.max_pending} can wait for the model "
                f"(prompt_max_pending): send fewer per request",
                {"prompts": len(prepared), "max_pending": self.max_pending},
            )
        req = _Request(prepared)
        with self._cond:
            if self._stopping:
                raise ModelUnavailable("the prompt service is stopping")
            if self._pending + len(prepared) > self.max_pending:
                wait = self._pending / self._rate if self._rate > 0 else 1.0
                raise QueueFull(
                    f"{self._pending} prompts are waiting for the model; retry in {wait:.1f} s",
                    {"pending": self._pending, "max_pending": self.max_pending}, retry_after_s=wait,
                )
            self._pending += len(prepared)
            self._queue.append(req)
            self._ensure_thread()
            self._cond.notify()
        return req.future

    def sketch_sync(self, prompts: Sequence[str]) -> list[SketchState]:
        """Prepare, submit and wait (for callers outside an event loop)."""
        return self.submit(self.prepare(prompts)).result()

    # -- the loop --------------------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="fisher-atlas-prompt-batcher", daemon=True)
            self._thread.start()

    def _gather(self) -> list[_Request] | None:
        """Wait for a first request, then gather more until ``max_batch`` prompts or the time bound."""
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            if self._stopping and not self._queue:
                return None
            batch = [self._queue.popleft()]
            size = len(batch[0].prepared)
            # Wait for more only under concurrency (the last batch gathered several requests, or more
            # are queued): a lone caller is not made to wait for company that does not come.
            wait = self.max_wait_s if (self._last_requests > 1 or self._queue) else 0.0
            deadline = time.monotonic() + wait
            while size < self.max_batch:
                if not self._queue:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                    continue
                if size + len(self._queue[0].prepared) > self.max_batch:
                    break
                req = self._queue.popleft()
                batch.append(req)
                size += len(req.prepared)
            self._last_requests = len(batch)
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._gather()
            if batch is None:
                return
            live = [r for r in batch if r.future.set_running_or_notify_cancel()]
            n = sum(len(r.prepared) for r in batch)
            t0 = time.perf_counter()
            try:
                states = self.sketch_prepared([p for r in live for p in r.prepared])
                at = 0
                for r in live:
                    r.future.set_result(states.part(at, at + len(r.prepared)))
                    at += len(r.prepared)
            except BaseException as exc:  # resolve every waiter; the loop goes on
                log.exception("prompt batch failed")
                for r in live:
                    if not r.future.done():
                        r.future.set_exception(exc)
            finally:
                dt = time.perf_counter() - t0
                with self._cond:
                    self._pending -= n
                    self.batches += 1
                    self.prompts_done += n
                    if dt > 0:
                        rate = n / dt
                        self._rate = rate if self._rate == 0 else 0.8 * self._rate + 0.2 * rate

    def _sketcher_for(self, rows: int) -> Sketcher:
        """The space's sketcher with a chunk of 32..256 rows, the smallest power of two ≥ ``rows``."""
        base = self.extractor.sketcher
        assert base is not None
        chunk = min(max(32, 1 << max(0, rows - 1).bit_length()), max(32, base.chunk_rows))
        sk = self._sketchers.get(chunk)
        if sk is None:
            sk = self._sketchers.setdefault(chunk, base.with_chunk_rows(chunk))
        return sk

    def buckets(self, prepared: Sequence[PreparedSample]) -> list[list[PreparedSample]]:
        """Length buckets: longest first, a new bucket when the padded size would pass ``token_budget``
        or a prompt is shorter than ``PAD_RATIO`` of its bucket's longest (bounded padding waste)."""
        out: list[list[PreparedSample]] = []
        for ps in sorted(prepared, key=lambda p: (-p.length, p.index)):
            if out:
                cur = out[-1]
                width = cur[0].length
                if (len(cur) + 1) * width <= self.token_budget and ps.length >= PAD_RATIO * width:
                    cur.append(ps)
                    continue
            out.append([ps])
        return out

    def sketch_prepared(self, prepared: Sequence[PreparedSample],
                        sketched: Callable[[int], None] | None = None) -> PromptStates:
        """States of tokenised prompts, in order: one forward per length bucket, one batched sketch; with each
        prompt's novelty vector (its mean head input, :func:`atlas.novelty.project`-ed) and whether it was cut to
        the token limit.

        Parameters
        ----------
        prepared : sequence of PreparedSample
            From :meth:`prepare` (any number; indices are ignored).
        sketched : callable, optional
            Called with the number of prompts through the model so far after each length bucket's forward (a job's
            progress: the forwards take most of the time; their batched sketches follow every ``SKETCH_ROWS``
            positions and at the end, and a pass that fits one sketch reported nothing until it ended).

        Returns
        -------
        PromptStates
        """
        ex = self.extractor
        lm = ex.lm
        # Re-index by position so each prompt's counted tokens carry its group id (= its position).
        items = [PreparedSample(j, p.sample_id, p.input_ids, p.first_target, p.truncated)
                 for j, p in enumerate(prepared)]
        out: list[SketchState | None] = [None] * len(prepared)
        hidden_means = torch.zeros((len(prepared), lm.hidden_size), dtype=torch.float64)
        rows: list[tuple[torch.Tensor, torch.Tensor, list[PreparedSample]]] = []
        n_rows = n_done = n_forwarded = 0

        def flush() -> None:
            nonlocal n_rows, n_done
            if not rows:
                return
            group_of = [ps for _, _, bucket in rows for ps in bucket]
            counts = torch.tensor([ps.n_counted for ps in group_of])
            groups = torch.repeat_interleave(torch.arange(len(group_of)), counts)
            a = torch.cat([r[0] for r in rows]) if len(rows) > 1 else rows[0][0]
            e = torch.cat([r[1] for r in rows]) if len(rows) > 1 else rows[0][1]
            states = sketch_groups(self._sketcher_for(a.shape[0]), a, e, groups, len(group_of),
                                   sample_ids=[ps.sample_id for ps in group_of])
            sums = torch.zeros((len(group_of), lm.hidden_size), dtype=torch.float64)
            sums.index_add_(0, groups, a[:, :lm.hidden_size].double().cpu())
            means = sums / counts.clamp(min=1).unsqueeze(1).double()
            for ps, mean in zip(group_of, means, strict=True):
                hidden_means[ps.index] = mean
            for ps, st in zip(group_of, states, strict=True):
                out[ps.index] = st
            rows.clear()
            n_rows, n_done = 0, n_done + len(group_of)

        with torch.inference_mode():
            for bucket in self.buckets(items):
                tb = collate(bucket, ex.pad_id, ex.padding_side)
                parts = list(iter_head_batches(lm, tb, logits_chunk=max(tb.n_positions, 1)))
                rows.append((torch.cat([hb.a for hb in parts]), torch.cat([hb.e for hb in parts]), bucket))
                n_rows, n_forwarded = n_rows + tb.n_positions, n_forwarded + len(bucket)
                if n_rows >= SKETCH_ROWS:
                    flush()
                if sketched is not None and n_forwarded < len(items):  # the last one: once its sketch is done
                    sketched(n_forwarded)
            flush()
            if sketched is not None:
                sketched(n_done)
        assert all(s is not None for s in out)
        return PromptStates.of([s for s in out if s is not None], project(hidden_means.numpy()),
                               [p.truncated for p in prepared])

    # -- stats and shutdown -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Pending prompts, batches run, mean batch size, measured prompts/s."""
        with self._cond:
            return {"pending": self._pending, "batches": self.batches, "prompts": self.prompts_done,
                    "mean_batch": self.prompts_done / self.batches if self.batches else 0.0,
                    "prompts_per_s": self._rate}

    def cancel_waiting(self) -> int:
        """Cancel the requests that wait for a batch (their futures end cancelled; the batch being run goes on);
        returns how many. A stopping worker gives those back for another to answer, rather than computing them
        for callers that stopped waiting when it withdrew."""
        with self._cond:
            waiting = list(self._queue)
            self._queue.clear()
            for req in waiting:
                req.future.cancel()
                self._pending -= len(req.prepared)
            self._cond.notify_all()
        return len(waiting)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no prompt waits or runs (the batch being run is answered); whether that came in time."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
        return True

    def close(self) -> None:
        """Finish the queued requests, then stop the loop."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)


class InProcessPromptSketcher:
    """:class:`atlas.ports.PromptSketcher` over a model loaded in this process (embedded mode).

    Parameters
    ----------
    extractor : Extractor or None
        The loaded model's extractor; ``None`` when the model failed to load (every call then raises
        ``ModelUnavailable`` with ``model_error``).
    model_error : str, optional
    **batching
        :class:`PromptBatcher` options.
    """

    def __init__(self, extractor: Extractor | None, *, model_name: str, model_error: str | None = None,
                 **batching: Any) -> None:
        self.model_name = model_name
        self.model_error = model_error
        self.batcher = PromptBatcher(extractor, **batching) if extractor is not None else None
        self.key: str | None = None
        self.model_fingerprint: str | None = None
        self.spec: dict[str, Any] = {}
        if extractor is not None and extractor.sketcher is not None:
            self.model_fingerprint = extractor.lm.fingerprint.key()
            self.key = serving_key(self.model_fingerprint, extractor.sketcher.spec.fingerprint())
            self.spec = extractor.sketcher.spec.to_dict()

    def check_served(self, space: SpaceKey) -> None:
        """Raise ``ModelUnavailable`` (503) when no model is loaded, ``IncompatibleSpace`` (409) when the loaded
        model or sketch spec is not the space's: this process serves one model and spec, so waiting cannot help (a
        remote prompt service answers 503 instead: a worker of the space's model may come up)."""
        if self.batcher is None:
            raise ModelUnavailable(
                f"the model {self.model_name!r} is not loaded: {self.model_error or 'unknown reason'}",
                {"model": self.model_name},
            )
        if space.serving_key != self.key:
            if space.model_fingerprint == self.model_fingerprint:  # the same model, another sketch spec
                differ = [k for k in sorted(set(space.spec) | set(self.spec)) if space.spec.get(k) != self.spec.get(k)]
                theirs, ours = (", ".join(f"{k}={spec.get(k)}" for k in differ) for spec in (space.spec, self.spec))
                why = (f"space {space.space_id} was sketched with {theirs}, this process sketches with {ours} "
                       "(the same model; start the service with the space's sketch settings to query it)")
            else:
                theirs, ours = repr(space.model_name), repr(self.model_name)
                if theirs == ours:  # one name, other weights (an export of another service's model): name the weights
                    theirs, ours = (f"{theirs} (fingerprint {space.model_fingerprint})",
                                    f"{ours} (fingerprint {self.model_fingerprint})")
                why = f"space {space.space_id} was sketched with the model {theirs}; this process serves {ours}"
            raise IncompatibleSpace(f"no model of this service serves space {space.space_id}: {why}",
                                    {"space_id": space.space_id, "model": space.model_name,
                                     "space_model": space.model_fingerprint, "served_model": self.model_fingerprint})

    async def sketch(self, space: SpaceKey, prompts: Sequence[str]) -> list[SketchState]:
        """Tokenise (in a thread), queue, and await the batched states."""
        self.check_served(space)
        assert self.batcher is not None
        prepared = await asyncio.to_thread(self.batcher.prepare, prompts)
        return await asyncio.wrap_future(self.batcher.submit(prepared))

    def stats(self) -> dict[str, Any]:
        """The batcher's figures (empty without a model)."""
        return {"mode": "inprocess", **(self.batcher.stats() if self.batcher else {})}

    def close(self) -> None:
        """Stop the batching loop: the prompts still waiting are cancelled, not computed (the service closes it at its
        stop, once its open requests are answered or closed: the prompts of requests cut at the grace period's end
        held the stop for up to 30 s more), the batch being run is finished."""
        if self.batcher is not None:
            self.batcher.cancel_waiting()
            self.batcher.close()
