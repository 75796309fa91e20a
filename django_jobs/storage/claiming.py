"""Claiming due runs in batches, each claimed run a ``Claim`` (``storage.reading``).

A claim is one short transaction: ``SELECT ... FOR UPDATE SKIP LOCKED`` picks due
rows no other transaction holds, an ``UPDATE`` marks them running under a fresh
lease token, and the commit releases the row locks. No handler runs inside it.
The attempt is counted here, at claim, so a run that kills its worker still
spends its attempts. Every later write to the run is fenced on that token
(``leases``).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import (
    DataError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    connections,
    transaction,
)
from django.db.models import (
    BooleanField,
    Exists,
    ExpressionWrapper,
    F,
    Subquery,
)
from django.db.models.functions import Now

from ..models import Hold, JobPool, Status
from ..ratelimits import Limits
from . import holds, ratelimits, runs, using, vendors
from .leases import WorkerIds
from .reading import (
    CLAIM_FIELDS,
    DATE_FIELDS,
    EARLIEST,
    RETURNED,
    claim_of,
    claimed_values,
    find_unwritable,
    passed_over,
)
from .reading import Claim as Claim

logger = logging.getLogger(__name__)


def claim_batch(
    worker_id: uuid.UUID,
    pools: Sequence[str] | None,
    limit: int,
    *,
    plan: int = 0,
    kind: bool | None = None,
    limits: Limits | None = None,
) -> list[Claim]:
    """Claim up to ``limit`` due runs of ``pools`` (all pools when None) for this worker.

    Highest priority first, then the lowest turn (``storage.turns``: tenants
    take turns), then the oldest ``run_at``, runs under the rate
    ``limits`` and the others alike; without ``limits`` no limit is enforced.
    Where the database claims in one statement, a new ``plan`` number makes the
    server plan it afresh. ``kind`` limits the claim to the runs of async handlers
    (True: a worker's event loop claims them) or to the others (False: its
    threads); None claims both.

    A run under a limit whose window is known to be full is not picked. The
    others under a limit are admitted as their windows allow
    (``storage.ratelimits.admit``): in the claim's transaction where it is
    made of several statements; where it is one statement (PostgreSQL), that
    statement claims the rest and hands their ids over to an admission of
    their own. When a window admitted fewer than were picked, it is full now
    and its runs are held: the slots they left are claimed again, once.
    """
    if limit <= 0 or (pools is not None and not pools):
        return []
    recovered = _recover()
    limits = limits or None
    left = Left()
    claims = _guarded(
        functools.partial(_claim, worker_id, pools, limit, plan, kind, limits=limits, left=left),
        recovered,
    )
    if limits is None:
        return claims
    try:
        claims += _admit_deferred(worker_id, limits, left)
        if left.refused and len(claims) < limit:
            more, left.refused = limit - len(claims), 0
            claims += _guarded(
                functools.partial(
                    _claim, worker_id, pools, more, plan, kind, limits=limits, left=left
                ),
                [],
            )
            claims += _admit_deferred(worker_id, limits, left)
    except (OperationalError, InterfaceError):
        if not claims:
            raise
        # An earlier statement committed: its runs must run, whatever this one did.
        logger.warning("claim of rate-limited runs failed", exc_info=True)
    ratelimits.after_claim(len(claims) < limit)
    return claims


@dataclass
class Left:
    """What a claim under rate limits left to admit (``deferred`` ids) or found no
    room for (``refused``, how many)."""

    deferred: list[int] = field(default_factory=list)
    refused: int = 0


def _guarded(claim: Callable[[uuid.UUID], list[Claim]], recovered: list[Claim]) -> list[Claim]:
    """``claim`` under a fresh lease token, with ``recovered`` runs first."""
    token = uuid.uuid4()
    try:
        claims = claim(token)
    except (OperationalError, InterfaceError):
        # The connection broke, perhaps after the server committed the claim and
        # before it said so: those runs would stay running under this live worker
        # for good. Their token says which they are; read them back when the
        # database answers again (now, or at a later claim).
        _uncertain.append(token)
        if recovered:
            return recovered
        raise
    return recovered + claims


def _claim(
    worker_id: uuid.UUID,
    pools: Sequence[str] | None,
    limit: int,
    plan: int,
    kind: bool | None,
    token: uuid.UUID,
    limits: Limits | None = None,
    left: Left | None = None,
) -> list[Claim]:
    admit = None if limits is None else _admission(limits, worker_id, token, left or Left())
    try:
        claims = _claim_in_one_statement(worker_id, pools, limit, plan, kind, token, limits, left)
        if claims is not None:
            return claims
        return claim_two_statements(
            worker_id, _picks(pools, kind, limits), limit, token, admit=admit
        )
    except (IntegrityError, DataError):
        # The unique index refused a second running run of one key: a claim that
        # took the key committed after this statement's snapshot was taken (or
        # the worker row is gone). Or the database refused to change a row (see
        # find_unwritable). Nothing was written; claim again the careful way,
        # whose second statement sees that commit and passes over such a row.
        logger.debug("claim refused by an integrity constraint; claiming again", exc_info=True)
        try:
            return claim_two_statements(
                worker_id, _picks(pools, kind, limits), limit, token, admit=admit
            )
        except IntegrityError:
            logger.warning("claim refused by an integrity constraint; retrying", exc_info=True)
            return []


def _picks(pools: Sequence[str] | None, kind: bool | None, limits: Limits | None) -> Any:
    """What a claim in several statements picks from: the candidates of each pool and
    kind (several picks are merged in claim order). Runs under a limit and the
    others are picked together: those of a full window are held out of the
    claim's index (``storage.rateholds``), so a pick reads none of them."""
    sets = candidate_sets(pools, locked=False, kind=kind, limits=limits)
    return sets[0] if len(sets) == 1 else tuple(sets)


