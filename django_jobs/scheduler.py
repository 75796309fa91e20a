"""The scheduler: one run per tick of every schedule, with every worker scheduling at once.

There is no leader. Each worker keeps the next tick of each of its schedules in
memory, and touches the database at start, when a tick is due, and every
``RELOAD_INTERVAL`` seconds to see which schedules were added, changed, paused,
resumed or deleted (one narrow query: every row's name, source, revision and
incarnation).
This module holds the statements the workers write ``JobSchedule`` rows with;
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
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.models import Case, QuerySet, TextField, Value, When
from django.db.models.functions import Cast, Coalesce, Greatest, Left, Length
from django.utils import timezone

from . import conf
from .exceptions import ScheduleNotFound, UnknownJobType
from .models import JobRun, JobSchedule, ScheduleSource
from .schedule_targets import code_entries, find_target, runtime_entry
from .schedules import MAX_CRON, Entry, Target, plan, schedule_input
from .storage.connections import discard_broken_connections
from .storage.control import ControlConnection

logger = logging.getLogger(__name__)

MAX_SLEEP = 60.0  # seconds; the clock is read again at least this often
ERROR_RETRY = timedelta(seconds=30)  # a schedule whose firing failed is tried again after this
# Seconds between two reads of which schedules changed: how long a worker may
# take to see a schedule added, changed, paused, resumed or deleted.
RELOAD_INTERVAL = 5.0
RELOAD_BATCH = 500  # rows read at once when many changed
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


def run_schedules(now: datetime | None = None, *, pools: list[str] | None = None) -> list[JobRun]:
    """Start the runs of every schedule (of jobs in ``pools``, or all) due at ``now``.

    What a worker's scheduler does, once, in this process; for tests (with an
    injected ``now``) and for running schedules without a worker. A schedule
    seen for the first time starts nothing for the past. Errors are raised.
    """
    now = timezone.now() if now is None else now
    scheduler = Scheduler(pools, threading.Event(), clock=lambda: now)
    return scheduler.fire_due(now, fire_one=fire)


class Scheduler:
    """A worker's scheduler thread: fires its pools' schedules as their ticks come due.

    The schedules declared in code (``entries``) are known at start; run-time
    ones are read from the table, and every ``RELOAD_INTERVAL`` seconds the
    scheduler reads which rows changed. Errors are logged and retried; nothing
    here ends the worker.
    """

    def __init__(
        self,
        pools: Sequence[str] | None,
        stop: threading.Event,
        *,
        clock: Callable[[], datetime] = timezone.now,
        control: ControlConnection | None = None,
    ) -> None:
        self.pools = None if pools is None else list(pools)
        self.entries = code_entries(self.pools)  # declared in code, for the worker's life
        self.runtime: dict[str, Entry] = {}  # added at run time, as last read
        # Each row's version last applied (LISTED: source, revision, incarnation).
        self.seen: dict[str, tuple[Any, ...] | None] = {}
        # The version of a row whose failure was logged: once per version, not
        # at every retry.
        self.said: dict[str, tuple[Any, ...] | None] = {}
        self.stop = stop
        self.clock = clock
        self.due: dict[str, datetime] | None = None  # next tick by schedule; None: not synced
        self.loaded_at: datetime | None = None  # when the rows were last read
        self.failures = 0
        # A worker's shared control connection, taken for each pass; without
        # one, the scheduler's thread has a connection of its own.
        self.control = control

    def run(self) -> None:
        """Fire due schedules until ``stop`` is set (the thread's target)."""
        names = ",".join(entry.name for entry in self.entries)
        logger.info("scheduler started schedules=%s", names)
        if self.control is not None:
            self.control.adopt()
        try:
            while not self.stop.is_set():
                try:
                    with self.control or nullcontext():
                        wait = self.step()
                except Exception:
                    logger.exception("scheduler failed; retrying in %ds", ERROR_RETRY.seconds)
                    wait = ERROR_RETRY.total_seconds()
                self.stop.wait(wait)
        finally:
            if self.control is not None:
                self.control.leave()
            else:
                connections.close_all()

    def step(self) -> float:
        """Sync (the first time), read changes (when due) and fire what is due; return
        seconds until the next tick or read."""
        try:
            self.fire_due(self.clock(), fire_one=self._fire)
        except DatabaseError as exc:
            self.failures += 1
            pause = min(0.5 * 2.0**self.failures, MAX_SLEEP)
            logger.warning("scheduler database error (%s); retrying in %.1fs", exc, pause)
            discard_broken_connections()
            return pause
        self.failures = 0
        assert self.due is not None
        assert self.loaded_at is not None
        now = self.clock()
        wait = min(
            [(when - now).total_seconds() for when in self.due.values()]
            + [RELOAD_INTERVAL - (now - self.loaded_at).total_seconds()]
        )
        return min(max(wait, 0.0), MAX_SLEEP)

    def fire_due(
        self, now: datetime, *, fire_one: Callable[[Entry, datetime], Fired]
    ) -> list[JobRun]:
        """One pass: sync and read the rows when due, then fire the due schedules."""
        if self.due is None:
            self.due = {name: when for name, when in sync(self.entries, now).items() if when}
        if (
            self.loaded_at is None
            or not 0 <= (now - self.loaded_at).total_seconds() < RELOAD_INTERVAL
        ):
            self.reload(now)
        runs: list[JobRun] = []
        for name, when in sorted(self.due.items()):
            if when > now:
                continue
            fired = fire_one(self._entry(name), now)
            runs.extend(fired.runs)
            if fired.next_tick is None:
                del self.due[name]
            else:
                self.due[name] = fired.next_tick
        return runs

    def _entry(self, name: str) -> Entry:
        return self.runtime.get(name) or next(e for e in self.entries if e.name == name)

    def _fire(self, entry: Entry, now: datetime) -> Fired:
        try:
            fired = fire(entry, now)
        except DatabaseError:
            raise  # the whole pass waits and retries
        except Exception as exc:
            # A bad input, a target no longer known, a row holding what no
            # schedule can be: this schedule only, tried again alone.
            self._complain(
                entry.name,
                "schedule=%s could not start its run (%s); retrying every %ds",
                entry.name,
                _brief(exc),
                ERROR_RETRY.seconds,
            )
            return Fired([], now + ERROR_RETRY)
        self.said.pop(entry.name, None)
        return fired

    def _complain(self, name: str, message: str, *args: Any) -> None:
        """Log a schedule's failure once for each version of its row (at DEBUG, with
        the traceback, afterwards): it is retried every 30 s or at every reread."""
        version = self.seen.get(name)
        again = name in self.said and self.said[name] == version
        self.said[name] = version
        if not again:
            logger.warning(message, *args)
        logger.debug(message, *args, exc_info=True)

    # --- seeing changes ---------------------------------------------------------------

    def reload(self, now: datetime) -> None:
        """Read which schedules changed since the last read, and apply what changed.

        One query lists every row's name, source, revision and incarnation;
        only the rows that changed (added, edited, paused, resumed, deleted,
        added again) are read, as ``read_rows()`` reads them: without inputs.
        """
        assert self.due is not None
        table = JobSchedule.objects.using(_using())
        listing = {name: tuple(rest) for name, *rest in table.values_list("name", *LISTED)}
        first = self.loaded_at is None
        self.loaded_at = now
        code = {entry.name: entry for entry in self.entries}
        changed = [
            name
            for name in sorted({*listing, *self.seen, *code})
            if listing.get(name) != self.seen.get(name, ())
        ]
        if first:
            # sync() has just read the code schedules' rows.
            synced = {
                name
                for name in changed
                if name in code and listing.get(name, ("",))[0] != ScheduleSource.RUNTIME
            }
            self.seen.update({name: listing.get(name) for name in synced})
            changed = [name for name in changed if name not in synced]
        for batch in _batches(changed, RELOAD_BATCH):
            rows = {row["name"]: row for row in read_rows(table.filter(name__in=batch))}
            for name in batch:
                self.seen[name] = listing.get(name)
                try:
                    self._apply(name, rows.get(name), code.get(name), now)
                except DatabaseError:
                    raise
                except Exception as exc:
                    # Whatever a row holds, the other schedules go on. Read again
                    # at the next reread (a task's module may be imported by then).
                    self._complain(
                        name,
                        "schedule=%s revision=%s not scheduled: %s",
                        name,
                        rows[name]["revision"] if name in rows else None,
                        _brief(exc),
                    )
                    self.seen.pop(name, None)
                    self.due.pop(name, None)
                    self.runtime.pop(name, None)

    def _apply(
        self, name: str, row: Mapping[str, Any] | None, code: Entry | None, now: datetime
    ) -> None:
        """Schedule ``name`` as its ``row`` (just read; None: deleted) now has it."""
        assert self.due is not None
        self.runtime.pop(name, None)
        self.due.pop(name, None)
        if row is not None and row["source"] == ScheduleSource.RUNTIME:
            self._apply_runtime(row)
        elif code is not None and row is None:
            when = sync([code], now)[name]  # deleted: seen for the first time again
            if when is not None:
                self.due[name] = when
        elif code is not None and row is not None:
            logger.info("schedule=%s revision=%s %s", name, row["revision"], _state(row))
            if row["paused_at"] is None:
                self.due[name] = code.schedule.next_after(_after(row))
        elif row is None:
            del self.seen[name]
            self.said.pop(name, None)
            logger.info("schedule=%s deleted", name)

    def _apply_runtime(self, row: Mapping[str, Any]) -> None:
        assert self.due is not None
        name = row["name"]
        entry = runtime_entry(row)
        due = None if row["paused_at"] else entry.schedule.next_after(_after(row))
        self.said.pop(name, None)
        if self.pools is not None and entry.pool not in self.pools:
            return
        self.runtime[name] = entry
        logger.info(
            "schedule=%s revision=%s %s target=%s",
            name,
            row["revision"],
            _state(row),
            entry.job_type,
        )
        if due is not None:
            self.due[name] = due


def _after(row: Mapping[str, Any]) -> datetime:
    """Where a row's ticks go on from: its latest handled tick, or when it was made."""
    return row["last_tick"] or row["created_at"]  # type: ignore[no-any-return]


def _brief(exc: BaseException) -> str:
    """An exception as one short log line: a row may have put anything in its message."""
    return f"{type(exc).__name__}: {str(exc)[:500]}"


def _state(row: Mapping[str, Any]) -> str:
    return "paused" if row["paused_at"] is not None else "active"


def _batches(items: list[str], size: int) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
