"""Runs held while their rate limit's window is full, out of the claim's way.

A due run under a job's limit (or a key's) whose window is full cannot start
before the window opens. Left in the claim's index, every claim would read past
it: a backlog of 100,000 runs of a job under ``"1/m"`` made every other run of
the pool five to ten times slower to claim. So such a run is held
(``hold = "rate"``, ``django_jobs_run_rate_held``):

* ``start()`` inserts a run held when its window is full at that moment;
* the claim's admission holds the runs it refused for a full window
  (``ratelimits.admit``, in the claim's transaction, the rows locked);
* ``hold_full()`` (the worker, every heartbeat interval, while one of its
  limits' windows is full) holds the other ready due runs under it: those that
  were ready when their window filled;
* ``release_open()`` (the worker, every tick) makes ready, for each window that
  was full and has opened since, as many of its held runs as it allows in a
  tick (first by priority, turn and age); the claim admits them, and holds
  those it finds no room for again. A window found open with none held is
  noted (in the process) and not looked at again until it is full again;
* ``release_stranded()`` (the worker, every heartbeat interval) releases the
  held runs whose limit is gone from the code (or whose window row is), and
  ``release_all()`` (``testing.drain``, which enforces no limit) all of them.

Holding is a hint, never the rule: the admission still decides under the
limit's row lock, so a run released early is refused and held again, and a run
is never started beyond its limit. A limit of a pool (``RATE_LIMITS``) is not
held this way: every run of the pool is under it, so a claim for that pool
reads none of its runs while its window is full (``ratelimits.pool_open``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import DateTimeField, ExpressionWrapper, Q, Value
from django.db.models.functions import Now

from ..models import Hold, RateLimitScope, Status
from ..ratelimits import Limits, Rate
from . import ratelimits as limited
from . import runs, using

logger = logging.getLogger(__name__)

# Runs held per pass, and per statement.
_HELD_PER_PASS = 5000
_BATCH = 1000
# Opened windows looked at per pass.
_WINDOWS = 200


def full_now(
    rate: Rate, job_type: str, rate_keys: Sequence[str | None], *, keyed: bool
) -> set[str | None]:
    """Of the new runs of ``job_type`` under ``rate`` (by their ``rate_keys``), the keys
    whose window is full now (``None`` standing for the job's own limit): those
    runs start held."""
    if keyed:
        names = sorted({key for key in rate_keys if key is not None})
        scope = RateLimitScope.KEY
    else:
        names, scope = [job_type], RateLimitScope.JOB
    if not names:
        return set()
    full = limited.limit_rows().filter(
        scope=scope, name__in=names, open_at__gt=Now(), limit=rate.count, period=rate.seconds
    )
    found = set(full.values_list("name", flat=True))
    return found if keyed else ({None} if found else set())


def hold_full(limits: Limits, pools: Sequence[str] | None) -> int:
    """Hold the ready due runs of ``pools`` under a job's or a key's limit whose window
    is full now, up to a pass's worth; how many."""
    if not limits.jobs or not _any_full(limits):
        return 0
    held = 0
    due = runs().due(pools).filter(limited.under_full_window(limits))
    while held < _HELD_PER_PASS:
        ids = list(due.order_by().values_list("id", flat=True)[:_BATCH])
        if not ids:
            break
        found = _hold(ids)
        held += found
        if not found:
            break  # all taken by claims meanwhile: the next pass looks again
    if held:
        logger.info("held runs whose rate limit's window is full held=%d", held)
    return held


def _any_full(limits: Limits) -> bool:
    """Whether a window of a job's limit or of a key's is full now (one short query)."""
    full = limited.limit_rows().filter(open_at__gt=Now())
    wanted = Q(scope=RateLimitScope.JOB, name__in=sorted(set(limits.jobs) - limits.keyed))
    if limits.keyed:
        wanted |= Q(scope=RateLimitScope.KEY)
    return bool(full.filter(wanted).exists())


def _hold(ids: list[int]) -> int:
    with transaction.atomic(using=using()):
        # Locked by primary key alone, checked under the lock (see claiming._locked).
        rows = list(
            runs()
            .filter(pk__in=ids)
            .order_by()
            .select_for_update(skip_locked=True)
            .values_list("id", "status", "hold")
        )
        ready = [run_id for run_id, status, hold in rows if (status, hold) == (Status.PENDING, "")]
        if ready:
            runs().filter(pk__in=ready).update(hold=Hold.RATE)
    return len(ready)


def release_open(limits: Limits, tick: float) -> int:
    """Release, for each window that was full and has opened in the last minute, as many
    held runs as it allows in ``tick`` seconds; how many. (An older one is the
    sweep's, ``release_stranded``.)"""
    since = ExpressionWrapper(Now() - Value(_OPENED_WITHIN), output_field=DateTimeField())
    opened = limited.limit_rows().filter(
        scope__in=[RateLimitScope.JOB, RateLimitScope.KEY], open_at__lte=Now(), open_at__gt=since
    )
    rows = list(
        opened.order_by("-open_at").values_list("pk", "scope", "name", "open_at")[:_WINDOWS]
    )
    seen = {pk: at for pk, _, _, at in rows}
    for pk in [pk for pk in _emptied if seen.get(pk) != _emptied[pk]]:
        del _emptied[pk]  # closed again, or out of sight: forgotten
    released = 0
    for pk, scope, name, open_at in rows:
        if _emptied.get(pk) == open_at:
            continue
        rate = _rate_of(scope, name, limits)
        count = _BATCH if rate is None else _per_tick(rate, tick)
        found = _release(_held_of(scope, name, limits), count)
        if not found:
            # Nothing held for it: not looked at again until it is full again. Noted
            # here, not written: a write to the limit's row would wait for claims.
            _emptied[pk] = open_at
        released += found
    return released


# The windows that opened with nothing held for them, by limit row: their open_at.
_emptied: dict[int, Any] = {}
# How long after it opened a window is looked at by every pass.
_OPENED_WITHIN = timedelta(minutes=1)


def _per_tick(rate: Rate, tick: float) -> int:
    """The runs a window of ``rate`` lets start in ``tick`` seconds (at least its count)."""
    return min(_BATCH, rate.count * max(1, math.ceil(tick / rate.seconds)))


def _rate_of(scope: str, name: str, limits: Limits) -> Rate | None:
    if scope == RateLimitScope.JOB:
        return limits.jobs.get(name)
    rates = [limits.jobs[job_type] for job_type in limits.keyed]
    return min(rates, key=lambda rate: rate.count / rate.seconds) if rates else None


def _held_of(scope: str, name: str, limits: Limits) -> Any:
    """The runs held for the window of the limit ``(scope, name)``."""
    held = runs().filter(status=Status.PENDING, hold=Hold.RATE)
    if scope == RateLimitScope.JOB:
        return held.filter(job_type=name)
    return held.filter(job_type__in=sorted(limits.keyed), rate_key=name)


def _release(held: Any, count: int) -> int:
    """Make ready the first ``count`` runs of ``held`` (priority, turn, age)."""
    ids = list(
        held.order_by("-priority", "turn", "run_at", "id").values_list("id", flat=True)[:count]
    )
    if not ids:
        return 0
    with transaction.atomic(using=using()):
        # Locked by primary key alone, checked under the lock (see claiming._locked):
        # a condition on the hold could lock, on InnoDB, entries of the held runs'
        # index that claims hold. A row another transaction holds is left held.
        rows = (
            runs()
            .filter(pk__in=ids)
            .order_by()
            .select_for_update(skip_locked=True)
            .values_list("id", "status", "hold")
        )
        found = [
            run_id for run_id, status, hold in rows if (status, hold) == (Status.PENDING, Hold.RATE)
        ]
        if found:
            runs().filter(pk__in=found).update(hold=Hold.READY)
    return len(found)


def release_stranded(limits: Limits, job_types: Iterable[str], tick: float) -> int:
    """Release the held runs of ``job_types`` (those this process knows) whose limit is
    no longer in force, or whose window has no row or is not full under the rate in
    force (a limit raised: a worker's first sweep, as it starts); how many."""
    known = sorted(set(job_types))
    held = runs().filter(status=Status.PENDING, hold=Hold.RATE, job_type__in=known)
    groups = list(held.order_by().values_list("job_type", "rate_key").distinct()[:_BATCH])
    released = 0
    for job_type, rate_key in groups:
        group = held.filter(job_type=job_type, rate_key=rate_key)
        rate = limits.jobs.get(job_type)
        if rate is None or (job_type in limits.keyed and rate_key is None):
            released += _release(group, _BATCH)  # no limit any longer: all of them
            continue
        scope, name = (
            (RateLimitScope.KEY, rate_key)
            if job_type in limits.keyed
            else (RateLimitScope.JOB, job_type)
        )
        # Full under the rate in force (a window closed under another rate, raised
        # since, opens at once).
        row = limited.limit_rows().filter(
            scope=scope, name=name, limit=rate.count, period=rate.seconds, open_at__gt=Now()
        )
        if not row.exists():
            released += _release(group, _per_tick(rate, tick))
    if released:
        logger.info("released runs held for a rate limit's window released=%d", released)
    return released


def release_all(pools: Sequence[str] | None) -> int:
    """Make ready every run of ``pools`` held for a rate limit (a drain that enforces
    none); how many."""
    held = runs().filter(status=Status.PENDING, hold=Hold.RATE)
    if pools is not None:
        held = held.filter(pool__in=pools)
    released = 0
    while found := _release(held, _BATCH):
        released += found
    return released