def _admit_deferred(worker_id: uuid.UUID, limits: Limits, left: Left) -> list[Claim]:
    """The admission of the runs under a limit that a one-statement claim picked and
    handed over (``left.deferred``), in a transaction of its own."""
    if not left.deferred:
        return []
    ids, left.deferred = left.deferred, []
    picked = runs().due(None).filter(pk__in=ids).order_by("-priority", "turn", "run_at")

    def admit(token: uuid.UUID) -> list[Claim]:
        admitting = _admission(limits, worker_id, token, left)
        try:
            return claim_two_statements(worker_id, picked, len(ids), token, admit=admitting)
        except IntegrityError:
            logger.warning("claim refused by an integrity constraint; retrying", exc_info=True)
            return []

    return _guarded(admit, [])


def _admission(
    limits: Limits, worker_id: uuid.UUID, token: uuid.UUID, left: Left
) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    """What a claim under ``limits`` does with the rows it locked: those under a limit
    admitted as their windows allow (and the others in claim order kept), all
    marked running; the count of those refused noted in ``left``."""

    def admit(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        under = {row["id"] for row in rows if ratelimits.limits_of(row, limits)}
        if not under:
            mark_running(rows, worker_id, token)
            return rows
        limited = [row for row in rows if row["id"] in under]
        admitted = {
            row["id"] for row in ratelimits.admit(limited, len(limited), limits, worker_id, token)
        }
        left.refused += len(under) - len(admitted)
        mark_running([row for row in rows if row["id"] not in under], worker_id, token)
        return [row for row in rows if row["id"] not in under or row["id"] in admitted]

    return admit


# The tokens of claims whose outcome the database did not report (the connection
# broke): this process's, read back by the next claim.
_uncertain: list[uuid.UUID] = []


def _recover() -> list[Claim]:
    """The runs claimed by claims whose commit was not reported, if any committed."""
    if not _uncertain:
        return []
    tokens = list(_uncertain)
    rows = list(
        claimed_values(runs().filter(lease_token__in=tokens, status=Status.RUNNING), "lease_token")
    )
    del _uncertain[: len(tokens)]  # read: they are settled, whatever was found
    if rows:
        logger.warning(
            "claim recovered %d runs whose claim committed as the connection broke: %s",
            len(rows),
            ",".join(str(row["id"]) for row in rows),
        )
    return [claim_of(row, row["lease_token"]) for row in rows]


def candidate_sets(
    pools: Sequence[str] | None, *, kind: bool | None = None, **options: Any
) -> list[Any]:
    """The candidates of a claim, a queryset per pool and kind when it claims for
    several.

    The claim's index leads with the pool, then the kind, so the runs of one pool
    and kind come from it in claim order and a claim reads the few it takes. Over
    several pools (or both kinds), one query would read every due run of them all
    to sort them (a paused pool's included, or a deep backlog of the other kind):
    each is read apart, and the picks merged in claim order. Without pools (every
    pool), one query.
    """
    if not pools:
        return [candidates(pools, kind=kind, **options)]
    kinds = (False, True) if kind is None else (kind,)
    return [
        candidates([pool], kind=each, **options) for pool in sorted(set(pools)) for each in kinds
    ]


def candidates(
    pools: Sequence[str] | None,
    *,
    locked: bool = True,
    kind: bool | None = None,
    limits: Limits | None = None,
) -> Any:
    """Due runs of ``pools`` (of the ``kind``, when given) that may be claimed now, in
    claim order, locked as read (unless not ``locked``); without the runs under
    one of the rate ``limits`` whose window is known to be full."""
    due = runs().due(pools)
    skipped = passed_over()
    if skipped:
        due = due.exclude(pk__in=skipped)
    if limits:
        due = ratelimits.claimable(due, limits)
    if kind is not None:
        # A range of the claim's index of its own: a deep backlog of the other
        # kind (an event loop at its limit) is not read past.
        due = due.filter(is_async=kind)
    # Runs of a paused pool stay pending. The subquery is part of the statement,
    # so a pause takes effect at every worker's next claim, with no cache to expire.
    paused = JobPool.objects.using(using()).filter(paused_at__isnull=False)
    if pools is not None and len(set(pools)) == 1:
        # Of this one pool: a condition on no run, which the server decides once
        # (PostgreSQL's one-time filter), reading none of a paused pool's runs,
        # nor of a pool whose own rate limit's window is full.
        due = due.filter(~Exists(paused.filter(name=pools[0])))
        if limits:
            due = due.filter(ratelimits.pool_open(pools[0], limits))
    else:
        due = due.exclude(pool__in=Subquery(paused.order_by().values("name")))
    # A run whose concurrency key has no slot free now is not a candidate, so a
    # blocked run is passed over instead of being claimed and put back (no
    # spinning). Checked only for rows that have a key, so the planner does not
    # turn it into an anti-join that scans every running row on each claim.
    due = due.filter(holds.has_room(pools))
    # SKIP LOCKED: rows another worker is claiming right now are passed over
    # instead of waited for, so claimers never queue behind each other and
    # never both get one row. The filter and order (priority, then the turns
    # that tenants take, storage.turns, then age) match the partial index
    # django_jobs_run_claim_kind (ready pending runs by pool and kind), so the
    # cost grows neither with finished history nor with runs held for their key
    # (storage.holds), nor with the other kind's backlog.
    due = due.order_by("-priority", "turn", "run_at")
    return due.select_for_update(skip_locked=True) if locked else due


# What a one-statement claim reads of the runs it picks (the vendor's statement names them).
_PICKED = ("id", "concurrency_key", "concurrency_limit", "priority", "turn", "run_at")


def _claim_in_one_statement(
    worker_id: uuid.UUID,
    pools: Sequence[str] | None,
    limit: int,
    plan: int,
    kind: bool | None,
    token: uuid.UUID,
    limits: Limits | None,
    left: Left | None,
) -> list[Claim] | None:
    """The claim in one statement, where the database has one. Under ``limits``, the
    statement claims the runs under none, and hands over the ids of those under
    one (``left.deferred``, in no order) for an admission of their own. Under
    tenant caps, the statement gives the runs of capped tenants their slots."""
    caps = holds.caps_in_force(pools)
    fields = _PICKED if caps is None else (*_PICKED, "pool", "tenant_id")
    connection = connections[using()]

    def picked() -> list[Any]:
        sets = []
        for rows in candidate_sets(pools, kind=kind, limits=limits):
            if limits is not None:
                under = ratelimits.under_a_limit(limits)
                rows = rows.annotate(deferred=ExpressionWrapper(under, output_field=BooleanField()))
                sets.append(rows.values(*fields, "deferred")[:limit])
            else:
                sets.append(rows.values(*fields)[:limit])
        return sets

    rows = vendors.of(connection).claim(
        connection,
        (
            (
                None if pools is None else tuple(pools),
                kind,
                limits and limits.signature(),
                tuple(passed_over()),
                caps,
            ),
            limit,
        ),
        picked,
        CLAIM_FIELDS,
        worker_id,
        token,
        plan,
        dates=DATE_FIELDS,
        deferring=limits is not None,
        caps=caps,
    )
    if rows is None:
        return None
    if limits is not None:
        # The last value says whether the row was handed over rather than claimed.
        if left is not None:
            left.deferred += [values[0] for values in rows if values[-1]]
        rows = [values[:-1] for values in rows if not values[-1]]
    # The values come in CLAIM_FIELDS order, then has_steps and dates_ok.
    claims = [claim_of(dict(zip(RETURNED, values, strict=True)), token) for values in rows]
    # In claim order (RETURNING has none); the whole batch starts at once.
    claims.sort(key=_claim_order)
    return claims


def _claim_order(claim: Claim) -> tuple[Any, ...]:
    """Highest priority first, then the oldest ``run_at`` (an unreadable one last)."""
    return (-claim.priority, claim.run_at is None, claim.run_at or EARLIEST, claim.run_id)


# How many times a claim reads again when every run it picked was taken by
# another claim meanwhile.
_REREADS = 3


def claim_two_statements(
    worker_id: uuid.UUID,
    picked: Any,
    limit: int,
    token: uuid.UUID | None = None,
    *,
    admit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None,
) -> list[Claim]:
    """The claim in separate statements (databases without a one-statement claim,
    and after a key conflict): the ids of up to ``limit`` runs ``picked`` selects,
    then those rows locked by id, skipping locked ones, then the ``UPDATE``.

    The rows are locked by id, not by the ordered, filtered ``picked`` itself:
    InnoDB locks every row such a statement reads, so a sort or a subquery there
    would lock rows the claim does not take. A run another claim took between
    the two reads is skipped (locked) or no longer pending; when that was every
    run picked, the claim reads again, passing over the runs it found taken.
    ``admit``, when given, chooses among the locked rows and marks them running
    itself (the rate limits' admission).
    """
    token = token or uuid.uuid4()
    connection = connections[using()]
    taken: list[int] = []  # picked, but locked by other claims: passed over when read again
    try:
        for _ in range(_REREADS):
            ids: list[int] = []
            try:
                with transaction.atomic(using=using()):
                    ids = _picked(picked, [*taken, *passed_over()], limit)
                    if not ids:
                        return []
                    rows = _locked(ids)
                    if not rows:
                        taken += ids
                        continue
                    rows = holds.within_limits(rows)
                    if not rows:
                        return []
                    if admit is not None:
                        rows = admit(rows)
                    else:
                        mark_running(rows, worker_id, token)
                    break
            except (IntegrityError, DataError):
                # Rolled back. One row the database refuses to change must not
                # refuse the claim of the others; a key conflict is the caller's.
                if not find_unwritable(ids, worker_id):
                    raise
        else:
            return []
    finally:
        vendors.of(connection).unlock_keys(connection)
    for row in rows:
        row["attempts"] += 1
    return [claim_of(row, token) for row in rows]


def _picked(picked: Any, passed: list[int], limit: int) -> list[int]:
    """The ids of up to ``limit`` runs ``picked`` selects but ``passed``: a queryset
    in claim order, or several, each read in claim order and merged."""
    if not isinstance(picked, tuple):
        return list(picked.exclude(pk__in=passed).values_list("id", flat=True)[:limit])
    rows = []
    for query in picked:
        rows += query.exclude(pk__in=passed).values_list("priority", "turn", "run_at", "id")[:limit]
    rows.sort(key=lambda row: (-row[0], row[1], row[2], row[3]))
    return [row[3] for row in rows[:limit]]


def mark_running(rows: list[dict[str, Any]], worker_id: uuid.UUID, token: uuid.UUID) -> None:
    """Mark the locked ``rows`` running under ``token``, their attempt counted."""
    if not rows:
        return
    # The rows are locked by this transaction, and were pending when locked, so
    # nothing else changes them before commit. By primary key alone: with a
    # status condition, InnoDB may read them through a status index, locking
    # entries of runs it does not change, which another transaction's write
    # needs while it waits for a row this claim holds (a deadlock).
    runs().filter(pk__in=[row["id"] for row in rows]).update(
        status=Status.RUNNING,
        attempts=F("attempts") + 1,
        claimed_by_id=worker_id,
        lease_token=token,
        started_at=Now(),
        worker_ids=WorkerIds(worker_id),
        **holds.slots_of(rows),
    )


def _locked(ids: list[int]) -> list[dict[str, Any]]:
    """The rows of ``ids`` still pending and ready, locked, in the order of ``ids``;
    the rows other transactions hold are skipped. Each says whether its run has
    recorded steps, so that a first execution needs no query to learn it has none."""
    # Locked by primary key alone, the status checked under the lock (see
    # mark_running): a status condition here could lock index entries of other
    # runs on InnoDB. A row no longer pending stays locked until the claim
    # commits, changed by nothing. Nor is a row held since it was picked (the
    # worker's hold pass committed between the two statements) claimed: it
    # would run held, and keep its hold past its end.
    locked = claimed_values(
        runs().filter(pk__in=ids).order_by().select_for_update(skip_locked=True),
        "rate_key",
        "concurrency_limit",
        "status",
        "hold",
    )
    order = {run_id: n for n, run_id in enumerate(ids)}
    pending = [
        row
        for row in locked
        if (row.pop("status"), row.pop("hold")) == (Status.PENDING, Hold.READY)
    ]
    return sorted(pending, key=lambda row: order[row["id"]])
