"""The writers users call: start, start_many, cancel, retry. Admin and backends call these too."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models.functions import Now
from django.utils import timezone

from . import conf, lifecycle
from .exceptions import InvalidJobInput, InvalidTransition, RunNotFound
from .models import TERMINAL_STATUSES, JobRun, JobStep, Status
from .notify import notify_pools
from .payloads import normalize
from .registry import JobHandler, get_handler

RETRYABLE_STATUSES = frozenset({Status.FAILED, Status.TIMED_OUT, Status.CANCELED})
PRIORITY_MIN = -32768
PRIORITY_MAX = 32767


def start(
    job_type: str,
    input: Any = None,
    *,
    pool: str | None = None,
    priority: int | None = None,
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    concurrency_key: str | None = None,
    idempotency_key: str | None = None,
    tags: Sequence[str] = (),
    tenant_id: str | None = None,
    parent: JobRun | int | None = None,
) -> JobRun:
    """Enqueue one run of ``job_type`` and return it; joins the caller's transaction.

    With an ``idempotency_key``, a run of the same job type and key that already
    exists is returned instead of a new one, also when two callers race.
    """
    handler = get_handler(job_type)
    run = _build(
        handler,
        input,
        pool=pool,
        priority=priority,
        run_at=run_at,
        delay=delay,
        concurrency_key=concurrency_key,
        idempotency_key=idempotency_key,
        tags=tags,
        tenant_id=tenant_id,
        parent=parent,
    )
    using = conf.get().DATABASE
    if run.idempotency_key is None:
        run.save(using=using, force_insert=True)
        return run
    try:
        # A savepoint: a duplicate key must not break the caller's transaction.
        with transaction.atomic(using=using):
            run.save(using=using, force_insert=True)
    except IntegrityError:
        # Under READ COMMITTED this INSERT waited for the other transaction that
        # holds the key; it committed, so this statement's fresh snapshot sees its row.
        existing = (
            JobRun.objects.using(using)
            .filter(job_type=job_type, idempotency_key=run.idempotency_key)
            .first()
        )
        if existing is None:
            raise
        return existing
    return run


def start_many(job_type: str, inputs: Iterable[Any], **options: Any) -> list[JobRun]:
    """Enqueue one run of ``job_type`` per input with one multi-row INSERT.

    Takes the options of ``start`` except ``idempotency_key`` (a key names one run).
    Every input is validated before anything is written.
    """
    if "idempotency_key" in options:
        raise TypeError("start_many() does not take idempotency_key; use start() per run")
    handler = get_handler(job_type)
    runs = [_build(handler, item, **options) for item in inputs]
    if not runs:
        return []
    return JobRun.objects.using(conf.get().DATABASE).bulk_create(runs)


def start_child(
    parent: JobRun, job_type: str, input: Any, *, close_policy: str, **options: Any
) -> JobRun:
    """Insert a child run of ``parent`` (used by ``ctx.spawn_child``, inside its step)."""
    run = _build(get_handler(job_type), input, parent=parent, **options)
    run.close_policy = close_policy
    run.save(using=conf.get().DATABASE, force_insert=True)
    return run


def cancel(
    run_id: int, *, cascade: bool = True, reason: str = "", tenant_id: str | None = None
) -> int:
    """Cancel a run; return how many runs were canceled or asked to cancel.

    A pending or waiting run ends canceled at once; a running one is asked to
    stop (its handler sees ``JobCanceled`` at its next step or ``check_cancel``,
    and is fenced after ``CANCEL_GRACE``). With ``cascade``, the children's
    close policies apply down the tree. Finished runs are left alone, so
    canceling twice is harmless. With ``tenant_id``, a run of another tenant is
    refused with ``RunNotFound``.
    """
    using = conf.get().DATABASE
    with transaction.atomic(using=using):
        run = _locked(run_id, tenant_id, parent_first=True)
        if run.status in TERMINAL_STATUSES:
            return 0
        reason = reason or "canceled"
        if run.status == Status.RUNNING:
            return lifecycle.request_cancel([run.pk], reason, cascade=cascade)
        count = len(lifecycle.cancel_now([run.pk], reason))
        if cascade:
            count += lifecycle.close_children([run.pk], reason=f"parent run {run.pk} canceled")
        if run.parent_id is not None:
            lifecycle.wake_parent(run.parent_id)
    return count


def retry(run_id: int, *, reset_steps: bool = False, tenant_id: str | None = None) -> JobRun:
    """Put a failed, timed-out or canceled run back to pending, with a fresh set of attempts.

    Completed steps stay recorded and replay, unless ``reset_steps``.
    """
    using = conf.get().DATABASE
    with transaction.atomic(using=using):
        run = _locked(run_id, tenant_id)
        if run.status not in RETRYABLE_STATUSES:
            raise InvalidTransition(
                f"run {run.pk} is {run.status}; "
                "only failed, timed-out or canceled runs can be retried"
            )
        JobRun.objects.using(using).filter(pk=run.pk, status=run.status).update(
            status=Status.PENDING,
            run_at=Now(),
            attempts=0,
            finished_at=None,
            cancel_requested_at=None,
            cancel_reason="",
            cancel_cascade=True,
            lease_token=None,
            claimed_by=None,
            awaiting=None,
        )
        if reset_steps:
            JobStep.objects.using(using).filter(run_id=run.pk).delete()
        notify_pools([run.pool])
    run.refresh_from_db(using=using)
    return run


def run_now(run_id: int, *, tenant_id: str | None = None) -> bool:
    """Make a pending run due now (its ``run_at`` set to now); False if it is not pending."""
    using = conf.get().DATABASE
    with transaction.atomic(using=using):
        run = _locked(run_id, tenant_id)
        changed = (
            JobRun.objects.using(using)
            .filter(pk=run.pk, status=Status.PENDING)
            .update(run_at=Now())
        )
        if changed:
            notify_pools([run.pool])
        return bool(changed)


def _locked(run_id: int, tenant_id: str | None, *, parent_first: bool = False) -> JobRun:
    """Return run ``run_id`` locked for update, within ``tenant_id`` when given.

    With ``parent_first``, the run's parent is locked before the run (the
    ancestors-first order of ``lifecycle``), for changes that may wake it.
    """
    if isinstance(run_id, bool) or not isinstance(run_id, int):
        raise RunNotFound(f"run ids are integers, got {run_id!r}")
    runs = JobRun.objects.using(conf.get().DATABASE)
    if parent_first:
        lifecycle.lock_parent(runs.filter(pk=run_id).values_list("parent_id", flat=True).first())
    run = runs.select_for_update().filter(pk=run_id).first()
    if run is None:
        raise RunNotFound(f"no run with id {run_id}")
    if tenant_id is not None and run.tenant_id != tenant_id:
        raise RunNotFound(f"no run with id {run_id} for tenant {tenant_id!r}")
    return run


def _build(
    handler: JobHandler,
    input: Any,
    *,
    pool: str | None = None,
    priority: int | None = None,
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    concurrency_key: str | None = None,
    idempotency_key: str | None = None,
    tags: Sequence[str] = (),
    tenant_id: str | None = None,
    parent: JobRun | int | None = None,
) -> JobRun:
    """Validate one run's input and options and return the unsaved JobRun."""
    data = normalize({} if input is None else input, what="input")
    run = JobRun(
        job_type=handler.job_type,
        pool=_required_text("pool", handler.pool if pool is None else pool, 100),
        priority=_priority(handler.priority if priority is None else priority),
        max_attempts=handler.retry.attempts,
        input=data,
        concurrency_key=_text(
            "concurrency_key",
            handler.concurrency_key_for(data) if concurrency_key is None else concurrency_key,
            255,
        ),
        idempotency_key=_text("idempotency_key", idempotency_key, 255),
        tags=_tags(tags),
        tenant_id=_text("tenant_id", tenant_id, 100),
    )
    when = _when(run_at, delay)
    if when is not None:
        run.run_at = when
    if parent is not None:
        _attach(run, parent)
    return run


def _attach(run: JobRun, parent: JobRun | int) -> None:
    if not isinstance(parent, JobRun):
        parent = (
            JobRun.objects.using(conf.get().DATABASE)
            .only("id", "root_id", "tenant_id")
            .get(pk=parent)
        )
    run.parent_id = parent.pk
    run.root_id = parent.root_id or parent.pk
    if run.tenant_id is None:
        run.tenant_id = parent.tenant_id
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


def _text(name: str, value: Any, max_length: int, *, required: bool = False) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value):
        raise InvalidJobInput(f"{name} must be a non-empty string, got {value!r}")
    if len(value) > max_length:
        raise InvalidJobInput(f"{name} is longer than {max_length} characters")
    if "\x00" in value:
        raise InvalidJobInput(f"{name} contains a NUL character")
    return value


def _required_text(name: str, value: Any, max_length: int) -> str:
    text = _text(name, value, max_length, required=True)
    assert text is not None
    return text


def _tags(tags: Sequence[str]) -> list[str]:
    if isinstance(tags, str):
        raise InvalidJobInput("tags must be a sequence of strings, not one string")
    result = list(tags)
    for tag in result:
        _text("tag", tag, 100, required=True)
    return result
