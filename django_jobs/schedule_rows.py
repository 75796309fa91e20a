"""What the workers read and write of ``JobSchedule`` rows: a code schedule's row
made, a schedule's due ticks fired, rows and inputs read.

These are the statements the workers write ``JobSchedule`` rows with;
the operators' (``schedule_api.py``) are each one short statement, and their
locking is told here too:

* A code schedule's row is made by the first worker to see it (``INSERT ... ON
  CONFLICT DO NOTHING``), with ``last_tick`` NULL: ticks before ``created_at``
  are never run. A run-time schedule's row is made by ``add_schedule()``, with
  the same rule. A code schedule whose name a run-time row holds is not
  scheduled (an error is logged): nothing overwrites an operator's schedule.
* A worker takes due ticks with one conditional ``UPDATE ... SET last_tick = <new>
  WHERE name = %s AND last_tick = <the value it read> AND revision = <the
  revision it read>`` in the transaction that also inserts their runs. Two
  workers racing: the second UPDATE waits for the first's row lock; once the
  first commits, PostgreSQL re-checks the WHERE on the new row version (READ
  COMMITTED; InnoDB's UPDATE reads the latest version too) and updates nothing,
  so the second starts nothing. If the first rolls back, the second proceeds.
  The transaction holds the lock only while it inserts the runs.
* Every operator change (an edit, a pause, a resume) is one UPDATE that raises
  ``revision``. A worker that read the row before it matches nothing, so a tick
  is never started under a definition that was changed or paused meanwhile;
  and a worker reads a run-time schedule's definition from the row it takes
  the ticks of, never from its memory, which may be ``RELOAD_INTERVAL`` old.
  A row added again under a deleted one's name starts again at revision 1, so
  the UPDATE also names the row's ``incarnation`` (new for every row made), and
  so does the reread: a row deleted and added again between two rereads is a
  new schedule to every worker, never the old one's state.
* What a worker reads of a row is bounded, and read defensively: the reread
  and the tick's read never select the input (a tick reads its own row's,
  within ``MAX_INPUT_BYTES``, after its UPDATE matched), nor more of the cron
  text than an expression may hold. A row holding what no schedule can be
  (written by hand: the database is trusted, but one bad row must not stop
  the others) is logged once per revision and left out, or retried alone.
* A changed cron expression or time zone moves ``last_tick`` forward to the
  changer's now, as ``GREATEST(COALESCE(last_tick, created_at), now)`` in the
  same UPDATE (a worker's sync of a changed declaration, or ``change_schedule``):
  the new expression's ticks before now were never due, and a tick another
  worker handled meanwhile is not handled again.
* A paused schedule starts nothing and nothing moves its ``last_tick``: once
  resumed, the ticks missed meanwhile follow its missed policy (``plan()``).
* A deleted row: the DELETE waits for a worker's transaction holding it; a
  worker that finds no row starts nothing (a code schedule's row is made again,
  as seen for the first time).
* Each run carries the idempotency key ``schedule:<name>:<UTC instant>``,
  unique per job type (``django_jobs_run_idempotency``): even a row reset by
  hand cannot start a second run for an instant whose run is still stored.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import Case, QuerySet, TextField, Value, When
from django.db.models.functions import Cast, Coalesce, Greatest, Left, Length

from . import conf
from .exceptions import ScheduleNotFound, UnknownJobType
from .models import JobRun, JobSchedule, ScheduleSource
from .schedule_targets import find_target, runtime_entry
from .schedules import MAX_CRON, Entry, Target, plan, schedule_input

# The scheduler's log lines, whichever of its modules writes them.
logger = logging.getLogger("django_jobs.scheduler")

ERROR_RETRY = timedelta(seconds=30)  # a schedule whose firing failed is tried again after this
# What the workers read of a row: its state, and a run-time schedule's
# definition, its input aside (read_input(), when a tick of the row fires) and
# its cron text cut past the longest an expression may be (read_rows()).
STATE = (
    "name",
    "source",
    "revision",
    "incarnation",
    "paused_at",
    "last_tick",
    "created_at",
    "job_type",
    "timezone",
    "missed",
)
# What tells a row's versions apart: a worker applies a row again when it changed.
LISTED = ("source", "revision", "incarnation")


@dataclass(frozen=True)
class Fired:
    """What one firing did: the runs it started and the schedule's next tick.

    ``next_tick`` is None when the schedule is not to be fired (paused, deleted,
    or its name now held by a schedule of the other source) until a reload.
    """

    runs: list[JobRun]
    next_tick: datetime | None


def _using() -> str:
    return conf.get().DATABASE


def _definition(entry: Entry) -> dict[str, str]:
    schedule = entry.schedule
    return {
        "job_type": entry.job_type,
        "cron": schedule.cron,
        "timezone": schedule.zone.key,
        "missed": schedule.missed,
    }


def sync(items: Sequence[Entry], now: datetime) -> dict[str, datetime | None]:
    """Make the rows of code schedules seen for the first time; return each one's next tick.

    A paused schedule's next tick is None, as is one whose name a run-time
    schedule holds. Each schedule is synced on its own: one that fails is logged
    and given a retry time instead of a tick, and the others still run. A
    database error ends the whole pass.
    """
    due: dict[str, datetime | None] = {}
    for entry in items:
        try:
            due[entry.name] = _sync(entry, now)
        except DatabaseError:
            raise
        except Exception:
            logger.exception("schedule=%s could not be synced; retrying later", entry.name)
            due[entry.name] = now + ERROR_RETRY
    return due


def _sync(entry: Entry, now: datetime) -> datetime | None:
    table = JobSchedule.objects.using(_using())
    definition = _definition(entry)
    table.bulk_create(
        [
            JobSchedule(
                name=entry.name,
                created_at=now,
                updated_at=now,
                next_tick=entry.schedule.next_after(now),
                **definition,
            )
        ],
        ignore_conflicts=True,
    )
    row = table.values("last_tick", "created_at", "source", "paused_at", *definition).get(
        name=entry.name
    )
    if row["source"] == ScheduleSource.RUNTIME:
        logger.error(
            "schedule=%s is declared in code, but a run-time schedule has that name: the "
            "code one is not scheduled; rename one of them",
            entry.name,
        )
        return None
    after = row["last_tick"] or row["created_at"]
    if {key: row[key] for key in definition} == definition:
        return None if row["paused_at"] else entry.schedule.next_after(after)
    # The declaration changed since a worker last wrote it: show the new one.
    changes: dict[str, Any] = {}
    if (row["cron"], row["timezone"]) != (definition["cron"], definition["timezone"]):
        # The new expression's ticks before now were never due: counting them
        # as missed would start them all under catch_up. GREATEST, so a tick
        # another worker has handled meanwhile is not handled again (COALESCE:
        # MySQL's GREATEST of a NULL is NULL).
        after = max(after, now)
        changes["last_tick"] = Greatest(Coalesce("last_tick", "created_at"), Value(now))
    due = entry.schedule.next_after(after)
    table.filter(name=entry.name).update(next_tick=due, updated_at=now, **changes, **definition)
    return None if row["paused_at"] else due


def fire(entry: Entry, now: datetime) -> Fired:
    """Start the runs of ``entry``'s ticks due at ``now``, unless another worker did.

    One short transaction: read the row, take the ticks with the conditional
    UPDATE, insert their runs (see the module docstring). A run-time schedule's
    definition is the row's, read here.
    """
    using = _using()
    target = None if entry.runtime else _target(entry)
    table = JobSchedule.objects.using(using)
    with transaction.atomic(using=using):
        row = _read_one(table, entry.name)
        if row is None:
            if entry.runtime:  # deleted: nothing more to start
                return Fired([], None)
            # Deleted since this worker started: seen for the first time again.
            return Fired([], sync([entry], now)[entry.name])
        if not _firable(entry, row):
            return Fired([], None)
        if entry.runtime:
            entry = runtime_entry(row)
            target = _target(entry)
        assert target is not None
        schedule = entry.schedule
        previous = row["last_tick"]
        decided = plan(schedule, previous or row["created_at"], now)
        if decided.latest is None:
            # Taken by another worker since this one last looked.
            return Fired([], schedule.next_after(previous or row["created_at"]))
        next_tick = schedule.next_after(decided.latest)
        won = table.filter(
            **_same_version(row),
            **({"last_tick__isnull": True} if previous is None else {"last_tick": previous}),
        ).update(
            last_tick=decided.latest,
            next_tick=next_tick,
            updated_at=now,
            **({} if entry.runtime else _definition(entry)),
        )
        if not won:
            # Another worker took these ticks and committed, or an operator
            # changed the schedule: this statement's snapshot sees where it is.
            return Fired([], _next_tick(entry, _read_one(table, entry.name)))
        data = schedule.input
        if entry.runtime and decided.run:
            # Read now, for this row only: the UPDATE above holds its lock, so
            # this is the input of the revision it matched.
            data = target.check_input(schedule_input(read_input(entry.name), what="input"))
        runs = [target.start(data, entry.name, tick) for tick in decided.run]
    if decided.missed:
        logger.warning(
            "schedule=%s missed=%s skipped=%d latest=%s",
            entry.name,
            schedule.missed,
            decided.missed,
            decided.latest.isoformat(),
        )
    for run in runs:
        logger.info(
            "schedule=%s run=%s type=%s tick=%s",
            entry.name,
            run.pk,
            run.job_type,
            run.run_at.isoformat(),
        )
    return Fired(runs, next_tick)


def _same_version(row: Mapping[str, Any]) -> dict[str, Any]:
    """The filter matching ``row`` only as read: same name, incarnation and revision."""
    made = (
        {"incarnation__isnull": True}
        if row["incarnation"] is None
        else {"incarnation": row["incarnation"]}
    )
    return {"name": row["name"], "revision": row["revision"], **made}


def read_rows(rows: QuerySet[JobSchedule]) -> list[dict[str, Any]]:
    """The state and definition of ``rows`` as the workers read them (``STATE``): no
    input, and no more of the cron text than one longer than ``MAX_CRON`` shows."""
    found = []
    for row in rows.values(*STATE, cron_cut=Left("cron", MAX_CRON + 1)):
        row["cron"] = row.pop("cron_cut")
        found.append(row)
    return found


def _read_one(table: QuerySet[JobSchedule], name: str) -> dict[str, Any] | None:
    rows = read_rows(table.filter(name=name))
    return rows[0] if rows else None


def read_input(name: str) -> Any:
    """The stored input of run-time schedule ``name``, decoded from its JSON text.

    ``ValueError`` when no run could take it, said without loading more than
    three times ``MAX_INPUT_BYTES`` of it: longer than that as stored (``start()``
    measures compact UTF-8; a stored text may add a space after each ``:`` and
    ``,``, and MySQL and MariaDB hold Django's ASCII-only JSON, where "é" is the
    six characters ``\\u00e9``: never three times as long), or JSON that Python
    cannot read (nested past its recursion limit, a number of thousands of
    digits). A row may hold anything: it is decoded here, where a failure is
    this schedule's, not when rows are fetched.
    """
    bound = 3 * conf.get().MAX_INPUT_BYTES
    text = Cast("input", TextField())
    found = list(
        JobSchedule.objects.using(_using())
        .filter(name=name)
        .annotate(size=Length(text))
        .values_list(
            "size",
            Case(When(size__lte=bound, then=text), default=Value(None), output_field=TextField()),
        )
    )
    if not found:
        raise ScheduleNotFound(f"no schedule named {name[:200]!r}")
    size, stored = found[0]
    if size is None:
        return None
    if stored is None:
        raise ValueError(f"the stored input is {size} characters long, more than runs may take")
    try:
        return json.loads(stored)
    except RecursionError:
        raise ValueError("the stored input is nested too deeply to be read") from None
    except ValueError as exc:
        raise ValueError(f"the stored input cannot be read: {str(exc)[:200]}") from None


def _target(entry: Entry) -> Target:
    # A code schedule's target is named in code, so a task's module may be imported.
    found = find_target(entry.job_type, importing=not entry.runtime)
    if found is None:
        raise UnknownJobType(f"schedule {entry.name!r}: no job or task {entry.job_type!r}")
    return found


def _firable(entry: Entry, row: Mapping[str, Any]) -> bool:
    """Whether ``row`` is ``entry``'s to fire: not paused, and of the entry's source
    (a name may change hands between a code and a run-time schedule)."""
    runtime = row["source"] == ScheduleSource.RUNTIME
    return row["paused_at"] is None and runtime == entry.runtime


def _next_tick(entry: Entry, row: Mapping[str, Any] | None) -> datetime | None:
    """``entry``'s next tick as ``row`` (read now) has it; None when it is not to be fired."""
    if row is None or not _firable(entry, row):
        return None
    schedule = runtime_entry(row).schedule if entry.runtime else entry.schedule
    return schedule.next_after(row["last_tick"] or row["created_at"])
