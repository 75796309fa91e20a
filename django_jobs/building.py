"""A new run, built from its handler and the caller's options, each checked.

``api`` (start, start_many, start_child) saves what this builds; a bad option
raises ``InvalidJobInput`` before anything is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from . import conf, tracing
from .exceptions import InvalidJobInput, RunNotFound
from .models import JobRun
from .names import concurrency_limit as check_concurrency_limit
from .names import pool_problem
from .payloads import normalize
from .registry import JobHandler

PRIORITY_MIN = -32768
PRIORITY_MAX = 32767
MAX_TAGS = 50  # each at most 100 characters: tags are for finding runs, not for data
# The idempotency keys of the runs schedules start (``schedule:<name>:<instant>``)
# are a namespace of their own: a caller that could create a tick's run first
# would have the scheduler adopt it, and the schedule's own input never run.
SCHEDULE_KEY_PREFIX = "schedule:"


def build(
    handler: JobHandler,
    input: Any,
    *,
    concurrency_key: str | None = None,
    **options: Any,
) -> JobRun:
    """Validate one run's input and options and return the unsaved JobRun."""
    run = template(handler, **options)
    run.input = normalize({} if input is None else input, what="input")
    run.concurrency_key = concurrency_key_of(handler, run.input, concurrency_key)
    run.rate_key = rate_key_of(handler, run.input)
    return run


def concurrency_key_of(handler: JobHandler, data: Any, given: str | None) -> str | None:
    """The run's concurrency key: the one given, else the handler's for this input."""
    key = handler.concurrency_key_for(data) if given is None else given
    return text("concurrency_key", key, 255)


def rate_key_of(handler: JobHandler, data: Any) -> str | None:
    """The key of the run's rate limit, from the handler's ``rate_limit_key``."""
    return text("rate_limit_key", handler.rate_key_for(data), 255)


def template(
    handler: JobHandler,
    *,
    pool: str | None = None,
    priority: int | None = None,
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    concurrency_limit: int | None = None,
    idempotency_key: str | None = None,
    tags: Sequence[str] = (),
    tenant_id: str | None = None,
    parent: JobRun | int | None = None,
    scheduled: bool = False,
) -> JobRun:
    """Validate the options of a run and return it unsaved, without input or key yet."""
    run = JobRun(
        job_type=handler.job_type,
        pool=_pool(handler.pool if pool is None else pool),
        priority=_priority(handler.priority if priority is None else priority),
        concurrency_limit=check_concurrency_limit(
            handler.concurrency_limit if concurrency_limit is None else concurrency_limit
        ),
        max_attempts=handler.retry.attempts,
        is_async=handler.is_async,
        idempotency_key=_idempotency_key(idempotency_key, scheduled),
        tags=_tags(tags),
        tenant_id=text("tenant_id", tenant_id, 100),
        # Once per call: start_many's runs share their starter's context.
        trace_context=tracing.capture(),
    )
    when = _when(run_at, delay)
    if when is not None:
        run.run_at = when
    if parent is not None:
        _attach(run, parent)
    return run


def _attach(run: JobRun, parent: JobRun | int) -> None:
    """Make ``run`` a child of ``parent``, in the parent's tenant.

    A child belongs to its parent's tenant: without a ``tenant_id`` it takes the
    parent's, and a parent of another tenant reads as a missing one.
    """
    if not isinstance(parent, JobRun):
        if isinstance(parent, bool) or not isinstance(parent, int):
            raise RunNotFound(f"run ids are integers, got {parent!r}")
        query = JobRun.objects.using(conf.get().DATABASE).only("id", "root_id", "tenant_id")
        if run.tenant_id is not None:
            # In the statement: another tenant's parent is not read, as a missing one.
            query = query.filter(tenant_id=run.tenant_id)
        found = query.filter(pk=parent).first()
        if found is None:
            raise RunNotFound(f"no run with id {parent}")
        parent = found
    if run.tenant_id is None:
        run.tenant_id = parent.tenant_id
    elif run.tenant_id != parent.tenant_id:
        raise RunNotFound(f"no run with id {parent.pk}")
    run.parent_id = parent.pk
    run.root_id = parent.root_id or parent.pk
    run.trigger_source = "child"
    run.trigger_ref = str(parent.pk)


def _when(run_at: datetime | None, delay: float | timedelta | None) -> datetime | None:
    if run_at is not None and delay is not None:
        raise InvalidJobInput("give run_at or delay, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise InvalidJobInput(f"run_at must be a datetime, got {run_at!r}")
        if timezone.is_naive(run_at):
            raise InvalidJobInput(f"run_at must be an aware datetime, got naive {run_at!r}")
        return run_at
    if delay is not None:
        try:
            seconds = conf.to_seconds(delay)
        except TypeError:
            seconds = -1.0
        if seconds < 0:
            raise InvalidJobInput(
                f"delay must be non-negative seconds or a timedelta, got {delay!r}"
            )
        if seconds == 0:
            return None  # due now by the database's clock, like no delay at all
        return timezone.now() + timedelta(seconds=seconds)
    return None


def _priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJobInput(f"priority must be an integer, got {value!r}")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise InvalidJobInput(
            f"priority must be between {PRIORITY_MIN} and {PRIORITY_MAX}, got {value}"
        )
    return value


def text(name: str, value: Any, max_length: int, *, required: bool = False) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value):
        raise InvalidJobInput(f"{name} must be a non-empty string, got {value!r}")
    if len(value) > max_length:
        raise InvalidJobInput(f"{name} is longer than {max_length} characters")
    if "\x00" in value:
        raise InvalidJobInput(f"{name} contains a NUL character")
    return value


def _idempotency_key(value: Any, scheduled: bool) -> str | None:
    key = text("idempotency_key", value, 255)
    if key is not None and key.startswith(SCHEDULE_KEY_PREFIX) and not scheduled:
        raise InvalidJobInput(
            f"idempotency keys starting with {SCHEDULE_KEY_PREFIX!r} are reserved for the "
            "runs schedules start; choose another prefix"
        )
    return key


def _pool(value: Any) -> str:
    problem = pool_problem(value)
    if problem is not None:
        raise InvalidJobInput(f"pool {value!r} {problem}")
    return str(value)


def _tags(tags: Sequence[str]) -> list[str]:
    if isinstance(tags, str):
        raise InvalidJobInput("tags must be a sequence of strings, not one string")
    result = list(tags)
    if len(result) > MAX_TAGS:
        raise InvalidJobInput(f"a run has at most {MAX_TAGS} tags, got {len(result)}")
    for tag in result:
        text("tag", tag, 100, required=True)
    return result
