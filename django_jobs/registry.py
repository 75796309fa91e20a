"""The ``@job`` decorator, the handler registry and discovery of apps' ``jobs.py``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .backoff import NO_RETRY, RetryPolicy
from .conf import to_seconds
from .exceptions import DuplicateJobType, UnknownJobType

if TYPE_CHECKING:
    from .context import JobContext
    from .models import JobRun

HandlerFn = Callable[["JobContext"], Any]
ConcurrencyKey = str | Callable[[Any], str | None] | None


@dataclass(frozen=True, eq=False)
class JobHandler:
    """A registered handler: the function plus the options given to ``@job``."""

    job_type: str
    fn: HandlerFn
    pool: str = "default"
    retry: RetryPolicy = NO_RETRY
    timeout: float | None = None
    concurrency_key: ConcurrencyKey = None
    priority: int = 0

    def __call__(self, ctx: JobContext) -> Any:
        return self.fn(ctx)

    def start(self, input: Any = None, **options: Any) -> JobRun:
        """Enqueue a run of this job; the options are those of ``django_jobs.start``."""
        from .api import start

        return start(self.job_type, input, **options)

    def start_many(self, inputs: Iterable[Any], **options: Any) -> list[JobRun]:
        """Enqueue one run of this job per input in one statement."""
        from .api import start_many

        return start_many(self.job_type, inputs, **options)

    def concurrency_key_for(self, input: Any) -> str | None:
        if self.concurrency_key is None or isinstance(self.concurrency_key, str):
            return self.concurrency_key
        return self.concurrency_key(input)

    @property
    def origin(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"


_handlers: dict[str, JobHandler] = {}
_lock = threading.Lock()


def job(
    job_type: str,
    *,
    pool: str = "default",
    retry: RetryPolicy | None = None,
    timeout: float | timedelta | None = None,
    concurrency_key: ConcurrencyKey = None,
    priority: int = 0,
) -> Callable[[HandlerFn], JobHandler]:
    """Register the decorated function ``fn(ctx)`` as the handler of ``job_type``."""
    if not isinstance(job_type, str) or not job_type:
        raise TypeError(f"job type must be a non-empty string, got {job_type!r}")
    if not isinstance(pool, str) or not pool:
        raise TypeError(f"pool must be a non-empty string, got {pool!r}")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise TypeError(f"retry must be a RetryPolicy, got {retry!r}")
    if not (
        concurrency_key is None or isinstance(concurrency_key, str) or callable(concurrency_key)
    ):
        raise TypeError(f"concurrency_key must be a string or a callable, got {concurrency_key!r}")
    seconds = None if timeout is None else to_seconds(timeout)
    if seconds is not None and seconds <= 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")

    def decorate(fn: HandlerFn) -> JobHandler:
        handler = JobHandler(
            job_type=job_type,
            fn=fn,
            pool=pool,
            retry=retry or NO_RETRY,
            timeout=seconds,
            concurrency_key=concurrency_key,
            priority=priority,
        )
        register(handler)
        return handler

    return decorate


def register(handler: JobHandler) -> None:
    """Add ``handler``; a second, different handler for one job type is an error.

    Registering the same function again (a module imported twice, as autoreload
    and some test runners do) replaces the entry instead.
    """
    with _lock:
        existing = _handlers.get(handler.job_type)
        if existing is not None and existing.origin != handler.origin:
            raise DuplicateJobType(
                f"job type {handler.job_type!r} is registered twice: by {existing.origin} "
                f"and by {handler.origin}"
            )
        _handlers[handler.job_type] = handler


def unregister(job_type: str) -> None:
    with _lock:
        _handlers.pop(job_type, None)


def get_handler(job_type: str) -> JobHandler:
    """Return the handler of ``job_type`` or raise ``UnknownJobType``."""
    try:
        return _handlers[job_type]
    except (KeyError, TypeError):
        raise UnknownJobType(
            f"no job is registered as {job_type!r}; define it with @job({job_type!r}) "
            "in the jobs.py of an installed app"
        ) from None


def all_handlers() -> dict[str, JobHandler]:
    return dict(_handlers)


def autodiscover() -> None:
    """Import the ``jobs`` module of every installed app, so their ``@job``s register."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("jobs")
