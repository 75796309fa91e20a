"""The writers users call: start, start_many, cancel, retry. Admin and backends call these too."""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.db import IntegrityError, connections, transaction
from django.db.models.functions import Now
from django.utils import timezone

from . import building, conf, transitions
from .debounce import start_debounced
from .exceptions import InvalidJobInput, SyncOnlyCall
from .models import Hold, JobRun, Status
from .payloads import control_problem, to_json
from .registry import JobHandler, get_handler
from .storage import holds as held
from .storage import rateholds, turns, vendors
from .storage.notify import notify_pools

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
    concurrency_limit: int | None = None,
    idempotency_key: str | None = None,
    debounce: float | timedelta | None = None,
    tags: Sequence[str] = (),
    tenant_id: str | None = None,
    parent: JobRun | int | None = None,
) -> JobRun:
    """Enqueue one run of ``job_type`` and return it; joins the caller's transaction.

    With an ``idempotency_key``, a run of the same job type, tenant and key that
    already exists is returned instead of a new one, also when two callers race.
    With ``debounce`` (seconds or a ``timedelta``) as well, the run is due that
    long after the start, and while it has not started a new start of the key
    moves it that long after itself and replaces its input (``django_jobs.debounce``).
    """
    return start_handler(
        get_handler(job_type),
        input,
        pool=pool,
        priority=priority,
        run_at=run_at,
        delay=delay,
        concurrency_key=concurrency_key,
        concurrency_limit=concurrency_limit,
        idempotency_key=idempotency_key,
        debounce=debounce,
        tags=tags,
        tenant_id=tenant_id,
        parent=parent,
    )


def start_handler(
    handler: JobHandler,
    input: Any,
    *,
    trigger: tuple[str, str] | None = None,
    scheduled: bool = False,
    **options: Any,
) -> JobRun:
    """``start()`` for a handler in hand (the tasks backend's, which ``@job`` did not register).

    ``trigger`` is the run's ``(trigger_source, trigger_ref)``, ``("api", "")`` by
    default. Only the scheduler passes ``scheduled``: its runs' idempotency keys
    are in the namespace callers' keys are refused from.
    """
    _refuse_event_loop("start")
    debounce = options.pop("debounce", None)
    if debounce is not None:
        if options.get("idempotency_key") is None:
            raise TypeError("start(debounce=...) needs an idempotency_key: the key names the run")
        if options.get("run_at") is not None or options.get("delay") is not None:
            raise TypeError("start(debounce=...) sets when the run is due: no run_at or delay")
        options["delay"] = debounce
    run = building.build(handler, input, scheduled=scheduled, **options)
    if trigger is not None:
        run.trigger_source, run.trigger_ref = trigger
    using = conf.get().DATABASE
    release = _hold_at_start([run], handler)
    turns.assign(run)
    if debounce is not None:
        debounced = start_debounced(run)
        release()
        return debounced
    if run.idempotency_key is None:
        run.save(using=using, force_insert=True)
        release()
        made_due([run])
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
    release()
    made_due([run])
    return run


# About the most one INSERT of start_many() carries: a server refuses a larger
# statement (MariaDB's and MySQL's max_allowed_packet, 16 MiB by default;
# PostgreSQL's 1 GiB per parameter), so a larger call is split into several
# statements in one transaction.
_BATCH_BYTES = 4 << 20
# What a run's row carries besides its input and keys, counted generously: the
# other columns' values and the statement's punctuation per row.
_ROW_BYTES = 1024


def start_many(job_type: str, inputs: Iterable[Any], **options: Any) -> list[JobRun]:
    """Enqueue one run of ``job_type`` per input with one multi-row INSERT.

    Takes the options of ``start`` except ``idempotency_key`` (a key names one run).
    Every input is validated before anything is written.
    """
    _refuse_event_loop("start_many")
    for option in ("idempotency_key", "debounce"):
        if option in options:
            raise TypeError(f"start_many() does not take {option}; use start() per run")
    handler = get_handler(job_type)
    # The options are the same for every run: validate them once, on a template.
    given_key = options.pop("concurrency_key", None)
    template = building.template(handler, **options)
    texts = [to_json({} if item is None else item, what="input") for item in inputs]
    data = [json.loads(text) for text in texts]
    if given_key is not None or not callable(handler.concurrency_key):
        keys = [building.concurrency_key_of(handler, None, given_key)] * len(data)
    else:
        keys = [building.concurrency_key_of(handler, value, None) for value in data]
    if callable(handler.rate_limit_key) and handler.keyed_rate:
        rate_keys = [building.rate_key_of(handler, value) for value in data]
    else:
        rate_keys = [building.rate_key_of(handler, None)] * len(data)
    if not data:
        return []
    using = conf.get().DATABASE
    connection = connections[using]
    vendor = vendors.of(connection)

    holds, release = _holds_at_start(template, keys, rate_keys, handler)
    turns.assign(template)
    turn_of = turns.of_many(template, len(data))

    def insert(chunk: range) -> list[JobRun]:
        part = vendor.insert_runs(
            connection,
            template,
            [texts[n] for n in chunk],
            [data[n] for n in chunk],
            [keys[n] for n in chunk],
            [rate_keys[n] for n in chunk],
            [holds[n] for n in chunk],
            [turn_of[n] for n in chunk],
        )
        if part is None:
            part = JobRun.objects.using(using).bulk_create(
                [
                    _copy(template, data[n], keys[n], rate_keys[n], holds[n], turn_of[n])
                    for n in chunk
                ]
            )
        return part

    chunks = list(_chunks(template, texts, keys, rate_keys))
    if len(chunks) == 1:
        started = insert(chunks[0])
    else:
        with transaction.atomic(using=using):  # all the runs or none
            started = [run for chunk in chunks for run in insert(chunk)]
    release()
    made_due(started)
    return started


