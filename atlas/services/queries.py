"""Queries: routing (prompts sketched by a :class:`~atlas.ports.PromptSketcher`), source recommendation,
pairwise alignment, alignment matrices and the atlas map.

Every query reads the stored states of a few tasks through the :class:`~atlas.services.StateLoader`
(FAISS gives the candidates, the exact estimators of :mod:`atlas.analysis` rank them).
"""

from __future__ import annotations

import asyncio
import numbers
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from atlas import analysis, changes, routing_repo
from atlas import repository as repo
from atlas import space_repository as sql
from atlas.errors import IncompatibleSpace, InvalidInput, NotFound, NotReady, PayloadTooLarge
from atlas.index import IndexManager
from atlas.lexical import TermCounts
from atlas.lru import ContentLru
from atlas.models import TASK_FAILED, TASK_READY, Space, Task
from atlas.novelty import NoveltyCache, SpaceNovelty
from atlas.ports import PromptSketcher, SpaceKey, check_prompt_lengths
from atlas.route_calibration import split_rates
from atlas.routing import MAX_ROUTE_K, unit_means
from atlas.services.states import Loaded, StateLoader
from atlas.signature_repository import novelty_vectors
from atlas.store import Store
from atlas.vocabulary import MAX_SOURCES
from atlas.whitening import WhiteningCache
from fishersketch import SketchState


@dataclass
class Timings:
    """Server-side stage timings of one request, in seconds."""

    forward_s: float = 0.0
    search_s: float = 0.0

    def header(self) -> str:
        """``Server-Timing`` value in ms: ``forward`` (waiting for the batched prompt sketch, queueing
        included) and ``search`` (FAISS + state loading + exact re-rank)."""
        return f"forward;dur={self.forward_s * 1e3:.3f}, search;dur={self.search_s * 1e3:.3f}"


