"""What the queue looks like now, per pool: read by ``jobstatus`` and the admin's pools page.

Every query is served by a partial index (pending, running and waiting runs,
runs finished recently), so a snapshot costs the same with a year of history
as with a day of it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import (
    Count,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    Min,
    TextField,
    Value,
)
from django.db.models.functions import Cast, Left, Now
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from . import conf, ratelimits
from .models import (
    FINISHED_STATUSES,
    UNFINISHED_STATUSES,
    Hold,
    JobPool,
    JobRun,
    Status,
    Worker,
    WorkerStatus,
)
from .payloads import Unreadable, cut, finite, printable, read_json
from .pools import MAX_PAUSE_REASON, declared_pools
from .registry import all_handlers
from .storage import ratelimits as limited_runs

logger = logging.getLogger(__name__)

PROGRESS_LIMIT = 50
# The most characters of a run's progress, or of a worker's pools, read from a
# row: set_progress() writes a few hundred; past this a value is marked
# unreadable, never loaded whole.
PROGRESS_TEXT = 10_000
POOLS_TEXT = 100_000


@dataclass
class PoolStatus:
    """One pool: runs by status (unfinished now, finished within the window), lag, workers."""

    name: str
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(UNFINISHED_STATUSES + FINISHED_STATUSES, 0)
    )
    # Age of the oldest pending run that is due: how far behind the pool is.
    oldest_pending: timedelta | None = None
    workers: int = 0
    paused_at: datetime | None = None
    pause_reason: str = ""
    # Due pending runs that a spent rate limit holds back until its window allows.
    rate_limited: int = 0
    # Pending runs held until their concurrency key is free (JobRun.hold).
    held_for_key: int = 0
    # Pending runs held until their tenant is under its cap in the pool.
    held_for_tenant: int = 0
    # Pending runs held until their rate limit's window opens (counted in
    # rate_limited too).
    held_for_rate: int = 0
    # Waiting runs that wait for an event (ctx.wait_for_event; counted in "waiting").
    waiting_for_event: int = 0
    # The pool's own rate limit (DJANGO_JOBS["RATE_LIMITS"]), as written: "100/m".
    rate_limit: str | None = None

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    def finished(self) -> int:
        return sum(self.counts[status] for status in FINISHED_STATUSES)


@dataclass(frozen=True)
class WorkerState:
    id: str
    name: str
    pools: list[str]
    concurrency: int
    status: str
    heartbeat_age: timedelta
    # Silent for longer than STALE_THRESHOLD: its runs are about to be rescued.
    stale: bool
    # Why its row's pools could not be read (it then counts for no pool), or None.
    pools_unreadable: str | None = None


@dataclass(frozen=True)
class RunProgress:
    run_id: int
    job_type: str
    pool: str
    attempt: int
    running_for: timedelta | None
    done: float
    total: float | None
    message: str
    updated: datetime | None
    # Why the stored progress could not be read (it then shows as this mark), or None.
    unreadable: str | None = None

    @property
    def percent(self) -> float | None:
        if not self.total or self.total < 0:
            return None
        return min(100.0, 100.0 * self.done / self.total)


@dataclass
class Snapshot:
    taken_at: datetime
    window: timedelta
    pools: list[PoolStatus]
    workers: list[WorkerState]
    progress: list[RunProgress]

    def runs_per_minute(self, pool: PoolStatus) -> float:
        """Runs of ``pool`` that finished within the window, per minute."""
        return pool.finished() / (self.window.total_seconds() / 60)

    def as_json(self) -> dict[str, Any]:
        """The snapshot as plain JSON types (``jobstatus --json``); durations in seconds."""
        return {
            "taken_at": self.taken_at.isoformat(),
            "window_seconds": self.window.total_seconds(),
            "pools": [
                {
                    "pool": pool.name,
                    "paused": pool.paused,
                    "paused_at": pool.paused_at.isoformat() if pool.paused_at else None,
                    "pause_reason": pool.pause_reason,
                    "counts": pool.counts,
                    "oldest_pending_seconds": _seconds(pool.oldest_pending),
                    "runs_per_minute": round(self.runs_per_minute(pool), 3),
                    "workers": pool.workers,
                    "rate_limited": pool.rate_limited,
                    "held_for_key": pool.held_for_key,
                    "held_for_tenant": pool.held_for_tenant,
                    "held_for_rate": pool.held_for_rate,
                    "waiting_for_event": pool.waiting_for_event,
                    "rate_limit": pool.rate_limit,
                }
                for pool in self.pools
            ],
            "workers": [
                {
                    "id": worker.id,
                    "name": worker.name,
                    "pools": worker.pools,
                    "concurrency": worker.concurrency,
                    "status": worker.status,
                    "heartbeat_age_seconds": _seconds(worker.heartbeat_age),
                    "stale": worker.stale,
                    "pools_unreadable": worker.pools_unreadable,
                }
                for worker in self.workers
            ],
            "progress": [
                {
                    "run_id": run.run_id,
                    "job_type": run.job_type,
                    "pool": run.pool,
                    "attempt": run.attempt,
                    "running_seconds": _seconds(run.running_for),
                    "done": run.done,
                    "total": run.total,
                    "message": run.message,
                    "updated_at": run.updated.isoformat() if run.updated else None,
                    "unreadable": run.unreadable,
                }
                for run in self.progress
            ],
        }


def age(value: timedelta | None) -> str:
    """A short age: ``4s``, ``12m``, ``3h``, ``2d``; ``-`` for none."""
    if value is None:
        return "-"
    seconds = value.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else round(value.total_seconds(), 3)


def snapshot(
    *,
    window: timedelta = timedelta(minutes=5),
    pools: list[str] | None = None,
    with_progress: bool = True,
) -> Snapshot:
    """Read the queue's state now; ``pools`` limits it to those pools.

    ``with_progress=False`` leaves out the running runs' progress, for readers
    that do not show it (the pools page, the metrics).

    Ages (lag, heartbeats, running time) are measured on the database's clock,
    the one workers write with, so a reading host whose clock is off sees the
    same numbers.
    """
    if window.total_seconds() <= 0:
        raise ValueError(f"window must be positive, got {window!r}")
    found: dict[str, PoolStatus] = {}

    def pool(name: str) -> PoolStatus:
        return found.setdefault(name, PoolStatus(name))

    runs = JobRun.objects.using(conf.get().DATABASE).order_by()
    if pools is not None:
        runs = runs.filter(pool__in=pools)
    # One query per status, so that each is served by that status's partial index.
    for status in UNFINISHED_STATUSES:
        for row in runs.filter(status=status).values("pool").annotate(n=Count("id")):
            pool(row["pool"]).counts[status] = row["n"]
    # Through django_jobs_run_keyed: held runs all have a key.
    held = runs.filter(status=Status.PENDING, concurrency_key__isnull=False, hold=Hold.KEY)
    for row in held.values("pool").annotate(n=Count("id")):
        pool(row["pool"]).held_for_key = row["n"]
    # Through django_jobs_run_tenanted: runs held for a cap all have a tenant.
    held = runs.filter(status=Status.PENDING, tenant_id__isnull=False, hold=Hold.TENANT)
    for row in held.values("pool").annotate(n=Count("id")):
        pool(row["pool"]).held_for_tenant = row["n"]
    # Through django_jobs_run_rate_held.
    held = runs.filter(status=Status.PENDING, hold=Hold.RATE)
    for row in held.values("pool").annotate(n=Count("id")):
        pool(row["pool"]).held_for_rate = row["n"]
    # Through django_jobs_run_waiting (the waiting runs alone).
    events = runs.filter(status=Status.WAITING, awaiting_event__isnull=False)
    for row in events.values("pool").annotate(n=Count("id")):
        pool(row["pool"]).waiting_for_event = row["n"]
    due = runs.filter(status=Status.PENDING, run_at__lte=Now()).values("pool")
    for oldest in due.annotate(lag=_since(Min("run_at"))):
        pool(oldest["pool"]).oldest_pending = max(oldest["lag"], timedelta(0))
    since = ExpressionWrapper(Now() - Value(window), output_field=DateTimeField())
    recent = runs.filter(finished_at__gte=since).values("pool", "status")
    for finished in recent.annotate(n=Count("id")):
        pool(finished["pool"]).counts[finished["status"]] = finished["n"]
    workers = _workers(pools)
    for worker in workers:
        if not worker.stale:
            for name in worker.pools:
                if pools is None or name in pools:
                    pool(name).workers += 1
    _add_pool_rows(pool, pools, found)
    _add_rate_limits(pool, pools)
    return Snapshot(
        taken_at=timezone.now(),
        window=window,
        pools=[found[name] for name in sorted(found)],
        workers=workers,
        progress=_progress(runs) if with_progress else [],
    )


def _since(moment: Any) -> ExpressionWrapper[Any]:
    """The time from ``moment`` (an expression) to the database's now."""
    return ExpressionWrapper(Now() - moment, output_field=DurationField())


