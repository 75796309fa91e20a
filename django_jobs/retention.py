"""Deleting finished runs and their steps (and events) in batches (``manage.py prunejobs``).

A run goes with its whole family: a top-level run (no parent) that finished
before the cutoff is deleted together with its descendants and every step of
them, and only if none of them is still unfinished. So a run whose children
are still open stays, and no child is ever left pointing at a deleted parent.

Each batch is its own short transaction. The roots are locked first, then
their descendants (the ancestors-first order of ``lifecycle``), and their
statuses are checked again under those locks: a run that ``retry()`` put back
to pending meanwhile is kept. Roots another transaction holds are skipped,
for the next prune. The runs are walked by id from a cursor, so the whole
prune reads each row of the table once, however many batches it takes.

A prune also deletes the rows of rate limits that hold nothing any more
(``storage.ratelimits.prune_idle``): their callers choose the keys, so they
would otherwise only grow.

A worker prunes by itself (``Pruner``, on a thread of its own) when
``DJANGO_JOBS["RETENTION"]`` is set (30 days unless told): a bounded pass
every few minutes, at times of its own, each batch a short transaction on the
worker's control connection, so that its claims and heartbeats wait for one
batch at most (see docs/decisions.md).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now

from . import conf, ratelimits
from .models import FINISHED_STATUSES, JobEvent, JobRun, JobStep
from .registry import all_handlers
from .storage import ratelimits as limit_rows
from .storage import vendors
from .storage.connections import discard_broken_connections
from .storage.control import ControlConnection

logger = logging.getLogger(__name__)


@dataclass
class Pruned:
    runs: int = 0
    steps: int = 0
    kept_open: int = 0  # finished roots kept because a descendant is unfinished
    batches: int = 0
    rate_limits: int = 0  # rows of rate limits that held nothing any more


def prune(
    older_than: timedelta,
    *,
    statuses: Sequence[str] = tuple(FINISHED_STATUSES),
    batch_size: int = 1000,
    dry_run: bool = False,
) -> Pruned:
    """Delete runs (with their families and steps) that finished ``older_than`` ago,
    then the rows of rate limits that hold nothing any more.

    ``statuses`` selects the top-level runs by their own status (finished
    statuses only); their descendants go with them whatever theirs. With
    ``dry_run``, nothing is deleted or locked: the counts say what would go.
    """
    roots = old_roots(older_than, statuses)
    result = Pruned()
    cursor: int | None = 0
    while cursor is not None:
        cursor = prune_batch(roots, cursor, batch_size, result, dry_run=dry_run)
    result.rate_limits = prune_rate_limits(batch_size=batch_size, dry_run=dry_run)
    return result


def old_roots(older_than: timedelta, statuses: Sequence[str] = tuple(FINISHED_STATUSES)) -> Any:
    """The top-level runs that ended with one of ``statuses`` ``older_than`` ago (by
    the database's clock, read by each statement)."""
    unfinished = set(statuses) - set(FINISHED_STATUSES)
    if unfinished:
        raise ValueError(f"only finished runs can be pruned, not {sorted(unfinished)}")
    cutoff = ExpressionWrapper(Now() - Value(older_than), output_field=DateTimeField())
    runs = JobRun.objects.using(conf.get().DATABASE)
    return runs.filter(parent__isnull=True, status__in=statuses, finished_at__lt=cutoff)


def prune_batch(
    roots: Any, after: int, batch_size: int, result: Pruned, *, dry_run: bool = False
) -> int | None:
    """Delete, in one transaction, the families of the next ``batch_size`` of
    ``roots`` by id after ``after`` (added to ``result``); return the last id read,
    or None when no root was left after ``after``."""
    runs = JobRun.objects.using(roots.db)
    with transaction.atomic(using=roots.db):
        batch = list(
            roots.filter(pk__gt=after).order_by("pk").values_list("pk", flat=True)[:batch_size]
        )
        if not batch:
            return None
        result.batches += 1
        _prune_batch(roots, runs, batch, result, dry_run)
    last: int = batch[-1]
    return last


def prune_rate_limits(*, batch_size: int = 1000, dry_run: bool = False) -> int:
    """Delete the rows of rate limits that hold nothing any more, judged under the
    limits this code declares (every registered job's, and ``RATE_LIMITS``); return
    how many went (would go, with ``dry_run``)."""
    limits = ratelimits.in_force(all_handlers(tasks=True))
    return limit_rows.prune_idle(limits, batch_size=batch_size, dry_run=dry_run)


def _prune_batch(roots: Any, runs: Any, batch: list[int], result: Pruned, dry_run: bool) -> None:
    if not dry_run:
        # Checked again under the lock; roots held elsewhere wait for the next prune.
        batch = list(
            roots.filter(pk__in=batch)
            .select_for_update(skip_locked=True)
            .values_list("pk", flat=True)
        )
    family = runs.filter(root_id__in=batch).order_by("pk")
    if not dry_run:
        family = family.select_for_update()
    members = list(family.values_list("pk", "root_id", "status"))
    open_roots = {root for _, root, status in members if status not in FINISHED_STATUSES}
    doomed = [pk for pk in batch if pk not in open_roots]
    doomed += [pk for pk, root, _ in members if root not in open_roots]
    result.kept_open += len(open_roots)
    if not doomed:
        return
    if dry_run:
        result.runs += len(doomed)
        result.steps += JobStep.objects.using(runs.db).filter(run_id__in=doomed).count()
        return
    result.steps += _delete(JobStep._meta.db_table, "run_id", doomed)
    # Their events, kept or taken, go with them (counted with neither).
    _delete(JobEvent._meta.db_table, "run_id", doomed)
    result.runs += _delete(JobRun._meta.db_table, "id", doomed)


def _delete(table: str, column: str, ids: list[int]) -> int:
    """One ``DELETE`` without loading rows (Django's delete() would collect them first).

    The foreign keys between the runs being deleted are checked at commit where
    the database can defer them (PostgreSQL), else row by row in an order that
    removes children first (the vendor's ``delete``).
    """
    connection = connections[conf.get().DATABASE]
    return vendors.of(connection).delete(connection, table, column, ids)


# --- a worker's retention ---------------------------------------------------------------

# Seconds between a worker's passes, on average: each waits from half to one and a
# half times this, at random, so that a fleet started at once does not prune at
# once (docs/decisions.md). Read at each wait; the test suite shortens it.
INTERVAL = 300.0
# What one pass does at most: so many batches of so many top-level runs, each batch
# one transaction on the control connection (claims and heartbeats wait for one
# batch at most, and for none between two).
BATCH_SIZE = 100
PASS_BATCHES = 10
# Seconds to the next pass, on average, after a pass that used its whole budget
# (a backlog: the first pass after retention was turned on, a burst that aged).
CATCH_UP = 5.0


class Pruner:
    """A worker's retention thread: deletes the runs that finished ``older_than``
    seconds ago (with their families, as ``prune`` does), a bounded pass at a time.

    The walk by id goes on across passes from where the last one stopped, and
    starts again from the first id once it reaches the last: finished runs kept
    (an unfinished member, a lock) are passed over, never read again and again.
    Errors are logged and the next pass tries again; nothing here ends the worker.
    """

    def __init__(
        self,
        older_than: float,
        stop: threading.Event,
        *,
        control: ControlConnection | None = None,
        worker: object = None,
    ) -> None:
        self.older_than = timedelta(seconds=older_than)
        self.stop = stop
        # A worker's shared control connection, taken for each batch; without one,
        # the thread has a connection of its own.
        self.control = control
        self.worker = worker  # its id, for the log
        self.cursor = 0  # the last top-level run's id the walk read

    def run(self) -> None:
        """Prune, a pass at a time, until ``stop`` is set (the thread's target)."""
        if self.control is not None:
            self.control.adopt()
        try:
            more = False
            while not self.stop.wait(self.pause(more)):
                try:
                    more = self.step()
                except Exception:
                    logger.exception("worker=%s retention failed", self.worker)
                    more = False
        finally:
            if self.control is not None:
                self.control.leave()
            else:
                connections.close_all()

    @staticmethod
    def pause(more: bool) -> float:
        """Seconds to the next pass: about ``INTERVAL``, or ``CATCH_UP`` after a pass
        that left more to do, at random from half to one and a half times that."""
        mean = min(CATCH_UP, INTERVAL) if more else INTERVAL
        return mean * (0.5 + random.random())

    def step(self) -> bool:
        """One pass: up to ``PASS_BATCHES`` batches; whether it stopped for its budget
        before the walk's end (more may be due now).

        After each batch it pauses as long as the batch took: the threads that
        waited for the control connection meanwhile (a claim, a heartbeat) take
        it first, as a lock hands itself to no one in turn, and the pass keeps
        the database busy half the time at most.
        """
        result = Pruned()
        roots = old_roots(self.older_than)
        took = 0.0
        try:
            for _ in range(PASS_BATCHES):
                if self.stop.wait(took):
                    return False
                began = time.monotonic()
                after = self._batch(roots, result)
                took = time.monotonic() - began
                if after is None:
                    self.cursor = 0  # the walk's end: the next pass starts again
                    return False
                self.cursor = after
            return True
        except DatabaseError as exc:
            logger.warning("worker=%s retention database error: %s", self.worker, exc)
            return False
        finally:
            self._log(result)

    def _batch(self, roots: Any, result: Pruned) -> int | None:
        with self.control or nullcontext():
            try:
                return prune_batch(roots, self.cursor, BATCH_SIZE, result)
            except DatabaseError:
                discard_broken_connections()
                raise

    def _log(self, result: Pruned) -> None:
        if result.runs:
            logger.info(
                "worker=%s retention deleted runs=%d steps=%d kept_open=%d older_than=%s",
                self.worker,
                result.runs,
                result.steps,
                result.kept_open,
                describe_age(self.older_than.total_seconds()),
            )


def describe_age(seconds: float | None) -> str:
    """A retention as the log writes it: ``30d``, ``12h``, ``90s``; ``off`` for None."""
    if seconds is None:
        return "off"
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
