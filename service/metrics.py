"""Prometheus metrics of one app instance (``GET /metrics``).

Each app owns a :class:`prometheus_client.CollectorRegistry`, so several apps in one process (tests)
never clash. Request latency and query stage timings are observed in-process; job durations,
tokens processed and queue depth are read from the database at scrape time (the source of truth,
also for jobs run by Celery workers on other machines).

Metrics
-------
``fisher_atlas_http_requests_total{method,route,status}`` / ``fisher_atlas_http_request_duration_seconds``
    Every request, by route template.
``fisher_atlas_search_seconds{kind}``
    Search + exact re-rank time, model forward excluded (``kind`` = route | sources | align | matrix | atlas).
``fisher_atlas_prompt_forward_seconds``
    Per routing call (a ``/v1/route`` request, each batch of 64 labelled prompts of ``POST /v1/route/fit``): the wait
    for its prompts' states (queue, model forward and sketch; in this process or on a worker over Redis). It was
    declared but never observed until 2026-12-02. ``search_seconds{kind="route"}`` counts the same calls.
``fisher_atlas_job_duration_seconds`` (summary from SQL), ``fisher_atlas_job_tokens_total``,
``fisher_atlas_job_tokens_per_second`` (last finished job), ``fisher_atlas_jobs{status}``,
``fisher_atlas_queue_depth``, ``fisher_atlas_index_size``.
    Read from SQL at each scrape, so every replica reports the same: the job figures are of the succeeded jobs the
    store holds (its latest 10,000) and fall when tasks and their jobs are deleted — gauges, whatever their names
    (``_total`` is kept for the dashboards built on it); do not take their ``rate()``.
``fisher_atlas_state_cache_{hits,misses,evictions}_total``, ``fisher_atlas_state_cache_{entries,bytes,max_bytes}``
    The in-memory cache of task states this process routes and compares with (counters since start): a hit rate
    falling, or evictions rising, under a steady load says the cache is smaller than the tasks routed to.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

logger = logging.getLogger("fisher_atlas.service")

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

JobStats = dict[str, Any]
"""What the store snapshot callback returns: ``{"by_status": {status: n}, "duration_count",
"duration_sum", "tokens_total", "last_tokens_per_s", "queue_depth", "index_size"}``."""


class _StoreCollector(Collector):
    """Reads job and queue figures through a callback at scrape time."""

    def __init__(self, snapshot: Callable[[], JobStats]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        try:
            s = self._snapshot()
        except Exception:
            logger.warning("metrics snapshot failed", exc_info=True)
            return []
        jobs = GaugeMetricFamily("fisher_atlas_jobs", "Jobs by status.", labels=["status"])
        for status, n in sorted(s.get("by_status", {}).items()):
            jobs.add_metric([status], float(n))
        duration = SummaryMetricFamily(
            "fisher_atlas_job_duration_seconds",
            "Wall time (started to finished) of the succeeded jobs the store holds, its latest 10,000: read from "
            "SQL, so it falls when tasks and their jobs are deleted (not a counter: no rate()).",
            count_value=int(s.get("duration_count", 0)),
            sum_value=float(s.get("duration_sum", 0.0)),
        )
        tokens = GaugeMetricFamily(
            "fisher_atlas_job_tokens_total",
            "Tokens counted by the succeeded jobs the store holds, its latest 10,000: a gauge read from SQL, which "
            "falls when tasks and their jobs are deleted (not a counter: no rate()).",
            value=float(s.get("tokens_total", 0))
        )
        tps = GaugeMetricFamily(
            "fisher_atlas_job_tokens_per_second",
            "Tokens per second of the latest (highest id) succeeded job.",
            value=float(s.get("last_tokens_per_s", 0.0)),
        )
        depth = GaugeMetricFamily(
            "fisher_atlas_queue_depth", "Jobs queued or running.", value=float(s.get("queue_depth", 0))
        )
        index = GaugeMetricFamily(
            "fisher_atlas_index_size", "Signatures in the FAISS index of the default space.",
            value=float(s.get("index_size", 0)),
        )
        return [jobs, duration, tokens, tps, depth, index]


class _CacheCollector(Collector):
    """Reads a :class:`atlas.state_cache.StateCache`'s counters (``stats()``) at scrape time."""

    def __init__(self, stats: Callable[[], Any]) -> None:
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        s = self._stats()
        out: list[Metric] = [CounterMetricFamily(f"fisher_atlas_state_cache_{name}", f"State cache {what}.",
                                                 value=float(getattr(s, name)))
                             for name, what in (("hits", "hits"), ("misses", "misses (states read from SQL)"),
                                                ("evictions", "evictions (least recently used, to fit max_bytes)"))]
        out += [GaugeMetricFamily(f"fisher_atlas_state_cache_{name}", f"State cache {what}.",
                                  value=float(getattr(s, name)))
                for name, what in (("entries", "entries (tasks)"), ("bytes", "bytes held"),
                                   ("max_bytes", "byte budget"))]
        return out


class Metrics:
    """The metrics of one app; ``registry`` is what ``/metrics`` exposes."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "fisher_atlas_http_requests", "HTTP requests.", ["method", "route", "status"], registry=self.registry
        )
        self.request_seconds = Histogram(
            "fisher_atlas_http_request_duration_seconds", "HTTP request latency.", ["method", "route"],
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.search_seconds = Histogram(
            "fisher_atlas_search_seconds", "Search + exact re-rank time, model forward excluded.", ["kind"],
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.forward_seconds = Histogram(
            "fisher_atlas_prompt_forward_seconds",
            "Per routing call (a route request, a batch of a fit): the wait for its prompts' states.",
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )

    def watch_store(self, snapshot: Callable[[], JobStats]) -> None:
        """Register the scrape-time collector of job/queue figures."""
        self.registry.register(_StoreCollector(snapshot))

    def watch_cache(self, stats: Callable[[], Any]) -> None:
        """Register the scrape-time collector of the state cache's counters."""
        self.registry.register(_CacheCollector(stats))
