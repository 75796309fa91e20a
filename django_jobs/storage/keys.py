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

from django.db import transaction
from django.db.models import Exists, OuterRef
from django.db.models.functions import Now

from ..models import Hold, Status
from . import runs, using

logger = logging.getLogger(__name__)

# Keys per statement: an IN list the servers plan well.
_KEYS_PER_STATEMENT = 500


def taken(keys: Iterable[str | None]) -> set[str]:
    """Of ``keys``, those a running run holds now."""
    found: set[str] = set()
    for chunk in _chunks(keys):
        found.update(
            runs()
            .filter(status=Status.RUNNING, concurrency_key__in=chunk)
            .order_by()
            .values_list("concurrency_key", flat=True)
        )
    return found


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
    running = runs().filter(concurrency_key=OuterRef("concurrency_key"), status=Status.RUNNING)
    ready = runs().due(None).filter(concurrency_key=OuterRef("concurrency_key"))
    first = (
        runs()
        .filter(status=Status.PENDING, hold=Hold.KEY, concurrency_key=key)
        .filter(~Exists(running), ~Exists(ready))
        .order_by("-priority", "run_at", "id")
        .values_list("id", flat=True)
        .first()
    )
    if first is None:
        return 0
    # By primary key: held runs are in no claim, so nothing but a cancel or
    # another release holds this row. Still held when written, or nothing.
    return int(
        runs().filter(pk=first, status=Status.PENDING, hold=Hold.KEY).update(hold=Hold.READY)
    )


def hold_taken(limit: int = 5000) -> int:
    """Hold the ready due runs of the keys that are taken now, up to ``limit``; how many.

    The taken keys are few (at most one per running run); their ready runs are
    found through ``django_jobs_run_keyed``, then locked by id, skipping rows
    another transaction holds (a claim taking one), and held if still ready.
    """
    keys = list(
        runs()
        .filter(status=Status.RUNNING, concurrency_key__isnull=False)
        .order_by()
        .values_list("concurrency_key", flat=True)[: _KEYS_PER_STATEMENT * 10]
    )
    held = 0
    for chunk in _chunks(keys):
        # Due runs only: a held run is due, so a release makes a run ready that
        # can be claimed at once (one due later is held once it is due).
        found = list(
            runs()
            .filter(status=Status.PENDING, hold=Hold.READY, concurrency_key__in=chunk)
            .filter(run_at__lte=Now())
            .order_by()
            .values_list("id", flat=True)[: limit - held]
        )
        if found:
            held += _hold(found)
        if held >= limit:
            break
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
    """Release the held runs of keys no run holds (a crash between a commit and its
    release); how many were released."""
    running = runs().filter(concurrency_key=OuterRef("concurrency_key"), status=Status.RUNNING)
    keys = list(
        runs()
        .filter(status=Status.PENDING, hold=Hold.KEY, concurrency_key__isnull=False)
        .filter(~Exists(running))
        .order_by()
        .values_list("concurrency_key", flat=True)
        .distinct()[:limit]
    )
    released = release(keys)
    if released:
        logger.info("released held runs of free concurrency keys released=%d", released)
    return released


def _chunks(keys: Iterable[str | None]) -> Iterator[list[str]]:
    wanted = sorted({key for key in keys if key is not None})
    for start in range(0, len(wanted), _KEYS_PER_STATEMENT):
        yield wanted[start : start + _KEYS_PER_STATEMENT]
