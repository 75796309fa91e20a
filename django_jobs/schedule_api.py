"""Schedules managed at run time: add, change, pause, resume and delete. The admin calls these.

A run-time schedule is a ``JobSchedule`` row (``source="runtime"``), which is
its definition; the workers see a change within ``scheduler.RELOAD_INTERVAL``
seconds, without a restart. A schedule declared in code (``@job(schedule=...)``,
``DJANGO_JOBS["SCHEDULES"]``) is changed in code: here it may only be paused
and resumed. Code and run-time schedules share one namespace.

Every change is recorded: logged at INFO, and, given a ``user`` (and with
``django.contrib.admin`` installed), as a ``LogEntry`` of the admin's history,
as the admin records its own changes. Each is one short statement; how they
meet the workers' is told in ``scheduler.py``'s docstring.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Case, F, Value, When
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone as django_timezone

from . import conf
from .exceptions import InvalidSchedule, ScheduleNotFound
from .models import JobSchedule, ScheduleSource
from .payloads import control_problem
from .registry import all_handlers
from .schedule_rows import read_input, sync
from .schedule_targets import code_entries, find_target
from .schedules import (
    MAX_CRON,
    MAX_NAME,
    MISSED_POLICIES,
    Schedule,
    code_names,
    name_problem,
    schedule_input,
    timezone_problem,
)

logger = logging.getLogger(__name__)

# The fields of a run-time schedule's definition, in the order forms show them.
FIELDS = ("job_type", "cron", "timezone", "missed", "input")
MAX_JOB_TYPE = 200  # JobSchedule.job_type
MAX_TIMEZONE = 100  # JobSchedule.timezone
MAX_REVISION = 2**31 - 1  # JobSchedule.revision, an integer column


class _Unchanged:
    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Any = _Unchanged()  # change_schedule(): leave this field as it is


@dataclass(frozen=True)
class Definition:
    """A checked run-time schedule: its columns, and the schedule they make."""

    columns: dict[str, Any]
    schedule: Schedule


def check_definition(
    job_type: object, cron: object, timezone: object, missed: object, input: Any
) -> Definition:
    """Check a run-time schedule's definition; raise ``InvalidSchedule`` naming the bad field.

    ``job_type`` names a ``@job`` or a ``django.tasks`` task whose module this
    process has imported (a name from a form or a row never imports anything);
    ``timezone`` None means ``settings.TIME_ZONE``, stored as its name.
    """
    if not isinstance(job_type, str) or not job_type or len(job_type) > MAX_JOB_TYPE:
        raise InvalidSchedule(
            f"job_type must be a job type or a task's path of 1-{MAX_JOB_TYPE} characters",
            "job_type",
        )
    target = find_target(job_type)
    if target is None:
        raise InvalidSchedule(
            f"job_type: no job is registered as {job_type!r}, and no django.tasks task with "
            "that path is imported in this process (import its module from your app's "
            "jobs.py)",
            "job_type",
        )
    if not isinstance(cron, str) or len(cron) > MAX_CRON:
        raise InvalidSchedule(f"cron must be a string of at most {MAX_CRON} characters", "cron")
    if (problem := control_problem(cron)) is not None:
        raise InvalidSchedule(f"cron {problem}", "cron")
    if timezone is None:
        timezone = settings.TIME_ZONE or "UTC"
    if isinstance(timezone, str) and len(timezone) > MAX_TIMEZONE:
        raise InvalidSchedule(f"timezone is longer than {MAX_TIMEZONE} characters", "timezone")
    if (problem := timezone_problem(timezone)) is not None:
        raise InvalidSchedule(problem, "timezone")
    if missed not in MISSED_POLICIES:
        raise InvalidSchedule(
            f"missed must be one of {', '.join(map(repr, MISSED_POLICIES))}", "missed"
        )
    try:
        schedule = Schedule(cron.strip(), timezone=str(timezone), missed=str(missed))
    except ValueError as exc:
        raise InvalidSchedule(str(exc), "cron") from None
    try:
        data = target.check_input(schedule_input(input, what="input"))
    except ValueError as exc:
        raise InvalidSchedule(str(exc), "input") from None
    columns = {
        "job_type": job_type,
        "cron": schedule.cron,
        "timezone": schedule.zone.key,
        "missed": schedule.missed,
        "input": data,
    }
    return Definition(columns, replace(schedule, input=data))


def check_name(name: object) -> str:
    """Check the name of a new run-time schedule; raise ``InvalidSchedule``."""
    problem = name_problem(name)
    if problem is not None:
        raise InvalidSchedule(f"name {problem}", "name")
    assert isinstance(name, str)
    if name in code_names(all_handlers()):
        raise InvalidSchedule(
            f"the name {name!r} is taken by a schedule declared in code (a @job's schedule is "
            "named after its job type; a DJANGO_JOBS['SCHEDULES'] one by its key)",
            "name",
        )
    if JobSchedule.objects.using(conf.get().DATABASE).filter(name=name).exists():
        raise InvalidSchedule(f"a schedule named {name!r} exists already", "name")
    return name


def add_schedule(
    name: str,
    job_type: str,
    cron: str,
    *,
    timezone: str | None = None,
    missed: str = "skip",
    input: Any = None,
    paused: bool = False,
    user: Any = None,
) -> JobSchedule:
    """Add a schedule at run time; return its row. Its runs start from its first tick.

    ``job_type`` is a ``@job`` type or a ``django.tasks`` task's path; ``timezone``
    an IANA name (``settings.TIME_ZONE`` by default); ``missed`` ``"skip"`` or
    ``"catch_up"``; ``input`` the JSON value every run gets (for a task,
    ``{"args": [...], "kwargs": {...}}``). ``user`` is recorded as the actor.
    """
    name = check_name(name)
    definition = check_definition(job_type, cron, timezone, missed, input)
    _check_user(user)
    now = django_timezone.now()
    row = JobSchedule(
        name=name,
        source=ScheduleSource.RUNTIME,
        created_at=now,
        updated_at=now,
        next_tick=definition.schedule.next_after(now),
        paused_at=now if paused else None,
        revision=1,
        **definition.columns,
    )
    using = conf.get().DATABASE
    try:
        with transaction.atomic(using=using):
            row.save(using=using, force_insert=True)
            _record(user, row, "added", [{"added": {}}])
    except IntegrityError:
        raise InvalidSchedule(f"a schedule named {name!r} exists already", "name") from None
    return row


def change_schedule(
    name: str,
    *,
    job_type: Any = UNCHANGED,
    cron: Any = UNCHANGED,
    timezone: Any = UNCHANGED,
    missed: Any = UNCHANGED,
    input: Any = UNCHANGED,
    user: Any = None,
) -> JobSchedule:
    """Change a run-time schedule's fields (those given); return its row.

    A new cron expression or time zone counts from now: its ticks before now
    were never due, so none is replayed. A schedule declared in code is refused.
    """
    _check_user(user)
    using = conf.get().DATABASE
    table = JobSchedule.objects.using(using)
    with transaction.atomic(using=using):
        row = _locked(name)
        if not row.runtime:
            raise InvalidSchedule(
                f"schedule {row.name!r} is declared in code; change it there (it may be "
                "paused and resumed here)"
            )
        given = {"job_type": job_type, "cron": cron, "timezone": timezone, "missed": missed}
        merged = {
            field: getattr(row, field) if value is UNCHANGED else value
            for field, value in given.items()
        }
        stored = _stored_input(row.name, required=input is UNCHANGED)
        merged["input"] = stored if input is UNCHANGED else input
        definition = check_definition(**merged)
        current = {**{f: getattr(row, f) for f in given}, "input": stored}
        changed = [f for f in FIELDS if definition.columns[f] != current[f]]
        if not changed:
            return row
        now = django_timezone.now()
        after = row.last_tick or row.created_at
        updates: dict[str, Any] = {f: definition.columns[f] for f in changed}
        if "cron" in changed or "timezone" in changed:
            # The new expression's ticks before now were never due (as for a
            # declaration changed in code); GREATEST keeps a tick handled meanwhile.
            after = max(after, now)
            updates["last_tick"] = Greatest(Coalesce("last_tick", "created_at"), Value(now))
        table.filter(name=row.name).update(
            **updates,
            next_tick=_next_tick(definition.schedule, after),
            revision=_next_revision(),
            updated_at=now,
        )
        row = _locked(row.name)
        fields = [_label(f) for f in changed]
        _record(user, row, "changed " + ",".join(changed), [{"changed": {"fields": fields}}])
    return row


def pause_schedule(name: str, *, user: Any = None) -> bool:
    """Start no more runs of schedule ``name`` (code or run-time) until resumed.

    Its ``last_tick`` stays, so on resume the ticks missed meanwhile follow its
    missed policy. False when it was paused already.
    """
    return _set_paused(name, True, user)


def resume_schedule(name: str, *, user: Any = None) -> bool:
    """Start runs of schedule ``name`` again; the ticks missed while it was paused
    follow its missed policy. False when it was not paused."""
    return _set_paused(name, False, user)


def delete_schedule(name: str, *, user: Any = None) -> None:
    """Delete a run-time schedule (or the row of a code schedule no longer declared).

    Its runs stay. A schedule this code declares is refused: remove it from the code.
    """
    _check_user(user)
    using = conf.get().DATABASE
    with transaction.atomic(using=using):
        row = _locked(name)
        if not row.runtime and row.name in {e.name for e in code_entries(None)}:
            raise InvalidSchedule(
                f"schedule {row.name!r} is declared in code; remove it there (it may be "
                "paused here)"
            )
        JobSchedule.objects.using(using).filter(name=row.name).delete()
        _record(user, row, "deleted", "")


def _set_paused(name: str, paused: bool, user: Any) -> bool:
    _check_user(user)
    using = conf.get().DATABASE
    table = JobSchedule.objects.using(using)
    now = django_timezone.now()
    if paused:
        _make_code_row(name, now)
    with transaction.atomic(using=using):
        _locked(name)  # ScheduleNotFound
        changed = table.filter(name=name, paused_at__isnull=paused).update(
            paused_at=now if paused else None, revision=_next_revision(), updated_at=now
        )
        if not changed:
            return False  # it was so already
        row = _locked(name)
        _record(user, row, "paused" if paused else "resumed", "Paused." if paused else "Resumed.")
    return True


def _make_code_row(name: str, now: datetime) -> None:
    """Make the row of a code schedule no worker has seen yet, so that it can be paused."""
    if not isinstance(name, str):
        return
    declared = [entry for entry in code_entries(None) if entry.name == name]
    if declared and not JobSchedule.objects.using(conf.get().DATABASE).filter(name=name).exists():
        sync(declared, now)


def _locked(name: str) -> JobSchedule:
    """Row ``name``, locked until the transaction ends, its input not loaded (a row
    may hold one that cannot be: ``_stored_input()`` reads it when needed)."""
    if not isinstance(name, str):
        raise ScheduleNotFound(f"schedule names are strings, got {type(name).__name__}")
    if not storable_name(name):
        raise ScheduleNotFound(f"no schedule named {name[:200]!r}")
    rows = JobSchedule.objects.using(conf.get().DATABASE).select_for_update().defer("input")
    found = rows.filter(name=name).first()
    if found is None:
        raise ScheduleNotFound(f"no schedule named {name[:200]!r}")
    return found


def storable_name(name: str) -> bool:
    """Whether a row could hold ``name`` (what a lookup may be asked for): at most
    200 characters, no NUL (PostgreSQL cannot compare text holding one at all), and
    valid Unicode. Names written by hand need not pass ``name_problem()``, so that
    every row stays reachable."""
    if len(name) > MAX_NAME or "\0" in name:
        return False
    try:
        name.encode()
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def _stored_input(name: str, *, required: bool) -> Any:
    """The input a row holds, read within ``MAX_INPUT_BYTES``. Unreadable, it is
    ``InvalidSchedule`` when the change keeps it (``required``): a new input must
    be given; else a value no input equals, so that any new one counts as a change."""
    try:
        return read_input(name)
    except ValueError as exc:
        if required:
            raise InvalidSchedule(f"{exc}: give a new input", "input") from None
        return UNCHANGED


def _next_tick(schedule: Schedule, after: datetime) -> datetime | None:
    """The tick after ``after``, for the admin; None past the years Python knows (a
    row may claim a latest tick in year 9999: it then never fires, as it says)."""
    try:
        return schedule.next_after(after)
    except OverflowError:
        return None


def _next_revision() -> Case:
    """``revision + 1``, back to 1 at the column's end: workers only ask whether it changed."""
    return Case(When(revision__gte=MAX_REVISION, then=Value(1)), default=F("revision") + 1)