def _checked_k(k: object, top: int) -> int:
    """``k`` as an int in ``1..top``: an int or a NumPy integer ("3" and 2.5 reached a slice: a TypeError)."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 1 <= int(k) <= top:
        raise InvalidInput(f"k must be an integer in 1..{top}, not {k!r}", {"k": repr(k)})
    return int(k)


class QueryService:
    """Read-only questions about the stored tasks (see the module docstring).

    Parameters
    ----------
    store, index, states
    prompts
        Sketches routing prompts (in this process or on remote workers).
    observe
        ``observe(kind, seconds)`` records a query's latency, model forward excluded (``/metrics``); optional.
    observe_forward
        ``observe_forward(seconds)`` records a route request's wait for its prompts' states (queue, forward and
        sketch, in this process or on a worker); optional.
    """

    def __init__(self, store: Store, index: IndexManager, states: StateLoader, prompts: PromptSketcher,
                 observe: Any = None, observe_forward: Any = None) -> None:
        self.store = store
        self.settings = store.settings
        self.index = index
        self.states = states
        self.prompts = prompts
        self.observe = observe or (lambda kind, seconds: None)
        self.observe_forward = observe_forward or (lambda seconds: None)
        self._space_keys: dict[str, tuple[float, SpaceKey]] = {}
        self._prompt_side: dict[int, tuple[int, frozenset[int]]] = {}
        self.whitenings = WhiteningCache()
        self.novelties = NoveltyCache()
        self._analyses: ContentLru[analysis.Matrices | analysis.AtlasMap] = ContentLru(ANALYSIS_CACHE_BYTES,
                                                                                         _analysis_bytes)

    def wait_refits(self, timeout_s: float | None = None) -> None:
        """Wait for the spaces' background re-fits running now (:mod:`atlas.space_fit_cache`)."""
        self.whitenings.wait_refits(timeout_s)
        self.novelties.wait_refits(timeout_s)

    # -- helpers ---------------------------------------------------------------------------------

    def space_key(self, space_ref: str | None) -> SpaceKey:
        """The :class:`SpaceKey` of a space reference (cached for a few seconds: spaces never change)."""
        ref = _cache_ref(space_ref)
        hit = self._space_keys.get(ref)
        now = time.monotonic()
        if hit is not None and now - hit[0] < 5.0:
            return hit[1]
        with self.store.read() as session:
            key = SpaceKey.of(self.store.resolve_space(session, space_ref))
        self._space_keys[ref] = (now, key)
        return key

    def _fresh_index(self, session: Session, space_id: int) -> int:
        """Apply committed changes the index and the state cache have not seen (read-your-writes for
        queries: the exact re-rank never reads a state older than the FAISS entry that found it); the last change
        ``session``'s snapshot holds."""
        watermark, mark = self.index.history(space_id)
        log_head = changes.head(session, watermark)
        # behind, ahead (a database restored under this replica) or at the same number in another history
        stale = not log_head.unchanged(mark)
        if stale:
            self.index.catch_up(space_id)
        self.states.catch_up(log_head.seq, mark=log_head.mark, check=stale)
        return log_head.seq

    def _ready_task(self, session: Session, task_id: int) -> Task:
        task = repo.get_task(session, task_id)
        if task.status == TASK_FAILED:  # its first job failed or was cancelled: it never will have one
            raise NotReady(f"task {task_id} ({task.name}) has no signature: it failed (its first job did not "
                           "succeed); delete it and add it again",
                           {"task_id": task_id, "status": task.status})
        if task.status != TASK_READY:
            raise NotReady(f"task {task_id} ({task.name}) has no signature yet (status {task.status}: its job has "
                           "not finished)", {"task_id": task_id, "status": task.status})
        return task

    def _neighbours(self, session: Session, space: Space, task_id: int, n: int) -> list[int]:
        """Up to ``n`` other ready tasks near ``task_id``: all of them when the space is small."""
        if n <= 0:  # a matrix cap of 1 or 2 tasks leaves no room for context
            return []
        if repo.count_signatures(session, space.id) <= n + 1:
            return sql.ready_task_ids(session, space.id, exclude=task_id, limit=n)
        sig_ids, vectors = repo.get_signatures(session, task_ids=[task_id])
        if len(sig_ids) == 0:
            raise NotReady(f"task {task_id} has no signature yet", {"task_id": task_id})
        _, ids = self.index.search(space.id, vectors, n + 1)
        return [int(i) for i in ids[0] if i >= 0 and int(i) != task_id][:n]

    # -- routing ---------------------------------------------------------------------------------

    async def route(self, prompts: Sequence[str], *, k: int = 3, threshold: float | None = None,
                    candidates: int | None = None, space_ref: str | None = None
                    ) -> tuple[list[analysis.RouteAnswer], Timings]:
        """Route prompts to their nearest tasks: batched prompt sketch, FAISS candidates, exact re-rank.

        Raises
        ------
        PayloadTooLarge, InvalidInput
            A prompt over ``max_prompt_chars`` or not sketchable.
        ModelUnavailable
            No model or worker serves the space (at once).
        IncompatibleSpace
            This process's one model or sketch spec is not the space's (embedded mode).
        QueueFull
            The prompt queue is full (``retry_after_s`` from its drain time).
        """
        if not prompts:
            raise InvalidInput("give at least one prompt")
        k = _checked_k(k, MAX_ROUTE_K)
        # a cosine in [-1, 1] (a NaN threshold answered every prompt, with a NaN confidence)
        thr = float(self.settings.route_threshold) if threshold is None else routing_repo.route_threshold(threshold)
        check_prompt_lengths(prompts, self.settings.max_prompt_chars)
        key = await asyncio.to_thread(self.space_key, space_ref)
        # sketch() checks that the space is served first (503 or 409 at once); a check here ran on the event loop,
        # and the remote sketcher's check reads Redis (a silent Redis stalled every request of the process).
        timings = Timings()
        t0 = time.perf_counter()
        states = await self.prompts.sketch(key, prompts)
        timings.forward_s = time.perf_counter() - t0
        self.observe_forward(timings.forward_s)
        t1 = time.perf_counter()
        answers = await asyncio.to_thread(self.search_states, key.space_id, states, k=k, threshold=thr,
                                          candidates=candidates or analysis.route_pool(k),
                                          per_task=threshold is None, texts=prompts)
        timings.search_s = time.perf_counter() - t1
        self.observe("route", timings.search_s)
        cut = getattr(states, "truncated", None)  # None: a sketcher that does not say
        if cut is not None:
            answers = [replace(a, truncated=was_cut) for a, was_cut in zip(answers, cut, strict=True)]
        return answers, timings

    def search_states(self, space_id: int, states: Sequence[SketchState], *, k: int, threshold: float,
                      candidates: int, per_task: bool = False, texts: Sequence[str] | None = None
                      ) -> list[analysis.RouteAnswer]:
        """FAISS candidates by signature (plus the space's completion tasks, routed on their prompt-side
        states), then the exact re-rank, for each query state; ``per_task``: each task's own calibrated
        threshold instead of ``threshold``; matches are ordered by the space-whitened ranking score
        (:mod:`atlas.whitening`, ``docs/SCORES.md``), fused with the lexical score of the prompt ``texts``
        (one per state; :mod:`atlas.lexical`) unless ``settings.route_lexical`` is false; a prompt that lacks
        a term of the answered task's active template is answered ``none`` (:mod:`atlas.template`) unless
        ``settings.route_template`` is false; a prompt short for a task is held to its length's threshold
        (:func:`atlas.routing.prompt_threshold`) unless ``settings.route_length_match`` is false."""
        answers = []
        queries = np.stack([np.asarray(st.signature(), dtype=np.float32) for st in states])
        with self.store.read() as session:
            space = sql.get_space(session, space_id)
            snapshot = self._fresh_index(session, space_id)
            scores, ids = self.index.search(space_id, queries, candidates)
            hits = [{int(t): float(sc) for t, sc in zip(ids[qi], scores[qi], strict=True) if t >= 0}
                    for qi in range(len(states))]
            # One read of the states and routing rows for the whole batch: the union of every query's
            # hits plus the tasks that always route on a prompt-side state.
            union = list(dict.fromkeys(t for h in hits for t in h))
            prompt_side = self._prompt_side_ids(session, space_id)
            loaded = self.states.load(session, space, [*union, *sorted(prompt_side - set(union))])
            keep = self.settings.route_template  # else no candidate carries its template: the test is off
            by_length = self.settings.route_length_match  # else none carries its views: every prompt judged whole
            base = {c.task_id: c if keep and by_length else replace(c, template=c.template if keep else None,
                                                                    length_views=c.length_views if by_length else None)
                    for c in routing_repo.route_candidates(session, self.store.spec_of(space), loaded, {})}
            mark = self._snapshot_mark(session, space_id, snapshot)
            whitening = self.whitenings.get(space_id, mark, lambda: self.index.ids(space_id),
                                            lambda ids: self._read_routing_means(space_id, ids), detached=True)
            vectors = getattr(states, "novelty", None)
            novelty = None
            if vectors is not None and per_task and self.settings.route_novelty:
                novelty = self._novelty_model(space_id, mark)
        terms: list[TermCounts | None] = [None] * len(states)
        if texts is not None and self.settings.route_lexical:
            terms = [TermCounts.from_texts([t]) for t in texts]
        for qi, (st, hit, pt) in enumerate(zip(states, hits, terms, strict=True)):
            cands = [replace(c, faiss_score=hit.get(t, 0.0)) for t, c in base.items() if t in hit or t in prompt_side]
            answers.append(analysis.rerank_route(st, cands, k=k, threshold=threshold, per_task=per_task,
                                                 whitening=whitening, prompt_terms=pt, novelty=novelty,
                                                 prompt_vector=None if novelty is None or vectors is None
                                                 else vectors[qi]))
        return answers

    def novelty_tested(self, space_id: int, rates: Mapping[int, float]) -> frozenset[int]:
        """Those of the space's tasks (the keys of ``rates``, each with its false-reject rate) that have a novelty
        test (:meth:`atlas.novelty.SpaceNovelty.tested` at the test's share of the rate: enough stored vectors;
        none when the test is off by ``route_novelty``), whatever their own switch: the tasks whose route threshold
        is taken at the rest of their rate while the switch is on and no override is set."""
        if not self.settings.route_novelty:
            return frozenset()
        with self.store.read() as session:
            model = self._novelty_model(space_id, self._snapshot_mark(session, space_id))
        return frozenset() if model is None else frozenset(
            t for t, rate in rates.items() if model.tested(int(t), split_rates(float(rate))[1]))

    def _snapshot_mark(self, session: Session, space_id: int, snapshot: int | None = None) -> int:
        """The space's content mark as ``session`` sees it: the index's, unless the session's snapshot began before
        the index caught up past it (the background sync, or another request's catch-up) — then the snapshot's last
        change. A fit read from an older snapshot was cached under the newer mark and kept: a task added in the window
        was fitted without its routing record (a concurrency review, 2026-12-07). ``snapshot``: the session's last
        change when already read (:meth:`_fresh_index`), else read here."""
        return min(self.index.content_mark(space_id), changes.last_seq(session) if snapshot is None else snapshot)

    def _novelty_model(self, space_id: int, mark: int) -> SpaceNovelty | None:
        """The space's novelty model at content mark ``mark`` (re-fitted when stale, in the background in a large
        space; its vectors, and later those of a task outside the fit, read by :meth:`_read_novelty_vectors`)."""
        return self.novelties.get(space_id, mark, lambda: [int(i) for i in self.index.ids(space_id)],
                                  self._read_novelty_vectors, detached=True)

    def _read_novelty_vectors(self, task_ids: list[int]) -> Mapping[int, np.ndarray]:
        """The tasks' stored novelty vectors, in a read session of its own (a task calibrated on its first use,
        after the route batch's session has ended)."""
        with self.store.read() as session:
            return novelty_vectors(session, task_ids)

    def _prompt_side_ids(self, session: Session, space_id: int) -> frozenset[int]:
        """The space's tasks that route on a prompt-side state (re-ranked on every route), read again only
        when the space's content mark moves (a task of the space added, appended or deleted: the job that
        stores a prompt-side state logs its change in the same transaction)."""
        mark = self.index.content_mark(space_id)
        hit = self._prompt_side.get(space_id)
        if hit is not None and hit[0] == mark:
            return hit[1]
        ids = frozenset(routing_repo.with_prompt_side(session, space_id, []))
        # The session's snapshot may predate the index's catch-up (a change committed in between moved the mark):
        # a set read there is cached only if the snapshot holds every change the mark stands for.
        if changes.last_seq(session) >= mark:
            self._prompt_side[space_id] = (mark, ids)
        return ids

    def _read_routing_means(self, space_id: int, task_ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Unit ``ae`` and error means, shapes (n, m), of what each task routes on (its prompt-side state
        for a completion task), and the tasks' typical scores (n,): what the space's whitening is fitted on. Read
        in a session of its own (a large space's re-fit runs in the background), from a snapshot at least as
        recent as the route's that asked for it."""
        with self.store.read() as session:
            space = sql.get_space(session, space_id)
            m = space.m
            loaded = self.states.load(session, space, task_ids)
            cands = routing_repo.route_candidates(session, self.store.spec_of(space), loaded, {})
        if not cands:
            return np.zeros((0, m)), np.zeros((0, m)), np.zeros(0)
        means = np.stack([unit_means(c.state) for c in cands])  # (n, 2, m)
        typicals = np.array([np.nan if c.typical is None else c.typical for c in cands])
        return means[:, 0], means[:, 1], typicals

    # -- recommendation and alignment ------------------------------------------------------------

    def sources(self, task_id: int, *, k: int = 5, candidates: int | None = None
                ) -> tuple[Loaded, list[analysis.Source], int]:
        """Recommended fine-tuning sources for a target task: ``(target, sources, compared)``."""
        cap = max(1, self.settings.max_matrix_tasks - 1)
        k = _checked_k(k, min(MAX_SOURCES, self.settings.max_matrix_tasks))  # REST's bound (the library took 200)
        n = min(candidates or analysis.default_candidates(k), cap)
        t0 = time.perf_counter()
        with self.store.read() as session:
            target = self._ready_task(session, task_id)
            space = target.space
            self._fresh_index(session, space.id)
            others = self._neighbours(session, space, task_id, n)
            loaded = self.states.load(session, space, [task_id, *others])
        if not loaded or loaded[0].task_id != task_id:
            raise NotReady(f"task {task_id} has no state yet", {"task_id": task_id})
        tgt = analysis.TaskState(loaded[0].task_id, loaded[0].name, loaded[0].state)
        cands = [analysis.TaskState(x.task_id, x.name, x.state) for x in loaded[1:]]
        out = analysis.recommend_sources(tgt, cands, k=k)
        self.observe("sources", time.perf_counter() - t0)
        return loaded[0], out, len(cands)

    def align(self, a: int, b: int) -> tuple[Loaded, Loaded, analysis.Factors]:
        """Alignment of one pair; EB shrinkage over ``a``'s nearest neighbours (as in :meth:`sources`)."""
        t0 = time.perf_counter()
        with self.store.read() as session:
            ta, tb = self._ready_task(session, a), self._ready_task(session, b)
            if ta.space_id != tb.space_id:
                raise IncompatibleSpace(f"tasks {a} and {b} belong to different spaces ({ta.space_id}, {tb.space_id})",
                                        {"space_ids": [ta.space_id, tb.space_id]})
            space = ta.space
            self._fresh_index(session, space.id)
            context = self._neighbours(session, space, a, min(analysis.default_candidates(5),
                                                              self.settings.max_matrix_tasks - 2))
            loaded = self.states.load(session, space, [a, b, *[c for c in context if c != b]])
        by_id = {x.task_id: x for x in loaded}
        if a not in by_id or b not in by_id:
            raise NotReady("both tasks need a stored state", {"task_ids": [a, b]})
        ctx = [] if a == b else [analysis.TaskState(x.task_id, x.name, x.state) for x in loaded
                                 if x.task_id not in (a, b)]
        f = analysis.pair_factors(analysis.TaskState(a, by_id[a].name, by_id[a].state),
                                  analysis.TaskState(b, by_id[b].name, by_id[b].state), ctx)
        self.observe("align", time.perf_counter() - t0)
        return by_id[a], by_id[b], f

    def matrix(self, task_ids: Sequence[int]) -> analysis.Matrices:
        """Alignment matrices of the given tasks (one space, all ready)."""
        ids = [int(i) for i in task_ids]
        if not ids:
            raise InvalidInput("give at least one ready task")
        cap = self.settings.max_matrix_tasks
        if len(ids) > cap:  # first: the checks below are bounded by the cap
            raise PayloadTooLarge(f"{len(ids)} tasks exceed the matrix limit of {cap}", {"max_matrix_tasks": cap})
        if len(set(ids)) != len(ids):
            twice = sorted(i for i, n in Counter(ids).items() if n > 1)
            raise InvalidInput(f"task_ids must be distinct: {', '.join(f'task {i}' for i in twice)} "
                               f"{'is' if len(twice) == 1 else 'are'} given more than once",
                               {"task_ids": ids, "repeated": twice})
        t0 = time.perf_counter()
        with self.store.read() as session:
            tasks = repo.get_tasks(session, ids)
            spaces = {t.space_id for t in tasks}
            if len(spaces) > 1:
                where = "; ".join(f"space {sp}: " + ", ".join(f"{t.id} ({t.name})" for t in tasks if t.space_id == sp)
                                  for sp in sorted(spaces))
                raise IncompatibleSpace(f"the tasks belong to different spaces ({where}); a matrix compares the "
                                        "tasks of one space", {"space_ids": sorted(spaces)})
            not_ready = [t for t in tasks if t.status != TASK_READY]
            if not_ready:
                named = ", ".join(f"{t.id} ({t.name}, {t.status})" for t in not_ready)
                raise NotReady(f"tasks without a signature: {named}", {"task_ids": [t.id for t in not_ready]})
            # the index's history check too: a database restored under this process (the same change number in
            # another history) left the state cache's entries of reused task ids as they were
            self._fresh_index(session, tasks[0].space_id)
            loaded = self.states.load(session, tasks[0].space, ids)
        gone = sorted(set(ids) - {x.task_id for x in loaded})
        if gone:  # deleted since the check above: a matrix without them answered 200 with fewer rows than asked
            raise NotFound(f"task(s) {', '.join(map(str, gone))} were deleted while the matrix was read",
                           {"task_ids": gone})
        mats = self._analyses.get_or_make(
            ("matrix", _states_key(loaded)),
            lambda: analysis.alignment_matrix([analysis.TaskState(x.task_id, x.name, x.state) for x in loaded]))
        assert isinstance(mats, analysis.Matrices)
        self.observe("matrix", time.perf_counter() - t0)
        return _copy(mats)

    def atlas(self, space_ref: str | None = None) -> tuple[Space, analysis.AtlasMap, int, bool]:
        """2-D map of a space's ready tasks (an even subset above ``max_matrix_tasks``):
        ``(space, map, total, sampled)``."""
        t0 = time.perf_counter()
        with self.store.read() as session:
            space = self.store.resolve_space(session, space_ref)
            self._fresh_index(session, space.id)
            ids = sql.ready_task_ids(session, space.id)
            chosen = analysis.even_sample(ids, self.settings.max_matrix_tasks)
            loaded = self.states.load(session, space, chosen)
            session.expunge(space)
        total = len(ids) - (len(chosen) - len(loaded))  # less those deleted since the list was read
        amap = self._analyses.get_or_make(
            ("atlas", _states_key(loaded)),
            lambda: analysis.atlas_layout([analysis.TaskState(x.task_id, x.name, x.state) for x in loaded]))
        assert isinstance(amap, analysis.AtlasMap)
        self.observe("atlas", time.perf_counter() - t0)
        return space, replace(amap, points=list(amap.points), extra=dict(amap.extra)), total, len(chosen) < len(ids)


ANALYSIS_CACHE_BYTES = 64 * 2**20
"""Bytes of alignment matrices and maps kept (a matrix of 256 tasks holds 2.6 MB): the dashboard asks for the same
map and matrix at every view, and each, of 256 tasks, cost about a second of CPU on a 2-core box."""


def _states_key(loaded: Sequence[Loaded]) -> tuple[tuple[int, str, bytes], ...]:
    """What a matrix or map is a function of: the tasks, in order, each named by its id, its name (shown in the
    answer) and its state's content digest (task id and row version named them until a database restored under a
    running process reused both: a concurrency review, 2026-12-07)."""
    return tuple((x.task_id, x.name, x.digest) for x in loaded)


def _copy(mats: analysis.Matrices) -> analysis.Matrices:
    """A copy of a cached answer that its caller may change (a library user's notebook) without changing the
    cache's."""
    return replace(mats, ids=list(mats.ids), names=list(mats.names), fisher=mats.fisher.copy(),
                   fisher_shrunk=mats.fisher_shrunk.copy(), activation=mats.activation.copy(),
                   error=mats.error.copy(), rho=mats.rho.copy(), pair_flags=dict(mats.pair_flags))


def _analysis_bytes(value: analysis.Matrices | analysis.AtlasMap) -> int:
    """Approximate bytes held by a cached matrix or map."""
    if isinstance(value, analysis.Matrices):
        return sum(a.nbytes for a in (value.fisher, value.fisher_shrunk, value.activation, value.error, value.rho))
    return 200 * len(value.points) + 1024


def _cache_ref(space_ref: str | int | None) -> str:
    """The cache key of a space reference: one per space however it is spelled (``" Default"``, ``"007"``), so
    the cache holds at most one entry per space id, per model name and for the default (``Store.resolve_space``)."""
    ref = "default" if space_ref is None else str(space_ref)
    if ref.strip().lower() in ("", "default"):
        return "default"
    if ref.isascii() and ref.isdigit():
        return ref.lstrip("0") or "0"
    return ref
