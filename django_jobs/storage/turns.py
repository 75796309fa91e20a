"""Fair turns: the order in which claims take the ready runs of one pool and priority.

A claim takes the highest priority first, then the lowest ``JobRun.turn``, then
the oldest ``run_at`` (the claim's index, ``django_jobs_run_claim_kind``, is in
that order for each pool and kind: threads or event loop). Turns are start-time
fair queueing over tenants, runs without a tenant being one more group:

* a new run's turn is the turn at the head of its pool, kind and priority (the
  lowest turn of their ready runs), or one past the last turn of its tenant's ready
  runs there when that is later; ``start_many()``'s runs take consecutive
  turns from there;
* so a tenant that starts 100,000 runs spreads them over 100,000 turns, and a
  run another tenant starts meanwhile takes the turn at the head: the next
  claim or the one after takes it, whatever the backlog before it;
* with one tenant only (or none), turns follow the order of starts: the
  claim's order is the age order it was before turns.

A run not due yet takes the turn ``LATER`` (after every other one) when it is
started or retried later: in turn order, a run due tomorrow with an early turn
would be read past by every claim until then. When it is due, the worker's
``give_turns()`` gives it a turn as if it were started then; until that pass
(a second at most while a worker runs) it is claimed after the others of its
priority, never left out.

Turns are a hint to the claim's order, never a condition: a run of any turn is
claimed. Two starts of one tenant at the same moment may take the same turn
(their age then orders them). ``DJANGO_JOBS["FAIR_TURNS"] = False`` gives every
run turn 0: the claim's order is priority, then age.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models import BigIntegerField, Case, Value, When
from django.db.models.functions import Now
from django.utils import timezone

from .. import conf
from ..models import LATER, Hold, JobRun, Status
from . import runs, using, vendors

# Due runs given a turn per pass, and per statement.
_PER_PASS = 1000
# Priorities of one pool looked at per pass (the claim index's distinct values,
# found one probe each).
_PRIORITIES = 20


def assign(template: JobRun) -> None:
    """Give ``template`` (a new run, or the template of a ``start_many()``, whose runs
    take consecutive turns from it) its turn: ``LATER`` when not due yet."""
    when = template.run_at
    fair = conf.get().FAIR_TURNS
    if isinstance(when, datetime) and when > timezone.now():
        template.turn = LATER if fair else 0
    elif not fair:
        template.turn = 0
    else:
        template.turn = _first(
            template.pool, template.is_async, template.priority, template.tenant_id
        )


def later() -> int:
    """The turn of a run put back to pending until a later time (a retry's backoff)."""
    return LATER if conf.get().FAIR_TURNS else 0


def of_many(template: JobRun, count: int) -> list[int]:
    """The turns of the ``count`` runs of a ``start_many()`` of ``template`` (given its
    turn by ``assign``): consecutive from it."""
    if template.turn >= LATER or not conf.get().FAIR_TURNS:
        return [template.turn] * count
    return [_capped(template.turn, n) for n in range(count)]


def _capped(turn: int, n: int) -> int:
    return turn if turn >= LATER else min(turn + n, LATER - 1)


def _first(pool: str, is_async: bool, priority: int, tenant_id: str | None) -> int:
    """The first turn a new run of ``tenant_id`` in ``pool`` (of the kind ``is_async``)
    at ``priority`` takes."""
    head, last = _head_and_last(pool, is_async, priority, tenant_id)
    return max(head or 0, 0 if last is None else _capped(last, 1))


def _head_and_last(
    pool: str, is_async: bool, priority: int, tenant_id: str | None
) -> tuple[Any, Any]:
    """The lowest turn of the ready runs of ``pool`` of a kind at ``priority``, and the
    highest of the tenant's ready runs there, either kind (None where there is none),
    in one query (a prepared statement where the database has them: planning it took
    twice as long as running it)."""
    connection = connections[using()]
    query = turn_query(pool, is_async, priority, tenant_id)
    rows = vendors.of(connection).fetch(connection, *query)
    return (None, None) if not rows else (rows[0][0], rows[0][1])


def turn_query(
    pool: str, is_async: bool, priority: int, tenant_id: str | None
) -> tuple[str, list[Any]]:
    """The query of ``_head_and_last``: two probes of an index each (the claim's, in
    turn order, and ``django_jobs_run_turns``), as a statement and its parameters."""
    connection = connections[using()]
    head_sql, last_sql = _statements(connection.alias, tenant_id is None)
    found = vendors.of(connection).last_turn(connection, pool, priority, tenant_id)
    if found is None:
        found = (last_sql, [pool, priority] + ([] if tenant_id is None else [tenant_id]))
    last_sql, last_params = found
    return f"SELECT ({head_sql}), ({last_sql})", [pool, is_async, priority, *last_params]


@functools.cache
def _statements(alias: str, untenanted: bool) -> tuple[str, str]:
    """The text of the head's probe, and of the tenant's last turn's, for ``alias``:
    written once (the ORM took longer to compile them than the server to run them).

    Each has a condition on a column outside the indexes (``id > 0``, always true):
    the server then reads each entry's row rather than the index alone, so it marks
    the entries of runs claimed since the last VACUUM dead as it passes them, and
    the next start skips them. An index-only scan never marks them: each start
    read every entry of the runs claimed since (2.7 ms after a drain of 20,000).
    The last turn is read in the turns index's order backwards, the tenant first,
    so that PostgreSQL reads ``tenant_id IS NULL`` in index order too, not sorted.
    """
    quote = connections[alias].ops.quote_name
    table = quote(JobRun._meta.db_table)
    pool, priority, tenant, turn = (quote(c) for c in ("pool", "priority", "tenant_id", "turn"))
    ready = (
        f"{quote('status')} = '{Status.PENDING}' AND {quote('hold')} = '{Hold.READY}' "
        f"AND {turn} < {LATER} AND {quote('id')} > 0"
    )
    head = (
        f"SELECT {turn} FROM {table} WHERE {pool} = %s AND {quote('is_async')} = %s "
        f"AND {priority} = %s AND {ready} ORDER BY {turn} LIMIT 1"
    )
    last = (
        f"SELECT {turn} FROM {table} WHERE {pool} = %s AND {priority} = %s "
        f"AND {tenant} {'IS NULL' if untenanted else '= %s'} AND {ready} "
        f"ORDER BY {tenant} DESC NULLS FIRST, {turn} DESC LIMIT 1"
    )
    return head, last


def give_turns(pools: Iterable[str] | None = None, limit: int = _PER_PASS) -> int:
    """Give a turn to the ready runs of ``pools`` (all when None) that are due now and
    still wait for one (``LATER``), oldest first, up to ``limit``; how many."""
    given = 0
    for pool in sorted(set(pools)) if pools is not None else _pools():
        for is_async in (False, True):
            for priority in _priorities(pool, is_async):
                given += _give(pool, is_async, priority, limit - given)
                if given >= limit:
                    return given
    return given


def _pools() -> list[str]:
    """The pools with ready runs waiting for a turn (every pool's, when no pool is named)."""
    waiting = runs().filter(status=Status.PENDING, hold=Hold.READY, turn=LATER)
    return sorted(set(waiting.order_by().values_list("pool", flat=True).distinct()[:1000]))


def _priorities(pool: str, is_async: bool) -> list[int]:
    """The distinct priorities of the ready runs of ``pool`` of a kind, highest first:
    one probe of the claim index each (an index scan, for the reason in
    ``_statements``: this runs twice a second, by a statement written once)."""
    connection = connections[using()]
    probe = _upkeep_statements(connection.alias)[0]
    found: list[int] = []
    below = _HIGHEST
    while len(found) < _PRIORITIES:
        rows = vendors.of(connection).fetch(connection, probe, [pool, is_async, below])
        if not rows:
            break
        priority = int(rows[0][0])
        found.append(priority)
        if priority <= _LOWEST:
            break
        below = priority - 1
    return found


# The bounds of a priority (a SmallIntegerField): the first probe's bound, the last.
_HIGHEST, _LOWEST = 2**15 - 1, -(2**15)


@functools.cache
def _upkeep_statements(alias: str) -> tuple[str, str]:
    """The text of ``_priorities``' probe and of ``_give``'s read of due ``LATER`` runs
    for ``alias``: written once, as ``_statements``, since the worker's pass runs
    them every tick on the connection its claims use (the ORM took longer to
    compile them than the server to run them)."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    table = quote(JobRun._meta.db_table)
    pool, kind, priority, turn, run_at, pk = (
        quote(c) for c in ("pool", "is_async", "priority", "turn", "run_at", "id")
    )
    now, now_params = runs().query.get_compiler(alias).compile(Now())
    assert not now_params, now_params
    ready = f"{quote('status')} = '{Status.PENDING}' AND {quote('hold')} = '{Hold.READY}'"
    probe = (
        f"SELECT {priority} FROM {table} WHERE {pool} = %s AND {kind} = %s AND {ready} "
        f"AND {pk} > 0 AND {priority} <= %s ORDER BY {priority} DESC LIMIT 1"
    )
    due_later = (
        f"SELECT {pk} FROM {table} WHERE {pool} = %s AND {kind} = %s AND {priority} = %s "
        f"AND {ready} AND {turn} = {LATER} AND {run_at} <= {now} "
        f"ORDER BY {run_at}, {pk} LIMIT %s"
    )
    return probe, due_later


def _give(pool: str, is_async: bool, priority: int, limit: int) -> int:
    """Give turns to up to ``limit`` due ``LATER`` runs of ``pool`` of a kind at
    ``priority``."""
    if limit <= 0:
        return 0
    connection = connections[using()]
    due_later = _upkeep_statements(connection.alias)[1]
    found = vendors.of(connection).fetch(connection, due_later, [pool, is_async, priority, limit])
    if not found:
        return 0
    ids = [row[0] for row in found]
    given = 0
    with transaction.atomic(using=using()):
        # Locked by primary key alone, checked under the lock (see claiming._locked);
        # a row a claim holds is passed over: it is being taken anyway.
        rows = list(
            runs()
            .filter(pk__in=ids)
            .order_by()
            .select_for_update(skip_locked=True)
            .values("id", "status", "hold", "turn", "tenant_id", "run_at")
        )
        rows = [
            row
            for row in rows
            if (row["status"], row["hold"], row["turn"]) == (Status.PENDING, Hold.READY, LATER)
        ]
        by_tenant: dict[str | None, list[int]] = {}
        for row in sorted(rows, key=lambda row: (row["run_at"], row["id"])):
            by_tenant.setdefault(row["tenant_id"], []).append(row["id"])
        fair = conf.get().FAIR_TURNS
        for tenant_id, tenant_ids in by_tenant.items():
            first = _first(pool, is_async, priority, tenant_id) if fair else 0
            whens = [
                When(pk=run_id, then=Value(_capped(first, n) if fair else 0))
                for n, run_id in enumerate(tenant_ids)
            ]
            given += (
                runs()
                .filter(pk__in=tenant_ids)
                .update(turn=Case(*whens, default=Value(LATER), output_field=BigIntegerField()))
            )
    return given
