"""Runs held while their group is full, out of the claim's way.

Two kinds of group limit how many of their runs run at once, each a ``Scope``:

* ``KEY``, a concurrency key: at most the runs' ``concurrency_limit`` (1 by
  default) of a key run at once;
* ``TENANT``, a tenant in a pool: at most ``DJANGO_JOBS["TENANT_CONCURRENCY"]``
  runs of one tenant run at once in a pool that setting caps (runs without a
  tenant are in no such group).

Each running run of a group holds one of its slots (0 to limit - 1), which a
unique index keeps to one running run each: the database enforces the limit,
and a claim gives slots (``within_limits``) under the group's lock.

A pending run whose group is full cannot be claimed. Left in the claim's index,
every claim would read past it: a backlog of 100,000 such runs behind one busy
key made every other run of the pool ten times slower to claim. So such a run
is *held* (``JobRun.hold``, the scope's): the claim reads ready runs only
(``django_jobs_run_ready``).

* ``start()`` inserts a run held when its group is full at that moment;
* ``hold_taken()`` (the worker, every second) holds the ready runs of groups
  that are full now (a burst started while the group had room);
* ``release()`` makes ready the first held runs (priority, then age) of each
  group, as many as it has room for beside its running and ready runs; it is
  called after the commit of every write that frees a slot (a run finishing,
  retrying later, suspending, rescued, given back) and after the commit of
  every write that holds runs;
* ``release_stranded()`` (the worker, every heartbeat interval) releases what
  a crash between a commit and its release left held.

Holding is only ever a hint: the claim still enforces the limit by the database,
so a run released too early is passed over as before, and held again. What must
never happen is a run held for good while its group has room. The two releases
after commit see to it: a write that frees a slot and a write that holds a run
of its group each read after their own commit, so the later of the two reads
sees the other's commit and releases the run (under READ COMMITTED, each
statement sees every commit before it began).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
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

from .. import conf
from ..models import Hold, Status
from . import runs, using, vendors

logger = logging.getLogger(__name__)

# Groups per statement: an IN list the servers plan well.
_GROUPS_PER_STATEMENT = 500

Group = tuple[str, ...]


@dataclass(frozen=True)
class Scope:
    """A kind of group whose running runs are limited: its columns (the last one
    NULL for a run in no group), its slot column and the hold of its waiting runs."""

    name: str
    hold: str
    columns: tuple[str, ...]
    slot: str

    def group(self, row: Mapping[str, Any]) -> Group | None:
        """The group of a run (a row with the scope's columns), None when in none."""
        values = tuple(row[column] for column in self.columns)
        if values[-1] is None or self.limit(values) == 0:
            return None
        return values

    def limit(self, group: Group, run_limit: int | None = None) -> int:
        """How many runs of ``group`` may run at once: ``run_limit`` (a key's run
        says), or the cap of the tenant's pool; 0 when that pool has none."""
        if self is KEY:
            return max(1, run_limit or 1)
        cap = conf.tenant_cap(group[0])
        return 0 if cap is None else cap

    def of(self, groups: Iterable[Group]) -> Q:
        """The runs of ``groups``, by pool (or key) with an IN list."""
        by_head: dict[Group, list[str]] = {}
        for group in groups:
            by_head.setdefault(group[:-1], []).append(group[-1])
        found = Q(pk__in=[])
        for head, lasts in by_head.items():
            of_head = dict(zip(self.columns, head, strict=False))
            found |= Q(**of_head, **{f"{self.columns[-1]}__in": lasts})
        return found

    def outer(self) -> dict[str, Any]:
        """The filter of the runs of the outer row's group."""
        return {column: OuterRef(column) for column in self.columns}

    def lock_name(self, group: Group) -> str:
        # A key is its own name, as the one-statement claim locks it; a tenant's
        # name cannot be a key's (keys hold no unit separator in practice, and a
        # clash would only make a claim pass a group over once).
        return group[0] if self is KEY else "tenant\x1f" + "\x1f".join(group)


KEY = Scope("concurrency keys", Hold.KEY, ("concurrency_key",), "concurrency_slot")
TENANT = Scope("tenants", Hold.TENANT, ("pool", "tenant_id"), "tenant_slot")
SCOPES = (KEY, TENANT)


def full(scope: Scope, groups: Iterable[Group | None], run_limit: int | None = None) -> set[Group]:
    """Of ``groups``, those whose every slot a running run holds now."""
    found: set[Group] = set()
    for chunk in _chunks(groups):
        running = runs().filter(scope.of(chunk), status=Status.RUNNING).order_by()
        counted = running.values(*scope.columns).annotate(count=Count("id"))
        for row in counted:
            group = tuple(row[column] for column in scope.columns)
            limit = scope.limit(group, run_limit)
            if limit and row["count"] >= limit:
                found.add(group)
    return found


def running_count(scope: Scope) -> Any:
    """How many runs of the outer row's group run now (0 when none)."""
    count = (
        runs()
        .filter(**scope.outer(), status=Status.RUNNING)
        .order_by()
        .values(*scope.columns)
        .annotate(count=Count("id"))
        .values("count")
    )
    return Coalesce(Subquery(count), Value(0))


def has_room(pools: Iterable[str] | None = None) -> Q:
    """Whether the outer run's groups have a slot free for it now (a run in no group
    always has): fewer runs of its key run than its limit, and of its tenant in its
    pool than the pool's cap (of ``pools``: the pools a claim is for)."""
    return key_room() & tenant_room(pools)


def key_room() -> Q:
    """Whether fewer runs of the outer run's concurrency key run than its limit."""
    running = runs().filter(**KEY.outer(), status=Status.RUNNING)
    # Exists first: most keys are free, and most limits are 1.
    return (
        Q(concurrency_key__isnull=True)
        | ~Exists(running)
        | Q(concurrency_limit__gt=1) & Q(LessThan(running_count(KEY), F("concurrency_limit")))
    )


def tenant_room(pools: Iterable[str] | None = None) -> Q:
    """Whether fewer runs of the outer run's tenant run in its pool than the pool's
    cap (always, for a run without a tenant or of a pool without a cap)."""
    caps = _caps_of(pools)
    if caps is None:
        return Q()
    named, others = caps
    room = Q(tenant_id__isnull=True)
    for pool, cap in named.items():
        room |= Q(pool=pool) & Q(LessThan(running_count(TENANT), Value(cap)))
    if others is None:
        room |= ~Q(pool__in=list(named))
    else:
        room |= ~Q(pool__in=list(named)) & Q(LessThan(running_count(TENANT), Value(others)))
    return room


def caps_in_force(
    pools: Iterable[str] | None,
) -> tuple[tuple[tuple[str, int], ...], int | None] | None:
    """The tenant caps of a claim for ``pools``, as the claim statement takes them
    (``vendors.base.Caps``); None when none of them is capped."""
    caps = _caps_of(pools)
    return None if caps is None else (tuple(sorted(caps[0].items())), caps[1])


def _caps_of(pools: Iterable[str] | None) -> tuple[dict[str, int], int | None] | None:
    """The tenant caps in force for a claim of ``pools``: by pool, and for the others."""
    if pools is None:
        named, others = conf.tenant_caps()
        return None if not named and others is None else (named, others)
    capped = {pool: conf.tenant_cap(pool) for pool in set(pools)}
    found = {pool: cap for pool, cap in capped.items() if cap is not None}
    return (found, None) if found else None


def release_after_commit(
    keys: Iterable[str | None] = (), tenants: Iterable[tuple[str, str | None]] = ()
) -> None:
    """``release()`` the groups of ``keys`` and of ``tenants`` (pool, tenant id) once
    the caller's transaction commits (at once outside one). The runs held for a
    cap since removed are the sweep's to release."""
    wanted: dict[Scope, set[Group]] = {
        KEY: {(key,) for key in keys if key is not None},
        TENANT: {
            group
            for pool, tenant in tenants
            if tenant is not None and (group := TENANT.group({"pool": pool, "tenant_id": tenant}))
        },
    }
    for scope, groups in wanted.items():
        _release_groups_after_commit(scope, groups)


def _release_groups_after_commit(scope: Scope, groups: set[Group]) -> None:
    if groups:
        transaction.on_commit(functools.partial(_release_quietly, scope, groups), using=using())


def _release_quietly(scope: Scope, groups: set[Group]) -> None:
    # After a commit: a failure here must not fail the write that committed.
    # What it leaves held, release_stranded() releases.
    try:
        release(scope, groups)
    except Exception:
        logger.warning("release of held runs failed; the next sweep releases them", exc_info=True)


def release(scope: Scope, groups: Iterable[Group | None]) -> int:
    """Make ready the first held runs of each of ``groups``, as many as it has room
    for; return how many were released."""
    released = 0
    for chunk in _chunks(groups):
        held = runs().filter(scope.of(chunk), status=Status.PENDING, hold=scope.hold)
        # Unordered: the model's ordering would make DISTINCT read every held run.
        found = set(held.order_by().values_list(*scope.columns).distinct())
        released += sum(_release_one(scope, group) for group in sorted(found))
    return released


def _release_one(scope: Scope, group: Group) -> int:
    """Make ready the first held runs of ``group``, as many as its limit has room
    for beside its running and ready due runs; how many."""
    of_group = dict(zip(scope.columns, group, strict=True))
    held = runs().filter(**of_group, status=Status.PENDING, hold=scope.hold)
    in_order = held.order_by("-priority", "turn", "run_at", "id")
    first = in_order.values_list("id", "concurrency_limit")[:1]
    if not first:
        return 0
    first_id, run_limit = first[0]
    limit = scope.limit(group, run_limit)
    busy = runs().filter(**of_group, status=Status.RUNNING).order_by()
    ready = runs().due(None).filter(**of_group).order_by()
    if not limit:
        # No cap any longer: every held run is ready again (a batch per release).
        ids = list(in_order.values_list("id", flat=True)[:_RELEASED_UNCAPPED])
    elif limit == 1:
        if busy.exists() or ready.exists():
            return 0
        ids = [first_id]
    else:
        room = limit - busy[:limit].count() - ready[:limit].count()
        if room <= 0:
            return 0
        ids = list(in_order.values_list("id", flat=True)[:room])
    # By primary key: held runs are in no claim, so nothing but a cancel or
    # another release holds these rows. Still held when written, or nothing.
    still_held = runs().filter(pk__in=ids, status=Status.PENDING, hold=scope.hold)
    return int(still_held.update(hold=Hold.READY))


# Held runs made ready at once when their group is no longer limited.
_RELEASED_UNCAPPED = 1000


def hold_taken(limit: int = 5000) -> int:
    """Hold the ready due runs of the groups that are full now, up to ``limit``; how many."""
    held = 0
    for scope in SCOPES:
        if scope is TENANT and _caps_of(None) is None:
            continue
        held += _hold_full(scope, limit - held)
        if held >= limit:
            break
    return held


def _hold_full(scope: Scope, limit: int) -> int:
    """Hold up to ``limit`` ready due runs of ``scope``'s full groups.

    The groups with running runs are few (at most one per running run), read with
    how many runs of each run; the ready runs of those so many fill are found
    through the scope's index of pending runs (``django_jobs_run_keyed``,
    ``django_jobs_run_tenanted``), then locked by id, skipping rows another
    transaction holds (a claim taking one), and held if still ready.
    """
    last = scope.columns[-1]
    counts: dict[int, list[Group]] = {}
    for row in (
        runs()
        .filter(status=Status.RUNNING, **{f"{last}__isnull": False})
        .order_by()
        .values(*scope.columns)
        .annotate(count=Count("id"))[: _GROUPS_PER_STATEMENT * 10]
    ):
        group = tuple(row[column] for column in scope.columns)
        counts.setdefault(row["count"], []).append(group)
    held = 0
    for count, groups in sorted(counts.items()):
        if scope is TENANT:
            groups = [group for group in groups if (cap := scope.limit(group)) and count >= cap]
        for chunk in _chunks(groups):
            ready = runs().filter(scope.of(chunk), status=Status.PENDING, hold=Hold.READY)
            # Due runs only: a held run is due, so a release makes a run ready that
            # can be claimed at once (one due later is held once it is due).
            ready = ready.filter(run_at__lte=Now())
            if scope is KEY:
                ready = ready.filter(concurrency_limit__lte=count)
            found = list(ready.order_by().values_list("id", flat=True)[: limit - held])
            if found:
                held += _hold(scope, found)
            if held >= limit:
                return held
    return held


def _hold(scope: Scope, ids: list[int]) -> int:
    with transaction.atomic(using=using()):
        # Locked by primary key alone, checked under the lock (see claiming._locked).
        rows = list(
            runs()
            .filter(pk__in=ids)
            .order_by()
            .select_for_update(skip_locked=True)
            .values("id", "status", "hold", *scope.columns)
        )
        ready = [row for row in rows if (row["status"], row["hold"]) == (Status.PENDING, "")]
        if not ready:
            return 0
        runs().filter(pk__in=[row["id"] for row in ready]).update(hold=scope.hold)
        # The groups may have had room again before this commit: look after it.
        _release_groups_after_commit(scope, {g for row in ready if (g := scope.group(row))})
    return len(ready)


def release_stranded(limit: int = 1000) -> int:
    """Release the held runs of groups with room for them (a crash between a commit
    and its release, or a cap raised or removed); how many were released."""
    released = 0
    for scope in SCOPES:
        # The group's last column is set on every held run: the scope's index of
        # pending runs (django_jobs_run_keyed, django_jobs_run_tenanted) serves.
        held = runs().filter(status=Status.PENDING, hold=scope.hold)
        held = held.filter(**{f"{scope.columns[-1]}__isnull": False})
        if scope is KEY:
            # Keys are many and their limits the runs' own: judged in the query.
            groups = list(
                held.filter(key_room()).order_by().values_list(*scope.columns).distinct()[:limit]
            )
        else:
            groups = _roomy(list(held.order_by().values_list(*scope.columns).distinct()[:limit]))
        if groups:
            found = release(scope, groups)
            if found:
                logger.info("released held runs of %s released=%d", scope.name, found)
            released += found
    return released


def _roomy(tenants: list[Group]) -> list[Group]:
    """Of the (pool, tenant) groups of ``tenants``, those under their pool's cap now
    (or whose pool has none any longer): their running runs counted in one query,
    rather than a count per held run."""
    counts: dict[Group, int] = {}
    for chunk in _chunks(tenants):
        running = runs().filter(TENANT.of(chunk), status=Status.RUNNING).order_by()
        for row in running.values(*TENANT.columns).annotate(count=Count("id")):
            counts[(row["pool"], row["tenant_id"])] = row["count"]
    return [
        group
        for group in tenants
        if (cap := conf.tenant_cap(group[0])) is None or counts.get(group, 0) < cap
    ]


def within_limits(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of the locked ``rows`` (in claim order), those a claim may mark running, each
    given a free slot of each of its groups (``row[scope.slot]``): as many of a
    group as it has free slots, and only of groups no other claim is taking."""
    for scope in SCOPES:
        rows = _within(scope, rows)
    return rows


def _within(scope: Scope, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``within_limits`` for one scope.

    Two claims inserting several groups into a unique index at once could wait
    on each other's uncommitted entries in a cycle (a deadlock). So the vendor
    says which groups this claim may take without waiting (PostgreSQL: those
    whose transaction-scoped advisory lock was free; MySQL and MariaDB: whose
    named lock was free; elsewhere: one per claim, which cannot form a cycle).
    Under that lock, no other claim gives a slot of the group, so the slots read
    here stay free until this claim commits.
    """
    wanted = list(dict.fromkeys(group for row in rows if (group := scope.group(row))))
    if not wanted:
        return rows
    connection = connections[using()]
    names = {scope.lock_name(group): group for group in wanted}
    allowed = {names[name] for name in vendors.of(connection).lock_keys(connection, list(names))}
    used: dict[Group, set[int]] = {group: set() for group in allowed}
    if allowed:
        # A claim that took a slot may have committed after this claim's first
        # statement began; this new statement sees it. (A run claimed without a
        # key's slot, by a worker of an older release, holds slot 0.)
        slot = Coalesce(scope.slot, Value(0)) if scope is KEY else F(scope.slot)
        running = runs().filter(scope.of(allowed), status=Status.RUNNING).order_by()
        for *group, taken in running.values_list(*scope.columns, slot):
            used[tuple(group)].add(taken)
    kept = []
    for row in rows:
        group = scope.group(row)
        if group is None:
            kept.append(row)
            continue
        if group not in used:
            continue
        limit = scope.limit(group, row.get("concurrency_limit")) or 1
        free = next((slot for slot in range(limit) if slot not in used[group]), None)
        if free is None:
            continue
        used[group].add(free)
        row[scope.slot] = free
        kept.append(row)
    return kept


def slots_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The slot columns' values for the UPDATE that marks ``rows`` running (as
    ``within_limits`` gave them), for each slot column some row has."""
    columns = {}
    for scope in SCOPES:
        by_slot: dict[int, list[int]] = {}
        for row in rows:
            if row.get(scope.slot) is not None:
                by_slot.setdefault(row[scope.slot], []).append(row["id"])
        if by_slot:
            whens = [When(pk__in=ids, then=Value(slot)) for slot, ids in sorted(by_slot.items())]
            columns[scope.slot] = Case(*whens, default=Value(None), output_field=IntegerField())
    return columns


def _chunks(groups: Iterable[Group | None]) -> Iterator[list[Group]]:
    wanted = sorted({group for group in groups if group is not None})
    for start in range(0, len(wanted), _GROUPS_PER_STATEMENT):
        yield wanted[start : start + _GROUPS_PER_STATEMENT]