def _add_pool_rows(pool: Any, pools: list[str] | None, found: dict[str, PoolStatus]) -> None:
    """Pools known from their rows appear even when idle: paused ones, and those a
    worker served that this code base declares (``pools.declared_pools``).

    A worker records every pool it serves, a mistyped ``--pool`` too: once that
    worker is gone and the pool has no runs to count, its row alone does not
    keep it listed.
    """
    rows = JobPool.objects.using(conf.get().DATABASE)
    if pools is not None:
        rows = rows.filter(name__in=pools)
    declared = declared_pools()
    # A reason is at most MAX_PAUSE_REASON characters when written through
    # pause_pool(); a row written otherwise is read, and shown, cut.
    reasons = rows.values_list("name", "paused_at", Left("pause_reason", MAX_PAUSE_REASON + 1))
    for name, paused_at, reason in reasons:
        if paused_at is None and name not in declared and name not in found:
            continue
        status = pool(name)
        status.paused_at = paused_at
        status.pause_reason = cut(reason or "", MAX_PAUSE_REASON)


def _add_rate_limits(pool: Any, pools: list[str] | None) -> None:
    """The pools' own limits, and their runs held back by a spent limit (as this
    code base and its settings declare them)."""
    limits = ratelimits.in_force(all_handlers(tasks=True), pools)
    for name, rate in limits.pools.items():
        pool(name).rate_limit = str(rate)
    for name, held in limited_runs.waiting(limits, pools).items():
        pool(name).rate_limited = held


