"""The admission of rate-limited runs at claim, and every statement on ``JobRateLimit`` rows.

Runs under a limit (``ratelimits.Limits``: their job type's, their key's, their
pool's) are picked with the others, in one priority order (``claimable``), and
admitted in a short transaction (where the claim is one statement, PostgreSQL,
it hands their ids over to a transaction of their own):

* The candidates are due runs, without those under a limit whose window is
  known to be full, for the rate in force: a limit row whose ``open_at`` is in
  the future hides its runs from the claim, as a busy concurrency key does, so
  no worker spins on a spent limit.
* The picked rows are locked by id, skipping locked ones (the two-statement
  claim's way), then the limit rows they need are made if missing and locked
  with a plain ``FOR UPDATE``, in (scope, name) order: claims of one limit wait
  for each other here, for the length of a few statements, and admit runs one
  claim at a time. The order means two claims can never wait on each other
  in a cycle. Retention (``prune_idle``) locks these rows too, skipping those
  a claim holds, and never waits.
* Under those locks the claim reads the database's clock, keeps each limit's
  starts within its window (``ratelimits.Window``), admits runs in claim order
  while every limit of a run has room, marks them running with that instant
  as ``started_at``, and stores each limit's starts, its rate and, when its
  window is full, ``open_at``: the instant the window next has room.

So at most ``count`` runs of a limit start in any span of its period, across
every worker, measured on ``started_at``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from django.db import connections
from django.db.models import Count, F, Min, Q
from django.db.models.functions import Now

from ..models import JobRateLimit, RateLimitScope, Status
from ..ratelimits import Limits, Rate, Window
from . import runs, using, vendors
from .leases import WorkerIds

# The instant (time.monotonic()) a limit's window this process saw full next
# opens; None when no claim of this process found one full.
_next_open: float | None = None


def limit_rows() -> Any:
    return JobRateLimit.objects.using(using())


def claimable(due: Any, limits: Limits) -> Any:
    """``due`` without the runs under a limit whose window is known to be full: what a
    claim picks from, limited runs and the others together, in one priority order."""
    return due.exclude(_held(limits))


def under_a_limit(limits: Limits) -> Q:
    """The runs under one of ``limits``: their claim goes through admission."""
    shared = sorted(set(limits.jobs) - limits.keyed)
    return (
        Q(job_type__in=shared)
        | Q(job_type__in=sorted(limits.keyed), rate_key__isnull=False)
        | Q(pool__in=sorted(limits.pools))
    )


def limited_runs(due: Any, limits: Limits) -> Any:
    """``due`` reduced to the runs under a limit."""
    return due.filter(Q(job_type__in=sorted(limits.jobs)) | Q(pool__in=sorted(limits.pools)))


def limited(due: Any, limits: Limits) -> Any:
    """``due`` reduced to runs under a limit whose window is not known to be full."""
    return limited_runs(due, limits).exclude(_held(limits))


def _held(limits: Limits) -> Q:
    """The runs one of whose limits is full now: its row's ``open_at`` is ahead, and
    was computed under the rate in force (a limit raised, or lowered, since is
    judged again at its next claim: ``open_at`` is the old rate's).

    Each test is ``name IN (the full limits' names)``, a subquery of its own that
    the server evaluates once per statement (a hash), not once per run: a claim
    reads past a held backlog at the cost of a lookup per run.
    """
    held = Q(pk__in=[])
    for rate, pools in _by_rate(limits.pools, limits.pools).items():
        held |= Q(pool__in=pools) & Q(pool__in=_full(rate, RateLimitScope.POOL))
    shared = set(limits.jobs) - limits.keyed
    for rate, types in _by_rate(limits.jobs, shared).items():
        held |= Q(job_type__in=types) & Q(job_type__in=_full(rate, RateLimitScope.JOB))
    for rate, types in _by_rate(limits.jobs, limits.keyed).items():
        held |= Q(job_type__in=types, rate_key__isnull=False) & Q(
            rate_key__in=_full(rate, RateLimitScope.KEY)
        )
    return held


def _full(rate: Rate, scope: str) -> Any:
    """The names of ``scope``'s limits full now under ``rate`` (a row stores the rate
    it was closed under)."""
    return (
        limit_rows()
        .filter(scope=scope, open_at__gt=Now(), limit=rate.count, period=rate.seconds)
        .values("name")
    )


def _by_rate(rates: Mapping[str, Rate], names: Iterable[str]) -> dict[Rate, list[str]]:
    """``names`` grouped by their rate in ``rates``, sorted (one statement text per set)."""
    grouped: dict[Rate, list[str]] = {}
    for name in sorted(names):
        grouped.setdefault(rates[name], []).append(name)
    return dict(sorted(grouped.items(), key=lambda item: (item[0].count, item[0].seconds)))


def limits_of(row: dict[str, Any], limits: Limits) -> list[tuple[str, str, Rate]]:
    """The limits a run is under, as (scope, name, rate)."""
    found = []
    pool_rate = limits.pools.get(row["pool"])
    if pool_rate is not None:
        found.append((RateLimitScope.POOL.value, row["pool"], pool_rate))
    job_rate = limits.jobs.get(row["job_type"])
    if job_rate is not None:
        if row["job_type"] not in limits.keyed:
            found.append((RateLimitScope.JOB.value, row["job_type"], job_rate))
        elif row["rate_key"] is not None:
            found.append((RateLimitScope.KEY.value, row["rate_key"], job_rate))
    return found


def admit(
    rows: list[dict[str, Any]], limit: int, limits: Limits, worker_id: uuid.UUID, token: uuid.UUID
) -> list[dict[str, Any]]:
    """Admit up to ``limit`` of ``rows`` (locked, pending, in claim order) while their
    limits have room, and mark them running; return them. In the claim's
    transaction (see the module docstring)."""
    needs = {row["id"]: limits_of(row, limits) for row in rows}
    names: dict[tuple[str, str], Rate] = {}
    for found in needs.values():
        for scope, name, rate in found:
            names.setdefault((scope, name), rate)  # a shared key: the first run's rate
    stored = _locked_limits(sorted(names))
    instant = _clock()
    now = instant.timestamp()
    windows = {key: Window.read(stored[key].starts, rate, now) for key, rate in names.items()}
    chosen: list[dict[str, Any]] = []
    for row in rows:
        if len(chosen) == limit:
            break
        mine = [windows[(scope, name)] for scope, name, _ in needs[row["id"]]]
        if all(window.has_room() for window in mine):
            for window in mine:
                window.admit()
            chosen.append(row)
    for key, window in windows.items():
        opens = window.opens_at()
        limit_rows().filter(pk=stored[key].pk).update(
            starts=window.stored(),
            open_at=None if opens is None else datetime.fromtimestamp(opens, UTC),
            limit=window.rate.count,
            period=window.rate.seconds,
            updated_at=instant,
        )
    if chosen:
        runs().filter(pk__in=[row["id"] for row in chosen], status=Status.PENDING).update(
            status=Status.RUNNING,
            attempts=F("attempts") + 1,
            claimed_by_id=worker_id,
            lease_token=token,
            started_at=instant,
            worker_ids=WorkerIds(worker_id),
        )
    return chosen


def _locked_limits(keys: list[tuple[str, str]]) -> dict[tuple[str, str], JobRateLimit]:
    """The rows of the limits ``keys`` (sorted), made if missing, locked in that order.

    The existing rows are locked first, and the missing ones made by an upsert,
    which leaves each row locked for update whoever inserted it. (An insert that
    ignores conflicts would not: on InnoDB it waits for a racing claim's new row
    and then holds a shared lock on it, and two claims both upgrading theirs
    deadlock. Without a row to lock, nothing serializes the first claims of a
    limit.)
    """
    table = limit_rows()

    def lock(wanted: list[tuple[str, str]]) -> dict[tuple[str, str], JobRateLimit]:
        rows = table.filter(_named(wanted)).order_by("scope", "name").select_for_update()
        return {(row.scope, row.name): row for row in rows}

    stored = lock(keys)
    missing = [key for key in keys if key not in stored]
    if missing:  # a limit's first runs
        features = connections[using()].features
        table.bulk_create(
            [JobRateLimit(scope=scope, name=name) for scope, name in missing],
            update_conflicts=True,
            update_fields=["name"],
            unique_fields=(
                ["scope", "name"] if features.supports_update_conflicts_with_target else None
            ),
        )
        stored.update(lock(missing))
    return stored


def _named(keys: Sequence[tuple[str, str]]) -> Q:
    by_scope: dict[str, list[str]] = {}
    for scope, name in keys:
        by_scope.setdefault(scope, []).append(name)
    found = Q(pk__in=[])
    for scope, names in by_scope.items():
        found |= Q(scope=scope, name__in=names)
    return found


def _clock() -> datetime:
    """The database's clock now (not the transaction's start: the locks were waited for)."""
    connection = connections[using()]
    return vendors.of(connection).clock(connection)


def _earliest_open() -> float | None:
    """When the first full window opens, as a ``time.monotonic()`` instant, or None."""
    first: datetime | None = (
        limit_rows().filter(open_at__gt=Now()).aggregate(first=Min("open_at"))["first"]
    )
    if first is None:
        return None
    return time.monotonic() + max(0.0, (first - _clock()).total_seconds())


def next_open() -> float | None:
    """When a window this process's claims found full opens (``time.monotonic()``), if
    one did: an idle worker claims again then rather than after its poll interval."""
    global _next_open
    if _next_open is not None and _next_open <= time.monotonic():
        _next_open = None  # opened: the claims since will say when the next one does
    return _next_open


def waiting(limits: Limits, pools: Sequence[str] | None = None) -> dict[str, int]:
    """How many due runs of each pool wait for a full window of one of their limits, now."""
    if not limits:
        return {}
    held = limited_runs(runs().due(pools), limits).filter(_held(limits))
    return dict(held.order_by().values("pool").annotate(n=Count("id")).values_list("pool", "n"))


def any_due(limits: Limits, pools: Sequence[str] | None = None) -> bool:
    """Whether runs under one of ``limits`` (of ``pools``) are due, their windows aside."""
    return bool(limits) and limited_runs(runs().due(pools), limits).exists()


def after_claim(short: bool) -> None:
    """After a claim of limited runs: when it came back short, note when the first
    full window opens (``next_open``)."""
    global _next_open
    if short:
        _next_open = _earliest_open()
