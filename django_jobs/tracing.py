"""An OpenTelemetry span around each attempt's handler, when ``opentelemetry-api`` is installed.

Without the package, or with the API but no tracer provider configured (no
SDK set up), no span is made: a non-recording span would still cost every run
some work for nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

try:
    from opentelemetry import trace
except ImportError:  # pragma: no cover - exercised without the extra installed
    trace = None  # type: ignore[assignment]

# (provider, its tracer): a provider set up after import is picked up.
_cached: tuple[Any, Any] = (None, None)


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


# What run_span returns without a tracer: cheaper to enter and leave than a
# generator-based context manager.
_NO_SPAN = nullcontext()


def run_span(
    run_id: int,
    job_type: str,
    pool: str,
    attempt: int,
    suspended: tuple[type[BaseException], ...] = (),
) -> AbstractContextManager[None]:
    """Trace one attempt of a run's handler as a consumer span named after its job type.

    An exception is recorded and marks the span as an error, except those in
    ``suspended`` (a run that now waits, or lost its lease), which only set
    ``django_jobs.outcome``.
    """
    tracer = _tracer()
    if tracer is None:
        return _NO_SPAN
    return _span(tracer, run_id, job_type, pool, attempt, suspended)


@contextmanager
def _span(
    tracer: Any,
    run_id: int,
    job_type: str,
    pool: str,
    attempt: int,
    suspended: tuple[type[BaseException], ...],
) -> Iterator[None]:
    attributes = {
        "messaging.system": "django_jobs",
        "messaging.operation.type": "process",
        "messaging.destination.name": pool,
        "django_jobs.run_id": run_id,
        "django_jobs.job_type": job_type,
        "django_jobs.attempt": attempt,
    }
    with tracer.start_as_current_span(
        f"django_jobs {job_type}",
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
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
