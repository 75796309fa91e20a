"""OpenTelemetry across start(): a run stores its starter's trace context, and each
attempt's span is a child of the starter's span (and links to it).

Spans of the attempts themselves (names, attributes, errors) are tested in test_metrics.py.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connections
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    TraceFlags,
    TraceState,
    use_span,
)

from django_jobs import astart, retry, start, start_many, tracing
from django_jobs.models import JobRun, Status
from django_jobs.tasks_backend import run_id
from django_jobs.testing import drain
from django_jobs.worker import EXIT_OK, JobWorker
from tests.testapp import jobs, tasks

pytestmark = pytest.mark.django_db

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> TracerProvider:
    provider = TracerProvider()
    monkeypatch.setattr(tracing.trace, "get_tracer_provider", lambda: provider)
    return provider


@pytest.fixture
def spans(provider: TracerProvider) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture
def request_span(provider: TracerProvider) -> Iterator[Span]:
    """The span of a web request that starts runs: current while the test runs."""
    with provider.get_tracer("tests").start_as_current_span("GET /orders") as span:
        yield span


def attempts(spans: InMemorySpanExporter, job_type: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == f"django_jobs {job_type}"]


def assert_child_of(span: ReadableSpan, parent: SpanContext) -> None:
    """``span`` is in ``parent``'s trace, its child, and links to it."""
    assert span.context is not None
    assert span.context.trace_id == parent.trace_id
    assert span.parent is not None
    assert (span.parent.trace_id, span.parent.span_id) == (parent.trace_id, parent.span_id)
    assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [
        (parent.trace_id, parent.span_id)
    ]


def assert_root(span: ReadableSpan) -> None:
    assert span.parent is None
    assert list(span.links) == []


def stored(run: JobRun) -> Any:
    return JobRun.objects.values_list("trace_context", flat=True).get(pk=run.pk)


def traceparent_of(span: Span | ReadableSpan) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


# --- what start() stores --------------------------------------------------------------


def test_a_run_started_in_a_span_stores_its_w3c_trace_context(request_span: Span) -> None:
    run = start("tests.noop")
    assert run.trace_context == {"traceparent": traceparent_of(request_span)}
    assert stored(run) == run.trace_context


def test_no_trace_context_without_a_current_span(provider: TracerProvider) -> None:
    assert stored(start("tests.noop")) is None


def test_no_trace_context_without_opentelemetry(
    request_span: Span, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracing, "trace", None)
    assert tracing.capture() is None
    assert stored(start("tests.noop")) is None


def test_the_tracestate_is_stored_with_the_traceparent() -> None:
    state = TraceState([("vendor", "abc"), ("other@tenant", "x y")])
    context = SpanContext(TRACE_ID, SPAN_ID, True, TraceFlags(1), trace_state=state)
    with use_span(NonRecordingSpan(context)):
        captured = tracing.capture()
    assert captured == {"traceparent": TRACEPARENT, "tracestate": "vendor=abc,other@tenant=x y"}


def test_a_tracestate_too_long_to_be_read_back_is_not_stored() -> None:
    state = TraceState([(f"k{i}", "v" * 200) for i in range(3)])
    context = SpanContext(TRACE_ID, SPAN_ID, True, TraceFlags(1), trace_state=state)
    with use_span(NonRecordingSpan(context)):
        assert tracing.capture() == {"traceparent": TRACEPARENT}


def test_start_many_stores_one_context_for_every_run(request_span: Span) -> None:
    # The vendors' fast inserts (PostgreSQL's INSERT ... unnest, MariaDB's
    # bulk_create with RETURNING, MySQL's rows in one transaction) write it too.
    runs = start_many("tests.noop", [{"i": i} for i in range(5)])
    expected = {"traceparent": traceparent_of(request_span)}
    assert [run.trace_context for run in runs] == [expected] * 5
    assert (
        list(
            JobRun.objects.filter(pk__in=[r.pk for r in runs]).values_list(
                "trace_context", flat=True
            )
        )
        == [expected] * 5
    )


def test_handler_start_astart_and_the_tasks_backend_store_it(request_span: Span) -> None:
    expected = {"traceparent": traceparent_of(request_span)}
    assert stored(jobs.noop.start()) == expected
    assert stored(jobs.noop.start_many([{}])[0]) == expected
    # Async callers: sync_to_async carries the context to the thread that inserts.
    assert stored(async_to_sync(astart)("tests.noop")) == expected
    result = tasks.add.enqueue(1, 2)
    assert JobRun.objects.get(pk=run_id(result.id)).trace_context == expected


# --- the attempts' spans ---------------------------------------------------------------