def _chunks(
    template: JobRun, texts: list[str], keys: list[str | None], rate_keys: list[str | None]
) -> Iterator[range]:
    """The runs of one start_many() call, as consecutive ranges of about
    ``_BATCH_BYTES`` each: one INSERT statement per range."""
    fixed = _ROW_BYTES + len(json.dumps(template.tags))
    start, size = 0, 0
    for n, text in enumerate(texts):
        row = fixed + len(text.encode()) + len(keys[n] or "") + len(rate_keys[n] or "")
        if size and size + row > _BATCH_BYTES:
            yield range(start, n)
            start, size = n, 0
        size += row
    yield range(start, len(texts))


def _copy(
    template: JobRun, data: Any, key: str | None, rate_key: str | None, hold: str, turn: int
) -> JobRun:
    run = copy.copy(template)
    run._state = copy.copy(template._state)
    run.input = data
    run.concurrency_key = key
    run.rate_key = rate_key
    run.hold = hold
    run.turn = turn
    return run


def _hold_at_start(new_runs: list[JobRun], handler: JobHandler) -> Callable[[], None]:
    """Start held the new runs whose group is full now (``storage.holds``), or whose
    rate limit's window is (``storage.rateholds``); what releases their groups once
    they are written."""
    found, release = _holds_at_start(
        new_runs[0],
        [run.concurrency_key for run in new_runs],
        [run.rate_key for run in new_runs],
        handler,
    )
    for run, hold in zip(new_runs, found, strict=True):
        run.hold = hold
    return release


def _holds_at_start(
    template: JobRun, keys: list[str | None], rate_keys: list[str | None], handler: JobHandler
) -> tuple[list[str], Callable[[], None]]:
    """The hold of each new run of ``template`` (by its key): held for its key when the
    key's slots are all taken now, else for its tenant when the tenant's cap is
    reached in its pool, else for its rate limit when its window is full, else
    ready; and what releases the groups of the held ones after the commit that
    writes them (a group freed before that commit then releases its runs; a
    window that opens before it, the worker's sweep)."""
    when = template.run_at
    if isinstance(when, datetime) and when > timezone.now():
        # Not due yet: held, if its group or window is still full, when it is.
        return [str(Hold.READY)] * len(keys), _nothing
    found, release = _held_for_groups(template, keys)
    if handler.rate_limit is not None and Hold.READY in found:
        full = rateholds.full_now(
            handler.rate_limit,
            template.job_type,
            [key for key, hold in zip(rate_keys, found, strict=True) if hold == Hold.READY],
            keyed=handler.keyed_rate,
        )
        found = [
            str(Hold.RATE) if hold == Hold.READY and (rate_key in full) else hold
            for hold, rate_key in zip(found, rate_keys, strict=True)
        ]
    return found, release


def _held_for_groups(
    template: JobRun, keys: list[str | None]
) -> tuple[list[str], Callable[[], None]]:
    """The holds for keys and tenant caps of ``_holds_at_start``."""
    ready = [str(Hold.READY)] * len(keys)
    tenant = held.TENANT.group({"pool": template.pool, "tenant_id": template.tenant_id})
    if all(key is None for key in keys) and tenant is None:
        return ready, _nothing
    groups = [(key,) for key in keys if key]
    taken = {group[0] for group in held.full(held.KEY, groups, template.concurrency_limit)}
    capped = tenant is not None and bool(held.full(held.TENANT, [tenant]))
    found = [Hold.KEY if key in taken else Hold.TENANT if capped else Hold.READY for key in keys]
    if not taken and not capped:
        return ready, _nothing
    tenants = [(template.pool, template.tenant_id)] if capped else []
    return [str(hold) for hold in found], functools.partial(
        held.release_after_commit, sorted(taken), tenants
    )


