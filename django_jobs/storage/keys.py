"""Runs held while their concurrency key is taken, out of the claim's way.

A pending run whose concurrency key another run holds (running) cannot be
claimed. Left in the claim's index, every claim would read past it: a backlog of
100,000 such runs behind one busy key made every other run of the pool ten
times slower to claim. So such a run is *held* (``JobRun.hold = 'key'``): the
claim reads ready runs only (``django_jobs_run_ready``).

* ``start()`` inserts a run held when its key is taken at that moment;
* ``hold_taken()`` (the worker, every second) holds the ready runs of keys
  that are taken now (a burst started while the key was free);
* ``release()`` makes ready the first held run (priority, then age) of each key
  that is free and has no ready run left; it is called after the commit of
  every write that frees a key (a run finishing, retrying later, suspending,
  rescued, given back) and after the commit of every write that holds runs;
* ``release_stranded()`` (the worker, every heartbeat interval) releases what
  a crash between a commit and its release left held.

Holding is only ever a hint: the claim still enforces the key by the database
(the unique index on running keys), so a run released too early is passed over
as before, and held again. What must never happen is a run held for good while
its key is free. The two releases after commit see to it: a write that frees a
key and a write that holds a run of it each read after their own commit, so the
later of the two reads sees the other's commit and releases the run (under READ
COMMITTED, each statement sees every commit before it began).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from django.db import connections, transaction
from django.db.models import (
    Case,
    Count,
    Exists,
    F,
    IntegerField,
    OuterRef,
    Q,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Now
from django.db.models.lookups import LessThan

from ..models import Hold, Status
from . import runs, using, vendors

logger = logging.getLogger(__name__)

# Keys per statement: an IN list the servers plan well.
_KEYS_PER_STATEMENT = 500


def taken(keys: Iterable[str | None], limit: int = 1) -> set[str]:
    """Of ``keys``, those that ``limit`` running runs (or more) hold now."""
    found: set[str] = set()
    for chunk in _chunks(keys):
        running = runs().filter(status=Status.RUNNING, concurrency_key__in=chunk).order_by()
        if limit <= 1:
            found.update(running.values_list("concurrency_key", flat=True))
        else:
            found.update(
                key
                for key, count in running.values("concurrency_key")
                .annotate(count=Count("id"))
                .values_list("concurrency_key", "count")
                if count >= limit
            )
    return found


def running_count() -> Any:
    """How many runs of the outer row's concurrency key run now (0 when none)."""
    count = (
        runs()
        .filter(concurrency_key=OuterRef("concurrency_key"), status=Status.RUNNING)
        .order_by()
        .values("concurrency_key")
        .annotate(count=Count("id"))
        .values("count")
    )
    return Coalesce(Subquery(count), Value(0))


def has_room() -> Q:
    """Whether the outer run's concurrency key has a slot free for it now (a run
    without a key always has): fewer runs of the key run than its limit."""
    running = runs().filter(concurrency_key=OuterRef("concurrency_key"), status=Status.RUNNING)
    # Exists first: most keys are free, and most limits are 1.
    return (
        Q(concurrency_key__isnull=True)
        | ~Exists(running)
        | Q(concurrency_limit__gt=1) & Q(LessThan(running_count(), F("concurrency_limit")))
    )


def release_after_commit(keys: Iterable[str | None]) -> None:
    """``release(keys)`` once the caller's transaction commits (at once outside one)."""
    wanted = {key for key in keys if key is not None}
    if wanted:
        transaction.on_commit(functools.partial(_release_quietly, wanted), using=using())


def _release_quietly(keys: set[str]) -> None:
    # After a commit: a failure here must not fail the write that committed.
    # What it leaves held, release_stranded() releases.
    try:
        release(keys)
    except Exception:
        logger.warning("release of held runs failed; the next sweep releases them", exc_info=True)


def release(keys: Iterable[str | None]) -> int:
    """Make ready the first held run of each of ``keys`` that no run holds and
    that has no ready run due; return how many were released."""
    released = 0
    for chunk in _chunks(keys):
        held = set(
            runs()
            .filter(status=Status.PENDING, hold=Hold.KEY, concurrency_key__in=chunk)
            # Unordered: the model's ordering would make DISTINCT read every held run.
            .order_by()
            .values_list("concurrency_key", flat=True)
            .distinct()
        )
        released += sum(_release_one(key) for key in sorted(held))
    return released


def _release_one(key: str) -> int:
    """Make ready the first held runs of ``key``, as many as its limit has room
    for beside its running and ready due runs; how many."""
    held = runs().filter(status=Status.PENDING, hold=Hold.KEY, concurrency_key=key)
    first = held.order_by("-priority", "run_at", "id").values_list("id", "concurrency_limit")[:1]
    if not first:
        return 0
    first_id, limit = first[0]
    busy = runs().filter(concurrency_key=key, status=Status.RUNNING).order_by()
    ready = runs().due(None).filter(concurrency_key=key).order_by()
    if limit <= 1:
        if busy.exists() or ready.exists():
            return 0
        ids = [first_id]
    else:
        room = limit - busy[:limit].count() - ready[:limit].count()
        if room <= 0:
            return 0
        ids = list(held.order_by("-priority", "run_at", "id").values_list("id", flat=True)[:room])
    # By primary key: held runs are in no claim, so nothing but a cancel or
    # another release holds these rows. Still held when written, or nothing.
    return int(
        runs().filter(pk__in=ids, status=Status.PENDING, hold=Hold.KEY).update(hold=Hold.READY)
    )