def _check_user(user: Any) -> None:
    if user is not None and getattr(user, "pk", None) is None:
        raise InvalidSchedule("user must be a saved user (an anonymous one cannot be recorded)")


def _record(user: Any, row: JobSchedule, verb: str, message: Any) -> None:
    """Record a change: an INFO line, and a ``LogEntry`` when there is a user to name."""
    logger.info("schedule=%s %s revision=%s by=%s", row.name, verb, row.revision, _actor(user))
    if user is None or not apps.is_installed("django.contrib.admin"):
        return
    from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry

    flag = {"added": ADDITION, "deleted": DELETION}.get(verb, CHANGE)
    LogEntry.objects.log_actions(
        user_id=user.pk, queryset=[row], action_flag=flag, change_message=message
    )


def _label(field: str) -> str:
    """A field's name as the admin's change messages give it (its verbose name)."""
    return str(getattr(JobSchedule._meta.get_field(field), "verbose_name", field))


def _actor(user: Any) -> str:
    return "code" if user is None else f"user:{user.pk}"


# --- the async forms ---------------------------------------------------------------


async def aadd_schedule(name: str, job_type: str, cron: str, **options: Any) -> JobSchedule:
    """``add_schedule`` for async code."""
    return await sync_to_async(add_schedule, thread_sensitive=True)(name, job_type, cron, **options)


async def achange_schedule(name: str, **changes: Any) -> JobSchedule:
    """``change_schedule`` for async code."""
    return await sync_to_async(change_schedule, thread_sensitive=True)(name, **changes)


async def apause_schedule(name: str, *, user: Any = None) -> bool:
    """``pause_schedule`` for async code."""
    return await sync_to_async(pause_schedule, thread_sensitive=True)(name, user=user)


async def aresume_schedule(name: str, *, user: Any = None) -> bool:
    """``resume_schedule`` for async code."""
    return await sync_to_async(resume_schedule, thread_sensitive=True)(name, user=user)


async def adelete_schedule(name: str, *, user: Any = None) -> None:
    """``delete_schedule`` for async code."""
    await sync_to_async(delete_schedule, thread_sensitive=True)(name, user=user)
