"""The writers users call: start, start_many, cancel, retry. Admin and backends call these too."""

from __future__ import annotations

import asyncio
import copy
import json
import os
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models.base import ModelState
from django.db.models.expressions import DatabaseDefault
from django.db.models.functions import Now
from django.db.models.signals import post_init, pre_init
from django.utils import timezone

from . import conf, lifecycle
from .exceptions import InvalidJobInput, InvalidTransition, RunNotFound, SyncOnlyCall
from .models import TERMINAL_STATUSES, JobRun, JobStep, Status
from .names import pool_problem
from .notify import notify_pools
from .payloads import control_problem, normalize, to_json
from .registry import JobHandler, get_handler

RETRYABLE_STATUSES = frozenset({Status.FAILED, Status.TIMED_OUT, Status.CANCELED})
PRIORITY_MIN = -32768
PRIORITY_MAX = 32767
MAX_TAGS = 50  # each at most 100 characters: tags are for finding runs, not for data
MAX_REASON = 1000  # characters of a cancel reason


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

    With an ``idempotency_key``, a run of the same job type, tenant and key that
    already exists is returned instead of a new one, also when two callers race.
    """
    return start_handler(
        get_handler(job_type),
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


def start_handler(
    handler: JobHandler, input: Any, *, trigger: tuple[str, str] | None = None, **options: Any
) -> JobRun:
    """``start()`` for a handler in hand (the tasks backend's, which ``@job`` did not register).

    ``trigger`` is the run's ``(trigger_source, trigger_ref)``, ``("api", "")`` by default.
    """
    _refuse_event_loop("start")
    run = _build(handler, input, **options)
    if trigger is not None:
        run.trigger_source, run.trigger_ref = trigger
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
            .filter(
                job_type=handler.job_type,
                idempotency_key=run.idempotency_key,
                tenant_id=run.tenant_id,  # None matches runs without a tenant
            )
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
    _refuse_event_loop("start_many")
    if "idempotency_key" in options:
        raise TypeError("start_many() does not take idempotency_key; use start() per run")
    handler = get_handler(job_type)
    # The options are the same for every run: validate them once, on a template.
    given_key = options.pop("concurrency_key", None)
    template = _template(handler, **options)
    texts = [to_json({} if item is None else item, what="input") for item in inputs]
    data = [json.loads(text) for text in texts]
    if given_key is not None or not callable(handler.concurrency_key):
        keys = [_key(handler, None, given_key)] * len(data)
    else:
        keys = [_key(handler, value, None) for value in data]
    if not data:
        return []
    using = conf.get().DATABASE
    if connections[using].vendor != "postgresql":
        runs = [_copy(template, value, key) for value, key in zip(data, keys, strict=True)]
        return JobRun.objects.using(using).bulk_create(runs)
    return _insert_many(using, template, texts, data, keys)


def _insert_many(
    using: str, template: JobRun, texts: list[str], data: list[Any], keys: list[str | None]
) -> list[JobRun]:
    """One ``INSERT ... SELECT FROM unnest(...)``: the runs differ only in input and key.

    Returns the runs as if loaded from the database. The ids come back as one
    array and the time of the statement once, not as a row per run: reading
    20,000 timestamps costs more than inserting the rows.
    """
    connection = connections[using]
    quote = connection.ops.quote_name
    columns: list[str] = []
    values: list[str] = []
    params: list[Any] = []
    now_columns = []  # columns whose database default is the statement's time
    for field in JobRun._meta.concrete_fields:
        if field.primary_key:
            continue
        columns.append(quote(str(field.column)))
        value = getattr(template, field.attname)
        if field.attname in ("input", "concurrency_key"):
            values.append(f"v.{field.attname}")
        elif isinstance(value, DatabaseDefault):
            # Now() is JobRun's only database default.
            assert isinstance(value.get_source_expressions()[0], Now), value
            now_columns.append(field.attname)
            values.append("STATEMENT_TIMESTAMP()")
        else:
            values.append(f"%s::{field.cast_db_type(connection) or 'text'}")
            params.append(field.get_db_prep_save(value, connection))
    statement = (
        f"WITH inserted AS (INSERT INTO {quote(JobRun._meta.db_table)} ({', '.join(columns)}) "
        f"SELECT {', '.join(values)} "
        "FROM unnest(%s::jsonb[], %s::text[]) WITH ORDINALITY AS v(input, concurrency_key, n) "
        "ORDER BY v.n RETURNING id) "
        # Ids come from a sequence in insertion order, so sorted they match the inputs.
        "SELECT array_agg(id ORDER BY id), STATEMENT_TIMESTAMP() FROM inserted"
    )
    with connection.cursor() as cursor:
        cursor.execute(statement, [*params, texts, keys])
        ids, now = cursor.fetchone()
    fields = {
        field.attname: getattr(template, field.attname) for field in JobRun._meta.concrete_fields
    }
    fields.update(dict.fromkeys(now_columns, now))
    return [
        _loaded(using, {**fields, "id": run_id, "input": value, "concurrency_key": key})
        for run_id, value, key in zip(ids, data, keys, strict=True)
    ]


def _loaded(using: str, fields: dict[str, Any]) -> JobRun:
    """A JobRun as ``Model.from_db`` builds it, without the per-field ``__init__``.

    ``from_db`` costs more than the INSERT itself for large batches; it is used
    only when something listens to ``pre_init`` or ``post_init`` for JobRun.
    """
    if pre_init.has_listeners(JobRun) or post_init.has_listeners(JobRun):
        return JobRun.from_db(using, list(fields), list(fields.values()))
    run = JobRun.__new__(JobRun)
    run.__dict__.update(fields)
    run._state = ModelState()
    run._state.adding = False
    run._state.db = using
    return run


def _copy(template: JobRun, data: Any, key: str | None) -> JobRun:
    run = copy.copy(template)
    run._state = copy.copy(template._state)
    run.input = data
    run.concurrency_key = key
    return run


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
    reason = _text("reason", reason, MAX_REASON) or "canceled"
    if (problem := control_problem(reason)) is not None:
        raise InvalidJobInput(f"reason {problem}")
    using = conf.get().DATABASE
    with transaction.atomic(using=using):
        run = _locked(run_id, tenant_id, parent_first=True)
        if run.status in TERMINAL_STATUSES:
            return 0
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
            worker_ids=[],
            finished_at=None,
            cancel_requested_at=None,
            cancel_reason="",
            cancel_cascade=True,
            lease_token=None,
            claimed_by=None,
            awaiting=None,
            progress=None,
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
        # The same answer as a missing run: a caller learns nothing of other tenants.
        raise RunNotFound(f"no run with id {run_id}")
    return run


def _build(
    handler: JobHandler,
    input: Any,
    *,
    concurrency_key: str | None = None,
    **options: Any,
) -> JobRun:
    """Validate one run's input and options and return the unsaved JobRun."""
    run = _template(handler, **options)
    run.input = normalize({} if input is None else input, what="input")
    run.concurrency_key = _key(handler, run.input, concurrency_key)
    return run


def _key(handler: JobHandler, data: Any, given: str | None) -> str | None:
    """The run's concurrency key: the one given, else the handler's for this input."""
    key = handler.concurrency_key_for(data) if given is None else given
    return _text("concurrency_key", key, 255)


def _template(
    handler: JobHandler,
    *,
    pool: str | None = None,
    priority: int | None = None,
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    idempotency_key: str | None = None,
    tags: Sequence[str] = (),
    tenant_id: str | None = None,
    parent: JobRun | int | None = None,
) -> JobRun:
    """Validate the options of a run and return it unsaved, without input or key yet."""
    run = JobRun(
        job_type=handler.job_type,
        pool=_pool(handler.pool if pool is None else pool),
        priority=_priority(handler.priority if priority is None else priority),
        max_attempts=handler.retry.attempts,
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
    """Make ``run`` a child of ``parent``, in the parent's tenant.

    A child belongs to its parent's tenant: without a ``tenant_id`` it takes the
    parent's, and a parent of another tenant reads as a missing one.
    """
    if not isinstance(parent, JobRun):
        if isinstance(parent, bool) or not isinstance(parent, int):
            raise RunNotFound(f"run ids are integers, got {parent!r}")
        found = (
            JobRun.objects.using(conf.get().DATABASE)
            .only("id", "root_id", "tenant_id")
            .filter(pk=parent)
            .first()
        )
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


def _pool(value: Any) -> str:
    problem = pool_problem(value)
    if problem is not None:
        raise InvalidJobInput(f"pool {value!r} {problem}")
    return str(value)


def _required_text(name: str, value: Any, max_length: int) -> str:
    text = _text(name, value, max_length, required=True)
    assert text is not None
    return text


def _tags(tags: Sequence[str]) -> list[str]:
    if isinstance(tags, str):
        raise InvalidJobInput("tags must be a sequence of strings, not one string")
    result = list(tags)
    if len(result) > MAX_TAGS:
        raise InvalidJobInput(f"a run has at most {MAX_TAGS} tags, got {len(result)}")
    for tag in result:
        _text("tag", tag, 100, required=True)
    return result


def _refuse_event_loop(name: str) -> None:
    """Refuse a call from async code at once, naming the way out.

    Django would refuse the first query anyway, with a message about "this";
    this names the function and ``sync_to_async``. ``DJANGO_ALLOW_ASYNC_UNSAFE``
    lifts it, as it lifts Django's own check.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    if os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE"):
        return
    raise SyncOnlyCall(
        f"django_jobs.{name}() was called from async code (an event loop is running in "
        f"this thread); it writes to the database synchronously: call it as "
        f"`await sync_to_async({name})(...)` (from asgiref.sync import sync_to_async)"
    )
