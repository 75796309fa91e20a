"""The scheduler: one run per tick of every schedule, with every worker scheduling at once.

There is no leader. Each worker keeps the next tick of each of its schedules in
memory, and touches the database at start, when a tick is due, and every
``RELOAD_INTERVAL`` seconds to see which schedules were added, changed, paused,
resumed or deleted (one narrow query: every row's name, source, revision and
incarnation).
The statements it reads and writes rows with, and their locking, are in
``schedule_rows``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connections
from django.utils import timezone

from . import conf
from .models import JobRun, JobSchedule, ScheduleSource
from .schedule_rows import ERROR_RETRY, LISTED, Fired, fire, read_rows, sync
from .schedule_targets import code_entries, runtime_entry
from .schedules import Entry
from .storage.connections import discard_broken_connections
from .storage.control import ControlConnection

__all__ = ["ERROR_RETRY", "RELOAD_INTERVAL", "Fired", "Scheduler", "fire", "run_schedules", "sync"]

logger = logging.getLogger(__name__)

MAX_SLEEP = 60.0  # seconds; the clock is read again at least this often
# Seconds between two reads of which schedules changed: how long a worker may
# take to see a schedule added, changed, paused, resumed or deleted.
RELOAD_INTERVAL = 5.0
RELOAD_BATCH = 500  # rows read at once when many changed
LISTED_NAMES = 20  # schedule names the start line lists; the others are counted


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
        # The schedules declared in code; run-time ones are logged as they are read.
        logger.info("scheduler started schedules=%s", listed(e.name for e in self.entries))
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


def listed(names: Iterable[str]) -> str:
    """Names for a log line: ``a,b``; ``none``; past ``LISTED_NAMES``, the first
    ones and how many more (``a,b,...,+980``)."""
    found = sorted(names)
    if not found:
        return "none"
    shown = ",".join(found[:LISTED_NAMES])
    more = len(found) - LISTED_NAMES
    return shown if more <= 0 else f"{shown},...,+{more}"


def _using() -> str:
    return conf.get().DATABASE


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