def hold_taken(limit: int = 5000) -> int:
    """Hold the ready due runs of the keys that are taken now, up to ``limit``; how many.

    The taken keys are few (at most one per running run), read with how many
    runs of each run; their ready runs whose concurrency limit so many reach are
    found through ``django_jobs_run_keyed``, then locked by id, skipping rows
    another transaction holds (a claim taking one), and held if still ready.
    """
    counts: dict[int, list[str]] = {}
    for key, count in (
        runs()
        .filter(status=Status.RUNNING, concurrency_key__isnull=False)
        .order_by()
        .values("concurrency_key")
        .annotate(count=Count("id"))
        .values_list("concurrency_key", "count")[: _KEYS_PER_STATEMENT * 10]
    ):
        counts.setdefault(count, []).append(key)
    held = 0
    for count, keys in sorted(counts.items()):
        for chunk in _chunks(keys):
            # Due runs only: a held run is due, so a release makes a run ready that
            # can be claimed at once (one due later is held once it is due).
            found = list(
                runs()
                .filter(status=Status.PENDING, hold=Hold.READY, concurrency_key__in=chunk)
                .filter(run_at__lte=Now(), concurrency_limit__lte=count)
                .order_by()
                .values_list("id", flat=True)[: limit - held]
            )
            if found:
                held += _hold(found)
            if held >= limit:
                return held
    return held


def _hold(ids: list[int]) -> int:
    with transaction.atomic(using=using()):
        # Locked by primary key alone, checked under the lock (see claiming._locked).
        rows = list(
            runs()
            .filter(pk__in=ids)
            .order_by()
            .select_for_update(skip_locked=True)
            .values_list("id", "status", "hold", "concurrency_key")
        )
        ready = [row for row in rows if row[1] == Status.PENDING and row[2] == Hold.READY]
        if not ready:
            return 0
        runs().filter(pk__in=[row[0] for row in ready]).update(hold=Hold.KEY)
        # The keys may have been freed before this commit: look again after it.
        release_after_commit(row[3] for row in ready)
    return len(ready)


def release_stranded(limit: int = 1000) -> int:
    """Release the held runs of keys with room for them (a crash between a commit and
    its release); how many were released."""
    keys = list(
        runs()
        .filter(status=Status.PENDING, hold=Hold.KEY, concurrency_key__isnull=False)
        .filter(has_room())
        .order_by()
        .values_list("concurrency_key", flat=True)
        .distinct()[:limit]
    )
    released = release(keys)
    if released:
        logger.info("released held runs of free concurrency keys released=%d", released)
    return released


def within_limits(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of the locked ``rows`` (in claim order), those a claim may mark running, each
    with a key given a free slot (``row["concurrency_slot"]``): as many of a key as
    its limit has free slots, and only of keys no other claim is taking.

    Two claims inserting several keys into the unique index at once could wait on
    each other's uncommitted keys in a cycle (a deadlock). So the vendor says
    which keys this claim may take without waiting (PostgreSQL: the keys whose
    transaction-scoped advisory lock was free; MySQL and MariaDB: whose named
    lock was free; elsewhere: one key per claim, which cannot form a cycle).
    Under that lock, no other claim gives a slot of the key, so the slots read
    here stay free until this claim commits.
    """
    wanted = list(dict.fromkeys(row["concurrency_key"] for row in rows if row["concurrency_key"]))
    if not wanted:
        return rows
    connection = connections[using()]
    allowed = vendors.of(connection).lock_keys(connection, wanted)
    used: dict[str, set[int]] = {key: set() for key in allowed}
    if allowed:
        # A claim that took a slot may have committed after this claim's first
        # statement began; this new statement sees it.
        for key, slot in (
            runs()
            .filter(concurrency_key__in=allowed, status=Status.RUNNING)
            .order_by()
            .values_list("concurrency_key", Coalesce("concurrency_slot", Value(0)))
        ):
            used[key].add(slot)
    kept = []
    for row in rows:
        key = row["concurrency_key"]
        if key is None:
            kept.append(row)
            continue
        if key not in used:
            continue
        limit = max(1, row.get("concurrency_limit") or 1)
        free = next((slot for slot in range(limit) if slot not in used[key]), None)
        if free is None:
            continue
        used[key].add(free)
        row["concurrency_slot"] = free
        kept.append(row)
    return kept


def slots_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``concurrency_slot`` column's values for the UPDATE that marks ``rows``
    running (as ``within_limits`` gave them), or nothing when none has a key."""
    by_slot: dict[int, list[int]] = {}
    for row in rows:
        if row.get("concurrency_slot") is not None:
            by_slot.setdefault(row["concurrency_slot"], []).append(row["id"])
    if not by_slot:
        return {}
    whens = [When(pk__in=ids, then=Value(slot)) for slot, ids in sorted(by_slot.items())]
    return {"concurrency_slot": Case(*whens, default=Value(None), output_field=IntegerField())}


def _chunks(keys: Iterable[str | None]) -> Iterator[list[str]]:
    wanted = sorted({key for key in keys if key is not None})
    for start in range(0, len(wanted), _KEYS_PER_STATEMENT):
        yield wanted[start : start + _KEYS_PER_STATEMENT]
