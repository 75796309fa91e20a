"""OpenTelemetry for runs, when ``opentelemetry-api`` is installed.

``capture()`` records the trace context of the code that starts a run (W3C
Trace Context, stored in ``JobRun.trace_context``), and ``run_span()`` traces
each attempt of the handler as a span in that trace.

Without the package, or with the API but no tracer provider configured (no
SDK set up), no span is made: a non-recording span would still cost every run
some work for nothing.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised without the extra installed
    trace = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

# W3C Trace Context, the one format stored whatever propagators the project
# configured (docs/decisions.md).
_W3C: Any = None if trace is None else TraceContextTextMapPropagator()

# (provider, its tracer): a provider set up after import is picked up.
_cached: tuple[Any, Any] = (None, None)

# A stored context came from the table, which anyone with access to the
# database can write: it is read by these rules only, W3C's at their strictest.
TRACEPARENT_LENGTH = 55
TRACESTATE_MAX_LENGTH = 512
TRACESTATE_MAX_MEMBERS = 32
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_TRACESTATE_MEMBER = re.compile(
    r"([a-z][_0-9a-z*/-]{0,255}|[a-z0-9][_0-9a-z*/-]{0,240}@[a-z][_0-9a-z*/-]{0,13})"
    r"=([\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e])"
)


def _tracer() -> Any:
    """The tracer of the configured provider, or None when tracing is not set up."""
    global _cached
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider):
        return None
    if _cached[0] is not provider:
        _cached = (provider, provider.get_tracer("django_jobs"))
    return _cached[1]


def capture() -> dict[str, str] | None:
    """The W3C trace context of the current span, to store on runs started now.

    None without OpenTelemetry or without a current span: a context lookup,
    nothing more, so ``start()`` pays nothing measurable for it. A span that
    is not recording (sampled out upstream) is captured too: its decision
    travels on, as it would over HTTP.
    """
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    if len(carrier.get("tracestate", "")) > TRACESTATE_MAX_LENGTH:
        del carrier["tracestate"]  # what the worker would refuse is not stored
    return carrier or None


def parse(stored: Any) -> Any:
    """The span context of a stored trace context, or None when there is none to use.

    A value that is not a dict, or whose ``traceparent`` is not exactly W3C's
    version 00 form, is ignored (with a debug log), never an error. A
    ``tracestate`` that is malformed, longer than 512 characters or of more
    than 32 members is dropped alone, as W3C Trace Context says: the
    ``traceparent`` still holds.
    """
    if trace is None or stored is None:
        return None
    if not isinstance(stored, dict):
        logger.debug("trace_context ignored: a %s, not an object", type(stored).__name__)
        return None
    parent = stored.get("traceparent")
    match = (
        _TRACEPARENT.fullmatch(parent)
        if isinstance(parent, str) and len(parent) == TRACEPARENT_LENGTH
        else None
    )
    if match is None:
        logger.debug("trace_context ignored: no valid traceparent")
        return None
    trace_id, span_id, flags = (int(group, 16) for group in match.groups())
    if not trace_id or not span_id:
        logger.debug("trace_context ignored: an all-zero trace or span id")
        return None
    return trace.SpanContext(
        trace_id,
        span_id,
        is_remote=True,
        trace_flags=trace.TraceFlags(flags & trace.TraceFlags.SAMPLED),
        trace_state=_trace_state(stored.get("tracestate")),
    )


def _trace_state(header: Any) -> Any:
    """The TraceState of a stored ``tracestate``; an empty one when it is absent or invalid."""
    if header is None:
        return trace.TraceState()
    if not isinstance(header, str) or len(header) > TRACESTATE_MAX_LENGTH:
        logger.debug("tracestate dropped: not a string of at most %d", TRACESTATE_MAX_LENGTH)
        return trace.TraceState()
    members = [member.strip(" \t") for member in header.split(",")]
    pairs = []
    for member in filter(None, members):
        match = _TRACESTATE_MEMBER.fullmatch(member)
        if match is None:
            logger.debug("tracestate dropped: a malformed member")
            return trace.TraceState()
        pairs.append((match[1], match[2]))
    if len(pairs) > TRACESTATE_MAX_MEMBERS or len({key for key, _ in pairs}) < len(pairs):
        logger.debug("tracestate dropped: too many members, or a key twice")
        return trace.TraceState()
    return trace.TraceState(pairs)


# What run_span returns without a tracer: cheaper to enter and leave than a
# generator-based context manager.
_NO_SPAN = nullcontext()


def run_span(
    run_id: int,
    job_type: str,
    pool: str,
    attempt: int,
    suspended: tuple[type[BaseException], ...] = (),
    trace_context: Any = None,
) -> AbstractContextManager[None]:
    """Trace one attempt of a run's handler as a consumer span named after its job type.

    With the ``trace_context`` of the run's starter (``JobRun.trace_context``),
    the span is a child of the starter's span, in its trace, and links to it.
    An exception is recorded and marks the span as an error, except those in
    ``suspended`` (a run that now waits, or lost its lease), which only set
    ``django_jobs.outcome``.
    """
    tracer = _tracer()
    if tracer is None:
        return _NO_SPAN
    return _span(tracer, run_id, job_type, pool, attempt, suspended, parse(trace_context))


@contextmanager
def _span(
    tracer: Any,
    run_id: int,
    job_type: str,
    pool: str,
    attempt: int,
    suspended: tuple[type[BaseException], ...],
    starter: Any,
) -> Iterator[None]:
    attributes = {
        "messaging.system": "django_jobs",
        "messaging.operation.type": "process",
        "messaging.destination.name": pool,
        "django_jobs.run_id": run_id,
        "django_jobs.job_type": job_type,
        "django_jobs.attempt": attempt,
    }
    # The starter's span as the parent: a request and the runs it started are one
    # trace. The link, which messaging conventions ask of consumers, says the same
    # to tools that follow links (docs/decisions.md).
    parent = None if starter is None else trace.set_span_in_context(trace.NonRecordingSpan(starter))
    with tracer.start_as_current_span(
        f"django_jobs {job_type}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
        links=None if starter is None else [trace.Link(starter)],
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield
        except suspended as exc:
            span.set_attribute("django_jobs.outcome", type(exc).__name__.lower())
            raise
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
