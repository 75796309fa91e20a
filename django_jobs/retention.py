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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now

from . import conf, ratelimits
from .models import FINISHED_STATUSES, JobEvent, JobRun, JobStep
from .registry import all_handlers
from .storage import ratelimits as limit_rows
from .storage import vendors


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
    unfinished = set(statuses) - set(FINISHED_STATUSES)
    if unfinished:
        raise ValueError(f"only finished runs can be pruned, not {sorted(unfinished)}")
    cutoff = ExpressionWrapper(Now() - Value(older_than), output_field=DateTimeField())
    runs = JobRun.objects.using(conf.get().DATABASE)
    roots = runs.filter(parent__isnull=True, status__in=statuses, finished_at__lt=cutoff)
    result = Pruned()
    cursor = 0
    while True:
        with transaction.atomic(using=conf.get().DATABASE):
            batch = list(
                roots.filter(pk__gt=cursor).order_by("pk").values_list("pk", flat=True)[:batch_size]
            )
            if not batch:
                break
            cursor = batch[-1]
            result.batches += 1
            _prune_batch(roots, runs, batch, result, dry_run)
    result.rate_limits = prune_rate_limits(batch_size=batch_size, dry_run=dry_run)
    return result


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
