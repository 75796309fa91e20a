"""The ``@job`` decorator, the handler registry and discovery of apps' ``jobs.py``."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from . import joboptions
from .backoff import NO_RETRY, RetryPolicy
from .conf import to_seconds
from .exceptions import (
    DuplicateJobType,
    InvalidStepOutput,
    JobCanceled,
    RetryAfter,
    UnknownJobType,
    is_never_retried,
)
from .names import concurrency_limit as check_concurrency_limit
from .names import pool_problem
from .ratelimits import Rate, parse_rate
from .schedules import MAX_NAME, Schedule

if TYPE_CHECKING:
    from .context import JobContext
    from .models import JobRun

logger = logging.getLogger(__name__)

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
    concurrency_limit: int = 1
    priority: int = 0
    # Called with the run id once a run of this type has ended (completed,
    # failed, timed out or canceled), in the process that ended it. While it is
    # set, a completion is written before the worker thread moves on.
    on_end: Callable[[int], None] | None = None
    # Start a run at every tick of this schedule (named after the job type).
    schedule: Schedule | None = None
    # At most so many runs start per period: of the job type, or per key.
    rate_limit: Rate | None = None
    rate_limit_key: ConcurrencyKey = None
    # A django.tasks task's handler: its input is {"args": [...], "kwargs": {...}},
    # and the key functions of JOB_OPTIONS are given those arguments.
    task_arguments: bool = False

    def __call__(self, ctx: JobContext) -> Any:
        return self.fn(ctx)

    @cached_property
    def is_async(self) -> bool:
        """Whether ``fn`` is an ``async def`` function: the worker runs it on its event loop."""
        return inspect.iscoroutinefunction(self.fn)

    def start(self, input: Any = None, **options: Any) -> JobRun:
        """Enqueue a run of this job; the options are those of ``django_jobs.start``."""
        # The one import upward (see docs/architecture.md): a definition that can
        # also enqueue itself, done lazily so that the registry loads before the API.
        from .api import start

        return start(self.job_type, input, **options)

    def start_many(self, inputs: Iterable[Any], **options: Any) -> list[JobRun]:
        """Enqueue one run of this job per input in one statement."""
        from .api import start_many

        return start_many(self.job_type, inputs, **options)

    async def astart(self, input: Any = None, **options: Any) -> JobRun:
        """``start`` for async code (``django_jobs.astart``)."""
        from .api import astart

        return await astart(self.job_type, input, **options)

    async def astart_many(self, inputs: Iterable[Any], **options: Any) -> list[JobRun]:
        """``start_many`` for async code (``django_jobs.astart_many``)."""
        from .api import astart_many

        return await astart_many(self.job_type, inputs, **options)

    def retryable(self, exc: BaseException) -> bool:
        """Whether another attempt might cure ``exc``: what a run's error and a
        failed step's error both record as ``retryable``.

        Whether attempts are left is another matter: a retryable error on the last
        attempt still fails the run. A ``RetryAfter`` is the handler asking for
        another attempt, whatever the policy's ``non_retryable`` lists.
        """
        if isinstance(exc, RetryAfter):
            return True
        if isinstance(exc, (JobCanceled, InvalidStepOutput)) or is_never_retried(exc):
            return False
        return self.retry.is_retryable(exc)

    def concurrency_key_for(self, input: Any) -> str | None:
        if self.concurrency_key is None or isinstance(self.concurrency_key, str):
            return self.concurrency_key
        return self.concurrency_key(input)

    @property
    def keyed_rate(self) -> bool:
        """Whether the rate limit is per key (``rate_limit_key``) rather than shared."""
        return self.rate_limit is not None and self.rate_limit_key is not None

    def rate_key_for(self, input: Any) -> str | None:
        """The key of a run's rate limit; None when the limit is not per key, or
        the key function gave none (such a run is not limited)."""
        if not self.keyed_rate:
            return None
        if isinstance(self.rate_limit_key, str):
            return self.rate_limit_key
        return self.rate_limit_key(input)  # type: ignore[misc]

    @property
    def origin(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"


_handlers: dict[str, JobHandler] = {}
# Handlers found by a resolver (django.tasks tasks, by their module path); kept
# apart from _handlers, which start() and the admin see.
_resolved: dict[str, JobHandler] = {}
_resolvers: list[Callable[[str], JobHandler | None]] = []
_lock = threading.Lock()


def job(
    job_type: str,
    *,
    pool: str = "default",
    retry: RetryPolicy | None = None,
    timeout: float | timedelta | None = None,
    concurrency_key: ConcurrencyKey = None,
    concurrency_limit: int = 1,
    priority: int = 0,
    schedule: str | Schedule | None = None,
    rate_limit: str | Rate | None = None,
    rate_limit_key: ConcurrencyKey = None,
) -> Callable[[HandlerFn], JobHandler]:
    """Register the decorated function ``fn(ctx)`` as the handler of ``job_type``.

    Handlers live in an installed app's ``jobs.py``, imported at startup. The
    options are defaults for every run of the job type:

    - ``pool``: the queue its runs wait in; a worker serves the pools it is started with.
    - ``retry``: a :class:`~django_jobs.RetryPolicy`; without one a run has one attempt.
    - ``timeout``: seconds (or a ``timedelta``) one attempt may take.
    - ``concurrency_key``: a string, or a callable of the input returning one (or
      None): at most ``concurrency_limit`` runs per key run at a time.
    - ``concurrency_limit``: how many runs of one key may run at once across the
      fleet, 1 by default (at most 1000).
    - ``priority``: higher is claimed first within a pool.
    - ``schedule``: a cron string or a :class:`~django_jobs.Schedule`, to start a
      run at every tick.
    - ``rate_limit``: at most so many runs start in any window of the period,
      across every worker: ``"100/m"``, ``"5/s"``, ``"1000/h"``, ``"10/30s"``.
    - ``rate_limit_key``: a string, or a callable of the input returning one (or
      None: that run is not limited), to make ``rate_limit`` one limit per key.

    ``fn`` may be an ``async def`` function: a worker runs it on its event loop
    (``--async-concurrency`` of them at once), and its context's durable
    operations are awaited (``await ctx.astep(...)``; see docs/async.md).

    The decorated name becomes a :class:`JobHandler`: call it with a context, or
    enqueue with its ``start()`` and ``start_many()``.
    """
    if not isinstance(job_type, str) or not job_type:
        raise TypeError(f"job type must be a non-empty string, got {job_type!r}")
    if not isinstance(pool, str) or not pool:
        raise TypeError(f"pool must be a non-empty string, got {pool!r}")
    if pool_problem(pool) is not None:
        raise ValueError(f"pool {pool!r} {pool_problem(pool)}")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise TypeError(f"retry must be a RetryPolicy, got {retry!r}")
    if not (
        concurrency_key is None or isinstance(concurrency_key, str) or callable(concurrency_key)
    ):
        raise TypeError(f"concurrency_key must be a string or a callable, got {concurrency_key!r}")
    check_concurrency_limit(concurrency_limit)
    if not (rate_limit_key is None or isinstance(rate_limit_key, str) or callable(rate_limit_key)):
        raise TypeError(f"rate_limit_key must be a string or a callable, got {rate_limit_key!r}")
    if rate_limit_key is not None and rate_limit is None:
        raise TypeError("rate_limit_key needs a rate_limit: the limit each key gets")
    rate = None if rate_limit is None else parse_rate(rate_limit)
    seconds = None if timeout is None else to_seconds(timeout)
    if seconds is not None and seconds <= 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    if isinstance(schedule, str):
        schedule = Schedule(schedule)
    if schedule is not None and not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a cron string or a Schedule, got {schedule!r}")
    if schedule is not None and len(job_type) > MAX_NAME:
        raise ValueError(f"a scheduled job type is at most {MAX_NAME} characters: {job_type!r}")

    def decorate(fn: HandlerFn) -> JobHandler:
        if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            # Accepted, it would fail every run (a generator is not JSON).
            raise TypeError(
                f"@job({job_type!r}) decorates {fn.__qualname__}, a generator function: "
                "a handler returns its output; write a def or an async def function"
            )
        handler = JobHandler(
            job_type=job_type,
            fn=fn,
            pool=pool,
            retry=retry or NO_RETRY,
            timeout=seconds,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            priority=priority,
            schedule=schedule,
            rate_limit=rate,
            rate_limit_key=rate_limit_key,
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


def get_handler(job_type: str, *, resolve: bool = False) -> JobHandler:
    """Return the handler of ``job_type`` or raise ``UnknownJobType``.

    With ``resolve`` (the worker's lookups), a type no ``@job`` registered is
    offered to the resolvers (``add_resolver``), and what they find is kept.
    """
    try:
        return with_options(_handlers[job_type])
    except (KeyError, TypeError):
        pass
    if resolve and isinstance(job_type, str):
        handler = _resolve(job_type)
        if handler is not None:
            return with_options(handler)
    hint = (
        " (or, for a django.tasks @task, check that its module imports and belongs to an "
        "installed app)"
        if resolve
        else ""
    )
    raise UnknownJobType(
        f"no job is registered as {job_type!r}; define it with @job({job_type!r}) "
        f"in the jobs.py of an installed app{hint}"
    ) from None


def with_options(handler: JobHandler) -> JobHandler:
    """``handler`` with the options ``DJANGO_JOBS["JOB_OPTIONS"]`` sets for its job
    type (``joboptions``) in place of its own; ``handler`` itself when none."""
    options = joboptions.options_for(handler.job_type, arguments=handler.task_arguments)
    if not options:
        return handler
    found = _with_options.get(handler.job_type)
    if found is None or found[0] is not handler or found[1] is not options:
        found = (handler, options, dataclasses.replace(handler, **options))
        _with_options[handler.job_type] = found
    return found[2]


# job type -> (the handler, the options applied, the handler with them): the
# options dict is JOB_OPTIONS' cached one, replaced when the settings change.
_with_options: dict[str, tuple[JobHandler, dict[str, Any], JobHandler]] = {}


def _resolve(job_type: str) -> JobHandler | None:
    handler = _resolved.get(job_type)
    if handler is not None:
        return handler
    for resolver in list(_resolvers):
        try:
            handler = resolver(job_type)
        except Exception:
            logger.exception("type=%s resolver %r failed", job_type, resolver)
            continue
        if handler is not None:
            with _lock:
                return _resolved.setdefault(job_type, handler)
    return None


def add_resolver(resolver: Callable[[str], JobHandler | None]) -> None:
    """Let ``resolver(job_type)`` supply handlers for types no ``@job`` registered."""
    with _lock:
        if resolver not in _resolvers:
            _resolvers.append(resolver)


def run_finished(job_type: str, run_id: int) -> None:
    """Tell the handler of ``job_type`` that run ``run_id`` ended (its ``on_end``).

    Never raises: an error is logged, as for a signal receiver.
    """
    try:
        handler = get_handler(job_type, resolve=True)
    except UnknownJobType:
        return
    if handler.on_end is None:
        return
    try:
        handler.on_end(run_id)
    except Exception:
        logger.exception("run=%s type=%s on_end failed", run_id, job_type)


def all_handlers(*, tasks: bool = False) -> dict[str, JobHandler]:
    """The handlers ``@job`` registered, with their ``JOB_OPTIONS``, by job type; with
    ``tasks``, also those the resolvers found (tasks met or loaded by this process)."""
    found = {job_type: with_options(handler) for job_type, handler in _handlers.items()}
    if tasks:
        for job_type, handler in list(_resolved.items()):
            found.setdefault(job_type, with_options(handler))
    return found


def autodiscover() -> None:
    """Import the ``jobs`` module of every installed app, so their ``@job``s register."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("jobs")