def test_the_attempt_is_a_child_of_the_starters_span(
    spans: InMemorySpanExporter, request_span: Span
) -> None:
    start("tests.noop")
    starter = request_span.get_span_context()
    assert drain() == 1
    (span,) = attempts(spans, "tests.noop")
    assert_child_of(span, starter)


def test_every_attempt_of_a_retried_run_is_in_the_starters_trace(
    spans: InMemorySpanExporter, provider: TracerProvider
) -> None:
    with provider.get_tracer("tests").start_as_current_span("POST /retry") as starter:
        run = start("tests.flaky", {"succeed_on": 2})
    drain()
    first, second = attempts(spans, "tests.flaky")
    assert_child_of(first, starter.get_span_context())
    assert_child_of(second, starter.get_span_context())
    # A retry by hand is another chapter of the same run: it keeps its starter.
    JobRun.objects.filter(pk=run.pk).update(status=Status.FAILED)
    with provider.get_tracer("tests").start_as_current_span("admin retry"):
        retry(run.pk)
    assert stored(run) == {"traceparent": traceparent_of(starter)}


def test_each_run_of_start_many_is_a_child_of_the_starters_span(
    spans: InMemorySpanExporter, request_span: Span
) -> None:
    start_many("tests.noop", [{}] * 3)
    assert drain() == 3
    found = attempts(spans, "tests.noop")
    assert len(found) == 3
    for span in found:
        assert_child_of(span, request_span.get_span_context())


def test_without_a_stored_context_the_attempt_is_a_root_span(
    spans: InMemorySpanExporter,
) -> None:
    start("tests.noop")
    drain()
    (span,) = attempts(spans, "tests.noop")
    assert_root(span)


def test_the_stored_tracestate_reaches_the_parent(spans: InMemorySpanExporter) -> None:
    run = start("tests.noop")
    JobRun.objects.filter(pk=run.pk).update(
        trace_context={"traceparent": TRACEPARENT, "tracestate": "vendor=abc , x@y=1"}
    )
    drain()
    (span,) = attempts(spans, "tests.noop")
    assert span.parent is not None
    assert span.parent.trace_state == TraceState([("vendor", "abc"), ("x@y", "1")])
    assert span.context is not None
    assert span.context.trace_id == TRACE_ID


def test_a_sampled_out_starter_samples_its_attempts_out(spans: InMemorySpanExporter) -> None:
    # The SDK's default sampler follows the parent: a request not traced has its
    # runs not traced either, as a service called over HTTP would.
    run = start("tests.noop")
    JobRun.objects.filter(pk=run.pk).update(trace_context={"traceparent": TRACEPARENT[:-2] + "00"})
    assert drain() == 1
    assert attempts(spans, "tests.noop") == []


def test_a_child_run_is_a_child_of_its_parents_attempt(
    spans: InMemorySpanExporter, request_span: Span
) -> None:
    parent = start("tests.parent", {"n": 1})
    drain()
    parent.refresh_from_db()
    assert parent.status == Status.COMPLETED
    first, resumed = attempts(spans, "tests.parent")  # it waited for its child between them
    (child_span,) = attempts(spans, "tests.echo")
    assert_child_of(first, request_span.get_span_context())
    assert_child_of(resumed, request_span.get_span_context())
    assert first.context is not None
    assert_child_of(child_span, first.context)
    child = JobRun.objects.get(parent=parent)
    assert child.trace_context == {"traceparent": traceparent_of(first)}


def test_an_async_child_under_drain_is_a_child_of_its_parents_attempt(
    spans: InMemorySpanExporter,
) -> None:
    start("tests.async_parent", {"n": 1})
    drain()
    first, _ = attempts(spans, "tests.async_parent")
    (child_span,) = attempts(spans, "tests.async_echo")
    assert first.context is not None
    assert_child_of(child_span, first.context)


# --- stored values that are not ours -------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # a string, not an object
        [TRACEPARENT],
        42,
        {},
        {"traceparent": None},
        {"traceparent": 7},
        {"traceparent": "garbage"},
        {"traceparent": TRACEPARENT.upper()},  # W3C's hex is lower case
        {"traceparent": TRACEPARENT + "-"},
        {"traceparent": " " + TRACEPARENT[1:]},
        {"traceparent": "01" + TRACEPARENT[2:]},  # a version this reader does not know
        {"traceparent": f"00-{0:032x}-{SPAN_ID:016x}-01"},  # all-zero trace id
        {"traceparent": f"00-{TRACE_ID:032x}-{0:016x}-01"},  # all-zero span id
        {"traceparent": TRACEPARENT.replace("-", "_")},
        {"traceparent": "00-" + "é" * 32 + f"-{SPAN_ID:016x}-01"},
        {"traceparent": TRACEPARENT[:-2] + "\n1"},
    ],
)
def test_a_malformed_trace_context_is_ignored(
    spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture, value: Any
) -> None:
    run = start("tests.noop")
    JobRun.objects.filter(pk=run.pk).update(trace_context=value)
    with caplog.at_level(logging.DEBUG, logger="django_jobs.tracing"):
        assert drain() == 1
    run.refresh_from_db()
    assert run.status == Status.COMPLETED
    (span,) = attempts(spans, "tests.noop")
    assert_root(span)
    assert "trace_context ignored" in caplog.text


