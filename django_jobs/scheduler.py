"""The scheduler: one run per tick of every schedule, with every worker scheduling at once.

There is no leader. Each worker keeps the next tick of each of its schedules in
memory and touches the database only at start and when a tick is due. This
module holds every statement that writes ``JobSchedule`` rows; the locking:

* A schedule's row is made by the first worker to see it (``INSERT ... ON
  CONFLICT DO NOTHING``), with ``last_tick`` NULL: ticks before ``created_at``
  are never run.
* A worker takes due ticks with one conditional ``UPDATE ... SET last_tick = <new>
  WHERE name = %s AND last_tick = <the value it read>`` in the transaction that
  also inserts their runs. Two workers racing: the second UPDATE waits for the
  first's row lock; once the first commits, PostgreSQL re-checks the WHERE on
  the new row version (READ COMMITTED) and updates nothing, so the second
  starts nothing. If the first rolls back, the second proceeds. Nothing else
  locks the row, and the transaction holds the lock only while it inserts the runs.
* A changed cron expression or time zone moves ``last_tick`` forward to the
  syncing worker's now, as ``GREATEST(last_tick, created_at, now)`` in one
  UPDATE: never back past ticks another worker handled meanwhile.
* Each run carries the idempotency key ``schedule:<name>:<UTC instant>``,
  unique per job type (``django_jobs_run_idempotency``): even a row reset by
  hand cannot start a second run for an instant whose run is still stored.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.models import Value
from django.db.models.functions import Greatest
from django.utils import timezone

from . import conf
from .api import start_handler
from .models import JobRun, JobSchedule
from .registry import all_handlers, get_handler
from .schedules import Entry, entries, idempotency_key, plan
from .storage.connections import discard_broken_connections
from .storage.control import ControlConnection

logger = logging.getLogger(__name__)

MAX_SLEEP = 60.0  # seconds; the clock is read again at least this often
ERROR_RETRY = timedelta(seconds=30)  # a schedule whose firing failed is tried again after this


@dataclass(frozen=True)
class Fired:
    """What one firing did: the runs it started and the schedule's next tick."""

    runs: list[JobRun]
    next_tick: datetime


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


def sync(items: Sequence[Entry], now: datetime) -> dict[str, datetime]:
    """Make the rows of schedules seen for the first time; return each schedule's next tick.

    Each schedule is synced on its own: one that fails is logged and given a
    retry time instead of a tick, and the others still run. A database error
    ends the whole pass.
    """
    due = {}
    for entry in items:
        try:
            due[entry.name] = _sync(entry, now)
        except DatabaseError:
            raise
        except Exception:
            logger.exception("schedule=%s could not be synced; retrying later", entry.name)
            due[entry.name] = now + ERROR_RETRY
    return due


def _sync(entry: Entry, now: datetime) -> datetime:
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
    row = table.values("last_tick", "created_at", *definition).get(name=entry.name)
    after = row["last_tick"] or row["created_at"]
    if {key: row[key] for key in definition} == definition:
        return entry.schedule.next_after(after)
    # The declaration changed since a worker last wrote it: show the new one.
    changes: dict[str, Any] = {}
    if (row["cron"], row["timezone"]) != (definition["cron"], definition["timezone"]):
        # The new expression's ticks before now were never due: counting them
        # as missed would start them all under catch_up. GREATEST, so a tick
        # another worker has handled meanwhile is not handled again.
        after = max(after, now)
        changes["last_tick"] = Greatest("last_tick", "created_at", Value(now))
    due = entry.schedule.next_after(after)
    table.filter(name=entry.name).update(next_tick=due, updated_at=now, **changes, **definition)
    return due


def fire(entry: Entry, now: datetime) -> Fired:
    """Start the runs of ``entry``'s ticks due at ``now``, unless another worker did.

    One short transaction: read the row, take the ticks with the conditional
    UPDATE, insert their runs (see the module docstring).
    """
    using = _using()
    handler = get_handler(entry.job_type)
    schedule = entry.schedule
    table = JobSchedule.objects.using(using)
    with transaction.atomic(using=using):
        row = table.filter(name=entry.name).values("last_tick", "created_at").first()
        if row is None:  # deleted since this worker started: seen for the first time again
            return Fired([], sync([entry], now)[entry.name])
        previous = row["last_tick"]
        decided = plan(schedule, previous or row["created_at"], now)
        if decided.latest is None:
            # Taken by another worker since this one last looked.
            return Fired([], schedule.next_after(previous or row["created_at"]))
        next_tick = schedule.next_after(decided.latest)
        won = table.filter(
            name=entry.name,
            **({"last_tick__isnull": True} if previous is None else {"last_tick": previous}),
        ).update(
            last_tick=decided.latest, next_tick=next_tick, updated_at=now, **_definition(entry)
        )
        if not won:
            # Another worker took these ticks and committed; this statement's
            # snapshot sees where it left the schedule.
            current = table.filter(name=entry.name).values("last_tick", "created_at").first()
            if current is None:
                return Fired([], next_tick)
            return Fired([], schedule.next_after(current["last_tick"] or current["created_at"]))
        runs = [
            start_handler(
                handler,
                schedule.input,
                trigger=("schedule", entry.name),
                run_at=tick,
                idempotency_key=idempotency_key(entry.name, tick),
            )
            for tick in decided.run
        ]
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


def run_schedules(now: datetime | None = None, *, pools: list[str] | None = None) -> list[JobRun]:
    """Start the runs of every schedule (of jobs in ``pools``, or all) due at ``now``.

    What a worker's scheduler does, once, in this process; for tests (with an
    injected ``now``) and for running schedules without a worker. A schedule
    seen for the first time starts nothing for the past.
    """
    now = timezone.now() if now is None else now
    items = entries(all_handlers(), pools)
    if not items:
        return []
    due = sync(items, now)
    runs: list[JobRun] = []
    for entry in items:
        if due[entry.name] <= now:
            runs.extend(fire(entry, now).runs)
    return runs


class Scheduler:
    """A worker's scheduler thread: fires its pools' schedules as their ticks come due.

    Errors are logged and retried; nothing here ends the worker.
    """

    def __init__(
        self,
        pools: Sequence[str] | None,
        stop: threading.Event,
        *,
        clock: Callable[[], datetime] = timezone.now,
        control: ControlConnection | None = None,
    ) -> None:
        self.entries = entries(all_handlers(), None if pools is None else list(pools))
        self.stop = stop
        self.clock = clock
        self.due: dict[str, datetime] | None = None  # next tick by schedule; None: not synced
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
        """Sync (the first time) and fire what is due; return seconds until the next tick."""
        now = self.clock()
        try:
            if self.due is None:
                self.due = sync(self.entries, now)
            for entry in self.entries:
                if self.due[entry.name] <= now:
                    self.due[entry.name] = self._fire(entry, now)
        except DatabaseError as exc:
            self.failures += 1
            pause = min(0.5 * 2.0**self.failures, MAX_SLEEP)
            logger.warning("scheduler database error (%s); retrying in %.1fs", exc, pause)
            discard_broken_connections()
            return pause
        self.failures = 0
        wait = (min(self.due.values()) - self.clock()).total_seconds()
        return min(max(wait, 0.0), MAX_SLEEP)

    def _fire(self, entry: Entry, now: datetime) -> datetime:
        try:
            return fire(entry, now).next_tick
        except DatabaseError:
            raise  # the whole pass waits and retries
        except Exception:
            # A bad input, a handler no longer registered: this schedule only.
            logger.exception("schedule=%s could not start its run; retrying later", entry.name)
            return now + ERROR_RETRY
