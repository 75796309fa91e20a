"""Prometheus metrics (outcome counters, durations, queue gauges) and OpenTelemetry spans."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError
from django.test import RequestFactory
from django.utils import timezone
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

from django_jobs import execution, metrics, start, tracing
from django_jobs.pools import pause_pool
from django_jobs.testing import drain
from tests.factories import JobRunFactory, WorkerFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    """A private registry with django_jobs' metrics; the observer is removed afterwards."""
    registry = CollectorRegistry()
    installed = metrics.install(registry)
    yield registry
    execution.outcome_observers.remove(installed.observe)
    del metrics._installed[id(registry)]


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_outcomes_are_counted_with_their_durations(registry: CollectorRegistry) -> None:
    start("tests.noop")
    start("tests.noop")
    start("tests.permanent")
    start("tests.flaky", {"succeed_on": 2})
    assert drain() == 5
    noop = {"job_type": "tests.noop", "pool": "default"}
    assert sample(registry, "django_jobs_runs_total", **noop, outcome="completed") == 2
    assert (
        sample(registry, "django_jobs_run_duration_seconds_count", **noop, outcome="completed") == 2
    )
    permanent = {"job_type": "tests.permanent", "pool": "default", "outcome": "failed"}
    assert sample(registry, "django_jobs_runs_total", **permanent) == 1
    flaky = {"job_type": "tests.flaky", "pool": "default"}
    assert sample(registry, "django_jobs_runs_total", **flaky, outcome="retry") == 1
    assert sample(registry, "django_jobs_runs_total", **flaky, outcome="completed") == 1


def test_install_is_idempotent(registry: CollectorRegistry) -> None:
    before = len(execution.outcome_observers)
    assert metrics.install(registry) is metrics._installed[id(registry)]
    assert len(execution.outcome_observers) == before


def test_the_queue_is_read_at_scrape_time(registry: CollectorRegistry) -> None:
    JobRunFactory(pool="mail", run_at=timezone.now() - timedelta(seconds=60))
    JobRunFactory(pool="mail", run_at=timezone.now() + timedelta(hours=1))
    WorkerFactory(pools=["mail"])
    pause_pool("reports")
    assert sample(registry, "django_jobs_queue_up") == 1
    assert sample(registry, "django_jobs_queue_runs", pool="mail", status="pending") == 2
    assert sample(registry, "django_jobs_queue_runs", pool="mail", status="running") == 0
    lag = sample(registry, "django_jobs_queue_lag_seconds", pool="mail")
    assert lag is not None
    assert lag >= 60
    assert sample(registry, "django_jobs_pool_workers", pool="mail") == 1
    assert sample(registry, "django_jobs_pool_paused", pool="reports") == 1
    assert sample(registry, "django_jobs_pool_paused", pool="mail") == 0


def test_a_database_error_at_scrape_time_reports_down(
    registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    def broken(**kwargs: Any) -> Any:
        raise DatabaseError("connection lost")

    monkeypatch.setattr(metrics, "snapshot", broken)
    assert sample(registry, "django_jobs_queue_up") == 0
    assert sample(registry, "django_jobs_queue_runs", pool="default", status="pending") is None
    assert "could not be read" in caplog.text


def test_a_failing_observer_does_not_break_the_run(caplog: Any) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("observer bug")

    execution.outcome_observers.append(broken)
    try:
        run = start("tests.noop")
        with caplog.at_level(logging.ERROR, logger="django_jobs.execution"):
            assert drain() == 1
    finally:
        execution.outcome_observers.remove(broken)
    run.refresh_from_db()
    assert run.status == "completed"
    assert "outcome observer" in caplog.text


def test_the_view_serves_the_text_format() -> None:
    JobRunFactory(pool="mail")
    try:
        response = metrics.metrics_view(RequestFactory().get("/metrics"))
    finally:
        installed = metrics._installed.pop(id(metrics.REGISTRY))
        execution.outcome_observers.remove(installed.observe)
        for collector in list(metrics.REGISTRY._collector_to_names):
            if isinstance(collector, metrics.QueueCollector) or collector in (
                installed.runs,
                installed.duration,
            ):
                metrics.REGISTRY.unregister(collector)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert b'django_jobs_queue_runs{pool="mail",status="pending"} 1.0' in response.content


# --- OpenTelemetry ----------------------------------------------------------------


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing.trace, "get_tracer_provider", lambda: provider)
    return exporter


def test_each_attempt_is_a_consumer_span(spans: InMemorySpanExporter) -> None:
    run = start("tests.echo", {"x": 1})
    drain()
    (span,) = spans.get_finished_spans()
    assert span.name == "django_jobs tests.echo"
    assert span.kind == SpanKind.CONSUMER
    assert span.attributes is not None
    assert span.attributes["django_jobs.run_id"] == run.pk
    assert span.attributes["django_jobs.attempt"] == 1
    assert span.attributes["messaging.destination.name"] == "echo"
    assert span.status.status_code == StatusCode.UNSET


def test_a_failing_attempt_is_an_error_span_with_the_exception(
    spans: InMemorySpanExporter,
) -> None:
    start("tests.permanent")
    drain()
    (span,) = spans.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR
    assert "PermanentError" in (span.status.description or "")
    assert [event.name for event in span.events] == ["exception"]


def test_a_suspended_attempt_is_not_an_error(spans: InMemorySpanExporter) -> None:
    start("tests.sleeper", {"seconds": 3600})
    drain()
    (span,) = spans.get_finished_spans()
    assert span.status.status_code == StatusCode.UNSET
    assert span.attributes is not None
    assert span.attributes["django_jobs.outcome"] == "suspended"


def test_no_span_without_a_configured_provider() -> None:
    assert tracing._tracer() is None


def test_without_prometheus_client_the_import_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "django_jobs.metrics")
    with pytest.raises(ImproperlyConfigured, match=r"django-durable-jobs\[metrics\]"):
        importlib.import_module("django_jobs.metrics")


def test_without_opentelemetry_there_is_no_span(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "trace", None)
    assert tracing._tracer() is None
    run = start("tests.noop")
    assert drain() == 1
    run.refresh_from_db()
    assert run.status == "completed"


@pytest.mark.django_db(transaction=True)
def test_a_run_the_watchdog_ended_is_counted_once(registry: CollectorRegistry) -> None:
    from django_jobs.worker import JobWorker

    run = start("tests.slow", {"seconds": 1.5})
    assert JobWorker(["default"], burst=True, poll_interval=0.05).run() == 0
    run.refresh_from_db()
    assert run.status == "timed_out"
    slow = {"job_type": "tests.slow", "pool": "default"}
    assert sample(registry, "django_jobs_runs_total", **slow, outcome="timed_out") == 1
    assert sample(registry, "django_jobs_runs_total", **slow, outcome="lost") is None


def test_a_scrape_leaves_no_connection_open(registry: CollectorRegistry) -> None:
    import threading

    from django.db import connections

    opened: list[bool] = []

    def scrape() -> None:
        assert sample(registry, "django_jobs_queue_up") == 1
        opened.append(connections["default"].connection is not None)

    thread = threading.Thread(target=scrape)
    thread.start()
    thread.join(timeout=30)
    assert opened == [False]