@pytest.mark.parametrize(
    "tracestate",
    [
        "k=" + "v" * 600,  # longer than W3C's 512
        ",".join(f"k{i}=v" for i in range(33)),  # more than 32 members
        "UPPER=case",
        "k=v=w",
        "k= ",  # an empty value
        "k=a,k=b",  # a key twice
        "k=\x01",
        7,
        ["k=v"],
    ],
)
def test_a_bad_tracestate_is_dropped_and_the_traceparent_kept(
    spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture, tracestate: Any
) -> None:
    run = start("tests.noop")
    JobRun.objects.filter(pk=run.pk).update(
        trace_context={"traceparent": TRACEPARENT, "tracestate": tracestate}
    )
    with caplog.at_level(logging.DEBUG, logger="django_jobs.tracing"):
        drain()
    (span,) = attempts(spans, "tests.noop")
    assert span.parent is not None
    assert (span.parent.trace_id, span.parent.span_id) == (TRACE_ID, SPAN_ID)
    assert span.parent.trace_state == TraceState()
    assert "tracestate dropped" in caplog.text


@pytest.mark.postgresql("MariaDB and MySQL refuse JSON this deep")
def test_a_trace_context_nested_too_deeply_to_decode_is_ignored(
    spans: InMemorySpanExporter,
) -> None:
    run = start("tests.noop")
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "UPDATE django_jobs_jobrun SET trace_context = %s::jsonb WHERE id = %s",
            ["[" * 5000 + "]" * 5000, run.pk],
        )
    assert drain() == 1
    run.refresh_from_db(fields=["status"])
    assert run.status == Status.COMPLETED
    (span,) = attempts(spans, "tests.noop")
    assert_root(span)


# --- real workers ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_worker_thread_makes_the_attempt_a_child_of_the_starters_span(
    spans: InMemorySpanExporter, request_span: Span
) -> None:
    runs = [start("tests.noop"), *start_many("tests.noop", [{}] * 2)]
    result: dict[str, int] = {}

    def work() -> None:
        try:
            worker = JobWorker(["default"], concurrency=2, burst=True, poll_interval=0.05)
            result["code"] = worker.run()
        finally:
            connections.close_all()

    thread = threading.Thread(target=work)  # no span of the test is current there
    thread.start()
    thread.join(60)
    assert result["code"] == EXIT_OK
    assert {run.pk for run in runs} == set(
        JobRun.objects.filter(status=Status.COMPLETED).values_list("pk", flat=True)
    )
    found = attempts(spans, "tests.noop")
    assert len(found) == 3
    for span in found:
        assert_child_of(span, request_span.get_span_context())


@pytest.mark.django_db(transaction=True)
def test_an_async_child_on_the_event_loop_is_a_child_of_its_parents_attempt(
    spans: InMemorySpanExporter, request_span: Span
) -> None:
    # aspawn_child's step runs on one of the worker's database threads, where the
    # attempt's span is not current: the context is taken on the loop.
    start("tests.async_parent", {"n": 1})
    worker = JobWorker(["default"], concurrency=1, burst=True, poll_interval=0.05)
    assert worker.run() == EXIT_OK
    # One attempt, or two when the parent waited for its child and resumed:
    # whether the child finished before the wait is the threads' race.
    parents = attempts(spans, "tests.async_parent")
    assert len(parents) in (1, 2)
    first = parents[0]
    (child_span,) = attempts(spans, "tests.async_echo")
    for parent in parents:
        assert_child_of(parent, request_span.get_span_context())
    assert first.context is not None
    assert_child_of(child_span, first.context)


# --- parse(), without a database --------------------------------------------------------


def test_parse_reads_exactly_what_capture_writes() -> None:
    context = SpanContext(TRACE_ID, SPAN_ID, True, TraceFlags(1), TraceState([("a", "1")]))
    with use_span(NonRecordingSpan(context)):
        captured = tracing.capture()
    parsed = tracing.parse(captured)
    assert (parsed.trace_id, parsed.span_id, parsed.trace_flags) == (TRACE_ID, SPAN_ID, 1)
    assert parsed.is_remote
    assert parsed.trace_state == TraceState([("a", "1")])


def test_parse_of_nothing_is_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert tracing.parse(None) is None
    monkeypatch.setattr(tracing, "trace", None)
    assert tracing.parse({"traceparent": TRACEPARENT}) is None