def _workers(pools: list[str] | None) -> list[WorkerState]:
    stale_after = timedelta(seconds=conf.get().STALE_THRESHOLD)
    live = (
        Worker.objects.using(conf.get().DATABASE)
        .filter(status__in=[WorkerStatus.RUNNING, WorkerStatus.STOPPING])
        .defer("pools")
        .annotate(heartbeat_age=_since(F("heartbeat_at")), pools_text=text_of("pools", POOLS_TEXT))
    )
    states = []
    for worker in live.order_by("hostname", "pid", "started_at"):
        served = pool_names(read_stored(worker.pools_text, f"worker={worker.pk} pools", POOLS_TEXT))
        names = served if isinstance(served, list) else []
        # One whose pools cannot be read is shown whatever the filter, marked.
        if pools is not None and names and not set(names) & set(pools):
            continue
        age = max(worker.heartbeat_age, timedelta(0))
        states.append(
            WorkerState(
                id=str(worker.pk),
                name=str(worker),
                pools=names,
                concurrency=worker.concurrency,
                status=worker.status,
                heartbeat_age=age,
                stale=age > stale_after,
                pools_unreadable=served.problem if isinstance(served, Unreadable) else None,
            )
        )
    return states


def pool_names(value: Any) -> list[str] | Unreadable:
    """The pools a worker row says it serves (``Worker.pools`` as read): its
    strings; an ``Unreadable`` as it is. ``[]`` means every pool."""
    if isinstance(value, Unreadable):
        return value
    if not isinstance(value, list):
        return Unreadable(f"a {type(value).__name__}, not a list") if value else []
    return [name for name in value if isinstance(name, str)]


def _progress(runs: Any) -> list[RunProgress]:
    """Running runs that reported progress, most recently started first."""
    rows = (
        runs.filter(status=Status.RUNNING, progress__isnull=False)
        .values("id", "job_type", "pool", "attempts", "started_at")
        .annotate(
            running_for=_since(F("started_at")), progress_text=text_of("progress", PROGRESS_TEXT)
        )
        .order_by("-started_at")[:PROGRESS_LIMIT]
    )
    found = []
    for row in rows:
        what = f"run={row['id']} progress"
        progress = read_stored(row["progress_text"], what, PROGRESS_TEXT)
        unreadable = progress.problem if isinstance(progress, Unreadable) else None
        if unreadable is None and not isinstance(progress, dict):
            unreadable = f"a {type(progress).__name__}, not an object"
        progress = progress if isinstance(progress, dict) else {}
        found.append(
            RunProgress(
                run_id=row["id"],
                job_type=row["job_type"],
                pool=row["pool"],
                attempt=row["attempts"],
                running_for=row["running_for"],
                done=finite(progress.get("done")) or 0.0,
                total=finite(progress.get("total")),
                message=printable(progress.get("message")),
                updated=_parsed(progress.get("at"), what),
                unreadable=unreadable,
            )
        )
    return found


def _parsed(value: Any, what: str) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return parse_datetime(value[:64])
    except ValueError:  # the shape of a date, not one: "2026-13-45T99:99:99"
        report_unreadable(what, f"its date {value[:64]!r} is not a date")
        return None


def text_of(column: str, limit: int) -> Any:
    """A JSON column as its text, at most ``limit + 1`` characters of it: Django
    would decode the whole value, and fail on one Python cannot hold."""
    return Left(Cast(column, TextField()), limit + 1)


# What was reported unreadable in this process, so that a row read at every
# refresh (jobstatus --watch, a scrape, a page) is logged once, not each time.
_reported: set[str] = set()
_reported_lock = threading.Lock()


def read_stored(text: Any, what: str, limit: int | None = None) -> Any:
    """A JSON column's value read from its text (``payloads.read_json``); an
    ``Unreadable`` in its place when it cannot be, reported once.

    ``what`` names the value in the log line: ``run=42 progress``.
    """
    value = read_json(text, limit=limit)
    if isinstance(value, Unreadable):
        report_unreadable(what, value.problem)
    return value


def report_unreadable(what: str, problem: str) -> None:
    """Log that the stored ``what`` cannot be shown, once per process."""
    with _reported_lock:
        fresh = what not in _reported
        if len(_reported) >= 10_000:
            _reported.clear()  # bounded: a flood of bad rows costs its memory once
        _reported.add(what)
    if fresh:
        logger.warning("%s is unreadable, shown marked: %s", what, problem)