def _nothing() -> None:
    pass


def made_due(runs: Sequence[JobRun] = ()) -> None:
    """Tell the test mode (``RUN_ON_COMMIT``) that ``runs``, or others, may be due now."""
    if conf.get().RUN_ON_COMMIT:
        # Imported here: the test mode runs handlers, whose modules import the API.
        from .inline import made_due as drain_when_committed

        drain_when_committed(runs)


def start_child(
    parent: JobRun,
    job_type: str,
    input: Any,
    *,
    close_policy: str,
    trace_context: dict[str, str] | None = None,
    **options: Any,
) -> JobRun:
    """Insert a child run of ``parent`` (used by ``ctx.spawn_child``, inside its step).

    ``trace_context`` is the handler's, captured where its span is current (an
    async handler's step runs on a database thread, outside it).
    """
    if "scheduled" in options:
        raise TypeError("spawn_child() got an unexpected keyword argument 'scheduled'")
    handler = get_handler(job_type)
    run = building.build(handler, input, parent=parent, **options)
    run.close_policy = close_policy
    run.trace_context = trace_context
    release = _hold_at_start([run], handler)
    turns.assign(run)
    run.save(using=conf.get().DATABASE, force_insert=True)
    release()
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
    reason = building.text("reason", reason, MAX_REASON) or "canceled"
    if (problem := control_problem(reason)) is not None:
        raise InvalidJobInput(f"reason {problem}")
    count = transitions.cancel(run_id, reason, cascade=cascade, tenant_id=tenant_id)
    # A parent waiting for the canceled run may be due now.
    made_due()
    return count


def retry(run_id: int, *, reset_steps: bool = False, tenant_id: str | None = None) -> JobRun:
    """Put a failed, timed-out or canceled run back to pending, with a fresh set of attempts.

    Completed steps stay recorded and replay, unless ``reset_steps``.
    """
    run = transitions.retry(run_id, reset_steps=reset_steps, tenant_id=tenant_id)
    made_due([run])
    return run


def run_now(run_id: int, *, tenant_id: str | None = None) -> bool:
    """Make a pending run due now (its ``run_at`` set to now); False if it is not pending."""
    using = conf.get().DATABASE
    with transaction.atomic(using=using):
        run = transitions.lock_run(run_id, tenant_id)
        changed = (
            JobRun.objects.using(using)
            .filter(pk=run.pk, status=Status.PENDING)
            .update(run_at=Now())
        )
        if changed:
            notify_pools([run.pool])
    if changed:
        made_due()
    return bool(changed)


# --- the async forms ---------------------------------------------------------------
#
# Each runs its synchronous form through sync_to_async(thread_sensitive=True),
# on the thread where Django runs the request's synchronous database work (the
# async ORM's too), so on the same connection. An async function cannot hold a
# transaction open across awaits: each call commits on its own, unless it is
# made from inside a synchronous function that opened one (docs/api.md).


async def astart(job_type: str, input: Any = None, **options: Any) -> JobRun:
    """``start`` for async code: the same options, the same run."""
    return await sync_to_async(start, thread_sensitive=True)(job_type, input, **options)


async def astart_many(job_type: str, inputs: Iterable[Any], **options: Any) -> list[JobRun]:
    """``start_many`` for async code."""
    # A generator is consumed here, before the call leaves this thread.
    items = list(inputs)
    return await sync_to_async(start_many, thread_sensitive=True)(job_type, items, **options)


async def acancel(
    run_id: int, *, cascade: bool = True, reason: str = "", tenant_id: str | None = None
) -> int:
    """``cancel`` for async code."""
    return await sync_to_async(cancel, thread_sensitive=True)(
        run_id, cascade=cascade, reason=reason, tenant_id=tenant_id
    )


async def aretry(run_id: int, *, reset_steps: bool = False, tenant_id: str | None = None) -> JobRun:
    """``retry`` for async code."""
    return await sync_to_async(retry, thread_sensitive=True)(
        run_id, reset_steps=reset_steps, tenant_id=tenant_id
    )


def _refuse_event_loop(name: str, *, instead: str | None = None) -> None:
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
    qualified = name if "." in name else f"django_jobs.{name}"
    raise SyncOnlyCall(
        f"{qualified}() was called from async code (an event loop is running in "
        f"this thread); it uses the database synchronously: call "
        f"`{instead or f'await django_jobs.a{name}(...)'}` instead"
    )
