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
  with a plain ``FOR UPDATE``, by id in id order: claims of one limit wait
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

from django.db import connections, transaction
from django.db.models import (
    Case,
    Count,
    DateTimeField,
    Exists,
    ExpressionWrapper,
    F,
    Min,
    Q,
    TextField,
    When,
)
from django.db.models.functions import Now

from ..models import Hold, JobRateLimit, RateLimitScope, Status
from ..ratelimits import MAX_PERIOD, Limits, Rate, Window
from . import holds, runs, using, vendors
from .leases import WorkerIds
from .reading import EARLIEST, LATEST, decoded

# The instant (time.monotonic()) a limit's window this process saw full next
# opens; None when no claim of this process found one full.
_next_open: float | None = None
# A limit row's starts as stored, for _starts to decode.
_STARTS_TEXT = ExpressionWrapper(F("starts"), output_field=TextField())


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


def under_full_window(limits: Limits) -> Q:
    """The runs under a job's or a key's limit whose window is known to be full (those
    ``storage.rateholds`` holds; a pool's limit is not held, see ``pool_open``)."""
    return _held(limits, pools=False)


def pool_open(pool: str, limits: Limits) -> Q:
    """Unless the window of ``pool``'s own limit is full: a condition on no run, which
    the server decides once per claim (as a paused pool's), so a claim for a pool
    whose window is full reads none of its runs. Always true for a pool without one."""
    rate = limits.pools.get(pool)
    if rate is None:
        return Q()
    full = limit_rows().filter(
        scope=RateLimitScope.POOL,
        name=pool,
        open_at__gt=Now(),
        limit=rate.count,
        period=rate.seconds,
    )
    return Q(~Exists(full))


def _held(limits: Limits, *, pools: bool = True) -> Q:
    """The runs one of whose limits is full now: its row's ``open_at`` is ahead, and
    was computed under the rate in force (a limit raised, or lowered, since is
    judged again at its next claim: ``open_at`` is the old rate's).

    Each test is ``name IN (the full limits' names)``, a subquery of its own that
    the server evaluates once per statement (a hash), not once per run: a claim
    reads past a held backlog at the cost of a lookup per run.
    """
    held = Q(pk__in=[])
    for rate, names in _by_rate(limits.pools, limits.pools if pools else ()).items():
        held |= Q(pool__in=names) & Q(pool__in=_full(rate, RateLimitScope.POOL))
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
    windows = {key: Window.read(_starts(stored[key]), rate, now) for key, rate in names.items()}
    chosen: list[dict[str, Any]] = []
    for row in rows:
        if len(chosen) == limit:
            break
        mine = [windows[(scope, name)] for scope, name, _ in needs[row["id"]]]
        if all(window.has_room() for window in mine):
            for window in mine:
                window.admit()
            chosen.append(row)
    # Refused for a full window of a job's limit or a key's: held until it opens
    # (storage.rateholds), out of the claims' way. Locked by this claim.
    taken = {row["id"] for row in chosen}
    refused = [
        row["id"]
        for row in rows
        if row["id"] not in taken
        and any(
            not windows[(scope, name)].has_room()
            for scope, name, _ in needs[row["id"]]
            if scope != RateLimitScope.POOL
        )
    ]
    if refused:
        # Locked by the claim and pending when locked: by primary key alone, as
        # claiming.mark_running explains.
        runs().filter(pk__in=refused).update(hold=Hold.RATE)
    for key, window in windows.items():
        opens = window.opens_at()
        limit_rows().filter(pk=stored[key]["pk"]).update(
            starts=window.stored(),
            open_at=None if opens is None else datetime.fromtimestamp(opens, UTC),
            limit=window.rate.count,
            period=window.rate.seconds,
            updated_at=instant,
        )
    if chosen:
        # Locked by the claim and pending when locked: by primary key alone, as
        # claiming.mark_running explains (no status index entries locked on InnoDB).
        runs().filter(pk__in=[row["id"] for row in chosen]).update(
            status=Status.RUNNING,
            attempts=F("attempts") + 1,
            claimed_by_id=worker_id,
            lease_token=token,
            started_at=instant,
            worker_ids=WorkerIds(worker_id),
            **holds.slots_of(chosen),
        )
    return chosen


def _starts(row: dict[str, Any]) -> Any:
    """A limit row's starts as stored, decoded; JSON Python cannot decode (anyone who
    can write the table can store it) is dropped, as malformed entries are."""
    try:
        return decoded(row["starts_text"])
    except ValueError:
        return []


