"""Prometheus metrics: run outcomes and durations, queue depth, lag and paused pools.

Needs the ``prometheus-client`` package (``pip install "django-durable-jobs[metrics]"``).
Outcomes and durations are counted by the process that records them (a worker,
or ``drain()``); the queue's depth, lag, workers and pauses are read from the
database when the metrics are scraped, so any process can expose them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.http import HttpRequest, HttpResponse

try:
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        REGISTRY,
        CollectorRegistry,
        Counter,
        Histogram,
        generate_latest,
        start_http_server,
    )
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise ImproperlyConfigured(
        "django_jobs.metrics needs the prometheus-client package: "
        'pip install "django-durable-jobs[metrics]"'
    ) from exc

from . import conf
from .execution import Outcome, outcome_observers
from .models import UNFINISHED_STATUSES
from .snapshot import snapshot
from .storage.claiming import Claim

logger = logging.getLogger(__name__)

# From a millisecond job to an hour-long one.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


class QueueCollector(Collector):
    """Per pool, at scrape time: runs by unfinished status, lag, live workers, paused."""

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The metric names, without a query (the registry asks at registration)."""
        return iter([])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        connection = connections[conf.get().DATABASE]
        try:
            yield from self._collect()
        finally:
            # prometheus_client serves each scrape on a new thread: its
            # connection would otherwise stay open until garbage-collected.
            if not connection.in_atomic_block:
                connection.close()

    def _collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "django_jobs_queue_up", "1 when the queue's state could be read from the database"
        )
        try:
            shot = snapshot(window=_WINDOW, with_progress=False)
        except DatabaseError:
            logger.warning("metrics: the queue's state could not be read", exc_info=True)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        depth = GaugeMetricFamily(
            "django_jobs_queue_runs",
            "Runs by pool and unfinished status",
            labels=["pool", "status"],
        )
        lag = GaugeMetricFamily(
            "django_jobs_queue_lag_seconds",
            "Age of the oldest due pending run (0 when none is due)",
            labels=["pool"],
        )
        workers = GaugeMetricFamily(
            "django_jobs_pool_workers", "Live workers serving the pool", labels=["pool"]
        )
        paused = GaugeMetricFamily(
            "django_jobs_pool_paused", "1 when the pool is paused", labels=["pool"]
        )
        held = GaugeMetricFamily(
            "django_jobs_queue_held_runs",
            "Pending runs held out of the claim, by pool and what they wait for",
            labels=["pool", "reason"],
        )
        for pool in shot.pools:
            for status in UNFINISHED_STATUSES:
                depth.add_metric([pool.name, status], pool.counts[status])
            age = pool.oldest_pending.total_seconds() if pool.oldest_pending else 0.0
            lag.add_metric([pool.name], age)
            workers.add_metric([pool.name], pool.workers)
            paused.add_metric([pool.name], 1 if pool.paused else 0)
            held.add_metric([pool.name, "key"], pool.held_for_key)
            held.add_metric([pool.name, "tenant"], pool.held_for_tenant)
            held.add_metric([pool.name, "rate"], pool.held_for_rate)
        yield from (depth, lag, workers, paused, held)


class RunMetrics:
    """The counters and histogram of run outcomes, fed by ``execution.outcome_observers``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.runs = Counter(
            "django_jobs_runs",
            "Run attempts that ended, by job type, pool and outcome",
            ["job_type", "pool", "outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            "django_jobs_run_duration_seconds",
            "Seconds an attempt took, from claim to recorded outcome",
            ["job_type", "pool", "outcome"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )

    def observe(self, claim: Claim, outcome: Outcome, duration: float) -> None:
        if outcome is Outcome.HANDED_OFF:
            return  # counted when the completion is written
        labels = (claim.job_type, claim.pool, outcome.value)
        self.runs.labels(*labels).inc()
        self.duration.labels(*labels).observe(duration)


# The window is irrelevant to the gauges; the shortest keeps the snapshot cheap.
_WINDOW = timedelta(seconds=1)
_installed: dict[int, RunMetrics] = {}
_lock = threading.Lock()


def install(registry: CollectorRegistry = REGISTRY) -> RunMetrics:
    """Register django_jobs' metrics in ``registry`` (once) and start counting outcomes."""
    with _lock:
        if id(registry) not in _installed:
            metrics = RunMetrics(registry)
            registry.register(QueueCollector())
            outcome_observers.append(metrics.observe)
            _installed[id(registry)] = metrics
        return _installed[id(registry)]


def serve(port: int, addr: str = "127.0.0.1") -> None:
    """Install the metrics and expose them over HTTP on ``addr:port`` (a daemon thread)."""
    install()
    start_http_server(port, addr=addr)
    logger.info("metrics served on %s:%d", addr, port)


def metrics_view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """A Django view of the metrics in Prometheus' text format; mount it behind your auth."""
    install()
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