def _locked_limits(keys: list[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The rows of the limits ``keys``, made if missing, locked in id order.

    The existing rows are locked first, and the missing ones made by an upsert,
    which leaves each row locked for update whoever inserted it. (An insert that
    ignores conflicts would not: on InnoDB it waits for a racing claim's new row
    and then holds a shared lock on it, and two claims both upgrading theirs
    deadlock. Without a row to lock, nothing serializes the first claims of a
    limit.)
    """
    table = limit_rows()

    def lock(wanted: list[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
        # Found without a lock, then locked by primary key alone, in id order: a
        # locking read by name that the server plans as a scan of the (small)
        # table locks every row it reads, other claims' limits too, and two such
        # claims deadlocked.
        ids = list(table.filter(_named(wanted)).values_list("pk", flat=True))
        rows = table.filter(pk__in=ids).order_by("pk").select_for_update()
        return {
            (row["scope"], row["name"]): row
            for row in rows.values("pk", "scope", "name", starts_text=_STARTS_TEXT)
        }

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
    """How many due runs of each pool wait for a full window of one of their limits, now
    (held for it, or not yet)."""
    if not limits:
        return {}
    ready = limited_runs(runs().due(pools), limits).filter(_held(limits))
    found = dict(ready.order_by().values("pool").annotate(n=Count("id")).values_list("pool", "n"))
    # And those held out of the claim's way until their window opens (storage.rateholds).
    held = runs().filter(status=Status.PENDING, hold=Hold.RATE)
    if pools is not None:
        held = held.filter(pool__in=pools)
    for pool, n in held.order_by().values("pool").annotate(n=Count("id")).values_list("pool", "n"):
        found[pool] = found.get(pool, 0) + n
    return found


def any_due(limits: Limits, pools: Sequence[str] | None = None) -> bool:
    """Whether runs under one of ``limits`` (of ``pools``) are due, their windows aside
    (held for one included)."""
    if not limits:
        return False
    if limited_runs(runs().due(pools), limits).exists():
        return True
    held = runs().filter(status=Status.PENDING, hold=Hold.RATE)
    return bool((held if pools is None else held.filter(pool__in=pools)).exists())


def after_claim(short: bool) -> None:
    """After a claim of limited runs: when it came back short, note when the first
    full window opens (``next_open``)."""
    global _next_open
    if short:
        _next_open = _earliest_open()


# --- retention ---------------------------------------------------------------------


def prune_idle(limits: Limits, *, batch_size: int = 1000, dry_run: bool = False) -> int:
    """Delete the rows of limits that hold nothing any more; return how many went
    (with ``dry_run``, would go: nothing is locked or deleted).

    A row is idle when no start it recorded is within its window, under the
    longer of its own rate and the one ``limits`` has for it (a limit made
    longer keeps its starts), its window is not held, and no pending or running
    run is under it. Deleting such a row changes nothing a claim decides: a claim
    that needs it makes it again, with the same empty window.

    The rows are walked by id, in batches. Each batch's idle rows are locked by
    id in id order, the claims' order, skipping those a claim holds (they
    are in use), and checked again under the lock: a claim that admitted a run
    meanwhile has recorded its start. So retention never waits for a claim, and
    a claim waits for it for one batch at most.
    """
    cursor, gone = 0, 0
    while True:
        batch = list(_rows().filter(pk__gt=cursor).order_by("pk")[:batch_size])
        if not batch:
            return gone
        cursor = batch[-1]["pk"]
        now = _clock().timestamp()
        idle = [row["pk"] for row in batch if _idle(row, limits, now)]
        if not idle:
            continue
        if dry_run:
            gone += len(_unused(batch, idle))
            continue
        with transaction.atomic(using=using()):
            locked = list(
                _rows().filter(pk__in=idle).order_by("pk").select_for_update(skip_locked=True)
            )
            now = _clock().timestamp()
            doomed = _unused(locked, [row["pk"] for row in locked if _idle(row, limits, now)])
            if doomed:
                gone += limit_rows().filter(pk__in=doomed).delete()[0]


def _rows() -> Any:
    """Limit rows not held (``open_at`` is not ahead), as retention reads them: their
    starts as stored text, and ``updated_at`` NULL when Python cannot hold it."""
    readable = Q(updated_at__gte=EARLIEST, updated_at__lte=LATEST)
    return (
        limit_rows()
        .filter(Q(open_at__isnull=True) | Q(open_at__lte=Now()))
        .values(
            "pk",
            "scope",
            "name",
            "period",
            starts_text=_STARTS_TEXT,
            updated=Case(When(readable, then=F("updated_at")), output_field=DateTimeField()),
        )
    )


def _idle(row: dict[str, Any], limits: Limits, now: float) -> bool:
    """Whether no start of ``row`` is within its window (see ``prune_idle``)."""
    if row["updated"] is None:
        return False  # a date out of range: kept, as anything it cannot judge
    period = _longest_period(row, limits)
    if row["updated"].timestamp() + period > now:
        return False  # the last claim that used it was less than a period ago
    return not Window.read(_starts(row), Rate(1, period), now).starts


def _longest_period(row: dict[str, Any], limits: Limits) -> float:
    """The longest window that may apply to ``row``: its own rate's, and the one in
    force for it (for a key, the longest of the keyed jobs' rates)."""
    scope, name = row["scope"], row["name"]
    current: Rate | None = None
    if scope == RateLimitScope.POOL:
        current = limits.pools.get(name)
    elif scope == RateLimitScope.JOB and name not in limits.keyed:
        current = limits.jobs.get(name)
    elif scope == RateLimitScope.KEY and limits.keyed:
        current = max((limits.jobs[t] for t in limits.keyed), key=lambda rate: rate.seconds)
    stored = row["period"]
    if not (isinstance(stored, float) and 0 < stored <= MAX_PERIOD):  # NaN fails too
        # Written by hand: judged by the rate in force, or kept for the longest period.
        return MAX_PERIOD if current is None else current.seconds
    return max(stored, 0.0 if current is None else current.seconds)


def _unused(rows: list[dict[str, Any]], ids: list[int]) -> list[int]:
    """Of ``ids`` (of ``rows``), the limits no pending or running run is under.

    One query per scope for the batch, by name: the runs' columns have no index
    of their own, so each reads the pending and running runs once.
    """
    chosen = set(ids)
    wanted = [row for row in rows if row["pk"] in chosen]
    active = runs().filter(status__in=[Status.PENDING, Status.RUNNING]).order_by()
    used: set[tuple[str, str]] = set()
    for scope, column in (
        (RateLimitScope.POOL, "pool"),
        (RateLimitScope.JOB, "job_type"),
        (RateLimitScope.KEY, "rate_key"),
    ):
        names = [row["name"] for row in wanted if row["scope"] == scope]
        if names:
            found = active.filter(**{f"{column}__in": names}).values_list(column, flat=True)
            used |= {(scope.value, name) for name in found.distinct()}
    return [row["pk"] for row in wanted if (row["scope"], row["name"]) not in used]
